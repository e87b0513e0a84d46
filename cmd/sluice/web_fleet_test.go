package main

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/sluicehq/sluice/internal/browsertest"
)

// The page's fleet, in a real Chromium against `sluice web`: 600 a minute against 100 a minute on
// three instances. With separate stores the fixed window lets 300 through, 100 on each
// instance; switched to a shared store, 100. Each time the page's summary, and what it shows per
// instance, are the numbers of `sluice simulate --compare --instances 3 --store ... --format json`.
func TestWebPageFleetMatchesSimulate(t *testing.T) {
	url := startWeb(t)
	page := browsertest.Simulation{Tab: browsertest.NewTab(t, 1366, 900)}
	const base = "traffic=600/min+for+1m&limit=100&period=1m&burst=0&instances=3&store="
	page.Open(url + "?" + base + "separate")
	if page.Value("instances") != "3" || page.Value("store") != "separate" {
		t.Fatalf("the form: instances %q, store %q", page.Value("instances"), page.Value("store"))
	}
	for _, tc := range []struct {
		store        string
		fixedWindow  string // allowed in all
		perInstance0 string // fixed-window's per instance
	}{
		{"separate", "300", "100,100,100"},
		{"shared", "100", "34,33,33"},
	} {
		if tc.store == "shared" { // as a person choosing it does
			page.Do("choosing a shared store", chromedp.Evaluate[chromedp.Void](`(() => { const el = document.getElementById('store');
				el.value = 'shared'; el.dispatchEvent(new Event('input', {bubbles: true})); })()`))
			page.Wait("the shared store's run", `document.getElementById('summary').dataset.query === `+browsertest.JSString(base+"shared"))
		}
		page.Click("#end")
		got := page.WaitComplete(base + tc.store)

		cli := ok(t, "", "simulate", "--compare", "--format", "json", "--limit", "100", "--period", "1m", "--burst", "0",
			"--instances", "3", "--store", tc.store, "--traffic", "600/min for 1m")
		want := browsertest.SummariesFromJSON(t, cli)
		if d := want.Diff(got); d != "" {
			t.Errorf("%s: the page's summary differs from sluice simulate's:\n%s", tc.store, d)
		}
		if got["fixed-window"]["allowed"] != tc.fixedWindow {
			t.Errorf("%s: fixed-window allowed %s; want %s", tc.store, got["fixed-window"]["allowed"], tc.fixedWindow)
		}
		// Per instance: the page's cells against the command's per_instance.
		var doc struct {
			Runs []struct {
				Algorithm   string `json:"algorithm"`
				PerInstance []struct {
					Summary struct {
						Allowed int64 `json:"allowed"`
					} `json:"summary"`
				} `json:"per_instance"`
			} `json:"runs"`
		}
		if err := json.Unmarshal([]byte(cli), &doc); err != nil {
			t.Fatal(err)
		}
		cells := browsertest.Eval[map[string]string](page.Tab, `Object.fromEntries([...document.querySelectorAll('#summary tbody tr')].map(
			tr => [tr.dataset.algorithm, tr.querySelector('td.fleet-col').dataset.instances]))`)
		for _, r := range doc.Runs {
			var w []string
			for _, pi := range r.PerInstance {
				w = append(w, strconv.FormatInt(pi.Summary.Allowed, 10))
			}
			if cells[r.Algorithm] != strings.Join(w, ",") {
				t.Errorf("%s, %s: the page shows %q per instance; the command %q", tc.store, r.Algorithm, cells[r.Algorithm], strings.Join(w, ","))
			}
		}
		if cells["fixed-window"] != tc.perInstance0 {
			t.Errorf("%s: fixed-window per instance %q; want %q", tc.store, cells["fixed-window"], tc.perInstance0)
		}
		if cmds := browsertest.Eval[string](page.Tab, `document.getElementById('commands').textContent`); cmds !=
			"sluice simulate --compare --limit 100 --period 1m --burst 0 --instances 3 --store "+tc.store+" --traffic '600/min for 1m' --format json" {
			t.Errorf("%s: the page's command line: %q", tc.store, cmds)
		}
		if !browsertest.Eval[bool](page.Tab, `getComputedStyle(document.querySelector('#summary th.fleet-col')).display !== 'none'`) {
			t.Errorf("%s: the per-instance column is hidden", tc.store)
		}
	}
	page.Screenshot("web-simulation-fleet")
}

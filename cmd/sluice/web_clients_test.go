package main

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/sluicehq/sluice/internal/browsertest"
)

// The page's several clients and the rest of the fleet (balance, store latency, an outage), in a
// real Chromium against `sluice web`. Each time the page's numbers — the summary, what each
// instance let through, and the per-client table, in all and per instance — are read from the
// DOM and compared with `sluice simulate --compare --format json` of the same flags.

// pageFleetDoc is what these tests read of `sluice simulate --compare --store ... --format json`.
type pageFleetDoc struct {
	Runs []struct {
		Algorithm string `json:"algorithm"`
		Requests  []struct {
			Key      string `json:"key"`
			Allowed  bool   `json:"allowed"`
			Instance int    `json:"instance"`
		} `json:"requests"`
		PerInstance []struct {
			Summary struct {
				Allowed int64 `json:"allowed"`
			} `json:"summary"`
		} `json:"per_instance"`
		PerClient []struct {
			Key     string `json:"key"`
			Summary struct {
				Offered, Allowed, Refused int64
			} `json:"summary"`
		} `json:"per_client"`
	} `json:"runs"`
}

// clientRow is a row of the page's per-client table: offered, allowed, refused, and instances
// (what each instance let through for the client, "34,33,33").
type clientRow map[string]string

// pageClients reads the page's per-client table: algorithm → client → its row.
func pageClients(page browsertest.Simulation) map[string]map[string]clientRow {
	return browsertest.Eval[map[string]map[string]clientRow](page.Tab, `(() => {
		const out = {};
		for (const tr of document.querySelectorAll('#clients tbody tr')) {
			const row = {};
			for (const td of tr.querySelectorAll('td[data-field]')) row[td.dataset.field] = td.textContent;
			row.instances = tr.querySelector('td.fleet-col').dataset.instances;
			(out[tr.dataset.algorithm] ||= {})[tr.dataset.client] = row;
		}
		return out;
	})()`)
}

// pageInstances reads the summary's allowed per instance: algorithm → "106,107,107".
func pageInstances(page browsertest.Simulation) map[string]string {
	return browsertest.Eval[map[string]string](page.Tab, `Object.fromEntries([...document.querySelectorAll('#summary tbody tr')].map(
		tr => [tr.dataset.algorithm, tr.querySelector('td.fleet-col').dataset.instances]))`)
}

// cliSummaries is browsertest.SummariesFromJSON with a summary's "fallback" object flattened
// into the page's columns fallback.open, fallback.local and fallback.closed.
func cliSummaries(t *testing.T, out string) browsertest.Summaries {
	t.Helper()
	sums := browsertest.SummariesFromJSON(t, out)
	for _, fields := range sums {
		raw, ok := fields["fallback"]
		if !ok {
			continue
		}
		var fb map[string]json.RawMessage
		if err := json.Unmarshal([]byte(raw), &fb); err != nil {
			t.Fatalf("fallback %s: %v", raw, err)
		}
		delete(fields, "fallback")
		for k, v := range fb {
			fields["fallback."+k] = string(v)
		}
	}
	return sums
}

// compareFleet checks the complete run on the page against the command's JSON: the summaries,
// allowed per instance, and the per-client table (in all from per_client; per instance counted
// from the command's requests, each with its key and instance). It returns the page's clients.
func compareFleet(t *testing.T, page browsertest.Simulation, name, cli string) map[string]map[string]clientRow {
	t.Helper()
	if d := cliSummaries(t, cli).Diff(page.Summaries()); d != "" {
		t.Errorf("%s: the page's summary differs from sluice simulate's:\n%s", name, d)
	}
	var doc pageFleetDoc
	if err := json.Unmarshal([]byte(cli), &doc); err != nil {
		t.Fatal(err)
	}
	instances, clients := pageInstances(page), pageClients(page)
	if len(clients) != len(doc.Runs) {
		t.Errorf("%s: the per-client table has algorithms %v; want %d", name, clients, len(doc.Runs))
	}
	for _, r := range doc.Runs {
		var w []string
		for _, pi := range r.PerInstance {
			w = append(w, strconv.FormatInt(pi.Summary.Allowed, 10))
		}
		if instances[r.Algorithm] != strings.Join(w, ",") {
			t.Errorf("%s, %s: the page shows %q per instance; the command %q", name, r.Algorithm, instances[r.Algorithm], strings.Join(w, ","))
		}
		perInstance := map[string][]int64{}
		for _, rq := range r.Requests {
			if perInstance[rq.Key] == nil {
				perInstance[rq.Key] = make([]int64, len(r.PerInstance))
			}
			if rq.Allowed {
				perInstance[rq.Key][rq.Instance-1]++
			}
		}
		if len(clients[r.Algorithm]) != len(r.PerClient) {
			t.Errorf("%s, %s: the page has clients %v; the command %d", name, r.Algorithm, clients[r.Algorithm], len(r.PerClient))
		}
		for _, c := range r.PerClient {
			var pi []string
			for _, n := range perInstance[c.Key] {
				pi = append(pi, strconv.FormatInt(n, 10))
			}
			want := clientRow{"offered": strconv.FormatInt(c.Summary.Offered, 10), "allowed": strconv.FormatInt(c.Summary.Allowed, 10),
				"refused": strconv.FormatInt(c.Summary.Refused, 10), "instances": strings.Join(pi, ",")}
			got := clients[r.Algorithm][c.Key]
			for k, v := range want {
				if got[k] != v {
					t.Errorf("%s, %s, client %s: the page's %s is %q; the command's %q", name, r.Algorithm, c.Key, k, got[k], v)
				}
			}
		}
	}
	return clients
}

// A buggy partner (600 a minute) and a normal one (20 a minute) against 100 a minute on three
// instances. With separate stores the fixed window lets 300 of the buggy partner's 600 through,
// 100 on each instance; with a shared store 100. The normal partner gets 20 of 20 both ways. The
// page's preset "partners" is this scenario.
func TestWebPageClientsMatchSimulate(t *testing.T) {
	url := startWeb(t)
	page := browsertest.Simulation{Tab: browsertest.NewTab(t, 1366, 900)}
	const pattern = "buggy: 600/min for 1m; normal: 20/min for 1m"
	const base = "traffic=buggy:+600/min+for+1m%3B+normal:+20/min+for+1m&limit=100&period=1m&burst=0&instances=3&store="
	page.Open(url)
	page.Click(`#presets button[data-preset="partners"]`) // the preset is this scenario
	page.Wait("the preset's run", `document.getElementById('summary').dataset.query === `+browsertest.JSString(base+"separate"))
	if got := page.Value("traffic"); got != pattern {
		t.Fatalf("the pattern is %q", got)
	}
	if browsertest.Eval[bool](page.Tab, `document.getElementById('clients-box').hidden`) {
		t.Fatal("the per-client table is hidden")
	}
	for _, tc := range []struct {
		store               string
		buggy, buggyPerInst string // fixed-window: the buggy partner's allowed, in all and per instance
	}{
		{"separate", "300", "100,100,100"},
		{"shared", "100", "34,33,33"},
	} {
		if tc.store == "shared" {
			page.Do("choosing a shared store", chromedp.Evaluate[chromedp.Void](`(() => { const el = document.getElementById('store');
				el.value = 'shared'; el.dispatchEvent(new Event('input', {bubbles: true})); })()`))
			page.Wait("the shared store's run", `document.getElementById('summary').dataset.query === `+browsertest.JSString(base+"shared"))
		}
		page.Click("#end")
		page.WaitComplete(base + tc.store)
		page.Wait("the per-client table's whole run", `document.getElementById('clients').dataset.complete === 'true'`)

		cli := ok(t, "", "simulate", "--compare", "--format", "json", "--limit", "100", "--period", "1m", "--burst", "0",
			"--instances", "3", "--store", tc.store, "--traffic", pattern)
		clients := compareFleet(t, page, tc.store, cli)
		fw := clients["fixed-window"]
		if fw["buggy"]["allowed"] != tc.buggy || fw["buggy"]["refused"] != strconv.Itoa(600-atoi(t, tc.buggy)) || fw["buggy"]["instances"] != tc.buggyPerInst {
			t.Errorf("%s: fixed-window, buggy: %v; want %s allowed, %s per instance", tc.store, fw["buggy"], tc.buggy, tc.buggyPerInst)
		}
		for alg, cs := range clients {
			if n := cs["normal"]; n["offered"] != "20" || n["allowed"] != "20" || n["refused"] != "0" {
				t.Errorf("%s, %s: the normal partner got %v; want 20 of 20", tc.store, alg, n)
			}
		}
		if line := pageText(page, "#card-fixed-window .clients"); line != "Let through: buggy "+tc.buggy+" of 600 · normal 20 of 20" {
			t.Errorf("%s: fixed-window's card says %q", tc.store, line)
		}
		if title := pageText(page, "#card-fixed-window .level-title"); title != "Count in the current window — client buggy" {
			t.Errorf("%s: fixed-window's state plot is titled %q", tc.store, title)
		}
		if cmds := pageText(page, "#commands"); cmds != "sluice simulate --compare --limit 100 --period 1m --burst 0 --instances 3 --store "+
			tc.store+" --traffic '"+pattern+"' --format json" {
			t.Errorf("%s: the page's command line: %q", tc.store, cmds)
		}
	}
	page.Screenshot("web-simulation-clients")
}

// A shared store that is slow (2ms a call) and down from 20s to 40s, each instance failing to
// local, then open, then closed: the page's numbers are the command's, the decisions made
// without the store counted by failure mode. A bad outage is named at its field.
func TestWebPageOutageMatchesSimulate(t *testing.T) {
	url := startWeb(t)
	page := browsertest.Simulation{Tab: browsertest.NewTab(t, 1366, 900)}
	const pattern = "buggy: 600/min for 1m; normal: 20/min for 1m"
	const base = "traffic=buggy:+600/min+for+1m%3B+normal:+20/min+for+1m&limit=100&period=1m&burst=0&instances=3&store=shared" +
		"&store-latency=2ms&outage=20s-40s&on-error="
	page.Open(url + "?" + base + "local")
	for id, want := range map[string]string{"store-latency": "2ms", "outage": "20s-40s", "on-error": "local"} {
		if got := page.Value(id); got != want {
			t.Errorf("field %s is %q, want %q", id, got, want)
		}
	}
	for _, mode := range []string{"local", "open", "closed"} {
		if mode != "local" {
			pageSet(page, "on-error", mode)
			page.Wait("the run failing "+mode, `document.getElementById('summary').dataset.query === `+browsertest.JSString(base+mode))
		}
		page.Click("#end")
		got := page.WaitComplete(base + mode)
		cli := ok(t, "", "simulate", "--compare", "--format", "json", "--limit", "100", "--period", "1m", "--burst", "0",
			"--instances", "3", "--store", "shared", "--store-latency", "2ms", "--outage", "20s-40s", "--on-error", mode, "--traffic", pattern)
		compareFleet(t, page, mode, cli)
		// 620 requests in a minute, those from 20s to 40s decided without the store.
		if fw := got["fixed-window"]; fw["fallback."+mode] != "207" || fw["max_latency_ms"] != "2" {
			t.Errorf("%s: fixed-window's summary %v; want 207 decided %s, waits of 2ms", mode, fw, mode)
		}
		if !browsertest.Eval[bool](page.Tab, `getComputedStyle(document.querySelector('#summary th.outage-col')).display !== 'none'`) {
			t.Errorf("%s: the outage's columns are hidden", mode)
		}
		if cmds := pageText(page, "#commands"); !strings.Contains(cmds, " --instances 3 --store shared --store-latency 2ms --outage 20s-40s --on-error "+mode+" ") {
			t.Errorf("%s: the page's command line: %q", mode, cmds)
		}
	}

	// Clearing the outage leaves no failure mode to choose; a bad one is named at its field.
	page.Type("outage", "40s-20s")
	page.Wait("the outage's error", `!document.getElementById('outage-error').hidden`)
	if msg := pageText(page, "#outage-error"); msg != "outage: the outage must end after it begins" {
		t.Errorf("the outage's error: %q", msg)
	}
	pageSet(page, "store", "separate")
	pageSet(page, "outage", "")
	page.Wait("on-error to be disabled", `document.getElementById('on-error').disabled`)
	page.Wait("the store latency's error", `!document.getElementById('store-latency-error').hidden`)
	if msg := pageText(page, "#store-latency-error"); !strings.HasPrefix(msg, "store latency: 2ms needs store shared") {
		t.Errorf("the store latency's error: %q", msg)
	}
}

// A random load balancer from a draw: the page's numbers are those of --balance random --draw N,
// and another draw deals the requests differently, as the command's does.
func TestWebPageRandomBalanceMatchesSimulate(t *testing.T) {
	url := startWeb(t)
	page := browsertest.Simulation{Tab: browsertest.NewTab(t, 1366, 900)}
	const pattern = "buggy: 600/min for 1m; normal: 20/min for 1m"
	const base = "traffic=buggy:+600/min+for+1m%3B+normal:+20/min+for+1m&limit=100&period=1m&burst=0&draw="
	const fleet = "&instances=3&store=separate&balance=random"
	page.Open(url + "?" + base + "7" + fleet)
	if page.Value("balance") != "random" || page.Value("draw") != "7" {
		t.Fatalf("the form: balance %q, draw %q", page.Value("balance"), page.Value("draw"))
	}
	seen := map[string]bool{}
	for _, draw := range []string{"7", "8"} {
		if draw != "7" {
			page.Type("draw", draw)
			page.Wait("the run of draw "+draw, `document.getElementById('summary').dataset.query === `+browsertest.JSString(base+draw+fleet))
		}
		page.Click("#end")
		page.WaitComplete(base + draw + fleet)
		cli := ok(t, "", "simulate", "--compare", "--format", "json", "--limit", "100", "--period", "1m", "--burst", "0",
			"--instances", "3", "--store", "separate", "--balance", "random", "--draw", draw, "--traffic", pattern)
		compareFleet(t, page, "draw "+draw, cli)
		seen[pageInstances(page)["token-bucket"]] = true
		if cmds := pageText(page, "#commands"); !strings.Contains(cmds, " --instances 3 --store separate --balance random --draw "+draw+" ") {
			t.Errorf("draw %s: the page's command line: %q", draw, cmds)
		}
	}
	if len(seen) != 2 {
		t.Errorf("draws 7 and 8 dealt the requests alike: %v", seen)
	}
}

// pageSet sets an input's or a select's value as a person choosing it does: an input event.
func pageSet(page browsertest.Simulation, id, value string) {
	page.Do("setting #"+id, chromedp.Evaluate[chromedp.Void](`(() => { const el = document.getElementById(`+browsertest.JSString(id)+`);
		el.value = `+browsertest.JSString(value)+`; el.dispatchEvent(new Event('input', {bubbles: true})); })()`))
}

func pageText(page browsertest.Simulation, selector string) string {
	return browsertest.Eval[string](page.Tab, `document.querySelector(`+browsertest.JSString(selector)+`).textContent`)
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

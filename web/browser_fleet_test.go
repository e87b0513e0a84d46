package web_test

// Browser tests of a fleet and of several clients on the page, in a real headless Chromium.

import (
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/browsertest"
	"github.com/sluicehq/sluice/sim"
	"github.com/sluicehq/sluice/web"
	"github.com/sluicehq/sluice/web/scenario"
)

// fleetRuns runs the page's traffic as `sluice simulate --compare --instances 3 --store ...`
// does, and returns the summaries, and per algorithm what each instance let through in all and
// for each client ("100,100,100", as the page's data-instances).
func fleetRuns(t *testing.T, pattern string, f sim.Fleet) (browsertest.Summaries, map[string]string, map[string]map[string]string) {
	t.Helper()
	reqs, err := sim.ParseClientTraffic(pattern)
	if err != nil {
		t.Fatal(err)
	}
	var results []sim.Result
	perInstance := map[string]string{}
	perClient := map[string]map[string]string{}
	for _, p := range sim.ComparePolicies(100, time.Minute, 0) {
		res, err := sim.Options{Fleet: &f}.Run(p, reqs)
		if err != nil {
			t.Fatal(err)
		}
		results = append(results, res)
		all := make([]int64, f.Instances)
		byClient := map[string][]int64{}
		for _, r := range res.Rows {
			if byClient[r.Key] == nil {
				byClient[r.Key] = make([]int64, f.Instances)
			}
			if r.Allowed {
				all[r.Instance-1]++
				byClient[r.Key][r.Instance-1]++
			}
		}
		alg := p.Algorithm.String()
		perInstance[alg] = joinInts(all)
		perClient[alg] = map[string]string{}
		for key, n := range byClient {
			perClient[alg][key] = joinInts(n)
		}
	}
	return summariesOf(t, results), perInstance, perClient
}

func joinInts(ns []int64) string {
	var s []string
	for _, n := range ns {
		s = append(s, strconv.FormatInt(n, 10))
	}
	return strings.Join(s, ",")
}

// The partners preset: a buggy partner (600 a minute) and a normal one (20) against 100 a
// minute on three instances. With separate stores the fixed window lets 300 of the buggy
// partner's through, 100 on each instance; choosing the shared store makes it 100. The summary,
// its per-instance column and the per-client table are `sluice simulate`'s, number for number.
func TestBrowserFleetAndClients(t *testing.T) {
	const pattern = "buggy: 600/min for 1m; normal: 20/min for 1m"
	var preset string
	for _, p := range scenario.Presets {
		if p.Name == "partners" {
			preset = p.Query
		}
	}
	if preset == "" || !strings.Contains(preset, "instances=3&store=separate") {
		t.Fatalf("the partners preset: %q", preset)
	}
	srv := httptest.NewServer(web.Handler())
	defer srv.Close()
	page := browsertest.Simulation{Tab: browsertest.NewTab(t, 1366, 900)}
	page.Open(srv.URL + "/?" + preset)
	for id, want := range map[string]string{"instances": "3", "store": "separate", "balance": "round-robin", "on-error": "closed"} {
		if got := page.Value(id); got != want {
			t.Errorf("field %s is %q, want %q", id, got, want)
		}
	}
	if !browsertest.Eval[bool](page.Tab, "document.getElementById('on-error').disabled") {
		t.Error("on error is enabled without an outage")
	}

	check := func(query string, f sim.Fleet, buggy string) {
		t.Helper()
		page.Click("#end")
		got := page.WaitComplete(query)
		want, perInstance, perClient := fleetRuns(t, pattern, f)
		if d := want.Diff(got); d != "" {
			t.Errorf("%s: the page's summary differs from sluice simulate --compare --instances's:\n%s", f.Stores, d)
		}
		for alg, counts := range perInstance {
			sel := `#summary tr[data-algorithm="` + alg + `"] td.fleet-col`
			if g := browsertest.Eval[string](page.Tab, `document.querySelector(`+browsertest.JSString(sel)+`).dataset.instances`); g != counts {
				t.Errorf("%s, %s: allowed per instance %q, want %q", f.Stores, alg, g, counts)
			}
			for key, counts := range perClient[alg] {
				row := `#clients tr[data-algorithm="` + alg + `"][data-client="` + key + `"]`
				if g := browsertest.Eval[string](page.Tab, `document.querySelector(`+browsertest.JSString(row+" td.fleet-col")+`).dataset.instances`); g != counts {
					t.Errorf("%s, %s, %s: allowed per instance %q, want %q", f.Stores, alg, key, g, counts)
				}
			}
		}
		if g := text(page, `#clients tr[data-algorithm="fixed-window"][data-client="buggy"] td[data-field="allowed"]`); g != buggy {
			t.Errorf("%s: the fixed window let %s of the buggy partner's through, want %s", f.Stores, g, buggy)
		}
		if l := text(page, "#card-fixed-window .clients"); !strings.Contains(l, "buggy "+buggy+" of 600 · normal 20 of 20") {
			t.Errorf("%s: the fixed window's card says %q", f.Stores, l)
		}
		if !browsertest.Eval[bool](page.Tab, `getComputedStyle(document.querySelector('#summary th.fleet-col')).display !== 'none' &&
			!document.getElementById('clients-box').hidden`) {
			t.Errorf("%s: the per-instance column or the per-client table is hidden", f.Stores)
		}
	}
	check(preset, sim.Fleet{Instances: 3, Stores: sim.SeparateStores}, "300")
	page.Screenshot("web-simulation-fleet")

	setValue(page, "store", "shared")
	shared := canonical(t, strings.Replace(preset, "store=separate", "store=shared", 1))
	page.Wait("the shared store's run", `document.getElementById('summary').dataset.query === `+browsertest.JSString(shared))
	check(shared, sim.Fleet{Instances: 3, Stores: sim.SharedStore}, "100")

	// An outage of the shared store, failing local: the On error choice is enabled, and the
	// requests decided without the store are counted as sim counts them.
	page.Type("outage", "20s-40s")
	setValue(page, "on-error", "local")
	outage := canonical(t, shared+"&outage=20s-40s&on-error=local")
	page.Wait("the outage's run", `document.getElementById('summary').dataset.query === `+browsertest.JSString(outage))
	if browsertest.Eval[bool](page.Tab, "document.getElementById('on-error').disabled") {
		t.Error("on error is disabled with an outage")
	}
	page.Click("#end")
	page.WaitComplete(outage)
	reqs, err := sim.ParseClientTraffic(pattern)
	if err != nil {
		t.Fatal(err)
	}
	f := sim.Fleet{Instances: 3, Outage: &sim.Outage{FromMicros: 20_000_000, ToMicros: 40_000_000, OnError: sluice.FailLocal}}
	res, err := sim.Options{Fleet: &f}.Run(sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 100, Period: time.Minute}, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if g := text(page, `#summary tr[data-algorithm="fixed-window"] td[data-col="fallback.local"]`); res.Summary.Local == 0 || g != strconv.FormatInt(res.Summary.Local, 10) {
		t.Errorf("the fixed window's requests decided locally: page %q, sim %d", g, res.Summary.Local)
	}
	if g := text(page, `#summary tr[data-algorithm="fixed-window"] td[data-field="allowed"]`); g != strconv.FormatInt(res.Summary.Allowed, 10) {
		t.Errorf("the fixed window allowed %s in the outage's run, sim %d", g, res.Summary.Allowed)
	}
}

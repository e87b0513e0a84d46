package web_test

import (
	"net/http/httptest"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/sluicehq/sluice/internal/browsertest"
	"github.com/sluicehq/sluice/sim/regions"
	"github.com/sluicehq/sluice/web"
)

// The regions page's first scenario (regions.js's DEFAULT), as the address it writes.
var regionsDefault = url.Values{
	"regions": {"eu,us,ap"}, "traffic": {"eu: 70/s for 3m; 10/s for 4m; us: 20/s for 7m; ap: 10/s for 3m; 70/s for 4m"},
	"algorithm": {"fixed-window"}, "limit": {"4800"}, "period": {"1m"}, "ledger-latency": {"50ms-150ms"},
	"floor": {"0.05"}, "safe-share": {"0.1"}, "partition": {"us@4m-4m45s"}, "flush-ledger": {"5m30s"},
}

// regionsRun is what `sluice simulate --regions` says for a query of the page: the bound, and
// what the regions admitted worldwide per window ("4702,4800,...").
func regionsRun(t *testing.T, query string) (bound, admitted string) {
	t.Helper()
	o, errs := regions.ParseQuery(query)
	if errs != nil {
		t.Fatal(errs)
	}
	res, err := regions.Run(o)
	if err != nil {
		t.Fatal(err)
	}
	var per []string
	for _, w := range res.Windows {
		per = append(per, strconv.FormatInt(w.Admitted, 10))
	}
	return strings.TrimPrefix(res.BoundText(), "bound: "), strings.Join(per, ",")
}

// sameAsSimulate checks that the page shows the numbers of sluice simulate --regions for its
// scenario: the bound's text and the worldwide admissions per window.
func sameAsSimulate(t *testing.T, tab *browsertest.Tab, query string) {
	t.Helper()
	bound, admitted := regionsRun(t, query)
	if got := browsertest.Eval[string](tab, "document.getElementById('bound').textContent"); got != bound {
		t.Errorf("the page's bound:\n%s\nsluice simulate --regions':\n%s", got, bound)
	}
	if got := browsertest.Eval[string](tab, "document.getElementById('windows').dataset.admitted"); got != admitted {
		t.Errorf("the page's windows admitted %s; sluice simulate --regions' %s", got, admitted)
	}
}

// The regions page, reached from the main page's link, opens on its first scenario and shows the
// answer without a touch: the bound held (in the words and numbers of sluice simulate --regions),
// the allotments followed the demand (eu, busiest before the move, had the largest allotment
// then and the smallest at the end), and both charts drawn, the summary and the first chart within
// a laptop's first screen; a bad traffic pattern is shown at its field and the last good result
// stays; a good change runs again. At a laptop's and a phone's size; screenshots to artifacts/.
func TestBrowserRegions(t *testing.T) {
	srv := httptest.NewServer(web.Handler())
	defer srv.Close()
	for _, size := range []screen{laptop, phone} {
		t.Run(size.name, func(t *testing.T) {
			page := size.open(t)
			tab := page.Tab

			// The main page links to the regions page and does not load its engine.
			page.Open(srv.URL + "/")
			if loaded := browsertest.Eval[[]string](tab, `performance.getEntriesByType('resource').map(e => e.name).filter(n => n.includes('regions'))`); len(loaded) > 0 {
				t.Errorf("the main page loaded %q", loaded)
			}
			link := browsertest.Eval[string](tab, `document.querySelector('header a[href="regions.html"]').href`)
			page.Do("following the link", chromedp.Navigate(link))
			page.Wait("the regions page's first run", `(() => { const s = document.getElementById('summary'); return s && s.dataset.query; })()`)

			data := browsertest.Eval[map[string]string](tab, `({...document.getElementById('summary').dataset})`)
			if !sameQuery(t, data["query"], regionsDefault) {
				t.Errorf("the summary is of %q", data["query"])
			}
			want := map[string]string{"held": "true", "topBefore": "eu", "largestBefore": "eu", "topAfter": "ap", "smallestAfter": "eu"}
			for k, v := range want {
				if data[k] != v {
					t.Errorf("the summary's %s is %q, want %q (all: %q)", k, data[k], v, data)
				}
			}
			if got := browsertest.Eval[string](tab, "location.search"); !sameQuery(t, strings.TrimPrefix(got, "?"), regionsDefault) {
				t.Errorf("the address is %q", got)
			}
			sameAsSimulate(t, tab, data["query"])
			if v := browsertest.Eval[string](tab, "document.getElementById('verdict').textContent"); !strings.HasPrefix(v, "Yes") {
				t.Errorf("the verdict: %q", v)
			}
			if c := browsertest.Eval[string](tab, "document.getElementById('converged').textContent"); !strings.Contains(c, "From 3m, ap has the most demand; its allotment is the largest") {
				t.Errorf("the convergence: %q", c)
			}
			if c := browsertest.Eval[string](tab, "document.getElementById('command').textContent"); c != "sluice simulate --regions eu,us,ap "+
				"--traffic 'eu: 70/s for 3m; 10/s for 4m; us: 20/s for 7m; ap: 10/s for 3m; 70/s for 4m' --algorithm fixed-window --limit 4800 --period 1m "+
				"--ledger-latency 50ms-150ms --floor 0.05 --safe-share 0.1 --partition us@4m-4m45s --flush-ledger 5m30s" {
				t.Errorf("the page's command line: %q", c)
			}
			if e := browsertest.Eval[string](tab, "document.getElementById('events').textContent"); e != "Marked: us cut off from the ledger 4m–4m45s; the ledger flushed at 5m30s." {
				t.Errorf("the chart's marks: %q", e)
			}
			waitDrawn(page)
			if !size.phone {
				for _, el := range []string{"#summary", "#allotments canvas"} {
					if bottom := browsertest.Eval[float64](tab, `document.querySelector('`+el+`').getBoundingClientRect().bottom`); bottom > float64(size.height) {
						t.Errorf("%s ends %.0f px down, below the first screen (%d px)", el, bottom, size.height)
					}
				}
			}
			if unlabelled := browsertest.Eval[[]string](tab, `[...document.querySelectorAll('input, select, textarea')].filter(e => !e.labels.length).map(e => e.id)`); len(unlabelled) > 0 {
				t.Errorf("inputs without a label: %q", unlabelled)
			}
			if bad := browsertest.Eval[[]string](tab, overflowing); len(bad) > 0 {
				t.Errorf("wider than their container:\n%s", strings.Join(bad, "\n"))
			}
			page.Screenshot("web-regions-" + size.name)

			// A bad pattern: the error at its field, the last good result kept.
			page.Type("traffic", "eu: 70/s for")
			page.Wait("the traffic's error", `!document.getElementById('traffic-error').hidden`)
			if msg := browsertest.Eval[string](tab, "document.getElementById('traffic-error').textContent"); !strings.HasPrefix(msg, "Traffic") {
				t.Errorf("the traffic's error: %q", msg)
			}
			if inv := browsertest.Eval[string](tab, "document.getElementById('traffic').getAttribute('aria-invalid')"); inv != "true" {
				t.Errorf("the traffic's aria-invalid: %q", inv)
			}
			if q := browsertest.Eval[string](tab, "document.getElementById('summary').dataset.query"); q != data["query"] {
				t.Errorf("after an error the summary is of %q", q)
			}
			if s := browsertest.Eval[string](tab, "document.getElementById('status').textContent"); !strings.Contains(s, "last good result") {
				t.Errorf("the status after an error: %q", s)
			}
			waitDrawn(page)
			if size.phone {
				page.Screenshot("web-regions-error-" + size.name)
			}

			// A good change runs again: the pattern back, a larger limit.
			page.Type("traffic", regionsDefault.Get("traffic"))
			page.Type("limit", "5400")
			changed := url.Values{}
			for k, v := range regionsDefault {
				changed[k] = v
			}
			changed.Set("limit", "5400")
			page.Wait("the run of limit 5400", `new URLSearchParams(document.getElementById('summary').dataset.query).get('limit') === '5400'`)
			query := browsertest.Eval[string](tab, "document.getElementById('summary').dataset.query")
			if !sameQuery(t, query, changed) {
				t.Errorf("the summary is of %q", query)
			}
			sameAsSimulate(t, tab, query)
			if inv := browsertest.Eval[bool](tab, "document.getElementById('traffic').hasAttribute('aria-invalid')"); inv {
				t.Error("the traffic is still marked invalid")
			}
		})
	}
}

// sameQuery reports whether query has the values of want.
func sameQuery(t *testing.T, query string, want url.Values) bool {
	t.Helper()
	got, err := url.ParseQuery(query)
	return err == nil && reflect.DeepEqual(got, want)
}

// waitDrawn waits until both charts of the regions page are drawn, with data.
func waitDrawn(page browsertest.Simulation) {
	page.Wait("the charts", `['allotments', 'windows'].every(id => { const el = document.getElementById(id), c = el.querySelector('canvas');
		return Number(el.dataset.drawn) > 1 && c && c.width > 0 && c.height > 0; })`)
}

package web_test

// Browser tests: the page in a real headless Chromium (internal/browsertest), served by
// web.Handler and by a plain static file server from web.Export's folder. They fail when
// Chromium is missing: run scripts/test.sh, which installs it.

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sluicehq/sluice/internal/browsertest"
	"github.com/sluicehq/sluice/sim"
	"github.com/sluicehq/sluice/web"
	"github.com/sluicehq/sluice/web/scenario"
)

// The first preset: 5/s for 10s, 40 in a second, 5/s for 10s; 5 a second, burst 40.
const burstQuery = "traffic=5/s+for+10s%3B+40+in+1s%3B+5/s+for+10s&limit=5&period=1s&burst=40"

// compareSummaries is what `sluice simulate --compare --format json` writes as each run's
// summary, made by the code it makes it with: sim.Compare, and sim.Summary's JSON.
func compareSummaries(t *testing.T, pattern string, limit int64, period time.Duration, burst int64) browsertest.Summaries {
	t.Helper()
	reqs, err := sim.ParseTraffic(pattern)
	if err != nil {
		t.Fatal(err)
	}
	results, err := sim.Compare(limit, period, burst, reqs)
	if err != nil {
		t.Fatal(err)
	}
	return summariesOf(t, results)
}

func summariesOf(t *testing.T, results []sim.Result) browsertest.Summaries {
	t.Helper()
	sums := browsertest.Summaries{}
	for _, r := range results {
		b, err := json.Marshal(r.Summary)
		if err != nil {
			t.Fatal(err)
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(b, &fields); err != nil {
			t.Fatal(err)
		}
		sums[r.Policy.Algorithm.String()] = map[string]string{}
		for k, v := range fields {
			sums[r.Policy.Algorithm.String()][k] = string(v)
		}
	}
	return sums
}

func canonical(t *testing.T, query string) string {
	t.Helper()
	sc, errs := scenario.Parse(query)
	if errs != nil {
		t.Fatal(errs)
	}
	return sc.Encode()
}

// The first preset opens on its whole run and is replayed; a number changed while the clock runs takes effect at once, the
// clock goes on, and at its end the summary is sluice simulate --compare's for the new numbers.
// Screenshots at a laptop's and a phone's width go to artifacts/.
func TestBrowserLiveChange(t *testing.T) {
	srv := httptest.NewServer(web.Handler())
	defer srv.Close()
	page := browsertest.Simulation{Tab: browsertest.NewTab(t, 1366, 900)}
	page.Open(srv.URL + "/?" + burstQuery)
	if got := page.Value("traffic"); got != "5/s for 10s; 40 in 1s; 5/s for 10s" {
		t.Fatalf("the pattern is %q", got)
	}
	// The page opens on the whole run; Replay plays it from 0, at 1×.
	page.WaitComplete(burstQuery)
	if page.Running() {
		t.Fatal("the clock runs by itself")
	}
	page.Click("#play")
	page.WaitBuckets(3)
	if !page.Running() {
		t.Fatal("the clock is not running")
	}

	page.Type("burst", "20")
	final := canonical(t, strings.Replace(burstQuery, "burst=40", "burst=20", 1))
	page.Wait("the page to run the new burst", `document.getElementById('summary').dataset.query === `+browsertest.JSString(final))
	if !page.Running() {
		t.Error("changing a number stopped the clock")
	}
	if k := browsertest.Eval[int](page.Tab, "Number(document.getElementById('time').value)"); k < 3 {
		t.Errorf("changing a number moved the clock back to bucket %d", k)
	}
	if got := browsertest.Eval[string](page.Tab, "location.search"); got != "?"+final {
		t.Errorf("the address is %q, want ?%s", got, final)
	}

	page.Click(`input[name=speed][value="100"]`)
	got := page.WaitComplete(final)
	want := compareSummaries(t, "5/s for 10s; 40 in 1s; 5/s for 10s", 5, time.Second, 20)
	if d := want.Diff(got); d != "" {
		t.Errorf("the page's summary differs from sluice simulate --compare's:\n%s", d)
	}
	if cmds := browsertest.Eval[string](page.Tab, "document.getElementById('commands').textContent"); cmds !=
		"sluice simulate --compare --limit 5 --period 1s --burst 20 --traffic '5/s for 10s; 40 in 1s; 5/s for 10s' --format json" {
		t.Errorf("the page's command line: %q", cmds)
	}
	page.Screenshot("web-simulation-desktop")

	// The keyboard works the clock: Enter on the focused Restart button starts it again (at 1×,
	// so that it is still running when we look).
	page.Click(`input[name=speed][value="1"]`)
	page.Do("restarting from the keyboard", chromedp.Focus(chromedp.ID("restart")), chromedp.KeyEvent("\r"))
	page.Wait("the clock to run again", `document.getElementById('play').textContent === 'Pause'`)
	if focused := browsertest.Eval[string](page.Tab, "document.activeElement.id"); focused != "restart" {
		t.Errorf("the focus moved to %q", focused)
	}

	// A phone: one column, nothing wider than the screen, the charts at its width.
	page.Do("a phone's screen", chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(2), chromedp.EmulateMobile))
	page.Wait("the charts to fit a phone", `[...document.querySelectorAll('.uplot')].every(u => u.offsetWidth <= 390)`)
	if w := browsertest.Eval[int](page.Tab, "document.documentElement.scrollWidth"); w > 390 {
		t.Errorf("at a phone's width the page is %d px wide, wider than the screen", w)
	}
	page.Screenshot("web-simulation-phone")
}

// A link reproduces its scenario: the fields, the address, and the run.
func TestBrowserRestoresTheAddress(t *testing.T) {
	srv := httptest.NewServer(web.Handler())
	defer srv.Close()
	page := browsertest.Simulation{Tab: browsertest.NewTab(t, 1280, 900)}

	query := "traffic=10/s+for+3s%3B+30+at+once%3B+2/s+for+5s&limit=4&period=500ms&burst=7&jitter=40ms&draw=9" +
		"&fixed-window.period=1s&token-bucket.burst=12"
	if canonical(t, query) != query {
		t.Fatalf("the test's query is not canonical: %s", canonical(t, query))
	}
	page.Open(srv.URL + "/?" + query)
	for id, want := range map[string]string{
		"traffic": "10/s for 3s; 30 at once; 2/s for 5s", "limit": "4", "period": "500ms", "burst": "7",
		"jitter": "40ms", "draw": "9", "fixed-window.period": "1s", "token-bucket.burst": "12",
		"fixed-window.limit": "", "leaky-bucket.burst": "", "sliding-log.period": "",
	} {
		if got := page.Value(id); got != want {
			t.Errorf("field %s is %q, want %q", id, got, want)
		}
	}
	if got := browsertest.Eval[string](page.Tab, "location.search"); got != "?"+query {
		t.Errorf("the address became %q", got)
	}
	page.Click("#end")
	got := page.WaitComplete(query)
	sc, _ := scenario.Parse(query)
	res, errs := sc.Run()
	if errs != nil {
		t.Fatal(errs)
	}
	var results []sim.Result
	for _, p := range sc.Policies() {
		r, err := sim.Run(p, res.Requests)
		if err != nil {
			t.Fatal(err)
		}
		results = append(results, r)
	}
	if d := summariesOf(t, results).Diff(got); d != "" {
		t.Errorf("the page's summary differs from sim.Run's of each policy on the jittered requests:\n%s", d)
	}
	if cmds := browsertest.Eval[string](page.Tab, "document.getElementById('commands').textContent"); !strings.Contains(cmds,
		"sluice simulate --algorithm token-bucket --limit 4 --period 500ms --burst 12 --trace trace.csv --format json") {
		t.Errorf("the page's command lines: %q", cmds)
	}

	// With jitter, the page offers the requests as a trace for sluice simulate --trace.
	if trace := browsertest.Eval[string](page.Tab, "sluice.trace()"); string(res.Trace()) != trace {
		t.Errorf("the page's trace differs from the scenario's (%d and %d bytes)", len(trace), len(res.Trace()))
	}
	page.Click("details.terminal summary")
	page.Click("#trace-link")

	// A preset is a link too.
	page.Click(`#presets button[data-preset="minute-boundary"]`)
	minute := scenario.Presets[1].Query
	page.Wait("the preset's address", `location.search === `+browsertest.JSString("?"+minute))
	if p := browsertest.Eval[string](page.Tab, `document.querySelector('#presets [aria-pressed=true]').dataset.preset`); p != "minute-boundary" {
		t.Errorf("the pressed preset is %q", p)
	}
	page.Click("#end")
	got = page.WaitComplete(minute)
	if d := compareSummaries(t, "idle 59s; 100 at once; idle 1s; 100 at once", 100, time.Minute, 100).Diff(got); d != "" {
		t.Errorf("the preset's summary:\n%s", d)
	}

	// An address with a mistake shows it at its field, and nothing breaks.
	page.Open(srv.URL + "/?traffic=5/s+for+2s&limit=0&period=1s&token-bucket.burst=x")
	for _, field := range []string{"limit", "token-bucket.burst"} {
		msg := browsertest.Eval[string](page.Tab, `(() => { const e = document.getElementById(`+browsertest.JSString(field+"-error")+`);
			return e.hidden ? '' : e.textContent; })()`)
		invalid := browsertest.Eval[string](page.Tab, `document.getElementById(`+browsertest.JSString(field)+`).getAttribute('aria-invalid') || ''`)
		if msg == "" || invalid != "true" {
			t.Errorf("field %s: error %q, aria-invalid %q; want it marked", field, msg, invalid)
		}
	}
	page.Type("limit", "5")
	page.Type("token-bucket.burst", "3")
	page.Wait("the fixed address to run", `document.getElementById('summary').dataset.query === `+
		browsertest.JSString(canonical(t, "traffic=5/s+for+2s&limit=5&period=1s&token-bucket.burst=3")))
}

// The exported folder works from plain static file servers: one that knows .wasm, and one that
// serves it as bytes of no particular type.
func TestBrowserExportedFolder(t *testing.T) {
	dir := t.TempDir()
	if err := web.Export(dir); err != nil {
		t.Fatal(err)
	}
	files := http.FileServer(http.Dir(dir))
	for name, h := range map[string]http.Handler{
		"http.FileServer": files,
		"a host that does not know .wasm": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasSuffix(r.URL.Path, ".wasm") {
				w.Header().Set("Content-Type", "application/octet-stream")
			}
			files.ServeHTTP(w, r)
		}),
	} {
		t.Run(name, func(t *testing.T) {
			srv := httptest.NewServer(h)
			defer srv.Close()
			page := browsertest.Simulation{Tab: browsertest.NewTab(t, 1280, 900)}
			page.Open(srv.URL + "/index.html?" + burstQuery)
			page.Click("#end")
			got := page.WaitComplete(burstQuery)
			if d := compareSummaries(t, "5/s for 10s; 40 in 1s; 5/s for 10s", 5, time.Second, 40).Diff(got); d != "" {
				t.Errorf("the exported page's summary differs from sluice simulate --compare's:\n%s", d)
			}
		})
	}
}

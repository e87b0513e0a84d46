package web_test

import (
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sluicehq/sluice/internal/browsertest"
	"github.com/sluicehq/sluice/sim"
	"github.com/sluicehq/sluice/web"
)

// clockMicros reads the virtual clock, in µs.
func clockMicros(page browsertest.Simulation) int64 {
	return browsertest.Eval[int64](page.Tab, "Number(document.getElementById('clock').dataset.us)")
}

// Live mode: started, the clock stepped, the limit changed mid-run, the clock run and paused.
// The summary is then sluice simulate's for the same traffic (12/s up to the pause) with the
// same change (--change t=T,limit=9), number for number, and the page's command line says so.
// The clock is stepped by the page's Step button and read from the page: nothing depends on
// how fast the machine is.
func TestBrowserLiveMode(t *testing.T) {
	srv := httptest.NewServer(web.Handler())
	defer srv.Close()
	page := browsertest.Simulation{Tab: browsertest.NewTab(t, 1366, 900)}
	page.Open(srv.URL + "/?traffic=5/s+for+10s&limit=5&period=1s&burst=10")
	// The wall clock is the test's: live mode's clock stays at 0 until the test moves it.
	page.FakeClock()
	page.Click("#live")
	page.Wait("live mode", `!document.getElementById('live-bar').hidden && document.getElementById('clock').dataset.us === '0' &&
		document.getElementById('play').textContent === 'Pause'`)
	page.Type("live-rate", "12")
	page.Do("entering the rate", chromedp.KeyEvent("\r"))
	page.Wait("the rate taken", `location.search.includes('traffic=12/s')`)
	for range 12 {
		page.Click("#step")
	}
	changed := clockMicros(page)
	if changed <= 0 || changed%1000 != 0 {
		t.Fatalf("after 12 steps the clock is at %d µs", changed)
	}
	page.Type("limit", "9")
	page.Do("entering the limit", chromedp.KeyEvent("\r"))
	page.Wait("the change recorded", `location.search.includes('change=')`)

	page.Click(`input[name=speed][value="10"]`)
	page.Click("#play")
	page.AdvanceClock(400) // 4 s at 10×
	page.Wait("the clock to run on 3s", "Number(document.getElementById('clock').dataset.us) > "+strconv.FormatInt(changed+3e6, 10))
	page.Click("#play")
	page.Wait("the paused run's whole summary", `document.getElementById('play').textContent === 'Play' &&
		document.getElementById('summary').dataset.complete === 'true'`)
	paused := clockMicros(page)
	got := page.Summaries()

	reqs, err := sim.ParseTraffic("12/s for " + sim.FormatDuration(paused))
	if err != nil {
		t.Fatal(err)
	}
	change := sim.Change{TMicros: changed, Limit: 9}
	policies := sim.ComparePolicies(5, time.Second, 10)
	results, err := sim.Options{Changes: []sim.Change{change}}.Compare(policies, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if d := summariesOf(t, results).Diff(got); d != "" {
		t.Errorf("paused at %d µs, the limit changed at %d µs: the page's summary differs from sluice simulate --change's:\n%s", paused, changed, d)
	}
	// The change made a difference: without it, other numbers.
	unchanged, err := sim.Options{}.Compare(policies, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if summariesOf(t, unchanged).Diff(got) == "" {
		t.Error("the page's summary is that of the run without the change")
	}
	// The bars count the same requests: their legend's totals are the summary's.
	legend := browsertest.Eval[[]string](page.Tab, `[...document.querySelectorAll('#card-token-bucket .traffic-chart .u-legend .u-value')].map(v => v.textContent)`)
	if tb := got["token-bucket"]; len(legend) != 3 || legend[1] != tb["refused"] || legend[2] != tb["allowed"] {
		t.Errorf("token-bucket's legend %q; its summary: refused %s, allowed %s", legend, tb["refused"], tb["allowed"])
	}
	want := "sluice simulate --compare --limit 5 --period 1s --burst 10 --change " + change.String() +
		" --traffic '12/s for " + sim.FormatDuration(paused) + "' --format json"
	if cmds := browsertest.Eval[string](page.Tab, "document.getElementById('commands').textContent"); cmds != want {
		t.Errorf("the page's command line:\n %s\nwant\n %s", cmds, want)
	}
	page.Screenshot("web-simulation-live")

	// Then, paused and stepped on: a burst sent, the bucket's burst lowered to 3 and the rate to
	// 4/s at one instant, the clock stepped on. The traffic is three segments now.
	for range 3 {
		page.Click("#step")
	}
	sent := clockMicros(page)
	page.Click("#live-send")
	page.Type("burst", "3")
	page.Do("entering the burst", chromedp.KeyEvent("\r"))
	page.Type("live-rate", "4")
	page.Do("entering the rate", chromedp.KeyEvent("\r"))
	for range 10 {
		page.Click("#step")
	}
	page.Wait("the new rate's traffic", `location.search.includes('%3B+4/s+for')`)
	page.Wait("the stepped run's whole summary", `document.getElementById('summary').dataset.complete === 'true'`)
	end := clockMicros(page)
	got = page.Summaries()
	pattern := "12/s for " + sim.FormatDuration(sent) + "; 20 at once; 4/s for " + sim.FormatDuration(end-sent)
	if reqs, err = sim.ParseTraffic(pattern); err != nil {
		t.Fatal(err)
	}
	changes := []sim.Change{change, {TMicros: sent, Burst: 3, SetBurst: true}}
	if results, err = (sim.Options{Changes: changes}).Compare(policies, reqs); err != nil {
		t.Fatal(err)
	}
	if d := summariesOf(t, results).Diff(got); d != "" {
		t.Errorf("%s with changes %v: the page's summary differs from sim's:\n%s", pattern, changes, d)
	}

	// Leaving live mode keeps the run as a scenario to replay, its change listed.
	page.Click("#live")
	page.Wait("the replay", `document.getElementById('live-bar').hidden && !document.getElementById('changes').hidden`)
	if text := browsertest.Eval[string](page.Tab, "document.getElementById('changes-text').textContent"); !strings.Contains(text, "limit=9") {
		t.Errorf("the changes listed: %q", text)
	}
}

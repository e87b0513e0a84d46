package web_test

// Browser tests of calendar windows and settled costs on the page, in a real headless Chromium.

import (
	"bytes"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
	_ "time/tzdata" // Europe/Berlin where /usr/share/zoneinfo is missing

	"github.com/chromedp/chromedp"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/browsertest"
	"github.com/sluicehq/sluice/sim"
	"github.com/sluicehq/sluice/web"
	"github.com/sluicehq/sluice/web/scenario"
)

// One request an hour for three days from Saturday 2026-03-28 in Berlin, 10 a day: Sunday
// 2026-03-29 has 23 hours.
const calendarQuery = "traffic=72+in+72h&limit=10&calendar=day&time-zone=Europe/Berlin&start=2026-03-28T00:00:00%2B01:00"

// 2 requests a second for 30 s, each charged 1 and settled at 1 to 20; 100 per 10 s.
const settledQuery = "traffic=2/s+for+30s&limit=100&period=10s&burst=100&actual=1-20&draw=1"

// setValue sets an input's or a select's value as a person choosing it does: an input event.
func setValue(page browsertest.Simulation, id, value string) {
	page.Do("setting #"+id, chromedp.Evaluate[chromedp.Void](`(() => { const el = document.getElementById(`+browsertest.JSString(id)+`);
		el.value = `+browsertest.JSString(value)+`; el.dispatchEvent(new Event('input', {bubbles: true})); })()`))
}

func text(page browsertest.Simulation, selector string) string {
	return browsertest.Eval[string](page.Tab, `document.querySelector(`+browsertest.JSString(selector)+`).textContent`)
}

// A calendar scenario across Berlin's 23-hour day: fixed-window and sliding-window run it, the
// three others say they have no calendar, the clock reads in Berlin's time, the windows are
// Berlin's days, and the summary is `sluice simulate --compare --calendar day --time-zone
// Europe/Berlin --start 2026-03-28T00:00:00+01:00`'s.
func TestBrowserCalendarAcrossBerlinsShortDay(t *testing.T) {
	srv := httptest.NewServer(web.Handler())
	defer srv.Close()
	page := browsertest.Simulation{Tab: browsertest.NewTab(t, 1366, 900)}
	page.Open(srv.URL + "/?" + calendarQuery)
	for id, want := range map[string]string{"calendar": "day", "time-zone": "Europe/Berlin", "start": "2026-03-28T00:00:00+01:00", "limit": "10"} {
		if got := page.Value(id); got != want {
			t.Errorf("field %s is %q, want %q", id, got, want)
		}
	}
	for id, want := range map[string]bool{"period": true, "burst": true, "time-zone": false, "fixed-window.limit": false,
		"fixed-window.period": true, "token-bucket.burst": true} {
		if got := browsertest.Eval[bool](page.Tab, `document.getElementById(`+browsertest.JSString(id)+`).disabled`); got != want {
			t.Errorf("field %s disabled %v, want %v", id, got, want)
		}
	}
	for _, alg := range []string{"sliding-log", "token-bucket", "leaky-bucket"} {
		if note := text(page, "#card-"+alg+" .no-calendar"); !strings.Contains(note, alg+" has no calendar") ||
			!browsertest.Eval[bool](page.Tab, `document.getElementById('card-`+alg+`').classList.contains('off')`) {
			t.Errorf("%s's card: %q, want it to say it has no calendar", alg, note)
		}
	}
	if d := text(page, "#card-fixed-window .description"); !strings.Contains(d, "calendar day") || !strings.Contains(d, "Europe/Berlin") {
		t.Errorf("fixed-window's description: %q", d)
	}

	page.Click("#end")
	got := page.WaitComplete(calendarQuery)
	loc, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	reqs, err := sim.ParseTraffic("72 in 72h")
	if err != nil {
		t.Fatal(err)
	}
	results, err := sim.Options{Start: time.Date(2026, 3, 28, 0, 0, 0, 0, loc)}.Compare(sim.CalendarPolicies(10, sluice.Day, loc), reqs)
	if err != nil {
		t.Fatal(err)
	}
	want := summariesOf(t, results)
	if d := want.Diff(got); d != "" {
		t.Errorf("the page's summary differs from sluice simulate --compare --calendar's:\n%s", d)
	}
	// What the command prints: 31 of 72 allowed by the fixed window, 29 by the sliding one.
	if got["fixed-window"]["allowed"] != "31" || got["sliding-window"]["allowed"] != "29" {
		t.Errorf("allowed: fixed-window %s, sliding-window %s; want 31 and 29", got["fixed-window"]["allowed"], got["sliding-window"]["allowed"])
	}
	if cmds := text(page, "#commands"); cmds != "sluice simulate --compare --limit 10 --calendar day --time-zone Europe/Berlin "+
		"--start 2026-03-28T00:00:00+01:00 --traffic '72 in 72h' --format json" {
		t.Errorf("the page's command line: %q", cmds)
	}
	page.Screenshot("web-simulation-calendar")

	// The clock reads in Berlin's time, with the day it is in: at 26 h it is 03:00 on the short day.
	buckets := browsertest.Eval[int](page.Tab, "Number(document.getElementById('time').max)")
	end := 119 * time.Hour // three days and a bit, to the end of the window after the last request's
	k := int(26 * time.Hour * time.Duration(buckets) / end)
	setValue(page, "time", strconv.Itoa(k))
	if local := text(page, "#clock-local"); local != "Sun 2026-03-29 03:00:00 +02:00 · day Sun 2026-03-29, 23h" {
		t.Errorf("at 26h the clock reads %q", local)
	}
	// The windows the plots mark: Berlin's local midnights.
	if labels := browsertest.Eval[string](page.Tab, `JSON.parse(sluice.run(location.search)).windows.map(w => w.label).join('|')`); labels !=
		"Sat 2026-03-28, 24h|Sun 2026-03-29, 23h|Mon 2026-03-30, 24h|Tue 2026-03-31, 24h|Wed 2026-04-01, 24h" {
		t.Errorf("windows: %s", labels)
	}

	// Another calendar, and back to a period: the inputs follow.
	setValue(page, "calendar", "week")
	week := strings.Replace(calendarQuery, "calendar=day", "calendar=week", 1)
	page.Wait("the week's run", `document.getElementById('summary').dataset.query === `+browsertest.JSString(week))
	setValue(page, "calendar", "")
	page.Type("period", "1h")
	page.Wait("a period's run", `document.getElementById('summary').dataset.query.includes('period=1h')`)
	if n := browsertest.Eval[int](page.Tab, "document.querySelectorAll('#summary tbody tr').length"); n != 5 {
		t.Errorf("with a period the summary has %d rows, want 5", n)
	}
	if browsertest.Eval[bool](page.Tab, "document.getElementById('time-zone').disabled") != true ||
		browsertest.Eval[bool](page.Tab, "document.getElementById('card-token-bucket').classList.contains('off')") {
		t.Error("without a calendar, the time zone is still enabled or the token bucket's card still off")
	}
}

// A settled scenario: the summary shows the estimated and the actual totals, each card the
// balance its settlements leave, and the trace the page offers has the real costs, so that
// `sluice simulate --compare --trace trace.csv` reproduces the summary.
func TestBrowserSettledCosts(t *testing.T) {
	srv := httptest.NewServer(web.Handler())
	defer srv.Close()
	page := browsertest.Simulation{Tab: browsertest.NewTab(t, 1366, 900)}
	page.Open(srv.URL + "/?" + settledQuery)
	page.Click("#end")
	got := page.WaitComplete(settledQuery)

	sc, errs := scenario.Parse(settledQuery)
	if errs != nil {
		t.Fatal(errs)
	}
	res, errs := sc.Run()
	if errs != nil {
		t.Fatal(errs)
	}
	tr, err := sim.ReadTrace(bytes.NewReader(res.Trace()))
	if err != nil {
		t.Fatal(err)
	}
	reqs, actual := tr.Requests, tr.Actual
	results, err := sim.Options{Actual: actual}.Compare(sim.ComparePolicies(100, 10*time.Second, 100), reqs)
	if err != nil {
		t.Fatal(err)
	}
	want := summariesOf(t, results)
	if d := want.Diff(got); d != "" {
		t.Errorf("the page's summary differs from sluice simulate --compare --trace's:\n%s", d)
	}
	for alg, fields := range got {
		if fields["settled"] != fields["allowed"] || fields["settled_cost"] != fields["allowed"] || fields["actual_cost"] == "" || fields["actual_cost"] == fields["settled_cost"] {
			t.Errorf("%s: settled %s, estimated %s, actual %s of %s allowed", alg, fields["settled"], fields["settled_cost"], fields["actual_cost"], fields["allowed"])
		}
	}
	if shown := browsertest.Eval[bool](page.Tab, `[...document.querySelectorAll('#summary th.settled-col')].every(th => getComputedStyle(th).display !== 'none')`); !shown {
		t.Error("the settled columns are hidden")
	}
	if caption := text(page, "#summary-caption"); !strings.Contains(caption, "settled at its real cost, 1-20") {
		t.Errorf("caption %q", caption)
	}
	if b := text(page, "#card-token-bucket .balance"); !strings.HasPrefix(b, "Balance after settlement at ") {
		t.Errorf("the token bucket's balance: %q", b)
	}
	if trace := browsertest.Eval[string](page.Tab, "sluice.trace()"); trace != string(res.Trace()) || !strings.HasPrefix(trace, "t_ms,key,cost,actual\n") {
		t.Errorf("the page's trace: %.80q", trace)
	}
	if cmds := text(page, "#commands"); cmds != "sluice simulate --compare --limit 100 --period 10s --burst 100 --trace trace.csv --format json" {
		t.Errorf("the page's command line: %q", cmds)
	}
	if hidden := browsertest.Eval[bool](page.Tab, "document.getElementById('trace-note').hidden"); hidden {
		t.Error("the trace's link is hidden")
	}
	page.Screenshot("web-simulation-settled")

	// A fixed real cost needs no draw; a mistake is marked at its field.
	page.Type("actual", "5")
	fixed := strings.Replace(settledQuery, "actual=1-20&draw=1", "actual=5", 1)
	page.WaitComplete(fixed)
	page.Type("actual", "20-1")
	page.Wait("the mistake marked", `document.getElementById('actual').getAttribute('aria-invalid') === 'true'`)
	if msg := text(page, "#actual-error"); !strings.Contains(msg, "20-1 is an empty range") {
		t.Errorf("the error shown: %q", msg)
	}

	// Real costs under a calendar: the two window algorithms settle on local days.
	page.Type("actual", "1-20")
	setValue(page, "calendar", "day")
	daily := canonical(t, "traffic=2/s+for+30s&limit=100&calendar=day&actual=1-20&draw=1")
	page.Wait("the daily run", `document.getElementById('summary').dataset.query === `+browsertest.JSString(daily))
	page.Click("#end")
	got = page.WaitComplete(daily)
	if len(got) != 2 || got["sliding-window"]["settled"] == "" || got["fixed-window"]["actual_cost"] == "" {
		t.Errorf("a calendar's settled summary: %v", got)
	}
}

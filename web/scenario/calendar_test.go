package scenario

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
	_ "time/tzdata" // the zones, where /usr/share/zoneinfo is missing (as in the browser)

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/browsertest"
	"github.com/sluicehq/sluice/sim"
)

// Three days from Saturday 2026-03-28 in Berlin, one request an hour, 10 a day: Sunday is a
// 23-hour day (the clocks go from 02:00 to 03:00).
const calendarQuery = "traffic=72+in+72h&limit=10&calendar=day&time-zone=Europe/Berlin&start=2026-03-28T00:00:00%2B01:00"

// Tokens: 2 requests a second for 30 s, each charged 1 and settled at 1 to 20; 100 per 10 s.
const settledQuery = "traffic=2/s+for+30s&limit=100&period=10s&burst=100&actual=1-20&draw=1"

func berlin(t *testing.T) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

func TestParseCalendar(t *testing.T) {
	sc := mustParse(t, "traffic=72+in+72h&limit=10&calendar=day&time-zone=Europe/Berlin&start=2026-03-28T00:00:00%2B01:00&fixed-window.limit=12")
	if sc.Calendar != sluice.Day || sc.Location.String() != "Europe/Berlin" || sc.Period != 0 || sc.Burst != 0 ||
		!sc.Start.Equal(time.Date(2026, 3, 27, 23, 0, 0, 0, time.UTC)) || sc.Own[0].Limit != 12 {
		t.Fatalf("Parse: %+v", sc)
	}
	ps := sc.Policies()
	loc := berlin(t)
	want := []sluice.Policy{
		{Algorithm: sluice.FixedWindow, Limit: 12, Calendar: sluice.Day, Location: loc},
		{Algorithm: sluice.SlidingWindow, Limit: 10, Calendar: sluice.Day, Location: loc},
	}
	if len(ps) != 2 {
		t.Fatalf("policies %+v, want fixed-window and sliding-window", ps)
	}
	for i := range ps {
		if ps[i].Algorithm != want[i].Algorithm || ps[i].Limit != want[i].Limit || ps[i].Calendar != sluice.Day || ps[i].Location.String() != "Europe/Berlin" {
			t.Errorf("policy %d: %+v, want %+v", i, ps[i], want[i])
		}
	}
	if got := sc.Encode(); got != calendarQuery+"&fixed-window.limit=12" {
		t.Errorf("Encode: %s", got)
	}

	// A calendar without a start starts at local midnight of 2026-03-28, in its zone; UTC is the
	// default zone, and "none" no calendar.
	for _, tc := range []struct{ query, encoded string }{
		{"traffic=1+at+once&limit=5&calendar=week&time-zone=America/New_York",
			"traffic=1+at+once&limit=5&calendar=week&time-zone=America/New_York&start=2026-03-28T00:00:00-04:00"},
		{"traffic=1+at+once&limit=5&calendar=month&time-zone=UTC", "traffic=1+at+once&limit=5&calendar=month&start=2026-03-28T00:00:00Z"},
		{"traffic=1+at+once&limit=5&calendar=none&period=1s&burst=0&time-zone=", "traffic=1+at+once&limit=5&period=1s&burst=0"},
		{"traffic=1+at+once&limit=5&calendar=year&burst=0", "traffic=1+at+once&limit=5&calendar=year&start=2026-03-28T00:00:00Z"},
		// A start without a calendar moves the clock's 0 (a period's windows stay on Unix time's).
		{"traffic=1+at+once&limit=5&period=7s&start=2026-03-28T12:00:00.5%2B05:30", "traffic=1+at+once&limit=5&period=7s&burst=0&start=2026-03-28T12:00:00.5%2B05:30"},
		{"traffic=1+at+once&limit=5&period=1s&actual=7", "traffic=1+at+once&limit=5&period=1s&burst=0&actual=7"},
		{"traffic=1+at+once&limit=5&period=1s&actual=+3+-+30+&draw=9", "traffic=1+at+once&limit=5&period=1s&burst=0&actual=3-30&draw=9"},
		{"traffic=1+at+once&limit=5&period=1s&actual=4-4&draw=9", "traffic=1+at+once&limit=5&period=1s&burst=0&actual=4"},
	} {
		sc := mustParse(t, tc.query)
		if got := sc.Encode(); got != tc.encoded {
			t.Errorf("Parse(%q).Encode():\n got %s\nwant %s", tc.query, got, tc.encoded)
		}
	}
}

// Every calendar and settled scenario's address reads back as the same scenario.
func TestEncodeRoundTripCalendarAndActual(t *testing.T) {
	for _, q := range []string{calendarQuery, settledQuery,
		"traffic=1+at+once&limit=5&calendar=week&time-zone=Australia/Lord_Howe&sliding-window.limit=2&draw=3&jitter=1s",
		"traffic=1+at+once&limit=5&period=1s&actual=0-9007199254740992&draw=3",
		"traffic=1+at+once&limit=5&calendar=month&time-zone=Asia/Tokyo&actual=0-9007199254740992&draw=3",
		"traffic=1+at+once&limit=5&calendar=year",
		"traffic=1+at+once&limit=5&period=1s&start=1969-12-31T23:59:59.999999Z&actual=0",
	} {
		sc := mustParse(t, q)
		again := mustParse(t, sc.Encode())
		if !reflect.DeepEqual(sc, again) {
			t.Errorf("%q: Parse(Encode()) = %+v, want %+v", q, again, sc)
		}
		if again.Encode() != sc.Encode() {
			t.Errorf("%q: Encode is not canonical: %q then %q", q, sc.Encode(), again.Encode())
		}
	}
}

func TestParseCalendarErrors(t *testing.T) {
	const base = "traffic=1+at+once&limit=5"
	for _, tc := range []struct {
		query string
		want  []string // "field: message part"
	}{
		{base + "&calendar=fortnight", []string{`calendar: "fortnight": want none, day, week, month or year`}},
		{base + "&calendar=day&time-zone=Mars/Olympus", []string{`time-zone: "Mars/Olympus" is not a known IANA time zone`}},
		{base + "&calendar=day&time-zone=Local", []string{`time-zone: "Local" is not a known IANA time zone`}},
		{base + "&period=1s&time-zone=Europe/Berlin", []string{"time-zone: needs a calendar"}},
		{base + "&calendar=day&period=1s", []string{"period: and a calendar exclude each other"}},
		{base + "&calendar=day&burst=3", []string{"burst: 3: with a calendar, fixed-window and sliding-window run, which take no burst"}},
		{base + "&calendar=day&token-bucket.burst=3&leaky-bucket.limit=2", []string{
			"token-bucket.burst: token-bucket has no calendar", "leaky-bucket.limit: leaky-bucket has no calendar"}},
		{base + "&calendar=day&fixed-window.period=1h", []string{"fixed-window.period: and a calendar exclude each other"}},
		{base + "&calendar=day&start=tomorrow", []string{`start: "tomorrow" is not an RFC 3339 time`}},
		{base + "&calendar=day&start=2026-03-28", []string{`start: "2026-03-28" is not an RFC 3339 time`}},
		{base + "&calendar=day&start=2026-03-28T00:00:00.0000001Z", []string{"start: 2026-03-28T00:00:00.0000001Z must be a whole number of microseconds"}},
		{base + "&period=1s&actual=x", []string{`actual: "x" is not a whole number (want a real cost such as 7, or a range such as 1-20)`}},
		{base + "&period=1s&actual=-1", []string{`actual: "-1" is not a real cost`}},
		{base + "&period=1s&actual=3-", []string{`actual: "3-" is not a real cost`}},
		{base + "&period=1s&actual=5-2", []string{"actual: 5-2 is an empty range"}},
		{base + "&period=1s&actual=1-y", []string{`actual: "y" is not a whole number (want a range such as 1-20)`}},
		{base + "&period=1s&actual=9007199254740993", []string{"actual: 9007199254740993 must be ≤ 2^53"}},
		// A misspelt calendar is still one: no "period is required" beside it.
		{base + "&calendar=dya&time-zone=Europe/Berlin", []string{`calendar: "dya"`}},
	} {
		sc, errs := Parse(tc.query)
		var got []string
		for _, e := range errs {
			got = append(got, e.Field+": "+e.Message)
		}
		if len(got) != len(tc.want) {
			t.Errorf("Parse(%q): errors %q, want %d like %q", tc.query, got, len(tc.want), tc.want)
			continue
		}
		for i := range got {
			if !strings.HasPrefix(got[i], tc.want[i]) {
				t.Errorf("Parse(%q): error %q, want one starting %q", tc.query, got[i], tc.want[i])
			}
		}
		_ = sc
	}
}

// A real cost that no clock could pay off is an error at its field, not a broken run.
func TestRunErrorsActual(t *testing.T) {
	sc := mustParse(t, "traffic=1+at+once&limit=1&period=1000h&actual=9007199254740992")
	_, errs := sc.Run()
	if len(errs) != 1 || errs[0].Field != KeyActual || !strings.HasPrefix(errs[0].Message, "is too large for token-bucket: ") {
		t.Errorf("Run: %v, want one error for actual", errs)
	}
}

// A calendar scenario's summaries are those of `sluice simulate --compare --calendar day
// --time-zone Europe/Berlin --start ...` (sim.Options.Compare of sim.CalendarPolicies, and the
// command's own numbers), its buckets add up to them, and its windows are Berlin's days.
func TestCalendarRunMatchesCompare(t *testing.T) {
	sc := mustParse(t, calendarQuery)
	res := mustRun(t, sc)
	reqs, _ := sim.ParseTraffic(sc.Traffic)
	want, err := sim.Options{Start: sc.Start}.Compare(sim.CalendarPolicies(10, sluice.Day, berlin(t)), reqs)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Runs) != 2 || res.Runs[0].Policy.Algorithm != sluice.FixedWindow || res.Runs[1].Policy.Algorithm != sluice.SlidingWindow {
		t.Fatalf("runs %d, want fixed-window and sliding-window", len(res.Runs))
	}
	// What `sluice simulate --compare --limit 10 --calendar day --time-zone Europe/Berlin
	// --start 2026-03-28T00:00:00+01:00 --traffic '72 in 72h'` prints.
	for i, allowed := range []int64{31, 29} {
		run := res.Runs[i]
		if run.Summary != want[i].Summary || run.Summary.Allowed != allowed || run.Summary.Offered != 72 {
			t.Errorf("%v: summary %+v, want %+v (allowed %d)", run.Policy.Algorithm, run.Summary, want[i].Summary, allowed)
		}
		if got := run.Cumulative[res.Buckets-1]; got != run.Summary {
			t.Errorf("%v: the last cumulative summary %+v", run.Policy.Algorithm, got)
		}
		var allowedSum int64
		for _, a := range run.Allowed {
			allowedSum += a
		}
		if allowedSum != run.Summary.Allowed {
			t.Errorf("%v: buckets allow %d", run.Policy.Algorithm, allowedSum)
		}
		for b, l := range run.Level {
			if l < 0 || l > run.Capacity {
				t.Errorf("%v: level %d at boundary %d is outside 0..%d", run.Policy.Algorithm, l, b, run.Capacity)
			}
		}
	}
	// Fixed window: a new day, a new count, at local midnight: 10 of Saturday's first 10 hours,
	// then nothing until Sunday 00:00 (24h), when the count starts again.
	fw := res.Runs[0]
	at := func(h int64) int { return int(h * 3600e6 / res.WidthMicros) }
	if fw.Level[at(23)] != 10 || fw.Level[at(24)] != 1 {
		t.Errorf("fixed-window's count at 23h and 24h: %d and %d, want 10 and 1", fw.Level[at(23)], fw.Level[at(24)])
	}

	hour := int64(3600e6)
	wantWindows := []Window{
		{0, 24 * hour, "Sat 2026-03-28, 24h", "Sat 28"},
		{24 * hour, 47 * hour, "Sun 2026-03-29, 23h", "Sun 29"},
		{47 * hour, 71 * hour, "Mon 2026-03-30, 24h", "Mon 30"},
		{71 * hour, 95 * hour, "Tue 2026-03-31, 24h", "Tue 31"},
		{95 * hour, 119 * hour, "Wed 2026-04-01, 24h", "Wed 1"}, // the sliding window is back to full quota at its end
	}
	if !reflect.DeepEqual(res.Windows, wantWindows) || res.EndMicros() != 119*hour {
		t.Errorf("windows %+v up to %d µs, want %+v", res.Windows, res.EndMicros(), wantWindows)
	}
	if got := sc.Instant(26 * hour); got != "Sun 2026-03-29 03:00:00 +02:00" {
		t.Errorf("Instant(26h) = %q", got)
	}

	var doc struct {
		Start    string `json:"start"`
		Calendar string `json:"calendar"`
		TimeZone string `json:"time_zone"`
		Windows  []struct {
			StartUs int64  `json:"start_us"`
			Label   string `json:"label"`
		} `json:"windows"`
		Runs []struct {
			Policy      json.RawMessage `json:"policy"`
			Description string          `json:"description"`
		} `json:"runs"`
	}
	if err := json.Unmarshal(res.JSON(), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Start != "2026-03-28T00:00:00+01:00" || doc.Calendar != "day" || doc.TimeZone != "Europe/Berlin" ||
		len(doc.Windows) != len(res.Windows) || doc.Windows[1].Label != "Sun 2026-03-29, 23h" || len(doc.Runs) != 2 {
		t.Errorf("JSON: %+v", doc)
	}
	if got := string(doc.Runs[1].Policy); got != `{"algorithm":"sliding-window","limit":10,"calendar":"day","time_zone":"Europe/Berlin","burst":0}` {
		t.Errorf("policy %s", got)
	}
	if !strings.Contains(doc.Runs[0].Description, "23 or 25 hours") {
		t.Errorf("description %q", doc.Runs[0].Description)
	}

	// A day calendar over years: too many windows to mark.
	long := mustRun(t, mustParse(t, "traffic=2+in+20000h&limit=10&calendar=day"))
	if long.Windows != nil {
		t.Errorf("%d windows over 20000 hours, want none listed", len(long.Windows))
	}
	// Without a time zone, the calendar's is UTC, and the JSON and the cards say so.
	if js := string(long.JSON()); !strings.Contains(js, `,"calendar":"day","time_zone":"UTC",`) ||
		!strings.Contains(js, `"calendar":"day","time_zone":"UTC","burst":0}`) || !strings.Contains(Describe(long.Runs[0].Policy), " in UTC.") {
		t.Errorf("a calendar in UTC: %.300s; %q", js, Describe(long.Runs[0].Policy))
	}
}

// A settled scenario: every request charged 1 and settled at its real cost, drawn from the scenario's random stream;
// the summaries are those of `sluice simulate --compare --trace trace.csv` on the page's trace.
func TestSettledRunMatchesCompare(t *testing.T) {
	sc := mustParse(t, settledQuery)
	res := mustRun(t, sc)
	if len(res.Actual) != 60 || !slices.Equal(res.Actual, sc.Actuals(60)) {
		t.Fatalf("%d real costs", len(res.Actual))
	}
	// Golden: the same draw must give the same costs in every Go version (links stay valid).
	if got := res.Actual[:5]; !slices.Equal(got, []int64{8, 13, 10, 19, 17}) {
		t.Errorf("draw 1's first real costs are %v: the generator changed, and old links with it", got)
	}
	for _, a := range res.Actual {
		if a < 1 || a > 20 {
			t.Errorf("real cost %d outside 1-20", a)
		}
	}
	other := sc
	other.Draw = 2
	if slices.Equal(other.Actuals(60), res.Actual) {
		t.Error("Draw 1 and Draw 2 gave the same real costs")
	}
	// The real costs do not move a jittered scenario's requests (their own stream).
	jit := mustParse(t, "traffic=10/s+for+2s&limit=5&period=1s&jitter=300ms&draw=42&actual=1-20")
	jr, _ := jit.Requests()
	if got := []int64{jr[0].TMicros, jr[1].TMicros, jr[19].TMicros}; !slices.Equal(got, []int64{85818, 201120, 2059711}) {
		t.Errorf("with real costs, draw 42's first times are %v", got)
	}

	// The trace the page offers reads back as the requests and their real costs.
	tr, err := sim.ReadTrace(bytes.NewReader(res.Trace()))
	reqs, actual := tr.Requests, tr.Actual
	if err != nil || !reflect.DeepEqual(reqs, res.Requests) || !slices.Equal(actual, res.Actual) {
		t.Fatalf("the trace reads back as %d requests, %d costs (%v)", len(reqs), len(actual), err)
	}
	if !strings.HasPrefix(string(res.Trace()), "t_ms,key,cost,actual\n0,k,1,8\n500,k,1,13\n") {
		t.Errorf("trace: %.60q", res.Trace())
	}
	want, err := sim.Options{Actual: actual}.Compare(sim.ComparePolicies(100, 10*time.Second, 100), reqs)
	if err != nil {
		t.Fatal(err)
	}
	var sumActual int64
	for _, a := range res.Actual {
		sumActual += a
	}
	for i, run := range res.Runs {
		s := run.Summary
		if s != want[i].Summary {
			t.Errorf("%v: summary %+v, want %+v", run.Policy.Algorithm, s, want[i].Summary)
		}
		if s.Settled != s.Allowed || s.SettledCost != s.Allowed || s.ActualCost == 0 || s.ActualCost > sumActual {
			t.Errorf("%v: settled %d (estimated %d, actual %d) of %d allowed", run.Policy.Algorithm, s.Settled, s.SettledCost, s.ActualCost, s.Allowed)
		}
	}
	// Settling at the real costs lets fewer through than charging 1 each would.
	plain := mustRun(t, mustParse(t, strings.Replace(settledQuery, "&actual=1-20&draw=1", "", 1)))
	if plain.Runs[0].Summary.Allowed != 60 || res.Runs[0].Summary.Allowed >= 60 {
		t.Errorf("fixed-window allows %d settled, %d unsettled", res.Runs[0].Summary.Allowed, plain.Runs[0].Summary.Allowed)
	}
	var doc struct {
		Actual string `json:"actual"`
		Runs   []struct {
			Summary map[string]json.RawMessage `json:"summary"`
		} `json:"runs"`
	}
	if err := json.Unmarshal(res.JSON(), &doc); err != nil || doc.Actual != "1-20" || doc.Runs[0].Summary["actual_cost"] == nil {
		t.Errorf("JSON: %+v (%v)", doc, err)
	}
}

func TestCommandsCalendarAndActual(t *testing.T) {
	for _, tc := range []struct {
		query string
		want  []string
	}{
		{calendarQuery, []string{"sluice simulate --compare --limit 10 --calendar day --time-zone Europe/Berlin --start 2026-03-28T00:00:00+01:00 --traffic '72 in 72h'"}},
		{"traffic=1+at+once&limit=10&calendar=month&sliding-window.limit=3", []string{
			"sluice simulate --algorithm fixed-window --limit 10 --calendar month --start 2026-03-28T00:00:00Z --traffic '1 at once'",
			"sluice simulate --algorithm sliding-window --limit 3 --calendar month --start 2026-03-28T00:00:00Z --traffic '1 at once'",
		}},
		{settledQuery, []string{"sluice simulate --compare --limit 100 --period 10s --burst 100 --trace trace.csv"}},
		{"traffic=1+at+once&limit=5&period=7s&start=2026-03-28T12:00:00%2B05:30&token-bucket.limit=2", []string{
			"sluice simulate --algorithm fixed-window --limit 5 --period 7s --start 2026-03-28T12:00:00+05:30 --traffic '1 at once'",
			"sluice simulate --algorithm sliding-log --limit 5 --period 7s --start 2026-03-28T12:00:00+05:30 --traffic '1 at once'",
			"sluice simulate --algorithm sliding-window --limit 5 --period 7s --start 2026-03-28T12:00:00+05:30 --traffic '1 at once'",
			"sluice simulate --algorithm token-bucket --limit 2 --period 7s --burst 0 --start 2026-03-28T12:00:00+05:30 --traffic '1 at once'",
			"sluice simulate --algorithm leaky-bucket --limit 5 --period 7s --burst 0 --start 2026-03-28T12:00:00+05:30 --traffic '1 at once'",
		}},
	} {
		sc := mustParse(t, tc.query)
		if got := sc.Commands(); !slices.Equal(got, tc.want) {
			t.Errorf("Commands(%q):\n got %q\nwant %q", tc.query, got, tc.want)
		}
	}
}

// The page's command lines, run with the real sluice binary (and the page's trace.csv), print
// the page's summaries, number for number: a calendar scenario across Berlin's 23-hour day, a
// settled one, and both with per-algorithm limits and jitter.
func TestCommandsReproduceTheCLI(t *testing.T) {
	bin := browsertest.SluiceBinary(t)
	defer os.RemoveAll(filepath.Dir(bin))
	for _, q := range []string{calendarQuery, settledQuery,
		"traffic=5/s+for+30s&limit=40&calendar=week&time-zone=Europe/Berlin&start=2026-12-31T23:59:50%2B01:00&sliding-window.limit=60&draw=5&jitter=100ms",
		"traffic=5/s+for+30s&limit=40&period=7s&burst=50&start=2026-12-31T23:59:50%2B01:00&token-bucket.limit=60&actual=0-3&draw=5&jitter=100ms",
		// Model tokens by the day across Berlin's short one: settled on calendar windows.
		"traffic=1+in+26h%3B+20+in+1h%3B+5+in+20h&limit=100&calendar=day&time-zone=Europe/Berlin&start=2026-03-28T00:00:00%2B01:00&actual=0-12&draw=3",
		// A live run: the rate changed at 7.3s, the limit at 4s, the burst at 11.25s.
		"traffic=10/s+for+7.3s%3B+25/s+for+8s&limit=5&period=1s&burst=10&change=t%3D4s%2Climit%3D8&change=t%3D11.25s%2Cburst%3D2&sliding-log.limit=3",
	} {
		res := mustRun(t, mustParse(t, q))
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "trace.csv"), res.Trace(), 0o644); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, line := range res.Scenario.Commands() {
			words := browsertest.ShellWords(line + " --format json")
			if words[0] != "sluice" {
				t.Fatalf("command %q", line)
			}
			cmd := exec.Command(bin, words[1:]...)
			cmd.Dir = dir
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			var doc struct {
				Runs []struct {
					Summary json.RawMessage `json:"summary"`
				} `json:"runs"`
				Summary json.RawMessage `json:"summary"`
			}
			if err := json.Unmarshal(out, &doc); err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			if doc.Summary != nil {
				got = append(got, string(doc.Summary))
			}
			for _, r := range doc.Runs {
				got = append(got, string(r.Summary))
			}
		}
		var raw []json.RawMessage
		if err := json.Unmarshal(res.SummariesJSON(res.Buckets), &raw); err != nil {
			t.Fatal(err)
		}
		var page []string
		for _, r := range raw {
			page = append(page, string(r))
		}
		if !slices.Equal(got, page) {
			t.Errorf("%s:\n the commands print %s\n the page shows    %s", q, got, page)
		}
	}
}

// TestMain removes the sluice binary that browsertest.SluiceBinary built, if any, once the tests are done.
func TestMain(m *testing.M) {
	code := m.Run()
	browsertest.RemoveSluiceBinary()
	os.Exit(code)
}

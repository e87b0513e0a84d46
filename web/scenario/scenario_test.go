package scenario

import (
	"bytes"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/sim"
)

const burstQuery = "traffic=5/s+for+10s%3B+40+in+1s%3B+5/s+for+10s&limit=5&period=1s&burst=40"

func mustParse(t *testing.T, query string) Scenario {
	t.Helper()
	sc, errs := Parse(query)
	if errs != nil {
		t.Fatalf("Parse(%q): %v", query, errs)
	}
	return sc
}

func mustRun(t *testing.T, sc Scenario) *Result {
	t.Helper()
	res, errs := sc.Run()
	if errs != nil {
		t.Fatalf("Run(%q): %v", sc.Encode(), errs)
	}
	return res
}

func TestParse(t *testing.T) {
	sc := mustParse(t, "?traffic=+5/s+for+10s;40  in 1s%3B&limit=5&period=1000ms&burst=40&jitter=20ms&draw=7"+
		"&token-bucket.burst=0&leaky-bucket.limit=10&fixed-window.period=2s&utm_source=x")
	want := Scenario{Traffic: "5/s for 10s; 40 in 1s", Jitter: 20 * time.Millisecond, Draw: 7,
		Limit: 5, Period: time.Second, Burst: 40}
	want.Own[0] = Override{Period: 2 * time.Second}
	want.Own[3] = Override{OwnBurst: true}
	want.Own[4] = Override{Limit: 10}
	if !reflect.DeepEqual(sc, want) {
		t.Errorf("Parse:\n got %+v\nwant %+v", sc, want)
	}
	if got := sc.Encode(); got != "traffic=5/s+for+10s%3B+40+in+1s&limit=5&period=1s&burst=40&jitter=20ms&draw=7"+
		"&fixed-window.period=2s&token-bucket.burst=0&leaky-bucket.limit=10" {
		t.Errorf("Encode: %s", got)
	}
	ps := sc.Policies()
	for i, want := range []sluice.Policy{
		{Algorithm: sluice.FixedWindow, Limit: 5, Period: 2 * time.Second},
		{Algorithm: sluice.SlidingLog, Limit: 5, Period: time.Second},
		{Algorithm: sluice.SlidingWindow, Limit: 5, Period: time.Second},
		{Algorithm: sluice.TokenBucket, Limit: 5, Period: time.Second, Burst: 0},
		{Algorithm: sluice.LeakyBucket, Limit: 10, Period: time.Second, Burst: 40},
	} {
		if ps[i] != want {
			t.Errorf("policy %d: %+v, want %+v", i, ps[i], want)
		}
	}
	if sc.IsCompare() {
		t.Error("IsCompare with overrides")
	}
}

// Every scenario's address reads back as the same scenario.
func TestEncodeRoundTrip(t *testing.T) {
	queries := []string{burstQuery, "traffic=1+at+once&limit=1&period=1ms&burst=0&jitter=1us&draw=18446744073709551615" +
		"&sliding-log.limit=3&sliding-window.period=1h&leaky-bucket.burst=1000&token-bucket.limit=2"}
	for _, p := range Presets {
		queries = append(queries, p.Query)
	}
	for _, q := range queries {
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

func TestPresets(t *testing.T) {
	names := map[string]bool{}
	for _, p := range Presets {
		if names[p.Name] || p.Name == "" || p.Title == "" || p.Description == "" {
			t.Errorf("preset %+v: empty or repeated name, or no title or description", p)
		}
		names[p.Name] = true
		sc := mustParse(t, p.Query)
		if sc.Encode() != p.Query {
			t.Errorf("preset %s: query %q is not canonical (%q)", p.Name, p.Query, sc.Encode())
		}
		mustRun(t, sc)
	}
	// A bare address, or one with only foreign keys, shows the first preset.
	for _, q := range []string{"", "?", "utm_source=x"} {
		if sc := mustParse(t, q); sc.Encode() != Presets[0].Query {
			t.Errorf("Parse(%q) = %q, want the first preset", q, sc.Encode())
		}
	}
	if Presets[0].Query != burstQuery {
		t.Errorf("the first preset is %q, want 5/s, then 40 in a second", Presets[0].Query)
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		query string
		want  []string // "field: message part"
	}{
		{"limit=5", []string{"traffic: is required", "period: is required"}},
		{"traffic=1+at+once&limit=0&period=1s", []string{"limit: 0 must be ≥ 1"}},
		{"traffic=1+at+once&limit=abc&period=1s", []string{`limit: "abc" is not a whole number`}},
		{"traffic=1+at+once&limit=99999999999999999999&period=1s", []string{"limit: 99999999999999999999 must be ≤ 2^53"}},
		{"traffic=1+at+once&limit=5&period=5", []string{`period: "5" is not a duration`}},
		{"traffic=1+at+once&limit=5&period=500us", []string{"period: 500us must be ≥ 1ms"}},
		{"traffic=1+at+once&limit=5&period=1000001ns", []string{"period: 1000001ns must be a whole number of microseconds"}},
		{"traffic=1+at+once&limit=5&period=1s&burst=-1", []string{"burst: -1 must be ≥ 0"}},
		{"traffic=1+at+once&limit=5&period=1s&jitter=-1s", []string{"jitter: -1s must be ≥ 0"}},
		{"traffic=1+at+once&limit=5&period=1s&draw=x", []string{`draw: "x" is not a whole number`}},
		{"traffic=1+at+once&limit=5&period=1s&fixed-window.burst=3", []string{"fixed-window.burst: fixed-window takes no burst"}},
		{"traffic=1+at+once&limit=5&period=1s&token-bucket.limit=0&sliding-log.period=0s", []string{
			"sliding-log.period: 0s must be ≥ 1ms", "token-bucket.limit: 0 must be ≥ 1"}},
		{"traffic=1+at+once&limit=1&period=1000h&burst=9007199254740992", []string{"burst: policy \"token-bucket\": burst 9007199254740992", "burst: policy \"leaky-bucket\""}},
		{"traffic=1+at+once&limit=1&period=1000h&leaky-bucket.burst=9007199254740992", []string{"leaky-bucket.burst: policy \"leaky-bucket\""}},
		{"traffic=%zz", []string{": the address's query string is malformed"}},
	} {
		_, errs := Parse(tc.query)
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
	}
}

func TestRunErrors(t *testing.T) {
	for _, tc := range []struct{ query, field, want string }{
		{"traffic=5/s+for+10s%3B+40+in&limit=5&period=1s", "traffic", `traffic segment 2 "40 in": want "R/s for D"`},
		{"traffic=idle+5s&limit=5&period=1s", "traffic", `"idle 5s" makes no requests`},
		{"traffic=200001+at+once&limit=5&period=1s", "traffic", "makes 200001 requests; the page takes at most 200000 (use sluice simulate"},
	} {
		sc := mustParse(t, tc.query)
		_, errs := sc.Run()
		if len(errs) != 1 || errs[0].Field != tc.field || !strings.Contains(errs[0].Message, tc.want) {
			t.Errorf("Run(%q): errors %v, want one for %s containing %q", tc.query, errs, tc.field, tc.want)
		}
	}
}

// The page's summaries are those of `sluice simulate --compare` (sim.Compare), and its buckets add
// up to them; the state it plots is the limiter's.
func TestRunMatchesCompare(t *testing.T) {
	for _, q := range append([]string{burstQuery}, Presets[1].Query, Presets[2].Query) {
		sc := mustParse(t, q)
		res := mustRun(t, sc)
		reqs, _ := sim.ParseTraffic(sc.Traffic)
		want, err := sim.Compare(sc.Limit, sc.Period, sc.Burst, reqs)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Runs) != len(want) {
			t.Fatalf("%d runs, want %d", len(res.Runs), len(want))
		}
		if res.Buckets > MaxBuckets || res.EndMicros() <= reqs[len(reqs)-1].TMicros {
			t.Errorf("%s: %d buckets of %d µs end before the last request or are too many", q, res.Buckets, res.WidthMicros)
		}
		for i, run := range res.Runs {
			w := want[i]
			named := w.Policy
			named.Name = run.Policy.Name
			if run.Policy != named {
				t.Errorf("run %d: policy %+v, want %+v", i, run.Policy, w.Policy)
			}
			if run.Summary != w.Summary {
				t.Errorf("%s %v: summary %+v, want %+v", q, w.Policy.Algorithm, run.Summary, w.Summary)
			}
			if got := run.Cumulative[res.Buckets-1]; got != w.Summary {
				t.Errorf("%v: the last cumulative summary %+v, want %+v", w.Policy.Algorithm, got, w.Summary)
			}
			var offered, allowed, refused, delayed, maxDelay int64
			for b := range res.Buckets {
				offered += run.Offered[b]
				allowed += run.Allowed[b]
				refused += run.Refused[b]
				delayed += run.Delayed[b]
				maxDelay = max(maxDelay, run.MaxDelayMicros[b])
				if run.Offered[b] != run.Allowed[b]+run.Refused[b] {
					t.Errorf("%v bucket %d: offered %d ≠ allowed %d + refused %d", w.Policy.Algorithm, b, run.Offered[b], run.Allowed[b], run.Refused[b])
				}
				if c := run.Cumulative[b]; c.Offered != offered || c.Allowed != allowed || c.Delayed != delayed || c.MaxDelayMicros != maxDelay {
					t.Errorf("%v bucket %d: cumulative %+v, buckets add up to offered %d allowed %d", w.Policy.Algorithm, b, c, offered, allowed)
				}
			}
			if offered != w.Summary.Offered || allowed != w.Summary.Allowed || refused != w.Summary.Refused ||
				delayed != w.Summary.Delayed || maxDelay != w.Summary.MaxDelayMicros {
				t.Errorf("%v: buckets add up to %d/%d/%d/%d/%d, want %+v", w.Policy.Algorithm, offered, allowed, refused, delayed, maxDelay, w.Summary)
			}
			for b, l := range run.Level {
				if l < 0 || l > run.Capacity {
					t.Errorf("%v: level %d at boundary %d is outside 0..%d", w.Policy.Algorithm, l, b, run.Capacity)
				}
			}
		}
	}
}

// The state the first preset plots, at a few instants: requests at a boundary count before the
// peek there.
func TestRunLevels(t *testing.T) {
	res := mustRun(t, mustParse(t, burstQuery))
	if res.WidthMicros != 200_000 || res.Buckets != 145 {
		t.Fatalf("timeline of %d buckets of %d µs, want 145 of 200 ms (20.8 s of traffic, then 8.2 s for the leaky bucket to drain)", res.Buckets, res.WidthMicros)
	}
	run := func(a sluice.Algorithm) Run { return res.Runs[slices.Index(algorithm.Algorithms, a)] }
	for _, tc := range []struct {
		alg      sluice.Algorithm
		boundary int
		level    int64
		drain    time.Duration
	}{
		{sluice.FixedWindow, 0, 1, time.Second}, // the request at 0 counts
		{sluice.FixedWindow, 4, 5, 200 * time.Millisecond},
		{sluice.FixedWindow, 5, 1, time.Second},
		{sluice.TokenBucket, 0, 39, 200 * time.Millisecond},
		{sluice.TokenBucket, 50, 39, 200 * time.Millisecond}, // 5/s exactly refills what 5/s takes
		{sluice.TokenBucket, 55, 4, 7200 * time.Millisecond}, // full at 10s; 40 taken and 5 refilled in the burst's second, then one at 11s
		{sluice.LeakyBucket, 0, 1, 200 * time.Millisecond},
		{sluice.LeakyBucket, 55, 36, 7200 * time.Millisecond}, // the burst queued
		{sluice.LeakyBucket, 145, 0, 0},
	} {
		r := run(tc.alg)
		if r.Level[tc.boundary] != tc.level || r.DrainMicros[tc.boundary] != tc.drain.Microseconds() {
			t.Errorf("%v at %v: level %d, drain %v; want %d, %v", tc.alg, time.Duration(tc.boundary)*200*time.Millisecond,
				r.Level[tc.boundary], time.Duration(r.DrainMicros[tc.boundary])*time.Microsecond, tc.level, tc.drain)
		}
	}
}

func TestTimeline(t *testing.T) {
	second := int64(1e6)
	fw := []sluice.Policy{{Algorithm: sluice.FixedWindow, Limit: 5, Period: time.Second}}
	for _, tc := range []struct {
		last     int64
		policies []sluice.Policy
		width    int64
		buckets  int
	}{
		{0, fw, 5000, 200},                     // 1 s of tail only
		{499 * second / 1000, fw, 10_000, 150}, // 1.499 s in 10 ms buckets
		{20 * second, fw, 100_000, 210},        // 21 s
		{3600 * second, fw, 30 * second, 121},  // an hour and a second
		{100 * 365 * 86400 * second, fw, 153 * 86400 * second, 239},
	} {
		w, n := timeline(tc.last, tc.policies, sim.Options{})
		if w != tc.width || n != tc.buckets || int64(n)*w <= tc.last || n > MaxBuckets {
			t.Errorf("timeline(%d): %d buckets of %d µs, want %d of %d", tc.last, n, w, tc.buckets, tc.width)
		}
	}
}

// Jitter is reproducible from its draw, keeps requests in order, and moves each by less than it.
func TestJitter(t *testing.T) {
	sc := mustParse(t, "traffic=10/s+for+2s&limit=5&period=1s&jitter=300ms&draw=42")
	a, errs := sc.Requests()
	if errs != nil {
		t.Fatal(errs)
	}
	b, _ := sc.Requests()
	if !reflect.DeepEqual(a, b) {
		t.Fatal("the same draw gave different requests")
	}
	plain, _ := sim.ParseTraffic(sc.Traffic)
	if !slices.IsSortedFunc(a, func(x, y sim.Request) int { return int(x.TMicros - y.TMicros) }) {
		t.Error("jittered requests are not in time order")
	}
	// Offsets are below the jitter: the k-th jittered time is within [plain_k, plain_k + jitter).
	for k := range a {
		if a[k].TMicros < plain[k].TMicros || a[k].TMicros >= plain[k].TMicros+300_000 {
			t.Errorf("request %d at %d µs, want within 300 ms after %d", k, a[k].TMicros, plain[k].TMicros)
		}
	}
	// Golden: the same draw must give the same times in every Go version (links stay valid).
	if got := []int64{a[0].TMicros, a[1].TMicros, a[19].TMicros}; !slices.Equal(got, []int64{85818, 201120, 2059711}) {
		t.Errorf("draw 42's first times are %v: the jitter's generator changed, and old links with it", got)
	}
	sc.Draw = 43
	c, _ := sc.Requests()
	if reflect.DeepEqual(a, c) {
		t.Error("Draw 42 and Draw 43 gave the same requests")
	}

	// The trace the page offers is what `sluice simulate --trace` reads back.
	res := mustRun(t, sc)
	back, err := sim.ParseTrace(bytes.NewReader(res.Trace()))
	if err != nil || !reflect.DeepEqual(back, res.Requests) {
		t.Errorf("the trace reads back as %d requests (%v), want the %d run", len(back), err, len(res.Requests))
	}
}

func TestCommands(t *testing.T) {
	for _, tc := range []struct {
		query string
		want  []string
	}{
		{burstQuery, []string{"sluice simulate --compare --limit 5 --period 1s --burst 40 --traffic '5/s for 10s; 40 in 1s; 5/s for 10s'"}},
		{"traffic=1+at+once&limit=5&period=1s&jitter=1ms", []string{"sluice simulate --compare --limit 5 --period 1s --burst 0 --trace trace.csv"}},
		{"traffic=1+at+once&limit=5&period=1m30s&token-bucket.burst=3", []string{
			"sluice simulate --algorithm fixed-window --limit 5 --period 1m30s --traffic '1 at once'",
			"sluice simulate --algorithm sliding-log --limit 5 --period 1m30s --traffic '1 at once'",
			"sluice simulate --algorithm sliding-window --limit 5 --period 1m30s --traffic '1 at once'",
			"sluice simulate --algorithm token-bucket --limit 5 --period 1m30s --burst 3 --traffic '1 at once'",
			"sluice simulate --algorithm leaky-bucket --limit 5 --period 1m30s --burst 0 --traffic '1 at once'",
		}},
	} {
		sc := mustParse(t, tc.query)
		if got := sc.Commands(); !slices.Equal(got, tc.want) {
			t.Errorf("Commands(%q):\n got %q\nwant %q", tc.query, got, tc.want)
		}
	}
	if got := shellQuote("it's"); got != `'it'\''s'` {
		t.Errorf("shellQuote: %s", got)
	}
}

func TestJSON(t *testing.T) {
	res := mustRun(t, mustParse(t, burstQuery))
	var doc struct {
		Query    string   `json:"query"`
		Commands []string `json:"commands"`
		Requests int      `json:"requests"`
		WidthUs  int64    `json:"width_us"`
		Buckets  int      `json:"buckets"`
		EndUs    int64    `json:"end_us"`
		Runs     []struct {
			Algorithm string          `json:"algorithm"`
			Policy    json.RawMessage `json:"policy"`
			Capacity  int64           `json:"capacity"`
			Offered   []int64         `json:"offered"`
			Level     []int64         `json:"level"`
			DrainUs   []int64         `json:"drain_us"`
			Summary   json.RawMessage `json:"summary"`
		} `json:"runs"`
	}
	if err := json.Unmarshal(res.JSON(), &doc); err != nil {
		t.Fatalf("the result is not JSON: %v", err)
	}
	if doc.Query != burstQuery || doc.Requests != 140 || doc.Buckets != res.Buckets || doc.EndUs != res.EndMicros() || len(doc.Runs) != 5 {
		t.Errorf("result: %+v", doc)
	}
	for i, r := range doc.Runs {
		want, _ := res.Runs[i].Summary.MarshalJSON()
		if string(r.Summary) != string(want) || r.Algorithm != algorithm.Algorithms[i].String() ||
			len(r.Offered) != res.Buckets || len(r.Level) != res.Buckets+1 || len(r.DrainUs) != res.Buckets+1 {
			t.Errorf("run %d: %s, summary %s, %d buckets", i, r.Algorithm, r.Summary, len(r.Offered))
		}
	}
	if got := string(doc.Runs[4].Policy); got != `{"algorithm":"leaky-bucket","limit":5,"period_ms":1000,"burst":40}` {
		t.Errorf("policy %s", got)
	}

	var sums []json.RawMessage
	if err := json.Unmarshal(res.SummariesJSON(res.Buckets), &sums); err != nil || len(sums) != 5 || string(sums[4]) != string(doc.Runs[4].Summary) {
		t.Errorf("SummariesJSON(all): %s (%v)", res.SummariesJSON(res.Buckets), err)
	}
	if got := string(res.SummariesJSON(-3)); !strings.HasPrefix(got, `[{"offered":0,"allowed":0,`) {
		t.Errorf("SummariesJSON(0): %s", got)
	}
	if got := string(Errors{{"limit", `"x" is "bad"`}}.JSON()); got != `{"errors":[{"field":"limit","message":"\"x\" is \"bad\""}]}` {
		t.Errorf("Errors.JSON: %s", got)
	}
	var presets []Preset
	if err := json.Unmarshal(PresetsJSON(), &presets); err != nil || !reflect.DeepEqual(presets, Presets) {
		t.Errorf("PresetsJSON: %v", err)
	}
}

func TestGenerator(t *testing.T) {
	for _, tc := range []struct {
		query, want, errField string
	}{
		{"rate=5&duration=21s&burst_size=40&burst_at=10s&burst_over=1s", "5/s for 10s; 40 in 1s; 5/s for 10s", ""},
		{"rate=0&duration=1m&burst_size=100&burst_at=59s", "idle 59s; 100 at once", ""},
		{"rate=0.5&duration=1m", "0.5/s for 1m", ""},
		{"rate=2&duration=10s&burst_size=8", "8 at once; 2/s for 10s", ""},
		{"rate=&burst_size=8&burst_at=0", "8 at once", ""},
		{"rate=0", "", "rate"},
		{"rate=abc&duration=1s", "", "rate"},
		{"rate=1.2345&duration=1s", "", "rate"},
		{"rate=5", "", "duration"},
		{"rate=5&duration=10s&burst_size=5&burst_at=9s&burst_over=2s", "", "burst_at"},
		{"rate=5&duration=x", "", "duration"},
		{"rate=5&duration=1s&burst_size=-2", "", "burst_size"},
	} {
		g, errs := ParseGenerator(tc.query)
		var got string
		if errs == nil {
			got, errs = g.Pattern()
		}
		switch {
		case tc.errField == "" && (errs != nil || got != tc.want):
			t.Errorf("%q: pattern %q, errors %v; want %q", tc.query, got, errs, tc.want)
		case tc.errField != "" && (len(errs) == 0 || errs[0].Field != tc.errField):
			t.Errorf("%q: pattern %q, errors %v; want an error for %s", tc.query, got, errs, tc.errField)
		}
	}
}

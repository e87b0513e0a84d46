package envoys

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

// moving is three Envoys whose demand moves: e3's grows from 5/s to 30/s at 2m as e1's falls
// from 30/s to 5/s.
func moving(t *testing.T) Options {
	t.Helper()
	names, err := Names("3")
	if err != nil {
		t.Fatal(err)
	}
	reqs, err := Traffic("e1: 30/s for 2m; 5/s for 2m; e2: 10/s for 4m; e3: 5/s for 2m; 30/s for 2m", names)
	if err != nil {
		t.Fatal(err)
	}
	return Options{Envoys: names, Requests: reqs, Limit: 1800, Period: time.Minute, Burst: 300, Latency: 10 * time.Millisecond}
}

func table(t *testing.T, res *Result) string {
	t.Helper()
	var b bytes.Buffer
	if err := res.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestMovingDemand: the assignments follow the demand (a fair split of 1800 a minute: 900, 600,
// 300, then 300, 600, 900), the bound holds in every window, RLQS calls the service a few times
// per report interval where RLS calls it per request, and the same options give the same run.
func TestMovingDemand(t *testing.T) {
	res, err := Run(moving(t))
	if err != nil {
		t.Fatal(err)
	}
	if !res.Held || !res.RLSHeld {
		t.Errorf("bounds: %s", res.BoundText())
	}
	got := [...]int64{res.Offered, res.Admitted, res.Fallback, res.RLSAdmitted, res.Reports, res.Responses, res.Streams, res.RLSCalls}
	want := [...]int64{10800, 7588, 781, 7498, 146, 139, 3, 10800}
	if got != want {
		t.Errorf("offered, RLQS admitted, fallback, RLS admitted, reports, responses, streams, RLS calls = %v; want %v", got, want)
	}
	if res.RLQSCalls*20 > res.RLSCalls {
		t.Errorf("RLQS made %d calls, RLS %d: want RLQS's far fewer", res.RLQSCalls, res.RLSCalls)
	}
	assigned := func(tMicros int64, envoy string) int64 {
		for _, r := range res.Rows {
			if r.StartMicros == tMicros && r.Envoy == envoy {
				return r.Assigned
			}
		}
		t.Fatalf("no row %d %s", tMicros, envoy)
		return 0
	}
	for _, c := range []struct {
		t          time.Duration
		e1, e2, e3 int64
	}{{time.Minute, 900, 600, 300}, {3 * time.Minute, 300, 600, 900}} {
		us := c.t.Microseconds()
		if a := [3]int64{assigned(us, "e1"), assigned(us, "e2"), assigned(us, "e3")}; a != [3]int64{c.e1, c.e2, c.e3} {
			t.Errorf("assignments at %v: %v; want %d %d %d", c.t, a, c.e1, c.e2, c.e3)
		}
	}
	// Windows after the first: each Envoy keeps to its assignment, all together to the limit.
	for _, w := range res.Windows[1:] {
		if w.Fallback != 0 || w.Assigned > 1800+w.Tokens {
			t.Errorf("window %+v", w)
		}
	}
	out := table(t, res)
	for _, s := range []string{
		"RLQS: 3 Envoys (e1, e2, e3) on one bucket {name: api}: 1800 per 1m, burst 300, split fair by demand; reports every 5s, assignment TTL 15s, latency 10ms each way; no_assignment allow, expired no-assignment\n",
		"calls to the service: RLQS 285 (146 reports, 139 responses, on 3 streams); RLS 10800 (one per request): RLQS made 2.64% of RLS's calls\n",
		"bound: RLQS admitted under assignments per 1m window ≤ L·W/P + Σ max_tokens of the buckets held or built in it = 1800 + 104…304: held in all 4 windows; RLS admitted by the store per window ≤ B + L = 300 + 1800 = 2100: held in all 4 windows\n",
	} {
		if !strings.Contains(out, s) {
			t.Errorf("the table has no %q:\n%s", s, out)
		}
	}
	again, err := Run(moving(t))
	if err != nil {
		t.Fatal(err)
	}
	if table(t, again) != out {
		t.Error("the same options gave another run")
	}
	if _, err := json.Marshal(res); err != nil {
		t.Error(err)
	}
}

// TestKillRestart: the service dies at 1m: the Envoys keep their assignments for their TTL, then
// deny (their expired behaviour); it restarts at 1m30s with new ledgers, which learn for a TTL
// and the hold before they hand out quota; the Envoys open new streams. RLS requests while it is
// down are admitted unasked. The bounds hold throughout.
func TestKillRestart(t *testing.T) {
	o := moving(t)
	reqs, err := Traffic("10/s for 3m", o.Envoys[:2])
	if err != nil {
		t.Fatal(err)
	}
	o.Envoys, o.Requests, o.Limit, o.Burst = o.Envoys[:2], reqs, 600, 100
	o.NoAssignment, o.Expired = Deny, Deny
	o.KillAt, o.RestartAt = time.Minute, 90*time.Second
	res, err := Run(o)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Held || !res.RLSHeld {
		t.Errorf("bounds: %s", res.BoundText())
	}
	state := func(at time.Duration) (string, int64) {
		var admitted int64
		st := ""
		for _, r := range res.Rows {
			if r.StartMicros == at.Microseconds() {
				admitted += r.Admitted
				st = r.State
			}
		}
		return st, admitted
	}
	for _, c := range []struct {
		at    time.Duration
		state string
		none  bool
	}{{5 * time.Second, "no_assignment", true}, {65 * time.Second, "active", false}, {80 * time.Second, "expired", true},
		{95 * time.Second, "expired", true}, {110 * time.Second, "active", false}} {
		st, n := state(c.at)
		if st != c.state || (n == 0) != c.none {
			t.Errorf("at %v: %s, %d admitted; want %s, none %v", c.at, st, n, c.state, c.none)
		}
	}
	if res.Streams != 4 || res.RLSDown != 600 || res.Windows[1].RLSOpen != 600 {
		t.Errorf("streams %d, RLS unanswered %d, window 1 %+v; want 4 streams, 600 unanswered", res.Streams, res.RLSDown, res.Windows[1])
	}
}

// TestOptionErrors: each bad option names its field.
func TestOptionErrors(t *testing.T) {
	base := func() Options {
		return Options{Envoys: []string{"e1"}, Limit: 10, Period: time.Second}
	}
	for _, c := range []struct {
		field string
		edit  func(*Options)
	}{
		{"period", func(o *Options) { o.Period = 1500 * time.Millisecond }},
		{"limit", func(o *Options) { o.Limit = 0 }},
		{"assignment-ttl", func(o *Options) { o.ReportInterval, o.TTL = 5*time.Second, 5*time.Second }},
		{"envoy-latency", func(o *Options) { o.Latency = 2 * time.Second }},
		{"expired", func(o *Options) { o.Expired = "maybe" }},
		{"restart-at", func(o *Options) { o.RestartAt = time.Second }},
		{"ledger-algorithm", func(o *Options) { o.Algorithm = "random" }},
	} {
		o := base()
		c.edit(&o)
		_, err := Run(o)
		var oe *OptionError
		if !errors.As(err, &oe) || oe.Field != c.field {
			t.Errorf("%s: %v", c.field, err)
		}
	}
	if _, err := Names("0"); err == nil {
		t.Error("0 Envoys")
	}
	if _, err := Names("a,a"); err == nil {
		t.Error("a name twice")
	}
	if _, err := Traffic("e9: 1/s for 1s", []string{"e1"}); err != nil {
		t.Error(err) // (Run says the name is not an Envoy's)
	}
	reqs, _ := Traffic("e9: 1/s for 1s", []string{"e1"})
	if _, err := Run(Options{Envoys: []string{"e1"}, Requests: reqs, Limit: 10, Period: time.Second}); err == nil || !strings.Contains(err.Error(), `"e9"`) {
		t.Errorf("unknown Envoy: %v", err)
	}
}

// TestRebuildChurn: a busy Envoy beside two sparse ones (a request every 7 and 10 seconds): the
// busy one's allotment moves as the sparse ones' demand comes and goes, and each change is a new
// assignment, which Envoy builds as a new token bucket, full. The service sends a changed bucket
// no larger than the one it replaces refilled since it was built (and keeps the bucket for a
// change of 2% or less), so the churn hands out no burst: a minute admits what RLS admits, the
// limit, not the twice the limit it did when every change was a full bucket (2370 of 1200).
func TestRebuildChurn(t *testing.T) {
	names, _ := Names("3")
	reqs, err := Traffic("e1: 100/s for 3m; e2: 0.15/s for 3m; e3: 0.1/s for 3m", names)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(Options{Envoys: names, Requests: reqs, Limit: 1200, Period: time.Minute, Burst: 200, NoAssignment: Deny})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Held || !res.RLSHeld {
		t.Errorf("bounds: %s", res.BoundText())
	}
	for _, w := range res.Windows[1:] {
		if w.Assigned > 1200 || w.Tokens > 200+3+1200 {
			t.Errorf("window at %dµs: admitted under assignments %d, Σ max_tokens %d; want at most the limit 1200 (no bursts from churn)", w.StartMicros, w.Assigned, w.Tokens)
		}
	}
	w := res.Windows[1]
	if got := [...]int64{w.Assigned, w.Built, w.Tokens, w.RLSAdmitted}; got != [...]int64{1191, 18, 216, 1200} {
		t.Errorf("window 1m: admitted under assignments, buckets built, Σ max_tokens, RLS admitted = %v", got)
	}
}

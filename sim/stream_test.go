package sim

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// streamTrace: a token bucket of 10,000 tokens refilled 10,000 per 10 s (one token a ms), and a
// key's requests of estimate 4,000 whose responses stream for a while.
const streamTrace = "t_ms,key,cost,actual,duration_ms\n" +
	"0,team,4000,14000,5000\n" + // ends at 5 s, 10,000 more than estimated
	"1000,team,4000,1000,19000\n" + // ends at 20 s, 3,000 less
	"6000,team,4000,4000,3000\n" + // refused: it has no response
	"12000,team,4000,4000,0\n" +
	"20000,team,10000,,\n" // at the instant the second response ends

// TestStreamsSettleAtTheirEnd: a response's estimate stays charged until it ends, and is settled
// then, on the virtual clock. The figures, by hand (b is the bucket's balance):
//
//	0 s   the first is allowed: b = 10,000 - 4,000 = 6,000; 1 running, 4,000 reserved
//	1 s   the second: b = 6,000 + 1,000 - 4,000 = 3,000; 2 running, 8,000 reserved — it gets in
//	      because the first one's overrun is not known yet
//	5 s   the first ends, settled at 14,000: b = 3,000 + 4,000 - 10,000 = -3,000; its row shows
//	      balance 0 and a wait of 3.001 s, until b = 1
//	6 s   b = -2,000: a request of 4,000 is refused for 6 s, until b = 4,000
//	12 s  b = 4,000: allowed, 0 left, settled at once (actual = estimate): a wait of 1 ms
//	20 s  the second ends first, settled at 1,000: b = 0 + 8,000, and the 3,000 refund gives
//	      nothing, for the bucket's refill since 1 s has long covered the 4,000 charged
//	      (algorithm.Settle); so a request of 10,000 is refused for 2 s
func TestStreamsSettleAtTheirEnd(t *testing.T) {
	tr, err := ReadTrace(strings.NewReader(streamTrace))
	if err != nil {
		t.Fatal(err)
	}
	if want := []int64{5e6, 19e6, 3e6, 0, 0}; !slices.Equal(tr.Durations, want) {
		t.Fatalf("durations %v, want %v", tr.Durations, want)
	}
	p := sluice.Policy{Algorithm: sluice.TokenBucket, Limit: 10000, Period: 10 * time.Second, Burst: 10000}
	res, err := Options{Actual: tr.Actual, Durations: tr.Durations}.Run(p, tr.Requests)
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		allowed               bool
		remaining, retry, end int64
		inFlight, reserved    int64
		settles               bool
		balance, wait         int64
	}
	for i, w := range []want{
		{true, 6000, 0, 5e6, 1, 4000, true, 0, 3_001_000},
		{true, 3000, 0, 20e6, 2, 8000, true, 8000, 0},
		{false, 0, 6e6, 6e6, 1, 4000, true, 0, 0}, // refused: it ends where it began
		{true, 0, 0, 12e6, 1, 4000, true, 0, 1000},
		{false, 8000, 2e6, 20e6, 0, 0, false, 0, 0}, // the refund gives nothing
	} {
		r := res.Rows[i]
		got := want{r.Allowed, r.Remaining, r.RetryAfterMicros, r.EndMicros, r.InFlight, r.Reserved, r.Settles, r.Balance, r.WaitMicros}
		if got != w || !r.Streams || r.held {
			t.Errorf("row %d: %+v, want %+v", i, r, w)
		}
	}
	s := res.Summary
	if !s.Streams || s.MaxInFlight != 2 || s.MaxReserved != 8000 || s.Waits != 2 || s.MaxWaitMicros != 3_001_000 || s.Settled != 3 || s.ActualCost != 19000 {
		t.Errorf("summary %+v", s)
	}
	b, _ := json.Marshal(res.Rows[0])
	if !strings.Contains(string(b), `"actual":14000,"balance":0,"end_ms":5000,"in_flight":1,"reserved":4000,"wait_ms":3001}`) {
		t.Errorf("row JSON %s", b)
	}

	// Settled at arrival instead, the first one's overrun refuses the second: b = -4,000 at 0.
	at, err := Options{Actual: tr.Actual}.Run(p, tr.Requests)
	if err != nil {
		t.Fatal(err)
	}
	if r := at.Rows[1]; r.Allowed || r.RetryAfterMicros != 7e6 || r.Streams {
		t.Errorf("settled at arrival, row 1: %+v, want refused for 7 s", r)
	}
}

// TestStreamSessionHolds: a stream session hands a running response's row back as Held,
// completes it from Ended once a later request, a peek or SettleUntil reaches its end, and keeps
// the times in order.
func TestStreamSessionHolds(t *testing.T) {
	s, err := Options{}.NewStreamSession(sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 100, Period: time.Minute}, 1)
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.DecideStream(Request{Key: "k", Cost: 60}, 10, 2e6)
	if err != nil || !r.held || r.Reserved != 60 {
		t.Fatalf("%+v %v", r, err)
	}
	if r, err = s.DecideStream(Request{TMicros: 1e6, Key: "k", Cost: 60}, 10, 0); err != nil || r.Allowed || r.Reserved != 60 {
		t.Fatalf("a second 60 while the first runs: %+v %v", r, err)
	}
	if e := s.Ended(); len(e) != 0 {
		t.Fatalf("ended before its end: %+v", e)
	}
	d, err := s.Peek(2e6, "k") // the first ends, refunding 50
	if err != nil || d.Remaining != 90 {
		t.Fatalf("peek at the end: %+v %v", d, err)
	}
	e := s.Ended()
	if len(e) != 1 || e[0].Seq != 0 || e[0].Row.held || e[0].Row.Balance != 90 {
		t.Fatalf("ended: %+v", e)
	}
	if _, err := s.DecideStream(Request{TMicros: 3e6, Key: "k", Cost: 1}, NoActual, 5e6); err != nil {
		t.Fatal(err)
	}
	if err := s.SettleUntil(MaxTimeMicros); err != nil {
		t.Fatal(err)
	}
	if e := s.Ended(); len(e) != 1 || e[0].Seq != 2 || e[0].Row.Settles {
		t.Fatalf("settled until the end: %+v", e)
	}
	if _, err := s.DecideStream(Request{TMicros: 7e6, Key: "k", Cost: 1}, NoActual, 0); err == nil || !strings.Contains(err.Error(), "before the previous") {
		t.Errorf("a request before the last end: %v", err)
	}
	if err := s.SettleUntil(7e6); err == nil || !strings.Contains(err.Error(), "before the last instant") {
		t.Errorf("settling until before the last end: %v", err)
	}
	if _, err := s.DecideStream(Request{TMicros: MaxTimeMicros, Key: "k", Cost: 1}, NoActual, -1); err == nil || !strings.Contains(err.Error(), "duration -1") {
		t.Errorf("a negative duration: %v", err)
	}
}

func TestReadTraceDurations(t *testing.T) {
	for _, c := range []struct{ trace, want string }{
		{"t_ms,duration_ms\n0,x\n", `trace line 2: duration_ms "x" is not a non-negative decimal`},
		{"t_ms,duration_ms\n0,1.0001\n", `duration_ms "1.0001" has more than 3 decimals`},
		{"t_ms,duration_ms\n1,9007199254740.992\n", `duration_ms "9007199254740.992" is too large`},
		{"t_ms,bogus\n0,1\n", "optionally key, cost, actual and duration_ms"},
	} {
		if _, err := ReadTrace(strings.NewReader(c.trace)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.trace, err, c.want)
		}
	}
	if _, err := ParseTrace(strings.NewReader("t_ms,duration_ms\n0,1\n")); err == nil || !strings.Contains(err.Error(), `unknown column "duration_ms"`) {
		t.Errorf("ParseTrace of a duration_ms column: %v", err)
	}
}

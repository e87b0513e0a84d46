package sim

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// TestSimulateActual: a trace's real costs settle each approved request right after its
// decision, on the virtual clock: the balance follows them exactly, a debt refuses what follows
// until its window ends, and a refused request settles nothing.
func TestSimulateActual(t *testing.T) {
	tr, err := ReadTrace(strings.NewReader("t_ms,key,cost,actual\n0,a,1000,250\n100,a,1000,4000\n200,a,1000,\n300,a,1000,9000\n400,a,1000,0\n1500,a,1000,100\n"))
	if err != nil {
		t.Fatal(err)
	}
	reqs, actual := tr.Requests, tr.Actual
	if want := []int64{250, 4000, NoActual, 9000, 0, 100}; len(actual) != len(want) {
		t.Fatalf("actual %v, want %v", actual, want)
	}
	p := sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 10000, Period: time.Second}
	res, err := Options{Actual: actual}.Run(p, reqs)
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		allowed            bool
		remaining, balance int64
		retry              int64
	}
	for i, w := range []want{
		{true, 9000, 9750, 0},
		{true, 8750, 5750, 0},  // 4,000 for an estimate of 1,000
		{true, 4750, 0, 0},     // no real cost: the estimate stands (balance not reported)
		{true, 3750, 0, 0},     // 9,000: 14,250 of 10,000, in debt
		{false, 0, 0, 600_000}, // refused until the window ends; settles nothing
		{true, 9000, 9900, 0},  // a new window
	} {
		r := res.Rows[i]
		if r.Allowed != w.allowed || r.Remaining != w.remaining || r.Balance != w.balance || r.RetryAfterMicros != w.retry || r.Settles != (actual[i] != NoActual) {
			t.Errorf("row %d: %+v, want %+v", i, r, w)
		}
	}
	if s := res.Summary; s.Settled != 4 || s.SettledCost != 4000 || s.ActualCost != 13350 {
		t.Errorf("summary %+v: want 4 settled, estimated 4000, actual 13350", s)
	}
	b, _ := json.Marshal(res.Rows[0])
	if !strings.Contains(string(b), `"actual":250,"balance":9750`) {
		t.Errorf("row JSON %s lacks actual and balance", b)
	}
	b, _ = json.Marshal(res.Rows[2])
	if strings.Contains(string(b), "actual") {
		t.Errorf("row JSON %s of a request without a real cost names one", b)
	}
	// Without real costs the run is as before: nothing settles, no balance.
	plain, err := Run(p, reqs)
	if err != nil || plain.Summary.Settled != 0 || plain.Rows[0].Settles || plain.Rows[1].Remaining != 8000 {
		t.Fatalf("without actual costs: %+v %v", plain.Summary, err)
	}
	// Compare gives every algorithm the same real costs.
	runs, err := Options{Actual: actual}.Compare(ComparePolicies(10000, time.Second, 0), reqs)
	if err != nil || len(runs) != 5 || runs[3].Rows[1].Balance != 6000 {
		t.Fatalf("compare: %v; token bucket row 1: %+v", err, runs[3].Rows[1])
	}
}

func TestReadTraceErrors(t *testing.T) {
	for _, c := range []struct{ trace, want string }{
		{"t_ms,actual\n0,-1\n", `trace line 2: actual "-1" is not a whole number in 0..2^53`},
		{"t_ms,actual\n0,x\n", `trace line 2: actual "x" is not a whole number`},
		{"t_ms,actual\n0,9007199254740993\n", "0..2^53"},
		{"t_ms,actual,actual\n0,1,1\n", `column "actual" appears twice`},
	} {
		if _, err := ReadTrace(strings.NewReader(c.trace)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.trace, err, c.want)
		}
	}
	if _, err := ParseTrace(strings.NewReader("t_ms,actual\n0,1\n")); err == nil || !strings.Contains(err.Error(), `unknown column "actual"`) {
		t.Errorf("ParseTrace of an actual column: %v", err)
	}
	s, _ := NewSession(sluice.Policy{Algorithm: sluice.TokenBucket, Limit: 5, Period: time.Second}, 1)
	if _, err := s.DecideSettled(Request{Key: "k", Cost: 1}, -2); err == nil || !strings.Contains(err.Error(), "actual cost -2") {
		t.Errorf("DecideSettled with actual -2: %v", err)
	}
}

// A fleet on one shared store settles there: with no budgets its instances count together, so
// each row is one instance's (the store's) — the settlements included. (The shared store wraps
// the memory store to count its calls and to fail in an outage; it must settle too.)
func TestFleetSharedStoreSettles(t *testing.T) {
	tr, err := ReadTrace(strings.NewReader("t_ms,key,cost,actual\n0,a,1000,250\n100,a,1000,4000\n200,a,1000,\n300,a,1000,9000\n400,a,1000,0\n1500,a,1000,100\n"))
	if err != nil {
		t.Fatal(err)
	}
	reqs, actual := tr.Requests, tr.Actual
	p := sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 10000, Period: time.Second}
	one, err := Options{Actual: actual}.Run(p, reqs)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []Fleet{{Instances: 3}, {Instances: 3, StoreLatency: time.Millisecond}} {
		fleet, err := Options{Actual: actual, Fleet: &f}.Run(p, reqs)
		if err != nil {
			t.Fatalf("%+v: %v", f, err)
		}
		for i, r := range fleet.Rows {
			w := one.Rows[i]
			if r.Allowed != w.Allowed || r.Remaining != w.Remaining || r.Balance != w.Balance || r.RetryAfterMicros != w.RetryAfterMicros || r.Settles != w.Settles {
				t.Errorf("%+v: row %d: %+v; one instance's: %+v", f, i, r, w)
			}
		}
		if s := fleet.Summary; s.Settled != one.Summary.Settled || s.ActualCost != one.Summary.ActualCost {
			t.Errorf("%+v: summary %+v; one instance's: %+v", f, s, one.Summary)
		}
	}
}

package decision

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/store/memory"
)

// recordingObserver records settlement outcomes.
type recordingObserver struct{ outcomes []SettleOutcome }

func (o *recordingObserver) Decided(*Request, *Verdict, time.Duration) {}
func (o *recordingObserver) Failed(*Request, error)                    {}
func (o *recordingObserver) Settled(_ *Request, out SettleOutcome) {
	o.outcomes = append(o.outcomes, out)
}

// TestFinish: every limit a request charged is settled with its own estimate and the real cost
// (a dry-run one too, under its own key); the rules' order (refund_on, count_only, cost_from);
// a refused request settles nothing.
func TestFinish(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(0))
	store := memory.New(memory.WithClock(clock))
	obs := &recordingObserver{}
	d := &Decider{Store: store, Observer: obs}
	hourly := sluice.Policy{Name: "hourly", Algorithm: sluice.FixedWindow, Limit: 1000, Period: 1000 * time.Hour}
	shadow := sluice.Policy{Name: "shadow", Algorithm: sluice.TokenBucket, Limit: 500, Period: 1000 * time.Hour}
	after := &config.After{CostFrom: "X-Used", RefundOn: []config.StatusMatch{{Class: 5}}}
	req := Request{Who: identity.Identity{Key: "c"}, Client: "c", Cost: 100, After: after,
		Limits: []Limit{{Policy: hourly, PolicyName: "hourly"}, {Policy: shadow, PolicyName: "shadow", DryRun: true, Key: "tenant"}}}
	left := func(key string, p sluice.Policy) int64 {
		dd, _ := store.Decide(context.Background(), key, p, 0)
		return dd.Remaining
	}
	header := func(v string) func(string) string {
		return func(name string) string {
			if name == "X-Used" {
				return v
			}
			return ""
		}
	}
	ctx := context.Background()
	for i, s := range []struct {
		resp       Response
		hourly, sh int64 // left after it
		outcome    SettleOutcome
	}{
		{Response{Status: 200, Header: header("30")}, 970, 470, Settled},
		{Response{Status: 200, Header: header("100")}, 870, 370, SettleKept},
		{Response{Status: 503, Header: header("30")}, 870, 370, Settled},       // refund_on first
		{Response{Aborted: true}, 870, 370, Settled},                           // no response: refund_on refunds it
		{Response{Status: 200, Header: header("-3")}, 770, 270, SettleGarbled}, // the estimate stands
		{Response{Status: 200, Header: header("400")}, 370, 0, Settled},        // the shadow bucket in debt
	} {
		v := d.Decide(ctx, &req)
		if !v.Passes() {
			t.Fatalf("step %d refused: %+v", i, v)
		}
		d.Finish(ctx, &req, &v, s.resp)
		v.Release()
		if got := obs.outcomes[len(obs.outcomes)-1]; got != s.outcome {
			t.Errorf("step %d: outcome %v, want %v", i, got, s.outcome)
		}
		if h, sh := left("c", hourly), left("tenant", shadow); h != s.hourly || sh != s.sh {
			t.Fatalf("step %d: left %d and %d, want %d and %d", i, h, sh, s.hourly, s.sh)
		}
	}
	// count_only: only a listed status costs; an aborted request none.
	login := Request{Who: identity.Identity{Key: "u"}, Client: "u", Cost: 1, After: &config.After{CountOnly: []int{401}},
		Limits: []Limit{{Policy: hourly, PolicyName: "hourly"}}}
	for i, s := range []struct {
		resp Response
		left int64
	}{{Response{Status: 200}, 1000}, {Response{Status: 401}, 999}, {Response{Aborted: true}, 999}, {Response{Status: 403}, 999}} {
		v := d.Decide(ctx, &login)
		d.Finish(ctx, &login, &v, s.resp)
		v.Release()
		if got := left("u", hourly); got != s.left {
			t.Fatalf("login %d (%+v): %d left, want %d", i, s.resp, got, s.left)
		}
	}
	// A refused request charged nothing: Finish leaves it alone.
	big := Request{Who: identity.Identity{Key: "u"}, Client: "u", Cost: 1000, After: &config.After{CountOnly: []int{401}},
		Limits: []Limit{{Policy: hourly, PolicyName: "hourly"}}}
	n := len(obs.outcomes)
	v := d.Decide(ctx, &big)
	if v.Passes() {
		t.Fatal("1000 of 999 passed")
	}
	d.Finish(ctx, &big, &v, Response{Status: 200})
	if len(obs.outcomes) != n || left("u", hourly) != 999 {
		t.Fatalf("Finish of a refused request: outcomes %v, left %d", obs.outcomes[n:], left("u", hourly))
	}
}

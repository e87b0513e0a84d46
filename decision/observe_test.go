package decision

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/store/memory"
)

// limitObserver records what LimitSettled is told.
type limitObserver struct {
	recordingObserver
	settled []string
}

func (o *limitObserver) LimitSettled(req *Request, i int, dec sluice.Decision, estimate, actual int64) {
	o.settled = append(o.settled, fmt.Sprintf("%s %d→%d at %d", req.Limits[i].PolicyName, estimate, actual, dec.At))
}

// TestLimitSettleObserver: a LimitSettleObserver is told, per limit the store settled, what the
// decision charged and what it costs now, with the decision (its instant): by Finish (cost_from
// here) and by Refund (a request shed for load); not for a settlement that changed nothing.
func TestLimitSettleObserver(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(5_000_000))
	obs := &limitObserver{}
	d := &Decider{Store: memory.New(memory.WithClock(clock)), Observer: obs}
	hourly := sluice.Policy{Name: "hourly", Algorithm: sluice.FixedWindow, Limit: 1000, Period: 1000 * time.Hour}
	req := Request{Who: identity.Identity{Key: "c"}, Client: "c", Cost: 100, After: &config.After{CostFrom: "X-Used"},
		Limits: []Limit{{Policy: hourly, PolicyName: "hourly"}}}
	ctx := context.Background()
	for _, used := range []string{"30", "100"} {
		v := d.Decide(ctx, &req)
		d.Finish(ctx, &req, &v, Response{Status: 200, Header: func(string) string { return used }})
		v.Release()
	}
	v := d.Decide(ctx, &req)
	d.Refund(ctx, &req, &v) // shed for load
	v.Release()
	if got, want := fmt.Sprint(obs.settled), "[hourly 100→30 at 5000000 hourly 100→0 at 5000000]"; got != want {
		t.Fatalf("LimitSettled was told %s; want %s", got, want)
	}
}

// usageObserver records LimitSettled and Charged.
type usageObserver struct {
	limitObserver
	charged []string
}

func (o *usageObserver) Charged(req *Request, i int, n int64) {
	o.charged = append(o.charged, fmt.Sprintf("%s +%d", req.Limits[i].PolicyName, n))
}

// TestUsageObserved: usage (Request.Charges) that a decision did not consume is charged, and the
// Observer is told twice: as a settlement of the limit (what the decision consumed, what the
// limit costs now: the shares diagnosis counts approvals net of it) and as usage charged (the
// metric). Nothing is told of usage the decision consumed itself.
func TestUsageObserved(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(5_000_000))
	obs := &usageObserver{}
	d := &Decider{Store: memory.New(memory.WithClock(clock)), Observer: obs}
	ten := sluice.Policy{Name: "ten", Algorithm: sluice.FixedWindow, Limit: 10, Period: time.Hour}
	ctx := context.Background()
	ask := func(cost, charge int64) Outcome {
		req := Request{Who: identity.Identity{Key: "c"}, Client: "c", Costs: []int64{cost}, Charges: []int64{charge},
			Limits: []Limit{{Policy: ten, PolicyName: "ten"}}}
		v := d.Decide(ctx, &req)
		defer v.Release()
		return v.Outcome
	}
	for _, step := range []struct {
		cost, charge int64
		want         Outcome
	}{
		{6, 6, Allowed}, // consumed by the decision: nothing more to charge
		{6, 6, Refused}, // 12 of 10: refused, and charged all the same
		{0, 0, Refused}, // a check: over
	} {
		if got := ask(step.cost, step.charge); got != step.want {
			t.Fatalf("cost %d, charge %d: %v, want %v", step.cost, step.charge, got, step.want)
		}
	}
	if got, want := fmt.Sprint(obs.charged), "[ten +6]"; got != want {
		t.Errorf("Charged was told %s; want %s", got, want)
	}
	if got, want := fmt.Sprint(obs.settled), "[ten 0→6 at 5000000]"; got != want {
		t.Errorf("LimitSettled was told %s; want %s", got, want)
	}
}

package decision

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/storetest"
)

// TestSettlementsPending: with Decider.Settlements, a cost_from settlement and a usage charge
// (Request.Charges, Envoy's hits_addend) that the store cannot make when asked are not lost: the
// settlement counts as settled (not failed), the charge does not fail its request, both are
// pending, and both land once the store takes them — the full costs charged, once.
func TestSettlementsPending(t *testing.T) {
	store := storetest.NewSettleOutage(memory.New())
	s := sluice.NewSettlements(store, sluice.SettlementOptions{Backoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	defer s.Close(context.Background())
	obs := &recordingObserver{}
	d := &Decider{Store: store, Observer: obs, Settlements: s}
	p := sluice.Policy{Name: "hourly", Algorithm: sluice.FixedWindow, Limit: 1000, Period: 1000 * time.Hour}
	ctx := context.Background()
	req := Request{Who: identity.Identity{Key: "c"}, Client: "c", Cost: 100, After: &config.After{CostFrom: "X-Used"},
		Limits: []Limit{{Policy: p, PolicyName: "hourly"}}}
	v := d.Decide(ctx, &req)
	if !v.Passes() {
		t.Fatalf("refused: %+v", v)
	}
	store.Down.Store(true)
	d.Finish(ctx, &req, &v, Response{Status: 200, Header: func(string) string { return "475" }})
	v.Release()
	if got := obs.outcomes[len(obs.outcomes)-1]; got != Settled {
		t.Fatalf("outcome %v, want settled (pending: it will land)", got)
	}
	usage := Request{Who: identity.Identity{Key: "u"}, Client: "u", Costs: []int64{0}, Charges: []int64{40}, NoHold: true,
		Limits: []Limit{{Policy: p, PolicyName: "hourly"}}}
	v = d.Decide(ctx, &usage)
	if v.Outcome == Failed {
		t.Fatalf("a usage charge the store could not make yet failed its request: %+v", v)
	}
	v.Release()
	if st := s.Stats(); st.Pending != 2 {
		t.Fatalf("stats %+v: want 2 pending", st)
	}
	store.Down.Store(false)
	deadline := time.Now().Add(20 * time.Second)
	for s.Stats().Pending != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("never landed: %+v", s.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	for key, want := range map[string]int64{"c": 525, "u": 960} {
		if dd, _ := store.Decide(ctx, key, p, 0); dd.Remaining != want {
			t.Fatalf("%s: remaining %d, want %d", key, dd.Remaining, want)
		}
	}
	if st := s.Stats(); st.Lost() != 0 || st.Landed != 2 {
		t.Fatalf("stats %+v", st)
	}
}

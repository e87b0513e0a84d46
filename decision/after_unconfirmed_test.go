package decision

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/internal/redistest"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

// TestFinishUnconfirmedIsSettled: under replicas_ack with the replica suspended, a settlement
// Redis applied but no replica acknowledged is sluice.ErrUnconfirmed: the refund happened, once,
// and Finish counts it as settled, not failed (it used to be ErrStoreUnavailable: "nothing
// changed", counted failed).
func TestFinishUnconfirmedIsSettled(t *testing.T) {
	g := redistest.StartReplicated(t, 1)
	store, err := redisstore.New(redisstore.Options{Addrs: []string{g.Primary.Addr}, ReplicasAck: 1,
		ReplicasAckTimeout: 200 * time.Millisecond, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	obs := &recordingObserver{}
	d := &Decider{Store: store, Observer: obs}
	hourly := sluice.Policy{Name: "hourly", Algorithm: sluice.FixedWindow, Limit: 1000, Period: time.Hour}
	req := Request{Who: identity.Identity{Key: "c"}, Client: "c", Cost: 100, After: &config.After{RefundOn: []config.StatusMatch{{Class: 5}}},
		Limits: []Limit{{Policy: hourly, PolicyName: "hourly"}}}
	ctx := context.Background()
	v := d.Decide(ctx, &req)
	if !v.Passes() {
		t.Fatalf("refused: %+v", v)
	}
	g.Replicas[0].Stop()
	defer g.Replicas[0].Cont()
	d.Finish(ctx, &req, &v, Response{Status: 503})
	v.Release()
	if len(obs.outcomes) != 1 || obs.outcomes[0] != Settled {
		t.Fatalf("outcomes %v, want [settled]", obs.outcomes)
	}
	if dd, err := store.Decide(ctx, "c", hourly, 0); err != nil || dd.Remaining != 1000 {
		t.Fatalf("after the refund: %+v, %v; want 1000 left", dd, err)
	}
}

package redis_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/store/redis"
)

// TestReplicasAck: with ReplicasAck, a decision that consumed is answered only once a replica
// acknowledged it (WAIT on the script's connection); with the replica suspended (SIGSTOP) it
// fails with ErrStoreUnavailable — though it did consume on the primary — while refusals and
// cost-0 checks are answered as usual. Decide (one script per call, and batched) and DecideAll.
func TestReplicasAck(t *testing.T) {
	g := redistest.StartReplicated(t, 1)
	replica := g.Replicas[0]
	for _, maxBatch := range []int{1, 0} {
		t.Run(fmt.Sprintf("MaxBatch=%d", maxBatch), func(t *testing.T) {
			// Bounds generous for a loaded machine (each call in flight dials its own connection).
			st := openStore(t, g.Primary, redis.Options{ReplicasAck: 1, ReplicasAckTimeout: 500 * time.Millisecond, Timeout: time.Second,
				MaxBatch: maxBatch, Prefix: fmt.Sprintf("ack%d:", maxBatch)})
			ctx := context.Background()
			p := sluice.Policy{Name: "acked", Algorithm: sluice.FixedWindow, Limit: 2, Period: time.Hour}
			waits := cmdstat(t, g.Primary, "wait", "calls")
			if d, err := st.Decide(ctx, "a", p, 1); err != nil || !d.Allowed {
				t.Fatalf("first decision: %+v, %v; want allowed", d, err)
			}
			if got := cmdstat(t, g.Primary, "wait", "calls"); got != waits+1 {
				t.Fatalf("WAIT ran %d times for one consuming decision, want 1", got-waits)
			}
			if d, err := st.Decide(ctx, "a", p, 0); err != nil || !d.Allowed || d.Remaining != 1 {
				t.Fatalf("a cost-0 check: %+v, %v; want allowed, 1 left", d, err)
			}
			if got := cmdstat(t, g.Primary, "wait", "calls"); got != waits+1 {
				t.Fatal("a cost-0 check sent WAIT")
			}

			replica.Stop()
			stopped := true
			defer func() {
				if stopped {
					replica.Cont()
				}
			}()
			d, err := st.Decide(ctx, "a", p, 1)
			if !errors.Is(err, sluice.ErrStoreUnavailable) || d.Allowed {
				t.Fatalf("a decision no replica acknowledged: %+v, %v; want ErrStoreUnavailable", d, err)
			}
			if !strings.Contains(err.Error(), "0 of the 1 replicas required (replicas_ack) acknowledged the change within 500ms") {
				t.Errorf("error %q does not say the replicas did not acknowledge", err)
			}
			// It consumed on the primary, and the store gives that back ("unavailable: used no
			// quota"): a cost-0 check sees 1 left again.
			waitRemaining(t, st, "a", p, 1)
			if d, err := st.Decide(ctx, "b", p, 0); err != nil || !d.Allowed {
				t.Fatalf("a cost-0 check with the replica stopped: %+v, %v; want allowed", d, err)
			}
			out := make([]sluice.Decision, 2)
			limits := []sluice.Limit{{Policy: p, Cost: 1}, {Policy: sluice.Policy{Name: "other", Algorithm: sluice.TokenBucket, Limit: 5, Period: time.Hour}, Cost: 1}}
			if ok, err := st.DecideAll(ctx, "c", limits, out); ok || !errors.Is(err, sluice.ErrStoreUnavailable) {
				t.Fatalf("DecideAll no replica acknowledged: %v, %v; want ErrStoreUnavailable", ok, err)
			}
			// Concurrent decisions (batched when MaxBatch allows): every consuming one fails.
			var wg sync.WaitGroup
			errs := make(chan error, 16)
			for i := range 16 {
				wg.Go(func() {
					if d, err := st.Decide(ctx, fmt.Sprintf("k%d", i), p, 1); err == nil && d.Allowed {
						errs <- fmt.Errorf("k%d allowed without a replica's acknowledgement", i)
					} else if err != nil && !errors.Is(err, sluice.ErrStoreUnavailable) {
						errs <- err
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}

			replica.Cont()
			stopped = false
			redistest.WaitReplicas(t, g.Primary, 1, 10*time.Second)
			if ok, err := st.DecideAll(ctx, "c", limits, out); !ok || err != nil {
				t.Fatalf("DecideAll with the replica back: %v, %v %+v; want allowed", ok, err, out)
			}
			wg = sync.WaitGroup{}
			errs = make(chan error, 16)
			for i := range 16 {
				wg.Go(func() {
					if d, err := st.Decide(ctx, fmt.Sprintf("j%d", i), p, 1); err != nil || !d.Allowed {
						errs <- fmt.Errorf("j%d with the replica back: %+v, %v; want allowed", i, d, err)
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		})
	}
}

// TestReplicasAckOptions: bad values are refused, naming the option.
func TestReplicasAckOptions(t *testing.T) {
	for _, tc := range []struct {
		opts redis.Options
		want string
	}{
		{redis.Options{Addrs: []string{"127.0.0.1:1"}, ReplicasAck: -1}, "ReplicasAck -1"},
		{redis.Options{Addrs: []string{"127.0.0.1:1"}, ReplicasAck: 1, ReplicasAckTimeout: -time.Second}, "ReplicasAckTimeout"},
	} {
		if s, err := redis.New(tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			s.Close()
			t.Errorf("New(%+v) = %v, want an error naming %s", tc.opts, err, tc.want)
		}
	}
}

// TestReplicasAckWithoutReplicas: a primary with fewer replicas than replicas_ack is logged at
// connection, and every consuming decision on it fails (the failure mode decides); refusals and
// cost-0 checks are still answered.
func TestReplicasAckWithoutReplicas(t *testing.T) {
	srv := redistest.Start(t)
	var logs ackLogBuffer
	st := openStore(t, srv, redis.Options{ReplicasAck: 1, ReplicasAckTimeout: 20 * time.Millisecond, Timeout: time.Second,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if got := logs.String(); !strings.Contains(got, "fewer replicas than replicas_ack") || !strings.Contains(got, "replicas=0") {
		t.Errorf("log %q does not warn of the missing replica", got)
	}
	p := sluice.Policy{Name: "alone", Algorithm: sluice.FixedWindow, Limit: 1, Period: time.Hour}
	if d, err := st.Decide(context.Background(), "k", p, 0); err != nil || !d.Allowed {
		t.Fatalf("a cost-0 check: %+v, %v", d, err)
	}
	if _, err := st.Decide(context.Background(), "k", p, 1); !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Fatalf("a consuming decision without a replica: %v; want ErrStoreUnavailable", err)
	}
	waitRemaining(t, st, "k", p, 1) // (consumed on the primary, and given back)
}

// waitRemaining waits until a cost-0 check of key under p sees remaining left: what a decision
// answered unavailable consumed is given back in the background.
func waitRemaining(t *testing.T, st *redis.Store, key string, p sluice.Policy, remaining int64) {
	t.Helper()
	var d sluice.Decision
	var err error
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); {
		if d, err = st.Decide(context.Background(), key, p, 0); err == nil && d.Remaining == remaining {
			return
		}
		runtime.Gosched()
	}
	t.Fatalf("%s: %+v, %v; want %d left (what the decision answered unavailable consumed given back)", key, d, err, remaining)
}

// TestSettleUnconfirmed: a settlement that Redis applied but too few replicas acknowledged
// (replicas_ack, the replica suspended) fails with sluice.ErrUnconfirmed — the change was made:
// do not retry it — not with ErrStoreUnavailable, which says nothing changed (it used to, and a
// caller that retried refunded twice). The refund is applied once.
func TestSettleUnconfirmed(t *testing.T) {
	g := redistest.StartReplicated(t, 1)
	replica := g.Replicas[0]
	st := openStore(t, g.Primary, redis.Options{ReplicasAck: 1, ReplicasAckTimeout: 200 * time.Millisecond, Timeout: time.Second})
	ctx := context.Background()
	p := sluice.Policy{Name: "settled", Algorithm: sluice.FixedWindow, Limit: 10, Period: time.Hour}
	d, err := st.Decide(ctx, "a", p, 5)
	if err != nil || !d.Allowed {
		t.Fatalf("a decision of 5: %+v, %v", d, err)
	}
	replica.Stop()
	defer replica.Cont()
	err = st.Settle(ctx, "a", p, d.At, 5, 2)
	if !errors.Is(err, sluice.ErrUnconfirmed) || errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Fatalf("a refund no replica acknowledged: %v; want ErrUnconfirmed, not ErrStoreUnavailable", err)
	}
	if c, err := st.Decide(ctx, "a", p, 0); err != nil || c.Remaining != 8 {
		t.Fatalf("after the refund of 3: %+v, %v; want 8 left (refunded once)", c, err)
	}
}

// ackLogBuffer is a bytes.Buffer safe for a logger's writes from several goroutines.
type ackLogBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *ackLogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *ackLogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestReplicasAckLostKeepsCharge: a decision whose WAIT gets no answer — the primary froze
// (SIGSTOP) while its replica was acknowledging, as a primary does that dies or hangs before a
// failover — fails with ErrStoreUnavailable and keeps its charge: no give-back is sent, since
// after a failover it would reach a replica that never had the charge and hand out quota nobody
// took (what a Sentinel failover under load showed as over-admission). Once the primary is back,
// the charge is still there. Both a direct call (MaxBatch 1) and the batcher.
func TestReplicasAckLostKeepsCharge(t *testing.T) {
	g := redistest.StartReplicated(t, 1)
	replica := g.Replicas[0]
	for _, maxBatch := range []int{1, 0} {
		t.Run(fmt.Sprintf("MaxBatch=%d", maxBatch), func(t *testing.T) {
			redistest.WaitReplicas(t, g.Primary, 1, 10*time.Second)
			// WAIT blocks inside Redis for up to 2 s; the call gives up at Timeout + that.
			st := openStore(t, g.Primary, redis.Options{ReplicasAck: 1, ReplicasAckTimeout: 2 * time.Second, Timeout: 300 * time.Millisecond,
				MaxBatch: maxBatch, Prefix: fmt.Sprintf("lost%d:", maxBatch)})
			ctx := context.Background()
			p := sluice.Policy{Name: "lost", Algorithm: sluice.FixedWindow, Limit: 5, Period: time.Hour}
			if d, err := st.Decide(ctx, "a", p, 1); err != nil || !d.Allowed {
				t.Fatalf("first decision: %+v, %v; want allowed", d, err)
			}
			calls := st.Stats().Calls

			replica.Stop()
			done := make(chan error, 1)
			go func() {
				d, err := st.Decide(ctx, "a", p, 1)
				if err == nil && d.Allowed {
					err = errors.New("allowed without an acknowledgement")
				}
				done <- err
			}()
			// The script ran and its WAIT is blocked in Redis: then the primary freezes.
			for end := time.Now().Add(10 * time.Second); infoField(t, g.Primary, "clients", "blocked_clients") != "1"; {
				if time.Now().After(end) {
					replica.Cont()
					t.Fatal("no client blocked in WAIT within 10 s")
				}
				runtime.Gosched()
			}
			g.Primary.Stop()
			err := <-done
			// The call goes on a grace beyond its caller to read a late reply (and give back
			// what that says was consumed); Close waits for it, and for any give-back, while the
			// primary is still frozen: its WAIT never answers.
			st.Close()
			g.Primary.Cont()
			replica.Cont()
			if !errors.Is(err, sluice.ErrStoreUnavailable) {
				t.Fatalf("a decision whose WAIT got no answer: %v; want ErrStoreUnavailable", err)
			}
			if got := st.Stats().Calls - calls; got != 1 {
				t.Errorf("%d script calls for the decision, want 1: a give-back was sent for a charge whose primary did not answer WAIT", got)
			}
			redistest.WaitReplicas(t, g.Primary, 1, 10*time.Second)
			check := openStore(t, g.Primary, redis.Options{Prefix: fmt.Sprintf("lost%d:", maxBatch)})
			if d, err := check.Decide(ctx, "a", p, 0); err != nil || d.Remaining != 3 {
				t.Errorf("after the primary came back: %+v, %v; want 3 left (both charges kept)", d, err)
			}
		})
	}
}

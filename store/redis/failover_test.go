package redis_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/store/redis"
)

// Failover tests: real primaries, replicas, sentinels and cluster nodes; the primary SIGKILLed
// under load; the store must follow the failover by itself. Each measures
//
//   - the unavailability window: from the kill until a decision sent after it succeeds (until
//     then every decision fails with ErrStoreUnavailable, and the failure mode would answer);
//   - the over-admission: approvals beyond the limit, counted per key over the whole run. The
//     policy is a token bucket that refills one token in about 21,000 s, so in a run of seconds
//     nothing refills: every approval beyond the limit is quota the failover gave back (writes
//     the primary acknowledged and no replica had when it died).

// failoverPolicy: limit tokens, the bucket refilling over a year (nothing refills in a test).
func failoverPolicy(limit int64) sluice.Policy {
	return sluice.Policy{Name: "failover", Algorithm: sluice.TokenBucket, Limit: limit, Period: 365 * 24 * time.Hour}
}

type failoverResult struct {
	approvals []int64       // per key, over the whole run
	failed    int64         // decisions that failed (all with ErrStoreUnavailable)
	window    time.Duration // from the kill until a decision sent after it succeeded
	over      int64         // Σ over keys of max(0, approvals − limit)
}

// runFailover hammers st from workers goroutines with decisions of cost 1 on keys under p, calls
// kill once 40% of the quota is approved, then after (if any: what the test does once the
// primary is dead, such as waiting for the new one), and goes on until the store has refused
// every key after it recovered — the quota is then spent on the new primary — and returns what
// it measured.
func runFailover(t *testing.T, st sluice.Store, keys []string, p sluice.Policy, workers int, kill, after func()) failoverResult {
	t.Helper()
	base := time.Now()
	now := func() int64 { return int64(time.Since(base)) + 1 } // > 0
	var (
		approvals             = make([]atomic.Int64, len(keys))
		refused               = make([]atomic.Bool, len(keys))
		total, failed, nKeys  atomic.Int64
		killedAt, recoveredAt atomic.Int64
		halfway, recovered    = make(chan struct{}), make(chan struct{})
		done, stop            = make(chan struct{}), make(chan struct{})
		halfOnce, recOnce     sync.Once
		doneOnce              sync.Once
		problemMu             sync.Mutex
		problem               error
	)
	killAt := int64(len(keys)) * p.Limit * 2 / 5
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			ctx := context.Background()
			for n := w; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				k := n % len(keys)
				start := now()
				d, err := st.Decide(ctx, keys[k], p, 1)
				if err != nil {
					failed.Add(1)
					if !errors.Is(err, sluice.ErrStoreUnavailable) {
						problemMu.Lock()
						problem = cmpErr(problem, fmt.Errorf("a decision failed with %v, not ErrStoreUnavailable", err))
						problemMu.Unlock()
					}
					continue
				}
				if k := killedAt.Load(); k != 0 && start > k && recoveredAt.CompareAndSwap(0, now()) {
					recOnce.Do(func() { close(recovered) })
				}
				switch {
				case d.Allowed:
					approvals[k].Add(1)
					if total.Add(1) >= killAt {
						halfOnce.Do(func() { close(halfway) })
					}
				case !d.Cached():
					if r := recoveredAt.Load(); r != 0 && start > r && refused[k].CompareAndSwap(false, true) && nKeys.Add(1) == int64(len(keys)) {
						doneOnce.Do(func() { close(done) })
					}
				}
			}
		})
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()
	select {
	case <-halfway:
	case <-time.After(30 * time.Second):
		t.Fatalf("only %d approvals in 30 s, before the kill", total.Load())
	}
	kill()
	killedAt.Store(now())
	if after != nil {
		after()
	}
	timeout := time.After(30 * time.Second)
	select {
	case <-recovered:
	case <-timeout:
		t.Fatalf("decisions did not resume within 30 s of the kill (%d failed)", failed.Load())
	}
	select {
	case <-done:
	case <-timeout:
		t.Fatalf("the store did not refuse every key within 30 s of the kill (%d of %d keys)", nKeys.Load(), len(keys))
	}
	close(stop)
	wg.Wait()
	stop = make(chan struct{}) // (for the deferred close)
	if problem != nil {
		t.Error(problem)
	}
	r := failoverResult{failed: failed.Load(), window: time.Duration(recoveredAt.Load() - killedAt.Load())}
	for k := range keys {
		r.approvals = append(r.approvals, approvals[k].Load())
		r.over += max(0, approvals[k].Load()-p.Limit)
	}
	return r
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

func failoverKeys(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return keys
}

const (
	failoverWorkers = 32
	failoverLimit   = 1500
)

// TestSentinelFailover: a primary, two replicas and three sentinels; the store knows only the
// sentinels. The primary is killed under load; the sentinels promote a replica, the store
// follows, and decisions resume. Without replicas_ack the failover may give back quota (async
// replication): logged, not asserted — a run may lose nothing.
func TestSentinelFailover(t *testing.T) {
	g := redistest.StartReplicated(t, 2)
	ss := redistest.StartSentinels(t, g.Primary, 3, redistest.SentinelConfig{})
	st, err := redis.New(redis.Options{Sentinel: &redis.Sentinel{Master: ss.Master, Addrs: ss.Addrs()}, Timeout: 250 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	p := failoverPolicy(failoverLimit)
	keys := failoverKeys("sentinel", 4)
	var promoted time.Duration
	r := runFailover(t, st, keys, p, failoverWorkers, g.Primary.Kill, func() {
		start := time.Now()
		ss.WaitNewMaster(g.Primary.Addr, "", 20*time.Second)
		promoted = time.Since(start)
	})
	t.Logf("Sentinel, 2 replicas, no replicas_ack: sentinels reported a new primary %v after the kill; decisions resumed %v after it "+
		"(%d failed meanwhile, all ErrStoreUnavailable); approvals per key %v of %d: over-admission %d",
		promoted.Round(time.Millisecond), r.window.Round(time.Millisecond), r.failed, r.approvals, failoverLimit, r.over)
}

// TestSentinelFailoverReplicasAck: the same with replicas_ack equal to the number of replicas
// (one, then two). Every approval was acknowledged by every replica, so whichever the sentinels
// promote has it: the failover gives back no quota, whatever the timing. (With fewer replicas
// left than replicas_ack, consuming decisions fail until one is replaced: the test restarts the
// dead node as a replica of the new primary, as an operator would, and the window includes that.)
func TestSentinelFailoverReplicasAck(t *testing.T) {
	for _, n := range []int{1, 2} {
		t.Run(fmt.Sprintf("replicas=%d", n), func(t *testing.T) {
			g := redistest.StartReplicated(t, n)
			ss := redistest.StartSentinels(t, g.Primary, 3, redistest.SentinelConfig{})
			st, err := redis.New(redis.Options{Sentinel: &redis.Sentinel{Master: ss.Master, Addrs: ss.Addrs()}, Timeout: 250 * time.Millisecond,
				ReplicasAck: n})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			p := failoverPolicy(failoverLimit)
			keys := failoverKeys(fmt.Sprintf("acked-%d", n), 4)
			var promoted, replaced time.Duration
			r := runFailover(t, st, keys, p, failoverWorkers, g.Primary.Kill, func() {
				start := time.Now()
				addr := ss.WaitNewMaster(g.Primary.Addr, "", 20*time.Second)
				promoted = time.Since(start)
				var primary *redistest.Server
				for _, r := range g.Replicas {
					if r.Addr == addr {
						primary = r
					}
				}
				if primary == nil {
					t.Fatalf("new primary %s is none of the replicas", addr)
				}
				g.Primary.RestartAsReplicaOf(addr)
				redistest.WaitReplicas(t, primary, n, 15*time.Second) // the other replica too: the sentinels repoint it
				replaced = time.Since(start)
			})
			t.Logf("Sentinel, %d replicas, replicas_ack %d: new primary %v after the kill, %d replicas again %v after it; decisions resumed %v after it "+
				"(%d failed meanwhile, all ErrStoreUnavailable); approvals per key %v of %d: over-admission %d",
				n, n, promoted.Round(time.Millisecond), n, replaced.Round(time.Millisecond), r.window.Round(time.Millisecond), r.failed, r.approvals, failoverLimit, r.over)
			for k, a := range r.approvals {
				if a > failoverLimit {
					t.Errorf("key %s: %d approvals of a limit of %d: the failover gave back acknowledged quota", keys[k], a, failoverLimit)
				}
			}
		})
	}
}

// TestClusterFailover: a cluster of three masters with a replica each. A store with replicas_ack
// sends WAIT to the node that ran the script. Then a master is killed under load (every key on
// it); its replica takes the slots over, the store follows, and decisions resume.
func TestClusterFailover(t *testing.T) {
	c := redistest.StartClusterReplicas(t, 3, time.Second)
	p := failoverPolicy(failoverLimit)
	var keys []string
	for i := 0; len(keys) < 4; i++ {
		if k := fmt.Sprintf("cluster-%d", i); owner(t, c, redis.DefaultPrefix+"{"+k+"}:"+p.Name) == 0 {
			keys = append(keys, k)
		}
	}

	acked, err := redis.New(redis.Options{Addrs: c.Addrs(), ReplicasAck: 1, Timeout: 250 * time.Millisecond, Prefix: "acked:"})
	if err != nil {
		t.Fatal(err)
	}
	waits := make([]int64, len(c.Servers))
	for i, srv := range c.Servers {
		waits[i] = cmdstat(t, srv, "wait", "calls")
	}
	// The key's slot under the "acked:" prefix: the hash tag decides, so the same node.
	if d, err := acked.Decide(context.Background(), keys[0], p, 1); err != nil || !d.Allowed {
		t.Fatalf("with replicas_ack on a cluster: %+v, %v; want allowed", d, err)
	}
	for i, srv := range c.Servers {
		if got, want := cmdstat(t, srv, "wait", "calls")-waits[i], map[bool]int64{true: 1, false: 0}[i == 0]; got != want {
			t.Errorf("master %d ran WAIT %d times, want %d (WAIT goes to the node that ran the script)", i, got, want)
		}
	}
	// DecideAll across two nodes' slots: checks (no WAIT), then a commit on each node, each
	// confirmed by WAIT there.
	a, b, na, nb := twoNodes(t, c, "across", p.Name)
	for i, srv := range c.Servers {
		waits[i] = cmdstat(t, srv, "wait", "calls")
	}
	out := make([]sluice.Decision, 2)
	if ok, err := acked.DecideAll(context.Background(), a, []sluice.Limit{{Policy: p, Cost: 1}, {Key: b, Policy: p, Cost: 1}}, out); !ok || err != nil {
		t.Fatalf("DecideAll across slots with replicas_ack: %v, %v %+v; want allowed", ok, err, out)
	}
	for i, srv := range c.Servers {
		if got, want := cmdstat(t, srv, "wait", "calls")-waits[i], map[bool]int64{true: 1, false: 0}[i == na || i == nb]; got != want {
			t.Errorf("master %d ran WAIT %d times for DecideAll across the slots of masters %d and %d, want %d", i, got, na, nb, want)
		}
	}
	acked.Close()

	st, err := redis.New(redis.Options{Addrs: c.Addrs(), Timeout: 250 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var promoted time.Duration
	r := runFailover(t, st, keys, p, failoverWorkers, c.Servers[0].Kill, func() {
		start := time.Now()
		c.WaitPromoted(t, 20*time.Second)
		promoted = time.Since(start)
	})
	t.Logf("Cluster, 3 masters with a replica each, no replicas_ack: a replica took over %v after the kill; decisions resumed %v after it "+
		"(%d failed meanwhile); approvals per key %v of %d: over-admission %d",
		promoted.Round(time.Millisecond), r.window.Round(time.Millisecond), r.failed, r.approvals, failoverLimit, r.over)
}

// TestSentinelOptions: Sentinel beside Addrs or URL, or without its master or addresses, is
// refused, naming what is wrong.
func TestSentinelOptions(t *testing.T) {
	sn := &redis.Sentinel{Master: "m", Addrs: []string{"127.0.0.1:26379"}}
	for _, tc := range []struct {
		opts redis.Options
		want string
	}{
		{redis.Options{Sentinel: sn, Addrs: []string{"127.0.0.1:6379"}}, "not several"},
		{redis.Options{Sentinel: sn, URL: "redis://127.0.0.1:6379"}, "not several"},
		{redis.Options{Sentinel: &redis.Sentinel{Addrs: sn.Addrs}}, "Sentinel.Master"},
		{redis.Options{Sentinel: &redis.Sentinel{Master: "m"}}, "Sentinel.Addrs is empty"},
		{redis.Options{Sentinel: &redis.Sentinel{Master: "m", Addrs: []string{"nope"}}}, "Sentinel.Addrs[0]"},
	} {
		if s, err := redis.New(tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			s.Close()
			t.Errorf("New(%+v) = %v, want an error with %q", tc.opts, err, tc.want)
		}
	}
}

// TestSentinelAuth: the primary's password (Options.Password) and the sentinels' own
// (Sentinel.Password) are each used where they belong; a wrong sentinel password is refused at
// New, not retried.
func TestSentinelAuth(t *testing.T) {
	g := redistest.StartReplicated(t, 1, "--requirepass", "primary-pw", "--masterauth", "primary-pw")
	ss := redistest.StartSentinels(t, g.Primary, 1, redistest.SentinelConfig{AuthPass: "primary-pw", RequirePass: "sentinel-pw"})
	st, err := redis.New(redis.Options{Password: "primary-pw",
		Sentinel: &redis.Sentinel{Master: ss.Master, Addrs: ss.Addrs(), Password: "sentinel-pw"}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if d, err := st.Decide(context.Background(), "k", failoverPolicy(5), 1); err != nil || !d.Allowed {
		t.Fatalf("through the sentinel: %+v, %v", d, err)
	}
	if _, err := redis.New(redis.Options{Password: "primary-pw",
		Sentinel: &redis.Sentinel{Master: ss.Master, Addrs: ss.Addrs(), Password: "wrong"}}); err == nil || !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Fatalf("a wrong sentinel password: %v, want an error at New", err)
	}
}

// TestSentinelFailoverLaggingReplica: one replica, which is behind when the primary dies: it
// stops receiving the stream (REPLICAOF a port where nothing listens: it keeps its data and
// waits for a primary that never answers) for 300 ms of load; then the primary is killed — what a
// replica 300 ms behind (a slow or broken link) looks like. (Cutting the link does not do: a
// replica reconnects at once; nor suspending the replica: the kernel's socket buffers take the
// stream and hand it over after the primary died.) The sentinels promote it, and every write it
// never received is quota given back:
//
//   - without replicas_ack the primary answered those decisions allowed, and the failover hands
//     their quota out again: over-admission is about 300 ms of approvals;
//   - with replicas_ack: 1 they were not answered allowed (WAIT timed out: ErrStoreUnavailable,
//     the failure mode decides), so nothing acknowledged is lost: over-admission 0.
//
// The dead node is then restarted as a replica of the new primary (replicas_ack needs one).
func TestSentinelFailoverLaggingReplica(t *testing.T) {
	for _, ack := range []int{0, 1} {
		t.Run(fmt.Sprintf("replicas_ack=%d", ack), func(t *testing.T) {
			g := redistest.StartReplicated(t, 1)
			ss := redistest.StartSentinels(t, g.Primary, 3, redistest.SentinelConfig{})
			st, err := redis.New(redis.Options{Sentinel: &redis.Sentinel{Master: ss.Master, Addrs: ss.Addrs()}, Timeout: 250 * time.Millisecond,
				ReplicasAck: ack})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			p := failoverPolicy(failoverLimit)
			keys := failoverKeys(fmt.Sprintf("lagging-%d", ack), 4)
			const lag = 300 * time.Millisecond
			r := runFailover(t, st, keys, p, failoverWorkers, func() {
				if _, err := g.Replicas[0].Do("REPLICAOF", "127.0.0.1", "1"); err != nil {
					t.Errorf("detaching the replica: %v", err)
				}
				time.Sleep(lag) // the replica's lag: load goes on meanwhile
				g.Primary.Kill()
			}, func() {
				addr := ss.WaitNewMaster(g.Primary.Addr, "", 20*time.Second)
				g.Primary.RestartAsReplicaOf(addr)
				redistest.WaitReplicas(t, g.Replicas[0], 1, 15*time.Second)
			})
			t.Logf("Sentinel, 1 replica lagging %v, replicas_ack %d: decisions resumed %v after the kill (%d failed); approvals per key %v of %d: over-admission %d",
				lag, ack, r.window.Round(time.Millisecond), r.failed, r.approvals, failoverLimit, r.over)
			if ack > 0 && r.over != 0 {
				t.Errorf("replicas_ack %d: over-admission %d, want 0: the failover gave back acknowledged quota", ack, r.over)
			}
		})
	}
}

// TestSentinelUnreachable: with no sentinel answering, New still returns the store, which
// answers ErrStoreUnavailable (the failure mode decides) and keeps trying in the background, as
// with a Redis that does not answer.
func TestSentinelUnreachable(t *testing.T) {
	dead := redistest.Start(t)
	addr := dead.Addr
	dead.Kill() // nothing listens there now
	st, err := redis.New(redis.Options{Sentinel: &redis.Sentinel{Master: "m", Addrs: []string{addr}}})
	if err != nil {
		t.Fatalf("New with no sentinel answering: %v; want a store that connects later", err)
	}
	defer st.Close()
	if _, err := st.Decide(context.Background(), "k", failoverPolicy(5), 1); !errors.Is(err, sluice.ErrStoreUnavailable) ||
		!strings.Contains(err.Error(), `the primary "m" of the sentinels`) {
		t.Fatalf("Decide: %v; want ErrStoreUnavailable naming the sentinels", err)
	}
}

// TestSentinelUnknownMaster: sentinels that answer but monitor no master of that name are a
// configuration error, answered at New (retrying cannot mend it).
func TestSentinelUnknownMaster(t *testing.T) {
	srv := redistest.Start(t)
	ss := redistest.StartSentinels(t, srv, 1, redistest.SentinelConfig{})
	st, err := redis.New(redis.Options{Sentinel: &redis.Sentinel{Master: "no-such-master", Addrs: ss.Addrs()}})
	if err == nil {
		st.Close()
		t.Fatal("New with a master name the sentinels do not monitor succeeded")
	}
	if !errors.Is(err, sluice.ErrStoreUnavailable) || !strings.Contains(err.Error(), `"no-such-master"`) {
		t.Fatalf("New: %v; want an error naming the master", err)
	}
	t.Log(err)
}

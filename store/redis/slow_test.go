package redis_test

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/store/redis"
)

// slowPolicy never refuses in these tests: every error is the store's.
var slowPolicy = sluice.Policy{Name: "slow", Algorithm: sluice.FixedWindow, Limit: 1 << 40, Period: time.Hour}

// slowLoad runs workers goroutines deciding through g, each on keys of its own, until stop is
// closed; it records the errors that are not ErrStoreSlow, the longest call, whether the breaker
// was ever seen open, and how many calls Redis answered after waiting longer than long.
type slowLoad struct {
	wg             sync.WaitGroup
	stop           chan struct{}
	ending         sync.Once
	calls, decided atomic.Int64
	slow, late     atomic.Int64 // ErrStoreSlow; decided after more than long
	longest        atomic.Int64 // ns, of the calls started after mark
	mark           atomic.Int64 // UnixNano
	mu             sync.Mutex
	failures       []string // errors other than ErrStoreSlow (at most 5)
	opened         atomic.Bool
}

func startSlowLoad(g sluice.Store, workers int, long time.Duration) *slowLoad {
	l := &slowLoad{stop: make(chan struct{})}
	for w := range workers {
		l.wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				if !g.(sluice.Available).Available() {
					l.opened.Store(true)
				}
				start := time.Now()
				out := make([]sluice.Decision, 1)
				_, err := g.DecideAll(bg, fmt.Sprintf("w%d-%d", w, i%50), []sluice.Limit{{Policy: slowPolicy, Cost: 1}}, out)
				took := time.Since(start)
				l.calls.Add(1)
				if start.UnixNano() >= l.mark.Load() {
					for {
						old := l.longest.Load()
						if int64(took) <= old || l.longest.CompareAndSwap(old, int64(took)) {
							break
						}
					}
				}
				switch {
				case err == nil:
					l.decided.Add(1)
					if took > long {
						l.late.Add(1)
					}
				case errors.Is(err, sluice.ErrStoreSlow):
					l.slow.Add(1)
				default:
					l.mu.Lock()
					if len(l.failures) < 5 {
						l.failures = append(l.failures, err.Error())
					}
					l.mu.Unlock()
				}
			}
		})
	}
	return l
}

// end stops the load and waits for its calls; more calls of it do nothing.
func (l *slowLoad) end() {
	l.ending.Do(func() { close(l.stop) })
	l.wg.Wait()
}

// TestSlowRedisKeepsBreakerClosed: a Redis that answers late — every call of several stalls of
// 300 ms (DEBUG SLEEP: Redis busy, as on a loaded machine) waits fifteen times the store's 20 ms
// timeout — is slow, not down: under a load of 8 concurrent callers and then of one caller at a
// time, the breaker (threshold 3) never opens, no call fails, and calls that Redis answered after
// the stall got their decisions (a call waits up to SlowTimeout, 5 s here, for a Redis not known
// to be down). Before, every stall failed the calls in flight at 20 ms, and the third failure
// opened the breaker.
func TestSlowRedisKeepsBreakerClosed(t *testing.T) {
	srv := redistest.Start(t, "--enable-debug-command", "yes")
	const timeout, stall = 20 * time.Millisecond, 300 * time.Millisecond
	st := openStore(t, srv, redis.Options{Timeout: timeout, SlowTimeout: 5 * time.Second, NegativeCacheSize: -1})
	g, err := sluice.Guard(st, sluice.WithBreaker(3, time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	for _, workers := range []int{8, 1} {
		t.Run(fmt.Sprintf("%d-callers", workers), func(t *testing.T) {
			load := startSlowLoad(g, workers, stall/2)
			for range 3 {
				mustDo(t, srv, "DEBUG", "SLEEP", fmt.Sprint(stall.Seconds())) // returns when the stall has ended
				decided := load.decided.Load()
				if !pollUntil(time.Now().Add(5*time.Second), func() bool { return load.decided.Load() > decided }) {
					t.Fatal("no decision after the stall")
				}
			}
			load.end()
			t.Logf("%d calls: %d decided (%d after more than %v), %d slow", load.calls.Load(), load.decided.Load(), load.late.Load(), stall/2, load.slow.Load())
			for _, f := range load.failures {
				t.Errorf("a call failed: %s", f)
			}
			if n := load.slow.Load(); n != 0 {
				t.Errorf("%d calls gave up as slow: a call waits up to SlowTimeout", n)
			}
			if load.opened.Load() || !g.(sluice.Available).Available() {
				t.Error("the breaker opened: a Redis that answers late was taken for a dead one")
			}
			if load.late.Load() == 0 {
				t.Errorf("no call was decided after waiting more than %v: none waited on through a stall", stall/2)
			}
		})
	}
}

// TestDeadRedisOpensBreaker: a Redis that answers nothing is still found down quickly, under a
// load of 8 concurrent callers through a guard (threshold 3): frozen (SIGSTOP), the calls sent
// after Redis's last reply fail as Redis down SlowTimeout S (300 ms) after each was sent, the
// breaker opening with the third — within S + silenceRecheck (10 ms) of the freeze
// (docs/design.md), allowing 500 ms for a busy machine — and no call waits longer than S (+ the
// same allowance); killed, the refused and reset connections are failures at once.
func TestDeadRedisOpensBreaker(t *testing.T) {
	const timeout, slow, allowance = 50 * time.Millisecond, 300 * time.Millisecond, 500 * time.Millisecond
	for _, how := range []string{"frozen", "killed"} {
		t.Run(how, func(t *testing.T) {
			srv := redistest.Start(t)
			st := openStore(t, srv, redis.Options{Timeout: timeout, SlowTimeout: slow, NegativeCacheSize: -1})
			g, err := sluice.Guard(st, sluice.WithBreaker(3, time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			load := startSlowLoad(g, 8, slow)
			defer load.end()
			decided := load.decided.Load()
			if !pollUntil(time.Now().Add(5*time.Second), func() bool { return load.decided.Load() > decided+100 }) {
				t.Fatalf("Redis does not decide: %d calls, %d decided, %d slow, failures %q", load.calls.Load(), load.decided.Load(), load.slow.Load(), load.failures)
			}
			var f *freezer
			if how == "frozen" {
				f = newFreezer(t, srv)
			}
			at := time.Now()
			load.mark.Store(at.UnixNano())
			if f != nil {
				f.freeze()
			} else {
				srv.Kill()
			}
			if !pollUntil(at.Add(10*time.Second), func() bool { return !g.(sluice.Available).Available() }) {
				t.Fatal("the breaker did not open")
			}
			opened := time.Since(at)
			bound := 150 * time.Millisecond // killed: at once
			if how == "frozen" {
				bound = slow + 10*time.Millisecond
			}
			load.end()
			longest := time.Duration(load.longest.Load())
			t.Logf("%s: the breaker opened %v after (bound %v); the longest call since waited %v", how, opened.Round(time.Millisecond), bound, longest.Round(time.Millisecond))
			if opened > bound+allowance {
				t.Errorf("%s Redis: the breaker opened %v after; want within %v (+%v)", how, opened, bound, allowance)
			}
			if longest > slow+allowance {
				t.Errorf("%s Redis: a call waited %v; want at most SlowTimeout %v (+%v)", how, longest, slow, allowance)
			}
		})
	}
}

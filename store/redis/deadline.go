package redis

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
)

// Deadlines: a call the store gave up on uses no quota.
//
// The store bounds every call (Options.SlowTimeout, or Options.Timeout while Redis is known down:
// life.go; and the caller's context); when the bound passes, the caller is told the store is
// unavailable — the gateway answers "503, used no quota". But a
// Redis that hangs (a stopped process, a stalled host) still has the call on its socket, and runs
// it when it resumes. So each script call carries its deadline on Redis's clock, and a script
// that runs after it decides nothing and writes nothing (lua/common.lua, DEADLINES).
//
// Redis's clock is not ours. Let off be Redis TIME minus this process's monotonic clock (µs) —
// a constant while neither clock is stepped, and drifting slowly with their rates. A call the
// store gives up on at local time D (its context's deadline) must not run at any Redis time
// after D + off. The store sends D + est, for an estimate est ≤ off: the script then refuses
// whenever it runs after D + est, which includes every moment after D + off (and, if est < off,
// a little before: a call that arrives in time, but only just, is refused too — which is safe,
// the caller is told "unavailable" and nothing was consumed). An estimate above off would let a
// call that arrives up to (est − off) after the caller gave up consume: the one unsafe direction.
//
// Every reply carries Redis TIME t of the moment the script ran, some local moment between the
// call's send and the reply's receipt r. So t − r ≤ off: each reply gives a lower bound, its
// error the time the reply took to come back (the round trip, at most). The estimate is the
// largest lower bound of the last one to two seconds (offsetWindow: the tightest, from the
// quickest replies), less deadlineMargin for the clocks' drift in that time:
//
//   - per hash slot on a Redis Cluster, since each node has its own clock (one for a single
//     server), learned from the replies of the slot's calls;
//   - and at least a floor: every node's own lower bound, measured with TIME every offsetWindow
//     (and at connection), the smallest of them — safe for any slot — less drift at maxDrift
//     (200 ppm) for the time since each was measured, which covers a quiet slot, a hang, or
//     nodes that stop answering.
//
// Limits: a step of Redis's clock backward by s makes est too high by s
// until the samples from before it age out (2·offsetWindow): a call queued on a hung Redis in
// those two seconds may consume if it runs less than s after its caller gave up. A step forward
// makes est too low: calls are refused early (and nothing consumed) until the next sample —
// which every refusal is, so the next call is decided. A slot that moves to another node (a
// failover, a resharding) keeps the old node's samples up to two seconds: the difference of the
// two clocks, usually well under a millisecond, is the exposure. A call cancelled before its
// deadline (not timed out) may still be decided: Redis cannot know.
//
// With Options.Clock (virtual time, for tests), the scripts read no time of Redis's and no
// deadline is sent: the test's clock is not Redis's, and nothing waits on real time.
const (
	offsetWindow   = time.Second
	deadlineMargin = time.Millisecond
	maxDriftPPM    = 200
)

// offsets estimates Redis's clock minus this process's monotonic clock, in µs, for each slot.
type offsets struct {
	slots []offsetSamples // 1 on a single server; clusterSlots on a cluster

	floorMu sync.Mutex
	nodes   map[string]offsetSample // guarded by floorMu: each node's last TIME measurement
	floor   atomic.Int64            // min over nodes of their bound, drift deducted up to floorAt
	floorAt atomic.Int64            // local µs of floor; 0: never measured
}

// offsetSamples holds the largest lower bound of a slot's replies in the current and the previous
// offsetWindow. Readers take no lock (every decision reads it); writers lock, and only to raise a
// bound or start a window (most replies raise nothing). Writers store cur and prev before epoch,
// so a reader that sees a window sees its bounds; one that sees the older window with newer
// bounds takes bounds that are as fresh or fresher: either way only true lower bounds.
type offsetSamples struct {
	mu        sync.Mutex   // serializes writers
	epoch     atomic.Int64 // the window of cur: local µs / offsetWindow
	cur, prev atomic.Int64 // math.MinInt64: none
}

type offsetSample struct{ bound, at int64 }

func newOffsets(cluster bool) *offsets {
	n := 1
	if cluster {
		n = clusterSlots
	}
	o := &offsets{slots: make([]offsetSamples, n), nodes: map[string]offsetSample{}}
	for i := range o.slots {
		o.slots[i].cur.Store(math.MinInt64)
		o.slots[i].prev.Store(math.MinInt64)
	}
	return o
}

func (o *offsets) samples(slot uint16) *offsetSamples {
	if len(o.slots) == 1 {
		return &o.slots[0]
	}
	return &o.slots[slot]
}

const windowMicros = int64(offsetWindow / time.Microsecond)

// learn records a reply on slot: Redis TIME redisNow, received at local µs received.
func (o *offsets) learn(slot uint16, redisNow, received int64) {
	bound, epoch := redisNow-received, received/windowMicros
	s := o.samples(slot)
	if s.epoch.Load() == epoch && bound <= s.cur.Load() {
		return // not tighter than what the window has
	}
	s.mu.Lock()
	switch e := s.epoch.Load(); {
	case epoch > e:
		if epoch == e+1 {
			s.prev.Store(s.cur.Load())
		} else {
			s.prev.Store(math.MinInt64)
		}
		s.cur.Store(bound)
		s.epoch.Store(epoch)
	case epoch == e:
		s.cur.Store(max(s.cur.Load(), bound))
	case epoch == e-1: // a reply of the previous window, received late by its goroutine
		s.prev.Store(max(s.prev.Load(), bound))
	}
	s.mu.Unlock()
}

// drift is the most two clocks can drift apart in d µs.
func drift(d int64) int64 { return (max(d, 0)*maxDriftPPM + 999_999) / 1_000_000 }

// estimate returns the offset to send deadlines with on slot at local µs now, and false if there
// is none (never measured: no deadline can be given).
func (o *offsets) estimate(slot uint16, now int64) (int64, bool) {
	est := int64(math.MinInt64)
	if at := o.floorAt.Load(); at != 0 {
		est = o.floor.Load() - drift(now-at)
	}
	epoch := now / windowMicros
	s := o.samples(slot)
	switch s.epoch.Load() {
	case epoch:
		est = max(est, s.cur.Load(), s.prev.Load())
	case epoch - 1:
		est = max(est, s.cur.Load())
	}
	if est == math.MinInt64 {
		return 0, false
	}
	return est - int64(deadlineMargin/time.Microsecond), true
}

// measure asks every node for its TIME (in parallel, each bounded by timeout) and updates the
// floor. It returns an error if no node answered; err is the last node's error.
func (o *offsets) measure(ctx context.Context, client rueidis.Client, timeout time.Duration, now func() int64) error {
	nodes := client.Nodes()
	type result struct {
		addr string
		s    offsetSample
		err  error
	}
	results := make(chan result, len(nodes))
	for addr, node := range nodes {
		go func() {
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			t, err := node.Do(ctx, node.B().Time().Build()).AsStrSlice()
			received := now()
			if err == nil {
				var us int64
				if us, err = parseTime(t); err == nil {
					results <- result{addr: addr, s: offsetSample{bound: us - received, at: received}}
					return
				}
			}
			results <- result{addr: addr, err: err}
		}()
	}
	var err error
	answered := 0
	o.floorMu.Lock()
	defer o.floorMu.Unlock()
	for range nodes {
		r := <-results
		if r.err != nil {
			err = r.err
			continue
		}
		answered++
		o.nodes[r.addr] = r.s
	}
	for addr := range o.nodes {
		if _, ok := nodes[addr]; !ok {
			delete(o.nodes, addr) // no longer in the cluster
		}
	}
	if answered == 0 {
		if err == nil {
			err = errors.New("no node to ask")
		}
		return err
	}
	at := now()
	floor := int64(math.MaxInt64)
	for _, s := range o.nodes {
		floor = min(floor, s.bound-drift(at-s.at))
	}
	o.floor.Store(floor) // before floorAt: a reader that sees the new floor with the old time deducts more drift, never less
	o.floorAt.Store(at)
	return nil
}

// parseTime returns TIME's reply in µs.
func parseTime(t []string) (int64, error) {
	if len(t) != 2 {
		return 0, fmt.Errorf("TIME replied %q", t)
	}
	sec, err1 := strconv.ParseInt(t[0], 10, 64)
	us, err2 := strconv.ParseInt(t[1], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("TIME replied %q", t)
	}
	return sec*1_000_000 + us, nil
}

// errDeadlinePassed is the error of a call that reached Redis after its deadline: it decided
// nothing. Redis answered it, late: slow, not down (life.go).
var errDeadlinePassed = fmt.Errorf("%w: %w: redis store: the call reached Redis after its deadline; it decided nothing",
	sluice.ErrStoreUnavailable, sluice.ErrStoreSlow)

const deadlineReply = "sluice: deadline passed: time "

// deadlinePassed reports whether err is a script's deadline error, and the Redis TIME it carries.
func deadlinePassed(err error) (int64, bool) { return replyTime(err, deadlineReply) }

// replyTime returns the time (µs) that follows prefix in the scripts' error reply err, if it is
// one that has it.
func replyTime(err error, prefix string) (int64, bool) {
	re, ok := rueidis.IsRedisErr(err)
	if !ok {
		return 0, false
	}
	msg := re.Error()
	i := strings.Index(msg, prefix)
	if i < 0 {
		return 0, false
	}
	rest := msg[i+len(prefix):]
	if j := strings.IndexByte(rest, ' '); j >= 0 {
		rest = rest[:j]
	}
	t, perr := strconv.ParseInt(rest, 10, 64)
	return t, perr == nil
}

// monoMicros is this process's monotonic clock, µs.
func monoMicros() int64 { return int64(time.Since(processStart) / time.Microsecond) }

// deadlineArg returns the deadline argument of a call on slot that the store gives up on at
// local deadline dl: "" if there is no estimate of Redis's clock (or with a Clock).
func (c *conn) deadlineArg(slot uint16, dl time.Time) string {
	est, ok := c.estimate(slot)
	return deadlineArg(est, ok, dl)
}

// estimate is the offsets' estimate for slot now; false with a Clock, or before any sample.
func (c *conn) estimate(slot uint16) (int64, bool) {
	if c.offsets == nil {
		return 0, false
	}
	return c.offsets.estimate(slot, monoMicros())
}

// deadlineArg is the deadline argument for the local deadline dl with the estimate est (if ok).
func deadlineArg(est int64, ok bool, dl time.Time) string {
	if !ok {
		return ""
	}
	return strconv.FormatInt(int64(dl.Sub(processStart)/time.Microsecond)+est, 10)
}

// learn records the Redis TIME of a reply on slot, received now.
func (c *conn) learn(slot uint16, redisNow int64) {
	if c.offsets != nil {
		c.offsets.learn(slot, redisNow, monoMicros())
	}
}

// refresh measures the nodes' clocks every offsetWindow until stop is closed.
func (c *conn) refresh(stop <-chan struct{}, timeout time.Duration) {
	defer close(c.refreshed)
	t := time.NewTicker(offsetWindow)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			_ = c.offsets.measure(context.Background(), c.client, timeout, monoMicros) // a node that does not answer keeps its last bound, drifting
		}
	}
}

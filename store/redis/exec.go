package redis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
)

// THE EXECUTOR. Every script call of the store — Decide's single script, the batcher's batch and
// single calls, DecideAll's multi and conc scripts, settlements, lease releases and renewals —
// goes through run, which owns, once each:
//
//   - the arguments: the job (what differs between the kinds of calls) writes them, given the
//     deadline on Redis's clock (deadline.go) and the instant whose calendar windows it passes;
//   - the calendar retry: a reply saying Redis's time is outside the windows passed (nothing
//     written) is asked once more with the windows around the time it names (calendar.go);
//   - replicas_ack's WAIT (wait.go), and what a decision WAIT did not confirm consumed: given back
//     if WAIT answered, kept if the primary did not answer it;
//   - the reply's length, and learning Redis's time from it (deadline.go);
//   - the mapping of errors: a deadline passed, a calendar out of range, an actual cost over
//     the limit, everything else unavailable;
//   - the call's deadline, and what a call that ends without a reply says of Redis: slow or down
//     (life.go), from whether Redis answered anything since it was sent;
//   - late replies: a decision the caller stopped waiting for (its context ended) whose reply
//     still comes, and says it consumed, is given back (giveBack), so that "unavailable: used no
//     quota" holds for replies that arrive after the caller gave up, not only for calls that reach
//     Redis after their deadline.
//
// What the negative cache remembers and forgets is decided where decisions are made of replies
// (Store.noteDecision); settlements publish their keys for every instance's cache (negcache.go).

// job is what one kind of script call brings to the executor.
type job interface {
	// arguments returns the call's arguments, with f's deadlines and calendar windows.
	arguments(f *frame) ([]string, error)
	// consumed reports whether reply (whose length the executor checked) says the call consumed
	// quota: what WAIT confirms, and what a reply nobody waits for any more gives back.
	consumed(reply []int64) bool
	// giveBack returns what undoes what reply consumed (nil if nothing can be: a settlement).
	giveBack(reply []int64) []refund
}

// frame is what the executor gives a job to write its arguments with.
type frame struct {
	s    *Store
	est  int64 // the estimate of Redis's clock (deadline.go), if ok
	ok   bool
	by   time.Time // when the call is given up: the latest deadline any of its scripts gets
	inst int64     // the instant (µs) whose calendar windows calendar policies pass
}

// deadline is the deadline argument of a script whose caller gives up at dl (or at the call's
// own bound, if sooner).
func (f *frame) deadline(dl time.Time) string {
	if f.by.Before(dl) {
		dl = f.by
	}
	return deadlineArg(f.est, f.ok, dl)
}

// request is one script call: the program, its keys and what the executor does around it.
type request struct {
	p        *program
	keys     []string
	want     int       // numbers in a reply: 6 per decision then the time; 2 for settlements and leases
	calendar bool      // the arguments pass calendar windows around inst: a miss is asked once more
	inst     int64     // the first attempt's instant for calendar windows (µs)
	consumes bool      // the call may consume: confirmed by WAIT under replicas_ack
	decides  bool      // a decision: a late reply, or one WAIT did not confirm, is given back
	worker   bool      // ctx is the batcher's worker's, which outlives its callers (batch.go)
	by       time.Time // when the caller stops waiting: the scripts' deadline
}

// lateGrace is how much longer than its callers a decision's call waits for its reply (the
// batcher's worker, or a goroutine of its own), to give back what a late one consumed: at least a
// second, so that a stalled or loaded process still reads it.
func (s *Store) lateGrace() time.Duration { return max(s.timeout, time.Second) }

// run makes the call r of j on c and returns its reply, of r.want numbers. On an error nothing
// was consumed, or it is being given back; except for a settlement WAIT did not confirm
// (ErrUnconfirmed: it was applied).
func (s *Store) run(ctx context.Context, c *conn, r *request, j job) ([]int64, error) {
	sl := c.slot(r.keys[0])
	// The call's deadline: r.by, or T from now if Redis is known down (life.go); its scripts
	// carry it, and its caller waits until then.
	sent := time.Now()
	by := s.deadline(c, sl, sent, r.by, s.callTimeout(r.consumes))
	f := frame{s: s, by: by, inst: r.inst}
	f.est, f.ok = c.estimate(sl)
	for attempt := 0; ; attempt++ {
		args, err := j.arguments(&f)
		if err != nil {
			return nil, err
		}
		s.calls.Add(1)
		a := ack{job: j}
		wait := &a
		if s.acks == nil || !r.consumes {
			wait = nil
		} else {
			a.primary = c.primary()
		}
		res, gone := s.send(ctx, c, sl, r, j, args, wait, sent, by)
		if gone != nil {
			return nil, gone // (the call goes on, and gives back what it consumed)
		}
		if err := res.NonRedisError(); err != nil && (ctx.Err() != nil || timeout(err)) {
			return nil, s.timedOut(c, sl, sent) // (slow or down: life.go)
		}
		reply, err := res.AsIntSlice()
		if err != nil {
			if t, miss := calendarMiss(err); miss && r.calendar {
				if attempt == 0 { // nothing written: once more, around Redis's time
					f.inst = t
					continue
				}
				return nil, fmt.Errorf("%w: %w: redis store: %v", sluice.ErrStoreUnavailable, errCalendarRange, err)
			}
			return nil, c.failed(sl, err)
		}
		if len(reply) != r.want {
			return nil, fmt.Errorf("%w: redis store: script replied %d numbers, want %d", sluice.ErrStoreUnavailable, len(reply), r.want)
		}
		c.learn(sl, reply[r.want-1])
		if a.err != nil { // consumed, and not on enough replicas
			if !r.decides {
				return reply, fmt.Errorf("%w: %v", sluice.ErrUnconfirmed, a.err)
			}
			s.giveBackAfter(&a, j.giveBack(reply))
			return reply, unavailable(a.err)
		}
		return reply, nil
	}
}

// send sends the call and returns its result; gone: the caller stopped waiting first (ctx
// ended, or the call's deadline by passed: await, which says whether Redis is slow or down), and
// why. A decision's direct call runs in a
// goroutine of its own, on a context lateGrace longer than the caller's, so that a reply that
// comes after the caller gave up is still read and what it consumed given back; the batcher's
// worker does the same for its calls (batch.go).
func (s *Store) send(ctx context.Context, c *conn, sl uint16, r *request, j job, args []string, wait *ack, sent, by time.Time) (rueidis.RedisResult, error) {
	if r.worker || !r.decides {
		return s.exec(ctx, c, r.p, r.keys, args, wait), nil
	}
	h := &lateCall{}
	h.done = make(chan struct{})
	if wait != nil {
		h.a = &ack{job: j, primary: wait.primary}
	}
	lctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), by.Add(s.lateGrace()))
	s.bg.Add(1)
	go h.run(s, lctx, cancel, c, r.p, r.keys, args, j, r.want)
	if err := s.await(ctx, c, sl, &h.handoff, sent, by); err != nil {
		return rueidis.RedisResult{}, err
	}
	if wait != nil {
		wait.err, wait.lost = h.a.err, h.a.lost
	}
	return h.res, nil
}

// lateCall is a direct decision's call running on beyond its caller.
type lateCall struct {
	handoff
	res rueidis.RedisResult
	a   *ack // nil: no WAIT
}

func (h *lateCall) run(s *Store, ctx context.Context, cancel context.CancelFunc, c *conn, p *program, keys, args []string, j job, want int) {
	defer s.bg.Done()
	defer cancel()
	h.res = s.exec(ctx, c, p, keys, args, h.a)
	if h.deliver() {
		return
	}
	if reply, err := h.res.AsIntSlice(); err == nil && len(reply) == want && j.consumed(reply) {
		s.giveBackAfter(h.a, j.giveBack(reply)) // nobody waits for it: what it consumed goes back
	}
}

// handoff hands a reply to a caller that may stop waiting first: exactly one of deliver and
// abandon succeeds.
type handoff struct {
	state atomic.Int32 // waiting, delivered or abandoned
	done  chan struct{}
}

const (
	waiting int32 = iota
	delivered
	abandoned
)

// deliver reports whether the caller still waits, and if so wakes it.
func (h *handoff) deliver() bool {
	if !h.state.CompareAndSwap(waiting, delivered) {
		return false
	}
	close(h.done)
	return true
}

// abandon reports whether the caller gave up before the reply was delivered; if false, done is
// (or is about to be) closed.
func (h *handoff) abandon() bool { return h.state.CompareAndSwap(waiting, abandoned) }

// refund is what gives back one charge: a settlement to 0 at the decision's instant, or for a
// concurrency limit the release of its lease.
type refund struct {
	key   string
	p     sluice.Policy
	at    int64
	cost  int64
	lease uint64 // concurrency: the lease to release
}

// maxRefunding bounds the give-backs in flight.
const maxRefunding = 64

// refund gives back rs in the background, at most maxRefunding at once (Close waits for them).
func (s *Store) refund(rs []refund) { s.refundOn("", rs) }

// giveBackAfter gives back rs, what a call consumed that its caller is told it did not: a call
// without replicas_ack's WAIT (a nil), or whose WAIT fell short. A WAIT that got no answer keeps
// the charges (the primary may be gone), and one that answered gives them back only to the
// primary that took them (refundOn; wait.go says why).
func (s *Store) giveBackAfter(a *ack, rs []refund) {
	switch {
	case a == nil:
		s.refund(rs)
	case !a.lost:
		s.refundOn(a.primary, rs)
	}
}

// refundOn is refund for charges made on primary (its address; "" if not known, or a cluster),
// which are given back only while the store still sends to it: after a failover, a give-back
// would reach the promoted replica, which may never have had the charges, and hand out quota
// nobody took (replicas_ack's WAIT fell short, wait.go); the charges died with the old primary or
// stay spent there, erring towards refusing.
func (s *Store) refundOn(primary string, rs []refund) {
	if len(rs) == 0 {
		return
	}
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		s.refunding <- struct{}{}
		defer func() { <-s.refunding }()
		for _, r := range rs {
			if primary != "" {
				if c, err := s.connected(); err != nil || c.primary() != primary {
					s.log.Warn("redis store: the quota of a decision answered as unavailable is not given back: the primary that took it is no longer the store's",
						"policy", r.p.Name, "primary", primary)
					continue
				}
			}
			s.giveBackOne(&r)
		}
	}()
}

// giveBackOne gives back r, on a bound of its own (the caller's is long gone), at least a second;
// once more if the call decided nothing (it reached Redis after its deadline), never if it may
// have been applied (a settlement is not idempotent).
func (s *Store) giveBackOne(r *refund) {
	timeout := max(s.callTimeout(true), time.Second)
	var err error
	for range 3 {
		if r.p.Algorithm == sluice.Concurrency {
			err = s.lease(context.Background(), timeout, "release", r.key, r.p, r.lease)
		} else {
			err = s.settleWithin(context.Background(), timeout, r.key, r.p, r.at, r.cost, 0)
		}
		if !errors.Is(err, errDeadlinePassed) {
			break
		}
	}
	if err != nil && !errors.Is(err, sluice.ErrUnconfirmed) {
		s.log.Warn("redis store: could not give back the quota of a decision answered as unavailable", "policy", r.p.Name, "error", err.Error())
	}
}

// failed returns the error of a script call on slot that failed with err: errDeadlinePassed if
// the script came after its deadline (and its Redis TIME is learned: the reply did arrive),
// ErrCostExceedsLimit for a settlement's actual cost beyond its policy, else unavailable.
func (c *conn) failed(slot uint16, err error) error {
	if t, ok := deadlinePassed(err); ok {
		c.learn(slot, t)
		return errDeadlinePassed
	}
	if re, ok := rueidis.IsRedisErr(err); ok && strings.Contains(re.Error(), "sluice: actual ") {
		return fmt.Errorf("%w: %v", sluice.ErrCostExceedsLimit, re.Error())
	}
	return unavailable(err)
}

// timeout reports whether err is a timeout: this call's, or one that broke the connection it
// shared (rueidis fails every call waiting on a connection whose own call timed out). Judged by
// whether Redis answers (life.go), unlike a refused or reset connection, a failure at once.
func timeout(err error) bool {
	var netErr net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &netErr) && netErr.Timeout())
}

// decisionOf is the decision of a script's six numbers r, made at the script's time at.
func decisionOf(r []int64, at int64) sluice.Decision {
	d := algorithm.MakeDecision(r[0] == 1, r[1], r[2], r[3], r[4], r[5])
	d.At = at // the script's now: what a settlement of the charge takes
	return d
}

package redis

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
)

// SLOW OR DOWN. A call that gets no reply in time is not evidence that Redis is down: on a busy
// machine (more runnable processes than cores) Redis and this process are scheduled late, and
// replies come late. A Redis that is down answers nothing at all: killed, its connections are
// refused or reset (an error at once, a failure as it always was); frozen (SIGSTOP, a stalled
// host or VM), its sockets accept and nothing comes back. So the store tells the two apart by
// whether Redis answers anything — any call's reply, on time or late, or a script's error reply —
// on the call's slot (one for a single server; a Redis Cluster's hash slot, which one node
// answers). With T = Options.Timeout and S = Options.SlowTimeout (S ≥ T):
//
//   - A call waits for its reply up to S from when it was sent, and its script carries that
//     bound as its deadline on Redis's clock (deadline.go): what the caller waits, and no more.
//   - A call that ends without a reply is Redis down if Redis answered nothing at all since the
//     call was sent — S of silence: ErrStoreUnavailable alone, a failure the breaker counts —
//     and otherwise slow (Redis answered other calls meanwhile, or a script's deadline passed):
//     ErrStoreUnavailable wrapping sluice.ErrStoreSlow, which the guard answers by the failure
//     mode and the breaker does not count.
//   - Once Redis is found down, a call sent before any reply comes waits only T (T plus
//     replicas_ack's WAIT, for a call that may consume), which its script carries as its
//     deadline: T without a reply is all it waits for a Redis known not to answer (the
//     breaker's probe is such a call), and it is down too. Any reply ends it: calls wait S again.
//   - A call given up on is still read (its late reply given back, exec.go), and its reply
//     counts as Redis answering.
//
// So a Redis that answers within S, however late, fails no call and opens no breaker; a frozen
// one fails the calls sent after its last reply at S after each was sent, and every call after
// the first of them at T. Before a call believes Redis silent it gives the process a moment
// (silenceRecheck) to read what has arrived: a process that resumes from a stall runs its expired
// timers before the goroutines whose sockets became readable, so a timer can fire with replies
// sitting unread. (Its deadline has passed by then: nothing can be decided meanwhile.)
type slotLife struct {
	heard atomic.Int64 // monoMicros of the last reply received on the slot; 0: none yet
	down  atomic.Int64 // heard when Redis was last found down; down == heard: it still is
}

// silenceRecheck is how long a call that finds Redis silent waits once more before it believes
// it (see above): enough for a scheduler round (Go polls the network at the latest every 10 ms).
const silenceRecheck = 10 * time.Millisecond

func newLife(cluster bool) []slotLife {
	n := 1
	if cluster {
		n = clusterSlots
	}
	l := make([]slotLife, n)
	for i := range l {
		l[i].down.Store(-1)
	}
	return l
}

// life is slot's record of Redis's replies.
func (c *conn) life(slot uint16) *slotLife {
	if len(c.lives) == 1 {
		return &c.lives[0]
	}
	return &c.lives[slot]
}

// answered records a reply on slot, received now.
func (c *conn) answered(slot uint16) { c.life(slot).heard.Store(monoMicros()) }

// micros is t on monoMicros's clock.
func micros(t time.Time) int64 { return int64(t.Sub(processStart) / time.Microsecond) }

// isDown reports whether Redis was found down on l and has answered nothing since.
func (l *slotLife) isDown() bool { return l.down.Load() == l.heard.Load() }

// deadline is when a call on slot sent at sent gives up, at the latest: hard (S from sent, or the
// caller's deadline if sooner), or soft from sent if Redis is known down.
func (s *Store) deadline(c *conn, slot uint16, sent, hard time.Time, soft time.Duration) time.Time {
	if c.life(slot).isDown() {
		if dl := sent.Add(soft); dl.Before(hard) {
			return dl
		}
	}
	return hard
}

// await waits for h's reply until ctx ends or until by (the call's deadline, from s.deadline):
// nil once delivered (the caller reads it), else the error to answer with, the call abandoned
// (whoever gets its reply gives back what it consumed). sent is when the call was sent (or
// queued).
func (s *Store) await(ctx context.Context, c *conn, slot uint16, h *handoff, sent, by time.Time) error {
	t := deadlineTimers.Get().(*time.Timer)
	defer func() {
		t.Stop() // (since Go 1.23, nothing is received from a stopped timer: it can be reused)
		deadlineTimers.Put(t)
	}()
	t.Reset(time.Until(by))
	var why error
	for doubted := false; why == nil; doubted = true {
		select {
		case <-h.done:
			return nil
		case <-ctx.Done():
			why = unavailable(ctx.Err())
		case <-t.C:
			if why = s.verdict(c.life(slot), micros(sent), monoMicros(), !doubted); why == nil {
				t.Reset(silenceRecheck)
			}
		}
	}
	if h.abandon() {
		return why
	}
	<-h.done // delivered meanwhile: the answer stands
	return nil
}

// verdict is the error of a call on l sent at sent that ends without a reply at now (µs): slow if
// Redis answered since sent, or if the call's bound was shorter than S (a settlement's, a lease's)
// and Redis is not known down; else down — or, if doubt, nil: look once more, after
// silenceRecheck, before finding Redis down.
func (s *Store) verdict(l *slotLife, sent, now int64, doubt bool) error {
	h := l.heard.Load()
	switch {
	case h > sent:
		return errSlow(now-sent, "Redis answered other calls meanwhile")
	case l.down.Load() == h:
		return errDown(now - max(h, sent))
	case now-sent < int64(s.slow/time.Microsecond):
		return errSlow(now-sent, "Redis is not known to be down")
	case doubt:
		return nil
	}
	l.down.Store(h)
	return errDown(now - sent)
}

// timedOut is the error of a call on slot, sent at sent, that ran out of time without waiting
// in await (a settlement, a lease, a call queued behind a full queue), or whose connection broke
// with a timeout.
func (s *Store) timedOut(c *conn, slot uint16, sent time.Time) error {
	return s.verdict(c.life(slot), micros(sent), monoMicros(), false)
}

func errDown(silence int64) error {
	return fmt.Errorf("%w: redis store: Redis has answered nothing for %v (down or frozen)",
		sluice.ErrStoreUnavailable, (time.Duration(silence) * time.Microsecond).Round(time.Millisecond))
}

func errSlow(waited int64, why string) error {
	return fmt.Errorf("%w: %w: redis store: no reply within %v; %s (slow, not down)",
		sluice.ErrStoreUnavailable, sluice.ErrStoreSlow, (time.Duration(waited) * time.Microsecond).Round(time.Millisecond), why)
}

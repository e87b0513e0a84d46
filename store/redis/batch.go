package redis

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
)

// batcher decides the requests that wait at the same moment with as few script calls
// (batch.lua) as it can instead of one each. A request never waits for a batch to fill: a
// batch is whatever is waiting when a call can be sent, so a quiet store sends batches of one.
//
// On a single server, each of a few workers takes whatever requests are queued, up to max, and
// sends them as one call; workers run concurrently, so batches pipeline too.
//
// On a Redis Cluster a script's keys must share a hash slot, so batches are per slot (all of one
// client's keys share one): a request whose slot has no call in flight is sent at once, from its
// own goroutine, as a batch of one; those that arrive for the slot while a call is in flight wait
// and go together in the next call. Busy slots (a hot client) get batches; the rest go one by one.
type batcher struct {
	s       *Store
	c       *conn
	script  *program // batch.lua; a batch of one is sent as its algorithm's single script (smaller, faster)
	cluster bool
	queue   chan *call  // single server
	slots   []slotQueue // cluster: by hash slot
	max     int
	stop    chan struct{}
	closing sync.Once
	stopped sync.WaitGroup
}

// slotQueue holds the requests for one hash slot that arrived while a call to it was in flight.
type slotQueue struct {
	mu      sync.Mutex
	busy    bool    // a call to the slot is in flight
	waiting []*call // for the next call
	w       *worker // the slot's scratch space, made at its first call (one call at a time uses it)
	first   [1]*call
}

// call is one decision of one key: waiting for its batch, or sent alone through the executor
// as its algorithm's single script (it is then the executor's job: Decide without batching, a
// batch of one, a calendar decision asked again around Redis's time).
type call struct {
	handoff         // the reply to a caller that may stop waiting first
	key      string // the client's key (what gives back a charge nobody waits for)
	p        sluice.Policy
	cost     int64
	cal      bool  // a calendar policy: args[2] is its windows around inst (calendar.go)
	inst     int64 // the instant of args[2]'s windows
	keys     [2]string
	args     [5]string
	argv     [8]string // the single script's arguments (scratch)
	sent     time.Time // when the caller asked (its timeout runs from then: await)
	deadline time.Time // when the caller stops waiting, at the latest
	slot     uint16    // keys' hash slot, on a cluster
	reply    [7]int64  // the script's reply: the decision, then its time
	err      error
}

const (
	batchWorkers = 4
	clusterSlots = 16384
)

func newBatcher(s *Store, c *conn, max int, cluster bool) *batcher {
	b := &batcher{s: s, c: c, script: s.batch, cluster: cluster, max: max, stop: make(chan struct{})}
	if cluster {
		b.slots = make([]slotQueue, clusterSlots)
		return b
	}
	b.queue = make(chan *call, 4*batchWorkers*max)
	for i := 0; i < batchWorkers; i++ {
		b.stopped.Add(1)
		go b.work()
	}
	return b
}

// newCall returns a call for the decision of key under p at cost on the keys hash and log with
// args (single.lua's ARGV[1..5]; for a calendar policy, its windows around inst), whose caller
// asked at sent and waits until deadline at the latest.
func newCall(key string, p *sluice.Policy, cost int64, hash, log string, args [5]string, inst int64, sent, deadline time.Time) *call {
	c := &call{key: key, p: *p, cost: cost, cal: p.Calendar != algorithm.NoCalendar, inst: inst,
		keys: [2]string{hash, log}, args: args, sent: sent, deadline: deadline}
	c.done = make(chan struct{})
	return c
}

// request is the executor's request for c alone (its algorithm's single script), given up at by.
func (c *call) request(s *Store, by time.Time, worker bool) request {
	p := s.single[c.p.Algorithm]
	if c.cal {
		p = s.calSingle[c.p.Algorithm]
	}
	return request{p: p, keys: c.keys[:], want: 7, calendar: c.cal, inst: c.inst, consumes: c.cost > 0, decides: true, worker: worker, by: by}
}

// arguments implements job: single.lua's ARGV.
func (c *call) arguments(f *frame) ([]string, error) {
	if c.cal && f.inst != c.inst { // (the executor's second attempt, around Redis's time)
		period, err := calendarArg(&c.p, f.inst)
		if err != nil {
			return nil, err
		}
		c.args[2], c.inst = period, f.inst
	}
	copy(c.argv[:5], c.args[:])
	c.argv[5], c.argv[6], c.argv[7] = f.s.now(), f.s.slack, f.deadline(c.deadline)
	return c.argv[:], nil
}

func (c *call) consumed(reply []int64) bool { return len(reply) > 0 && reply[0] == 1 && c.cost > 0 }

func (c *call) giveBack(reply []int64) []refund {
	return []refund{{key: c.key, p: c.p, at: reply[len(reply)-1], cost: c.cost}}
}

// wait waits for c's reply, or for ctx to end or c's deadline to pass (await: whether Redis is
// slow or down): then the call is abandoned, and whoever gets its reply gives back what it
// consumed. (The deadline is c's own, not a context's: a context with a timeout, derived from the
// caller's for every decision, cost more than the rest of Decide, on a caller's context that can
// be cancelled — a gRPC call's — whose children are kept in a map under a lock.)
func (b *batcher) wait(ctx context.Context, c *call) error {
	if err := b.s.await(ctx, b.c, c.slot, &c.handoff, c.sent, c.deadline); err != nil {
		return err
	}
	return c.err
}

// deadlineTimers are the stopped timers callers wait on for their calls' deadlines.
var deadlineTimers = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}}

// hand gives c its result (reply and err set); if its caller no longer waits, what the reply
// consumed is given back.
func (s *Store) hand(c *call) {
	if !c.deliver() && c.err == nil && c.consumed(c.reply[:]) {
		s.refund(c.giveBack(c.reply[:]))
	}
}

var errClosed = fmt.Errorf("%w: redis store: closed", sluice.ErrStoreUnavailable)

// decide queues c and waits for its reply, or for ctx to end or c's deadline to pass.
func (b *batcher) decide(ctx context.Context, c *call) error {
	if b.cluster {
		c.slot = slot(c.keys[0])
		return b.decideInSlot(ctx, c)
	}
	select {
	case b.queue <- c:
	default: // the queue is full: wait for room, as long as the caller would for the reply
		t := time.NewTimer(time.Until(c.deadline))
		defer t.Stop()
		select {
		case b.queue <- c:
		case <-ctx.Done():
			return unavailable(ctx.Err())
		case <-t.C:
			return b.s.timedOut(b.c, 0, c.sent)
		case <-b.stop:
			return errClosed
		}
	}
	return b.wait(ctx, c) // (the worker finishes c even if nobody waits)
}

// decideInSlot sends c at once if its slot has no call in flight (and the requests that arrive
// meanwhile then go together in its next call); else c waits for the slot's next call.
func (b *batcher) decideInSlot(ctx context.Context, c *call) error {
	q := &b.slots[c.slot]
	q.mu.Lock()
	select {
	case <-b.stop:
		q.mu.Unlock()
		return errClosed
	default:
	}
	if !q.busy {
		q.busy = true
		q.mu.Unlock()
		// Sent from a goroutine of its own: the call waits a grace beyond its callers for a
		// late reply (exec.go), and c's caller waits only as long as its ctx.
		b.s.bg.Add(1)
		go b.leadFirst(q, c)
		return b.wait(ctx, c)
	}
	q.waiting = append(q.waiting, c)
	q.mu.Unlock()
	return b.wait(ctx, c) // (the slot's next call decides c even if nobody waits)
}

// lead sends batch, all of one slot, then passes on what waits for the slot: to a new
// goroutine, so that the caller of the first request gets its answer without waiting for more.
func (b *batcher) lead(q *slotQueue, batch []*call) {
	if q.w == nil {
		q.w = &worker{b: b}
	}
	q.w.send(batch)
	q.mu.Lock()
	if len(q.waiting) == 0 {
		q.busy = false
		q.mu.Unlock()
		return
	}
	n := min(len(q.waiting), b.max)
	next := slices.Clone(q.waiting[:n])
	q.waiting = append(q.waiting[:0], q.waiting[n:]...)
	clear(q.waiting[len(q.waiting) : len(q.waiting)+n]) // (no stale pointers kept)
	q.mu.Unlock()
	b.s.bg.Go(func() { b.lead(q, next) })
}

// leadFirst is lead of c alone, from a goroutine of the store's.
func (b *batcher) leadFirst(q *slotQueue, c *call) {
	defer b.s.bg.Done()
	q.first[0] = c // (q is busy until lead ends: no other leadFirst of q runs meanwhile)
	b.lead(q, q.first[:])
}

func (b *batcher) work() {
	defer b.stopped.Done()
	batch := make([]*call, 0, b.max)
	w := &worker{b: b}
	for {
		select {
		case c := <-b.queue:
			batch = append(batch[:0], c)
		case <-b.stop:
			b.drain()
			return
		}
	fill:
		for len(batch) < b.max {
			select {
			case c := <-b.queue:
				batch = append(batch, c)
			default:
				break fill
			}
		}
		w.send(batch)
	}
}

// worker is one worker's scratch space, reused from batch to batch; it is the executor's job
// for a batch of several (batch.lua).
type worker struct {
	b     *batcher
	keys  []string
	argv  []string
	live  []*call
	batch []*call // the batch being sent
}

// send decides batch (on a cluster, all of one slot) with one script call through the executor
// (a batch of one: its single script), and hands each call its result. Calls whose callers no
// longer wait are not sent; each call sent carries its deadline — its caller's, or this call's
// own bound if sooner. The worker waits lateGrace longer than that for the reply: a caller that
// stopped waiting meanwhile abandoned its call, and what its reply consumed is given back.
func (w *worker) send(batch []*call) {
	b, s := w.b, w.b.s
	consumes := false
	for _, c := range batch {
		consumes = consumes || c.cost > 0
	}
	timeout := s.hardTimeout(consumes)
	ctx, cancel := context.WithTimeout(context.Background(), timeout+s.lateGrace())
	defer cancel()
	now := time.Now()
	sendBy := now.Add(timeout)
	w.live = w.live[:0]
	for _, c := range batch {
		if now.Before(c.deadline) && c.state.Load() != abandoned {
			w.live = append(w.live, c)
		} else {
			c.err = unavailable(context.DeadlineExceeded)
			c.deliver()
		}
	}
	batch = w.live
	if len(batch) == 0 {
		return
	}
	if len(batch) == 1 {
		w.alone(ctx, batch[0], sendBy, batch[0].inst)
		return
	}
	w.batch = batch
	w.keys = w.keys[:0]
	for _, c := range batch {
		w.keys = append(w.keys, c.keys[0], c.keys[1])
	}
	r := request{p: b.script, keys: w.keys, want: 6*len(batch) + 1, consumes: consumes, decides: true, worker: true, by: sendBy}
	reply, err := s.run(ctx, b.c, &r, w)
	for i, c := range batch {
		switch {
		case err != nil && (reply == nil || (reply[6*i] == 1 && c.cost > 0)):
			c.err = err // (a shortfall of WAIT fails those that consumed, given back: the executor)
		case reply[6*i] == -1:
			c.err = errDeadlinePassed
		case reply[6*i] == -2: // Redis's time is outside the calendar windows passed: asked alone around it
			w.alone(ctx, c, sendBy, reply[6*len(batch)])
			continue
		default:
			copy(c.reply[:6], reply[6*i:6*i+6])
			c.reply[6] = reply[6*len(batch)]
		}
		s.hand(c)
	}
	w.batch = nil
}

// alone decides c with its single script, its windows (if a calendar policy) around inst.
func (w *worker) alone(ctx context.Context, c *call, sendBy time.Time, inst int64) {
	r := c.request(w.b.s, sendBy, true)
	r.inst = inst
	reply, err := w.b.s.run(ctx, w.b.c, &r, c)
	if c.err = err; err == nil {
		copy(c.reply[:], reply)
	}
	w.b.s.hand(c)
}

// arguments implements job: batch.lua's ARGV.
func (w *worker) arguments(f *frame) ([]string, error) {
	w.argv = append(w.argv[:0], strconv.Itoa(len(w.batch)), f.s.now(), f.s.slack)
	for _, c := range w.batch {
		w.argv = append(w.argv, c.args[:]...)
	}
	for _, c := range w.batch {
		w.argv = append(w.argv, f.deadline(c.deadline))
	}
	return w.argv, nil
}

func (w *worker) consumed(reply []int64) bool {
	for i, c := range w.batch {
		if len(reply) > 6*i && reply[6*i] == 1 && c.cost > 0 {
			return true
		}
	}
	return false
}

func (w *worker) giveBack(reply []int64) []refund {
	var rs []refund
	for i, c := range w.batch {
		if reply[6*i] == 1 && c.cost > 0 {
			rs = append(rs, refund{key: c.key, p: c.p, at: reply[len(reply)-1], cost: c.cost})
		}
	}
	return rs
}

// slot is Redis Cluster's hash slot of key: the CRC16 (XMODEM) of its hash tag — the text
// between its first '{' and the first '}' after that, if not empty — or else of the whole key,
// modulo 16384.
func slot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc & 16383
}

// drain fails the calls still queued when the store closes.
func (b *batcher) drain() {
	for {
		select {
		case c := <-b.queue:
			c.err = errClosed
			c.deliver()
		default:
			return
		}
	}
}

func (b *batcher) close() {
	b.closing.Do(func() { close(b.stop) })
	b.stopped.Wait() // (the cluster's slot calls in flight end with the client's closing)
}

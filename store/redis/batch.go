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
	stopped sync.WaitGroup
}

// slotQueue holds the requests for one hash slot that arrived while a call to it was in flight.
type slotQueue struct {
	mu      sync.Mutex
	busy    bool    // a call to the slot is in flight
	waiting []*call // for the next call
}

// call is one decision waiting for its batch.
type call struct {
	alg      algorithm.Algorithm
	cal      bool // a calendar policy: args[2] is its windows (calendar.go)
	keys     [2]string
	args     [5]string
	deadline time.Time // when the caller stops waiting
	slot     uint16    // keys' hash slot, on a cluster
	reply    [7]int64  // the script's reply: the decision, then its time
	err      error
	done     chan struct{} // closed when reply or err is set
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

// newCall returns a call for the decision under algorithm a on the keys hash and log with args,
// whose caller waits until deadline.
func (b *batcher) newCall(a algorithm.Algorithm, hash, log string, args [5]string, deadline time.Time) *call {
	c := &call{alg: a, keys: [2]string{hash, log}, args: args, deadline: deadline, done: make(chan struct{})}
	if b.cluster {
		c.slot = slot(hash)
	}
	return c
}

var errClosed = fmt.Errorf("%w: redis store: closed", sluice.ErrStoreUnavailable)

// decide queues c and waits for its reply, or for ctx to end.
func (b *batcher) decide(ctx context.Context, c *call) error {
	if b.cluster {
		return b.decideInSlot(ctx, c)
	}
	select {
	case b.queue <- c:
	case <-ctx.Done():
		return unavailable(ctx.Err())
	case <-b.stop:
		return errClosed
	}
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		return unavailable(ctx.Err()) // the worker still finishes c; nobody reads it
	}
}

// decideInSlot sends c at once if its slot has no call in flight (and then, before it returns,
// hands the requests that arrived meanwhile to a goroutine of their own); else c waits for the
// slot's next call. The call in flight is bounded by the store's timeout, not by ctx.
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
		b.lead(q, []*call{c})
		return c.err
	}
	q.waiting = append(q.waiting, c)
	q.mu.Unlock()
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		return unavailable(ctx.Err()) // the slot's next call still decides c; nobody reads it
	}
}

// lead sends batch, all of one slot, then passes on what waits for the slot: to a new
// goroutine, so that the caller of the first request gets its answer without waiting for more.
func (b *batcher) lead(q *slotQueue, batch []*call) {
	w := worker{b: b}
	w.send(batch)
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
	go b.lead(q, next)
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

// worker is one worker's scratch space, reused from batch to batch.
type worker struct {
	b          *batcher
	keys, args []string
	live       []*call
}

// send decides batch (on a cluster, all of one slot) with one script call, and hands each call
// its reply. Calls whose callers no longer wait are not sent; each call sent carries its
// deadline — its caller's, or this call's own timeout if sooner.
func (w *worker) send(batch []*call) {
	b := w.b
	consumes := false
	for _, c := range batch {
		consumes = consumes || c.args[4] != "0" // cost
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.s.callTimeout(consumes))
	defer cancel()
	sendBy, _ := ctx.Deadline()
	now := time.Now()
	w.live = w.live[:0]
	for _, c := range batch {
		if now.Before(c.deadline) {
			w.live = append(w.live, c)
		} else {
			c.err = unavailable(context.DeadlineExceeded)
			close(c.done)
		}
	}
	batch = w.live
	if len(batch) == 0 {
		return
	}
	var sl uint16 // the offsets' slot: the batch's on a cluster
	if b.cluster {
		sl = batch[0].slot
	}
	est, ok := b.c.estimate(sl)
	deadline := func(c *call) string {
		if sendBy.Before(c.deadline) {
			return deadlineArg(est, ok, sendBy)
		}
		return deadlineArg(est, ok, c.deadline)
	}
	b.s.calls.Add(1)
	var a ack // one WAIT for the call, whose writes are all on its connection
	wait := b.s.waitFor(consumes, &a, func(reply []int64) bool {
		for i, c := range batch {
			if len(reply) > 6*i && reply[6*i] == 1 && c.args[4] != "0" {
				return true
			}
		}
		return false
	})
	if len(batch) == 1 {
		c := batch[0]
		reply, err := b.s.execSingle(ctx, b.c, c.alg, c.cal, c.keys, c.args, deadline(c), wait).AsIntSlice()
		switch {
		case err != nil:
			c.err = b.c.failed(sl, err)
		case len(reply) != 7:
			c.err = unavailable(fmt.Errorf("script replied %d numbers, want 7", len(reply)))
		case a.err != nil: // consumed, and not on enough replicas
			b.c.learn(sl, reply[6])
			c.err = a.err
		default:
			b.c.learn(sl, reply[6])
			copy(c.reply[:], reply[:7])
		}
		close(c.done)
		return
	}
	w.keys, w.args = w.keys[:0], w.args[:0]
	w.args = append(w.args, strconv.Itoa(len(batch)), b.s.now(), b.s.slack)
	for _, c := range batch {
		w.keys = append(w.keys, c.keys[0], c.keys[1])
		w.args = append(w.args, c.args[:]...)
	}
	for _, c := range batch {
		w.args = append(w.args, deadline(c))
	}
	reply, err := b.s.exec(ctx, b.c, b.script, w.keys, w.args, wait).AsIntSlice()
	if err == nil && len(reply) != 6*len(batch)+1 {
		err = fmt.Errorf("script replied %d numbers, want %d", len(reply), 6*len(batch)+1)
	}
	if err == nil {
		b.c.learn(sl, reply[6*len(batch)])
	}
	for i, c := range batch {
		switch {
		case err != nil:
			c.err = unavailable(err)
		case reply[6*i] == -1:
			c.err = errDeadlinePassed
		case reply[6*i] == -2: // Redis's time is outside the calendar windows passed: see calendar.go
			c.err = fmt.Errorf("%w: redis store: %s%d is outside the calendar windows passed", sluice.ErrStoreUnavailable, calendarReply, reply[6*len(batch)])
		case a.err != nil && reply[6*i] == 1 && c.args[4] != "0": // consumed, not on enough replicas
			c.err = a.err
		default:
			copy(c.reply[:6], reply[6*i:6*i+6])
			c.reply[6] = reply[6*len(batch)]
		}
		close(c.done)
	}
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
			close(c.done)
		default:
			return
		}
	}
}

func (b *batcher) close() {
	close(b.stop)
	b.stopped.Wait() // (the cluster's slot calls in flight end with the client's closing)
}

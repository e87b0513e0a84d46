package sluice

import (
	"container/heap"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// SETTLEMENTS THAT LAND. A settlement is a debt: the usage a response reported beyond its
// estimate, or a refund owed. SettleDecision makes one attempt; Settlements makes the settlement
// land. Its first attempt is made at once, by the caller; one whose outcome the store could not
// confirm (ErrStoreUnavailable: a timeout, a lost connection, the breaker open; or the caller's
// context ended) is queued and retried in the background, with backoff, until it lands or
// RetryFor has passed since the first attempt. Every attempt carries the same id, which the store
// records atomically with the change it makes (OnceSettler): an attempt whose reply was lost but
// which ran is not applied again by a retry. So a settlement is applied at most once, and is
// applied unless it is counted lost:
//
//   - deadline: RetryFor passed without an attempt that landed (the store down that long);
//   - full: MaxPending settlements were waiting already (memory stays bounded whatever the
//     clients send);
//   - shutdown: Close's bound passed with the settlement still waiting;
//   - refused: a retry failed with an error that retrying cannot mend (none of sluice's stores
//     answers one to an attempt that was accepted once; counted rather than retried forever).
//
// A store that is not an OnceSettler gets the one attempt (its error returned), as SettleDecision.

// Defaults of SettlementOptions.
const (
	DefaultSettleRetryFor        = 10 * time.Minute
	DefaultMaxPendingSettlements = 65536
	DefaultSettleBackoff         = 100 * time.Millisecond
	DefaultSettleMaxBackoff      = 5 * time.Second
	defaultSettleParallel        = 16
	maxSettleRound               = 1024 // settlements taken from the queue at once (then it is looked at again)
	settlementIDBytes            = 16   // 8 random bytes of the instance, 8 of a counter
	settlementsLostReasons       = 4
	lostDeadline, lostFull       = 0, 1
	lostShutdown, lostRefused    = 2, 3
)

// SettlementOptions configure Settlements; zero fields take their defaults.
type SettlementOptions struct {
	// RetryFor is how long after its first attempt a settlement is retried: no attempt starts
	// later, and one that has not landed by then is counted lost (deadline). The store keeps
	// each settlement's id until every attempt has run or never will: RetryFor from the first,
	// plus its own bound on a call.
	RetryFor time.Duration
	// MaxPending caps the settlements waiting to be retried: one more that fails is counted
	// lost (full) at once.
	MaxPending int
	// Backoff is the wait before a settlement's first retry, doubled after each (with jitter) up
	// to MaxBackoff.
	Backoff, MaxBackoff time.Duration
}

// ErrSettlementPending is returned by Settlements.Settle and Charge for a settlement whose
// first attempt the store could not confirm: it is queued, and retried until it lands (applied
// once) or is counted lost.
var ErrSettlementPending = errors.New("sluice: settlement not confirmed by the store yet: queued to be retried until it lands")

// ErrSettlementLost wraps the error of a settlement that was given up: counted lost.
var ErrSettlementLost = errors.New("sluice: settlement lost")

// Settlements settles charges on one store so that they land: see SETTLEMENTS THAT LAND. Make one
// per store, for everything that settles on it (the gateway's routes and Envoy's rate limit
// service share the gateway's), and Close it before the store. It is safe for concurrent use.
type Settlements struct {
	store Store
	o     SettlementOptions
	inst  [8]byte       // this Settlements' random half of every id
	seq   atomic.Uint64 // the counter half

	pending atomic.Int64 // queued or being retried
	landed  atomic.Uint64
	lost    [settlementsLostReasons]atomic.Uint64

	mu      sync.Mutex
	queue   settleQueue     // waiting for their next attempt, soonest first
	running bool            // the worker is running
	exited  chan struct{}   // closed when the running worker exits
	wake    chan struct{}   // (buffered) the worker looks again
	closing bool            // Close was called: no more queued; every one attempted now
	ctx     context.Context // the retries'; cancelled when Close gives up
	cancel  context.CancelFunc
}

// pendingSettlement is a settlement waiting for its next attempt.
type pendingSettlement struct {
	key              string
	p                Policy
	d                Decision
	reserved, actual int64
	id               string
	until            time.Time // no attempt starts from then on
	next             time.Time
	backoff          time.Duration
}

// NewSettlements returns Settlements on store (the store that decided: guarded, wrapped, as
// SettleDecision takes it).
func NewSettlements(store Store, o SettlementOptions) *Settlements {
	if o.RetryFor <= 0 {
		o.RetryFor = DefaultSettleRetryFor
	}
	if o.MaxPending <= 0 {
		o.MaxPending = DefaultMaxPendingSettlements
	}
	if o.Backoff <= 0 {
		o.Backoff = DefaultSettleBackoff
	}
	if o.MaxBackoff < o.Backoff {
		o.MaxBackoff = max(o.Backoff, DefaultSettleMaxBackoff)
	}
	s := &Settlements{store: store, o: o, wake: make(chan struct{}, 1)}
	// (math/rand/v2's generator is seeded from the system's entropy in every process; an id need
	// be unique, not secret, and crypto/rand added 160 KB to the web page's wasm.)
	binary.BigEndian.PutUint64(s.inst[:], rand.Uint64())
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

// Settle settles the charge decision d made of reserved on key under p with the real cost actual,
// as SettleDecision, and makes it land: nil once applied (or an error wrapping ErrUnconfirmed:
// applied, not confirmed by enough replicas); ErrSettlementPending if it is queued to be retried;
// an error wrapping ErrSettlementLost if it could not be queued (counted lost); another error
// (an invalid cost, a store that cannot settle) for a settlement that no attempt can make.
func (s *Settlements) Settle(ctx context.Context, key string, p Policy, d Decision, reserved, actual int64) error {
	if !d.Allowed || d.Fallback == FallbackOpen || reserved == actual {
		return nil
	}
	return s.settle(ctx, key, p, d, reserved, actual)
}

// Charge charges cost on key under p where decision d was decided, as ChargeDecision, and makes it
// land as Settle does.
func (s *Settlements) Charge(ctx context.Context, key string, p Policy, d Decision, cost int64) error {
	if d.Fallback == FallbackOpen || cost == 0 {
		return nil
	}
	d.At = SettleNow // as ChargeDecision
	return s.settle(ctx, key, p, d, 0, cost)
}

func (s *Settlements) settle(ctx context.Context, key string, p Policy, d Decision, reserved, actual int64) error {
	if !settlesOnce(s.store, d) {
		return settleWhere(ctx, s.store, key, p, d, reserved, actual, "", 0)
	}
	q := &pendingSettlement{key: key, p: p, d: d, reserved: reserved, actual: actual, id: s.newID(),
		until: time.Now().Add(s.o.RetryFor), backoff: s.o.Backoff}
	err := settleWhere(ctx, s.store, key, p, d, reserved, actual, q.id, s.o.RetryFor)
	if !retryable(err) {
		return err
	}
	return s.enqueue(q, err)
}

// retryable reports whether err leaves a settlement's outcome unknown, or says it was not made:
// the store could not be reached in time, or the caller gave up.
func retryable(err error) bool {
	if err == nil || errors.Is(err, ErrUnconfirmed) {
		return false
	}
	return errors.Is(err, ErrStoreUnavailable) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// newID returns a settlement id unique to this process's Settlements: 32 hexadecimal digits.
func (s *Settlements) newID() string {
	var b [settlementIDBytes]byte
	copy(b[:8], s.inst[:])
	n := s.seq.Add(1)
	for i := range 8 {
		b[8+i] = byte(n >> (56 - 8*i))
	}
	return hex.EncodeToString(b[:])
}

// enqueue queues q after its attempt failed with err, or counts it lost.
func (s *Settlements) enqueue(q *pendingSettlement, err error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		s.lost[lostShutdown].Add(1)
		return fmt.Errorf("%w (shutting down): %w", ErrSettlementLost, err)
	}
	if s.pending.Load() >= int64(s.o.MaxPending) {
		s.lost[lostFull].Add(1)
		return fmt.Errorf("%w (%d settlements pending already): %w", ErrSettlementLost, s.o.MaxPending, err)
	}
	s.pending.Add(1)
	q.next = time.Now().Add(jitter(q.backoff))
	heap.Push(&s.queue, q)
	s.startLocked()
	return ErrSettlementPending
}

// settleQueue is a min-heap of pending settlements by their next attempt (container/heap).
type settleQueue []*pendingSettlement

func (h settleQueue) Len() int           { return len(h) }
func (h settleQueue) Less(i, j int) bool { return h[i].next.Before(h[j].next) }
func (h settleQueue) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *settleQueue) Push(x any)        { *h = append(*h, x.(*pendingSettlement)) }
func (h *settleQueue) Pop() any {
	old := *h
	q := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return q
}

// jitter is d less up to a quarter, at random: retries of many settlements spread out.
func jitter(d time.Duration) time.Duration {
	n := rand.Uint64()
	q := int64(d / 4)
	if q <= 0 {
		return d
	}
	return d - time.Duration(n%uint64(q))
}

// startLocked starts the worker if it is not running, else wakes it; s.mu is held.
func (s *Settlements) startLocked() {
	if s.running {
		select {
		case s.wake <- struct{}{}:
		default:
		}
		return
	}
	s.running = true
	s.exited = make(chan struct{})
	go s.work(s.exited)
}

// work retries the queue's settlements as they come due, up to defaultSettleParallel at once,
// and exits when none is left.
func (s *Settlements) work(exited chan struct{}) {
	defer close(exited)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := time.Now()
		var due []*pendingSettlement
		var next time.Time
		s.mu.Lock()
		if s.ctx.Err() != nil { // Close gave up
			for range s.queue {
				s.lostLocked(lostShutdown)
			}
			clear(s.queue)
			s.queue = s.queue[:0]
		}
		for len(s.queue) > 0 && len(due) < maxSettleRound {
			q := s.queue[0]
			if q.next.After(now) {
				next = q.next
				break
			}
			heap.Pop(&s.queue)
			if !now.Before(q.until) {
				s.lostLocked(lostDeadline)
				continue
			}
			due = append(due, q)
		}
		if len(due) == 0 && len(s.queue) == 0 {
			s.running = false
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		if len(due) > 0 {
			s.attempt(due)
			continue
		}
		timer.Reset(next.Sub(now))
		select {
		case <-timer.C:
		case <-s.wake:
		case <-s.ctx.Done():
		}
	}
}

// lostLocked counts a queued settlement lost; s.mu is held.
func (s *Settlements) lostLocked(reason int) {
	s.lost[reason].Add(1)
	s.pending.Add(-1)
}

// attempt makes one attempt of each of due, up to defaultSettleParallel at once, and requeues
// those whose outcome is still unknown.
func (s *Settlements) attempt(due []*pendingSettlement) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, defaultSettleParallel)
	for _, q := range due {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			keep := time.Until(q.until)
			err := settleWhere(s.ctx, s.store, q.key, q.p, q.d, q.reserved, q.actual, q.id, max(keep, 0))
			s.mu.Lock()
			defer s.mu.Unlock()
			switch {
			case !retryable(err) && err != nil && !errors.Is(err, ErrUnconfirmed):
				s.lostLocked(lostRefused)
			case !retryable(err):
				s.landed.Add(1)
				s.pending.Add(-1)
			default:
				q.backoff = min(2*q.backoff, s.o.MaxBackoff)
				q.next = time.Now().Add(jitter(q.backoff))
				if q.next.After(q.until) {
					q.next = q.until
				}
				heap.Push(&s.queue, q)
			}
		})
	}
	wg.Wait()
}

// Close tries to land every pending settlement at once, and again with backoff, until none is
// left or ctx is done; those still pending then are counted lost (shutdown). Settlements that
// fail after Close are counted lost at once. Close the store afterwards.
func (s *Settlements) Close(ctx context.Context) {
	s.mu.Lock()
	s.closing = true
	now := time.Now()
	for _, q := range s.queue {
		q.next = now // every queued one is attempted now, then with its backoff
	}
	heap.Init(&s.queue)
	exited, running := s.exited, s.running
	if running {
		s.startLocked() // (wakes it)
	}
	s.mu.Unlock()
	if running {
		select {
		case <-exited:
		case <-ctx.Done():
			s.cancel() // the attempts in flight end; the worker counts what is left
			<-exited
		}
	}
	s.cancel()
}

// SettlementStats are a Settlements' figures.
type SettlementStats struct {
	Pending int64  `json:"pending"` // queued or being retried now
	Landed  uint64 `json:"landed"`  // landed on a retry (not the first attempt)
	// Lost, by reason: deadline, full, shutdown, refused (see SETTLEMENTS THAT LAND).
	LostDeadline uint64 `json:"lost_deadline"`
	LostFull     uint64 `json:"lost_full"`
	LostShutdown uint64 `json:"lost_shutdown"`
	LostRefused  uint64 `json:"lost_refused"`
}

// Lost is every settlement counted lost, whatever the reason.
func (st SettlementStats) Lost() uint64 {
	return st.LostDeadline + st.LostFull + st.LostShutdown + st.LostRefused
}

// Stats returns the figures now.
func (s *Settlements) Stats() SettlementStats {
	return SettlementStats{Pending: s.pending.Load(), Landed: s.landed.Load(),
		LostDeadline: s.lost[lostDeadline].Load(), LostFull: s.lost[lostFull].Load(),
		LostShutdown: s.lost[lostShutdown].Load(), LostRefused: s.lost[lostRefused].Load()}
}

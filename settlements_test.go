package sluice_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store/memory"
)

// outage is the memory store, its settlements failing with ErrStoreUnavailable (changing
// nothing) while down is set; it records every attempt's id and instant.
type outage struct {
	*memory.Store
	down     atomic.Bool
	mu       sync.Mutex
	attempts []attempt
}

type attempt struct {
	id string
	at time.Time
}

func (o *outage) SettleOnce(ctx context.Context, key string, p sluice.Policy, at, reserved, actual int64, id string, keep time.Duration) error {
	o.mu.Lock()
	o.attempts = append(o.attempts, attempt{id, time.Now()})
	o.mu.Unlock()
	if o.down.Load() {
		return sluice.ErrStoreUnavailable
	}
	return o.Store.SettleOnce(ctx, key, p, at, reserved, actual, id, keep)
}

func (o *outage) tries() []attempt {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]attempt(nil), o.attempts...)
}

// waitFor polls cond until it holds, failing the test after a generous bound (a loaded machine).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

var tokens = sluice.Policy{Name: "tokens", Algorithm: sluice.FixedWindow, Limit: 1000, Period: 1000 * time.Hour}

// charged decides an estimate of 100 on key, approved.
func charged(t *testing.T, st sluice.Store, key string) sluice.Decision {
	t.Helper()
	d, err := st.Decide(context.Background(), key, tokens, 100)
	if err != nil || !d.Allowed {
		t.Fatalf("decide: %+v %v", d, err)
	}
	return d
}

func remaining(t *testing.T, st sluice.Store, key string) int64 {
	t.Helper()
	d, err := st.Decide(context.Background(), key, tokens, 0)
	if err != nil {
		t.Fatal(err)
	}
	return d.Remaining
}

// TestSettlementsRetryUntilLanded: a settlement the store could not make is queued
// (ErrSettlementPending) and retried with backoff, every attempt with the same id (another
// settlement has another), until the store takes it: then it is applied once (the full usage
// charged), nothing is pending, and nothing was lost. A charge (Envoy's hits_addend) the same.
func TestSettlementsRetryUntilLanded(t *testing.T) {
	st := &outage{Store: memory.New()}
	s := sluice.NewSettlements(st, sluice.SettlementOptions{Backoff: 2 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	defer s.Close(context.Background())
	ctx := context.Background()
	d := charged(t, st, "a")
	st.down.Store(true)
	if err := s.Settle(ctx, "a", tokens, d, 100, 475); !errors.Is(err, sluice.ErrSettlementPending) {
		t.Fatalf("settling while the store is down: %v, want ErrSettlementPending", err)
	}
	if err := s.Charge(ctx, "b", tokens, sluice.Decision{}, 30); !errors.Is(err, sluice.ErrSettlementPending) {
		t.Fatalf("charging while the store is down: %v, want ErrSettlementPending", err)
	}
	if p := s.Stats().Pending; p != 2 {
		t.Fatalf("pending %d, want 2", p)
	}
	waitFor(t, "retries", func() bool { return len(st.tries()) >= 8 })
	if r := remaining(t, st, "a"); r != 900 {
		t.Fatalf("remaining %d while the store is down, want the estimate's 900", r)
	}
	st.down.Store(false)
	waitFor(t, "nothing pending", func() bool { return s.Stats().Pending == 0 })
	if r := remaining(t, st, "a"); r != 525 {
		t.Fatalf("remaining %d once landed, want 525 (475 charged, once)", r)
	}
	if r := remaining(t, st, "b"); r != 970 {
		t.Fatalf("remaining %d once the charge landed, want 970", r)
	}
	ids := map[string]int{}
	for _, a := range st.tries() {
		if len(a.id) != 32 {
			t.Fatalf("id %q: want 32 hexadecimal digits", a.id)
		}
		ids[a.id]++
	}
	if len(ids) != 2 {
		t.Fatalf("%d ids over the attempts of two settlements: %v", len(ids), ids)
	}
	if st := s.Stats(); st.Landed != 2 || st.Lost() != 0 {
		t.Fatalf("stats %+v: want 2 landed, none lost", st)
	}
	// The store up: the first attempt lands, nothing is queued.
	if err := s.Settle(ctx, "a", tokens, charged(t, st, "a"), 100, 0); err != nil || s.Stats().Pending != 0 {
		t.Fatalf("settling on a store that answers: %v, %+v", err, s.Stats())
	}
	// An error no retry mends is returned, not queued.
	if err := s.Settle(ctx, "a", tokens, d, -1, 5); !errors.Is(err, sluice.ErrInvalidCost) || s.Stats().Pending != 0 {
		t.Fatalf("an invalid cost: %v, %+v", err, s.Stats())
	}
}

// TestSettlementsDeadline: a settlement is retried for RetryFor from its first attempt and no
// longer: no attempt starts after it, and then it is counted lost (deadline), its estimate
// standing.
func TestSettlementsDeadline(t *testing.T) {
	st := &outage{Store: memory.New()}
	const retryFor = 150 * time.Millisecond
	s := sluice.NewSettlements(st, sluice.SettlementOptions{RetryFor: retryFor, Backoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	defer s.Close(context.Background())
	d := charged(t, st, "a")
	st.down.Store(true)
	if err := s.Settle(context.Background(), "a", tokens, d, 100, 900); !errors.Is(err, sluice.ErrSettlementPending) {
		t.Fatal(err)
	}
	start := time.Now() // (after the first attempt: RetryFor counts from before it)
	waitFor(t, "the settlement given up", func() bool { return s.Stats().Pending == 0 })
	if st := s.Stats(); st.LostDeadline != 1 || st.Lost() != 1 || st.Landed != 0 {
		t.Fatalf("stats %+v: want one lost at its deadline", st)
	}
	tries := st.tries()
	if len(tries) < 3 {
		t.Fatalf("%d attempts in %v: want it retried", len(tries), retryFor)
	}
	for _, a := range tries {
		if a.at.Sub(start) > retryFor {
			t.Fatalf("an attempt %v after the first: past RetryFor %v", a.at.Sub(start), retryFor)
		}
	}
	st.down.Store(false)
	if r := remaining(t, st, "a"); r != 900 {
		t.Fatalf("remaining %d: a lost settlement leaves the estimate, want 900", r)
	}
}

// TestSettlementsCap: at MaxPending settlements waiting, one more that fails is counted lost
// (full) at once and its error says so; memory stays bounded.
func TestSettlementsCap(t *testing.T) {
	st := &outage{Store: memory.New()}
	s := sluice.NewSettlements(st, sluice.SettlementOptions{MaxPending: 2, Backoff: time.Hour})
	st.down.Store(true)
	for i, key := range []string{"a", "b", "c"} {
		err := s.Charge(context.Background(), key, tokens, sluice.Decision{}, 10)
		switch {
		case i < 2 && !errors.Is(err, sluice.ErrSettlementPending):
			t.Fatalf("charge %d: %v, want pending", i, err)
		case i == 2 && (!errors.Is(err, sluice.ErrSettlementLost) || !errors.Is(err, sluice.ErrStoreUnavailable)):
			t.Fatalf("charge past the cap: %v, want ErrSettlementLost wrapping the store's error", err)
		}
	}
	if st := s.Stats(); st.Pending != 2 || st.LostFull != 1 {
		t.Fatalf("stats %+v: want 2 pending, 1 lost (full)", st)
	}
	// Close, the store still down: the two are tried at once (a backoff of an hour notwithstanding),
	// then counted lost (shutdown) when its bound passes.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	s.Close(ctx)
	if st := s.Stats(); st.Pending != 0 || st.LostShutdown != 2 {
		t.Fatalf("after Close: %+v, want the 2 lost (shutdown)", st)
	}
	if n := len(st.tries()); n < 5 {
		t.Fatalf("%d attempts: Close should have tried the pending ones again", n)
	}
}

// TestSettlementsCloseDrains: Close tries pending settlements at once, whatever their backoff,
// and returns when they have landed; one that fails after Close is counted lost (shutdown).
func TestSettlementsCloseDrains(t *testing.T) {
	st := &outage{Store: memory.New()}
	s := sluice.NewSettlements(st, sluice.SettlementOptions{Backoff: time.Hour})
	d := charged(t, st, "a")
	st.down.Store(true)
	if err := s.Settle(context.Background(), "a", tokens, d, 100, 300); !errors.Is(err, sluice.ErrSettlementPending) {
		t.Fatal(err)
	}
	st.down.Store(false)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s.Close(ctx)
	if ctx.Err() != nil {
		t.Fatal("Close waited for the backoff")
	}
	if r := remaining(t, st, "a"); r != 700 || s.Stats().Pending != 0 || s.Stats().Landed != 1 {
		t.Fatalf("after Close: remaining %d, %+v; want 700, landed", r, s.Stats())
	}
	st.down.Store(true)
	if err := s.Charge(context.Background(), "a", tokens, sluice.Decision{}, 5); !errors.Is(err, sluice.ErrSettlementLost) || s.Stats().LostShutdown != 1 {
		t.Fatalf("a charge failing after Close: %v, %+v; want lost (shutdown)", err, s.Stats())
	}
}

// TestSettlementsOneAttemptWithoutIDs: a store that does not implement OnceSettler gets one
// attempt, its error returned, nothing queued (a retry might settle twice).
func TestSettlementsOneAttemptWithoutIDs(t *testing.T) {
	st := &outage{Store: memory.New()}
	plain := plainSettler{st}
	s := sluice.NewSettlements(plain, sluice.SettlementOptions{})
	defer s.Close(context.Background())
	d := charged(t, st, "a")
	st.down.Store(true)
	if err := s.Settle(context.Background(), "a", tokens, d, 100, 200); !errors.Is(err, sluice.ErrStoreUnavailable) || errors.Is(err, sluice.ErrSettlementPending) {
		t.Fatalf("a store that cannot settle once: %v, want its error", err)
	}
	if s.Stats().Pending != 0 {
		t.Fatal("queued a settlement for a store that cannot settle once")
	}
}

// plainSettler is a store that settles, but not once by id.
type plainSettler struct{ o *outage }

func (p plainSettler) Decide(ctx context.Context, key string, pol sluice.Policy, cost int64) (sluice.Decision, error) {
	return p.o.Decide(ctx, key, pol, cost)
}

func (p plainSettler) DecideAll(ctx context.Context, key string, limits []sluice.Limit, out []sluice.Decision) (bool, error) {
	return p.o.DecideAll(ctx, key, limits, out)
}

func (p plainSettler) Settle(ctx context.Context, key string, pol sluice.Policy, at, reserved, actual int64) error {
	if p.o.down.Load() {
		return sluice.ErrStoreUnavailable
	}
	return p.o.Settle(ctx, key, pol, at, reserved, actual)
}

// TestSettlementsMany: 5,000 settlements of 50 keys pending at once, with backoffs of their own,
// all land once the store takes them again, each applied once: every key is charged exactly its
// usage.
func TestSettlementsMany(t *testing.T) {
	st := &outage{Store: memory.New()}
	s := sluice.NewSettlements(st, sluice.SettlementOptions{Backoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	defer s.Close(context.Background())
	st.down.Store(true)
	const keys, each = 50, 100
	for i := range keys * each {
		key := string(rune('A' + i%keys))
		if err := s.Charge(context.Background(), key, tokens, sluice.Decision{}, 3); !errors.Is(err, sluice.ErrSettlementPending) {
			t.Fatal(err)
		}
	}
	waitFor(t, "every settlement retried", func() bool { return len(st.tries()) >= 2*keys*each })
	st.down.Store(false)
	waitFor(t, "nothing pending", func() bool { return s.Stats().Pending == 0 })
	for i := range keys {
		if r := remaining(t, st, string(rune('A'+i))); r != 1000-3*each {
			t.Fatalf("key %c: remaining %d, want %d", 'A'+i, r, 1000-3*each)
		}
	}
	if st := s.Stats(); st.Landed != keys*each || st.Lost() != 0 {
		t.Fatalf("stats %+v", st)
	}
}

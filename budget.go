package sluice

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/keyhash"
)

// LocalBudget is a policy's local budget (a token lease): an instance takes Size units of the
// policy's quota from the shared store in one consuming decision and spends them in process,
// one request at a time, until they run out or MaxAge has passed since it asked for them —
// and, for the window algorithms, never beyond the end of the window they were counted in.
// Units it did not spend expire: they stay counted in the store (giving them back would need a
// refund the stores do not have), so a budget errs on the side of refusing.
//
// The bound, with I instances each budgeting a key, r = Limit/Period and C = Capacity():
//
//   - fixed-window: at most Limit admitted in any one window, exactly as without budgets, for
//     any number of instances: every unit is counted in the store's window before it is spent,
//     and spent only before that window ends.
//   - sliding-window: the same guarantee as without budgets (at every instant the window's
//     weighted estimate of what was admitted is at most Limit, and each aligned window admits
//     at most Limit): units are counted in the window they are spent in, and the estimate only
//     falls between the take and the spend.
//   - calendar windows (Policy.Calendar): the same as their algorithm's; a budget expires at the
//     latest at the local boundary that ends the window it was counted in.
//   - token-bucket: over any interval of length T, at most C + r·T + min(r·MaxAge, I·Size)
//     admitted (without budgets: C + r·T). A unit spent in the interval was taken at most MaxAge
//     before it; and what was taken before the interval began is at most Size per instance.
//
// The other two cannot take a budget: the sliding log decides by every approved request's own
// timestamp (units taken at once would be logged at one instant), and the leaky bucket's
// delays are computed by the shared queue at each request's arrival.
//
// Refusals are the store's own: when an instance's budget is empty and the store refuses a
// new one, the request itself is decided by the store, so its RetryAfter is exact.
//
// A decision spent from a budget has Source FromBudget; one that the call to the store decided
// (the request that took the budget, or one the store decided itself) keeps the store's Source.
type LocalBudget struct {
	Size   int64         // units taken per call to the store: 1..the policy's Capacity()
	MaxAge time.Duration // how long a budget may be spent from: ≥ 1ms
}

// Validate reports what is wrong with b as p's budget, naming the field (local_budget.size,
// local_budget.max_age, or local_budget for an algorithm that takes none); nil if usable. The
// error wraps ErrInvalidPolicy.
func (b LocalBudget) Validate(p Policy) error {
	bad := func(format string, args ...any) error {
		who := "policy"
		if p.Name != "" {
			who = fmt.Sprintf("policy %q", p.Name)
		}
		return fmt.Errorf("%w: %s: %s", ErrInvalidPolicy, who, fmt.Sprintf(format, args...))
	}
	switch {
	case p.Algorithm == SlidingLog:
		return bad("local_budget is not supported by sliding-log: it decides by every approved request's own timestamp, which units taken at once do not have (use sliding-window, fixed-window or token-bucket)")
	case p.Algorithm == LeakyBucket:
		return bad("local_budget is not supported by leaky-bucket: each request's delay is computed by the shared queue when it arrives (use token-bucket for a budgeted rate)")
	case p.Algorithm == Concurrency:
		return bad("local_budget is not supported by concurrency: a slot is one request in flight, taken and given back in the store, which units taken at once are not")
	case b.Size <= 0:
		return bad("local_budget.size %d must be > 0", b.Size)
	case b.Size > p.Capacity():
		what := "limit"
		if p.Algorithm == TokenBucket && p.Burst > 0 {
			what = "burst"
		}
		return bad("local_budget.size %d must be ≤ the policy's %s %d", b.Size, what, p.Capacity())
	case b.MaxAge < time.Millisecond:
		return bad("local_budget.max_age %v must be ≥ 1ms", b.MaxAge)
	}
	return nil
}

// DefaultMaxBudgets is how many (key, policy) budgets a BudgetStore keeps at most by default.
const DefaultMaxBudgets = 1 << 16

// BudgetOption configures a BudgetStore.
type BudgetOption func(*BudgetStore)

// WithBudgetClock runs the budgets' expiry on c (tests, the simulator): the clock the store
// itself runs on, or one that moves at its rate.
func WithBudgetClock(c Clock) BudgetOption { return func(s *BudgetStore) { s.clock = c } }

// WithMaxBudgets bounds how many (key, policy) budgets are kept (default DefaultMaxBudgets; at
// least one per shard, 16): keys come from clients, so their number must not grow memory. When
// full, an expired budget is dropped, else some other idle one (its unspent units expire with
// it); a request that finds no room is decided by the store.
func WithMaxBudgets(n int) BudgetOption { return func(s *BudgetStore) { s.max = n } }

// BudgetStore is a Store that serves policies with a local budget from budgets taken from the
// store it wraps (see LocalBudget), and passes everything else on. It works on any Store; put
// it under the guard (Guard(Budgeted(redis))) so that a store failure while taking a budget
// meets the failure mode. It is safe for concurrent use.
type BudgetStore struct {
	store   Store
	budgets func(p Policy) LocalBudget
	clock   Clock
	max     int
	hash    keyhash.Hasher
	shards  [budgetShards]budgetShard
}

const budgetShards = 16

type budgetShard struct {
	mu sync.Mutex
	m  map[budgetKey]*budgetEntry // guarded by mu
}

type budgetKey struct{ name, key string }

// refillOp is one goroutine taking a budget; the others wait for done.
type refillOp struct {
	done   chan struct{}
	failed bool // the store failed (written before done is closed)
}

// budgetEntry is one instance's budget of one (key, policy). Fields guarded by mu.
type budgetEntry struct {
	mu        sync.Mutex
	policy    Policy    // the policy its units were counted under
	units     int64     // left to spend; never more than the budget's Size
	expires   time.Time // spend only before this
	remaining int64     // the store's Remaining when the budget was taken
	resetAt   time.Time // the store's ResetAfter then, as a time
	at        int64     // the store's Decision.At then: where a settlement of a unit spent from it goes
	dryUntil  time.Time // the store refused a budget: decide exactly until then
	refilling *refillOp // the budget being taken, nil if none
	dead      bool      // evicted: look the entry up again
}

// Budgeted wraps store so that each policy p for which budgets(p) has a Size > 0 is served
// from local budgets; budgets is asked at every decision (it may follow a configuration that
// reloads) and must be fast. A budget that does not Validate for its policy, a cost above its
// Size, a cost of 0 and a dry-run limit are decided by store exactly.
func Budgeted(store Store, budgets func(p Policy) LocalBudget, opts ...BudgetOption) *BudgetStore {
	s := &BudgetStore{store: store, budgets: budgets, clock: wallClock{}, max: DefaultMaxBudgets, hash: keyhash.New()}
	for _, o := range opts {
		o(s)
	}
	for i := range s.shards {
		s.shards[i].m = map[budgetKey]*budgetEntry{}
	}
	return s
}

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

// budget returns p's budget if a request of cost can be served from one.
func (s *BudgetStore) budget(p *Policy, cost int64) (LocalBudget, bool) {
	if cost <= 0 || s.budgets == nil {
		return LocalBudget{}, false
	}
	b := s.budgets(*p)
	if b.Size <= 0 || cost > b.Size || b.Validate(*p) != nil {
		return LocalBudget{}, false
	}
	return b, true
}

// Decide implements Store.
func (s *BudgetStore) Decide(ctx context.Context, key string, p Policy, cost int64) (Decision, error) {
	b, ok := s.budget(&p, cost)
	if !ok {
		return s.store.Decide(ctx, key, p, cost)
	}
	return s.decide(ctx, key, &p, cost, b)
}

func (s *BudgetStore) decide(ctx context.Context, key string, p *Policy, cost int64, b LocalBudget) (Decision, error) {
	for {
		e := s.entry(p.Name, key)
		if e == nil {
			return s.store.Decide(ctx, key, *p, cost)
		}
		now := s.clock.Now()
		e.mu.Lock()
		if e.dead {
			e.mu.Unlock()
			continue
		}
		e.follow(p)
		if e.units >= cost && now.Before(e.expires) {
			e.units -= cost
			d := e.local(p, now)
			e.mu.Unlock()
			return d, nil
		}
		if op := e.refilling; op != nil {
			// One goroutine takes a budget at a time; the others wait for it rather than ask
			// the store each on its own. If the store failed it, each asks the store itself, at
			// once, instead of trying again one after another, a timeout each.
			e.mu.Unlock()
			select {
			case <-op.done:
				if op.failed {
					return s.store.Decide(ctx, key, *p, cost)
				}
				continue
			case <-ctx.Done():
				// As a store whose call the caller gave up on answers.
				return Decision{Limit: p.Capacity()}, fmt.Errorf("%w: waiting for a local budget: %w", ErrStoreUnavailable, ctx.Err())
			}
		}
		if now.Before(e.dryUntil) {
			e.mu.Unlock()
			return s.store.Decide(ctx, key, *p, cost)
		}
		e.startRefill()
		e.mu.Unlock()
		d, taken, err := s.refill(ctx, e, key, p, b, cost, true)
		if err != nil || taken {
			return d, err
		}
		// The store refused a budget: it decides this request itself, so a refusal is its
		// own, with its exact RetryAfter.
		return s.store.Decide(ctx, key, *p, cost)
	}
}

// follow forgets a budget counted under another policy of the same name (a reload or an override
// changed it). Its unspent units stay used in the store, which keeps what was used under a changed
// limit: they count until the window ends or the bucket refills, never more than was taken.
func (e *budgetEntry) follow(p *Policy) {
	if e.policy != *p {
		e.policy, e.units, e.dryUntil, e.expires = *p, 0, time.Time{}, time.Time{}
	}
}

// startRefill marks e as being refilled; what was left of its budget is dropped, so that an
// instance never holds more than one budget's units of a key.
func (e *budgetEntry) startRefill() {
	e.refilling = &refillOp{done: make(chan struct{})}
	e.units = 0
}

// local is the decision of a request served from e's budget at now: Source FromBudget, an
// answer that made no round trip to the store (so it says nothing of the store's health).
func (e *budgetEntry) local(p *Policy, now time.Time) Decision {
	return Decision{Allowed: true, Limit: p.Capacity(), Remaining: e.remaining + e.units, ResetAfter: max(0, e.resetAt.Sub(now)), At: e.at, Source: FromBudget}
}

// refill takes a budget of b.Size units for e from the store (or, if the store has fewer but at
// least need, what it has), e having been marked refilling by the caller. If serve, need units
// of it go to the caller's request, whose decision it returns. taken reports whether the store
// gave a budget; if not, e is left dry until the store said a whole budget would fit.
func (s *BudgetStore) refill(ctx context.Context, e *budgetEntry, key string, p *Policy, b LocalBudget, need int64, serve bool) (d Decision, taken bool, err error) {
	t0 := s.clock.Now() // before the store decides: a deadline from here is never later than the store's
	n := b.Size
	d, err = s.store.Decide(ctx, key, *p, n)
	first := d
	if err == nil && !d.Allowed && d.Remaining >= need {
		n = min(b.Size, d.Remaining)
		d, err = s.store.Decide(ctx, key, *p, n)
	}
	e.mu.Lock()
	defer func() {
		e.refilling.failed = err != nil
		close(e.refilling.done)
		e.refilling = nil
		e.mu.Unlock()
	}()
	if e.dead || e.policy != *p {
		// Evicted or reloaded meanwhile: the units stay counted in the store, unspent.
		if err == nil && d.Allowed && serve {
			d.Remaining += n - need
			return d, true, nil
		}
		return d, false, err
	}
	if err != nil {
		return d, false, err
	}
	if !d.Allowed {
		if first.RetryAfter > 0 {
			e.dryUntil = t0.Add(first.RetryAfter)
		}
		return d, false, nil
	}
	life := b.MaxAge
	switch p.Algorithm {
	case FixedWindow: // the count lasts until the window ends
		life = min(life, d.ResetAfter)
	case SlidingWindow: // the count of window w lasts until w+2 begins; the window ends a period earlier
		if p.Calendar != NoCalendar {
			life = min(life, d.ResetAfter-nextWindowLength(p, t0, d.ResetAfter))
			break
		}
		life = min(life, d.ResetAfter-p.Period)
	}
	e.units, e.expires, e.remaining, e.resetAt, e.at = n, t0.Add(life), d.Remaining, t0.Add(d.ResetAfter), d.At
	if !serve {
		return d, true, nil
	}
	e.units -= need
	d = e.local(p, t0)
	d.Source = FromStore // the store decided this request in the call that took the budget
	return d, true, nil
}

// entry returns the budget entry of (name, key), creating it if there is room; nil if not.
func (s *BudgetStore) entry(name, key string) *budgetEntry {
	sh := &s.shards[s.hash.Strings(name, key)%budgetShards]
	k := budgetKey{name, key}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.m[k]; e != nil {
		return e
	}
	if len(sh.m) >= max(1, s.max/budgetShards) && !s.evict(sh) {
		return nil
	}
	e := &budgetEntry{}
	sh.m[k] = e
	return e
}

// evict drops an expired budget of sh, else some other idle one (map order: arbitrary), looking
// at a few; sh.mu is held. It reports whether there is room now.
func (s *BudgetStore) evict(sh *budgetShard) bool {
	now := s.clock.Now()
	const look = 8
	var victim budgetKey
	var ve *budgetEntry
	seen := 0
	for k, e := range sh.m {
		if seen++; seen > look {
			break
		}
		if !e.mu.TryLock() {
			continue // in use right now
		}
		idle := e.refilling == nil
		expired := idle && !now.Before(e.expires) && !now.Before(e.dryUntil)
		if expired {
			e.dead = true
			e.mu.Unlock()
			delete(sh.m, k)
			return true
		}
		e.mu.Unlock()
		if idle && ve == nil {
			victim, ve = k, e
		}
	}
	if ve == nil {
		return false
	}
	ve.mu.Lock()
	if ve.refilling != nil {
		ve.mu.Unlock()
		return false
	}
	ve.dead, ve.units = true, 0
	ve.mu.Unlock()
	delete(sh.m, victim)
	return true
}

// Budgets reports how many budget entries s holds (for tests and metrics).
func (s *BudgetStore) Budgets() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// DecideAll implements Store. A request whose every limit has a budget (and is not dry-run) is
// served locally if every one of those budgets has its cost; a budget that lacks it is refilled
// first (a consuming decision of that limit alone, which is not the request's). If any limit
// still lacks one, or any has no budget, the store decides the whole request exactly, all or
// nothing: the request never consumes from some budgets and not others.
func (s *BudgetStore) DecideAll(ctx context.Context, key string, limits []Limit, out []Decision) (bool, error) {
	budgets := make([]LocalBudget, 0, 4)
	for i := range limits {
		l := &limits[i]
		b, ok := s.budget(&l.Policy, l.Cost)
		if !ok || l.DryRun {
			return s.store.DecideAll(ctx, key, limits, out)
		}
		budgets = append(budgets, b)
	}
	if len(limits) == 1 {
		l := &limits[0]
		d, err := s.decide(ctx, l.EffectiveKey(key), &l.Policy, l.Cost, budgets[0])
		out[0] = d
		return err == nil && d.Allowed, err
	}
	for attempt := 0; attempt < 2; attempt++ {
		ok, lacking := s.spendAll(key, limits, out)
		if ok {
			return true, nil
		}
		if lacking == nil || attempt == 1 {
			break
		}
		for _, i := range lacking {
			l := &limits[i]
			if !s.refillOnly(ctx, l.EffectiveKey(key), &l.Policy, budgets[i], l.Cost) {
				return s.store.DecideAll(ctx, key, limits, out)
			}
		}
	}
	return s.store.DecideAll(ctx, key, limits, out)
}

// spendAll serves a request from the budgets of all its limits, or from none: it reports
// whether it did, and if not the limits whose budgets lack the cost (nil: a budget could not be
// kept at all).
func (s *BudgetStore) spendAll(key string, limits []Limit, out []Decision) (bool, []int) {
	entries := make([]*budgetEntry, len(limits))
	order := make([]int, len(limits))
	for i := range limits {
		l := &limits[i]
		if entries[i] = s.entry(l.Policy.Name, l.EffectiveKey(key)); entries[i] == nil {
			return false, nil
		}
		order[i] = i
	}
	// Locked in one order (name, key) by every caller, so that two requests never deadlock.
	slices.SortFunc(order, func(a, b int) int {
		if c := strings.Compare(limits[a].Policy.Name, limits[b].Policy.Name); c != 0 {
			return c
		}
		return strings.Compare(limits[a].EffectiveKey(key), limits[b].EffectiveKey(key))
	})
	now := s.clock.Now()
	var lacking []int
	for _, i := range order {
		e := entries[i]
		e.mu.Lock()
		if e.dead {
			lacking = append(lacking, i)
			continue
		}
		e.follow(&limits[i].Policy)
		if e.units < limits[i].Cost || !now.Before(e.expires) {
			lacking = append(lacking, i)
		}
	}
	if lacking == nil {
		for _, i := range order {
			e := entries[i]
			e.units -= limits[i].Cost
			out[i] = e.local(&limits[i].Policy, now)
		}
	}
	for _, i := range order {
		entries[i].mu.Unlock()
	}
	return lacking == nil, lacking
}

// refillOnly gives (key, p) a budget of at least need units, unless the store refuses one or
// another goroutine is taking one (then it waits for it). It reports whether a budget with need
// units may now be there.
func (s *BudgetStore) refillOnly(ctx context.Context, key string, p *Policy, b LocalBudget, need int64) bool {
	e := s.entry(p.Name, key)
	if e == nil {
		return false
	}
	now := s.clock.Now()
	e.mu.Lock()
	if e.dead {
		e.mu.Unlock()
		return false
	}
	e.follow(p)
	if e.units >= need && now.Before(e.expires) {
		e.mu.Unlock()
		return true
	}
	if op := e.refilling; op != nil {
		e.mu.Unlock()
		select {
		case <-op.done:
			return !op.failed
		case <-ctx.Done():
			return false
		}
	}
	if now.Before(e.dryUntil) {
		e.mu.Unlock()
		return false
	}
	e.startRefill()
	e.mu.Unlock()
	_, taken, err := s.refill(ctx, e, key, p, b, need, false)
	return err == nil && taken
}

// CheckPolicy passes the question on to the wrapped store.
func (s *BudgetStore) CheckPolicy(p Policy) error {
	if err := checkConcurrency(s.store, p); err != nil {
		return err
	}
	if pc, ok := s.store.(PolicyChecker); ok {
		return pc.CheckPolicy(p)
	}
	return nil
}

// nextWindowLength is the length of the calendar window after the one a sliding-window decision
// counted in, which ends when the count stops weighing: now+reset by the store's clock. t0, this
// instance's clock, may differ from the store's a little; the window is found by an instant 11
// hours before that end, inside it for any skew under 11 hours (a calendar window lasts at least
// a day of 23 hours).
func nextWindowLength(p *Policy, t0 time.Time, reset time.Duration) time.Duration {
	_, start, end := p.WindowOf(t0.Add(reset - 11*time.Hour).UnixMicro())
	return time.Duration(end-start) * time.Microsecond
}

package sim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store/memory"
)

// StoreMode says where a Fleet's instances keep their counters.
type StoreMode uint8

const (
	// SharedStore: one store for all the instances (Redis in a deployment), so that they count
	// together and the fleet admits what one instance would.
	SharedStore StoreMode = iota
	// SeparateStores: each instance its own memory store, as sluice serve with store: memory on
	// several instances: each counts only the requests it sees, so that N instances behind a
	// load balancer admit up to N times the limit.
	SeparateStores
)

func (m StoreMode) String() string {
	if m == SeparateStores {
		return "separate"
	}
	return "shared"
}

// Balance says how a Fleet's load balancer deals the requests to the instances.
type Balance uint8

const (
	RoundRobin Balance = iota // in turn: 1, 2, …, N, 1, …
	Random                    // each to an instance drawn at random (Fleet.Draw), uniformly
)

func (b Balance) String() string {
	if b == Random {
		return "random"
	}
	return "round-robin"
}

// Outage is a window of virtual time [FromMicros, ToMicros) in which a Fleet's shared store
// fails: every call to it returns an error wrapping sluice.ErrStoreUnavailable, and each
// instance's sluice.Limiter answers with its failure mode, OnError, as the gateway's does:
// FailOpen admits (Row.Fallback "open"), FailClosed refuses (Row.Fallback "closed", no
// Retry-After), FailLocal decides on the instance's own memory store with 1/Instances of the
// policy (Row.Fallback "local"; on_error: local's share of a fleet of that many).
//
// The breaker does not run on virtual time (its cooldown is the process's clock), so the
// simulated instances ask the store at every request: each request in the window falls back,
// and the first one after it is decided by the store again.
type Outage struct {
	FromMicros, ToMicros int64
	OnError              sluice.FailureMode
}

// The Row.Fallback of a decision made without the store.
const (
	FallbackOpen   = "open"
	FallbackLocal  = "local"
	FallbackClosed = "closed"
)

func fallbackName(f sluice.Fallback) string {
	switch f {
	case sluice.FallbackOpen:
		return FallbackOpen
	case sluice.FallbackLocal:
		return FallbackLocal
	}
	return ""
}

// buildFleet makes f's limiters on s's clock: each on its own memory store or on one shared
// one, budgeted if f has a budget, guarded by the outage's failure mode if it has one.
func (s *Session) buildFleet(policy sluice.Policy, keys int, f Fleet) error {
	if f.Outage != nil {
		o := f.Outage
		switch {
		case f.Stores == SeparateStores:
			return fmt.Errorf("sim: outage: separate stores are each in their own instance's memory, which does not fail (give the shared store an outage)")
		case o.FromMicros < 0 || o.ToMicros <= o.FromMicros || o.ToMicros > MaxTimeMicros:
			return fmt.Errorf("sim: outage from %s to %s ms: want 0 ≤ from < to ≤ 2^53 µs", FormatMillis(o.FromMicros), FormatMillis(o.ToMicros))
		case o.OnError > sluice.FailLocal:
			return fmt.Errorf("sim: outage: unknown failure mode %d", uint8(o.OnError))
		}
		s.outage = o
	}
	if f.Balance > Random {
		return fmt.Errorf("sim: unknown balance %d", uint8(f.Balance))
	}
	if f.Balance == Random {
		s.rng = rand.New(rand.NewPCG(f.Draw, 0x5106ce))
	}
	newStore := func() *memory.Store {
		return memory.New(memory.WithClock(s.clock), memory.WithMaxKeys(max(1, keys)*memory.DefaultShards))
	}
	if f.StoreLatency < 0 || f.StoreLatency%time.Microsecond != 0 || f.StoreLatency > time.Hour {
		return fmt.Errorf("sim: store latency %v must be a whole number of µs from 0 to 1h", f.StoreLatency)
	}
	if f.StoreLatency > 0 && f.Stores == SeparateStores {
		return fmt.Errorf("sim: store latency: separate stores are each in their own instance's memory, without a round trip (give the shared store a latency)")
	}
	var shared sluice.Store
	if f.Stores == SharedStore {
		st := &sharedStore{store: newStore(), clock: s.clock}
		if s.outage != nil {
			st.from, st.to = s.origin+s.outage.FromMicros, s.origin+s.outage.ToMicros
		}
		shared, s.shared, s.latency = st, st, int64(f.StoreLatency/time.Microsecond)
	}
	for range f.Instances {
		store := shared
		if store == nil {
			store = newStore()
		}
		if f.Budget != (sluice.LocalBudget{}) {
			budget := func(sluice.Policy) sluice.LocalBudget { return f.Budget }
			store = sluice.Budgeted(store, budget, sluice.WithBudgetClock(s.clock), sluice.WithMaxBudgets(max(1, keys)))
		}
		// The breaker never opens: its cooldown is on the process's clock, not the virtual one.
		opts := []sluice.Option{sluice.WithBreaker(math.MaxInt32, time.Hour)}
		if s.outage != nil {
			switch s.outage.OnError {
			case sluice.FailOpen:
				opts = append(opts, sluice.WithFailureMode(sluice.FailOpen))
			case sluice.FailLocal:
				opts = append(opts, sluice.WithLocalFallback(newStore(), 1/float64(f.Instances)))
			}
		}
		lim, err := sluice.NewLimiter(store, policy, opts...)
		if err != nil {
			return err
		}
		s.limiters = append(s.limiters, lim)
	}
	return nil
}

// balance returns the instance (from 0) the next request goes to.
func (s *Session) balance() int {
	if s.rng != nil {
		return s.rng.IntN(len(s.limiters))
	}
	i := s.next
	s.next = (s.next + 1) % len(s.limiters)
	return i
}

// sharedStore is a Fleet's shared store: the real memory store, which counts the calls made to
// it (each a round trip of Fleet.StoreLatency), and fails in the outage's window of its clock
// as a Redis that cannot be reached does.
type sharedStore struct {
	store    *memory.Store
	clock    *sluice.ManualClock
	from, to int64 // the outage, µs since the Unix epoch; from = to: none
	calls    int64 // calls made to it, failed ones too
}

// errOutage is what the store answers in its outage.
var errOutage = fmt.Errorf("%w: the simulated store outage", sluice.ErrStoreUnavailable)

func (o *sharedStore) down() bool {
	o.calls++
	t := o.clock.Now().UnixMicro()
	return t >= o.from && t < o.to
}

func (o *sharedStore) Decide(ctx context.Context, key string, p sluice.Policy, cost int64) (sluice.Decision, error) {
	if o.down() {
		return sluice.Decision{}, errOutage
	}
	return o.store.Decide(ctx, key, p, cost)
}

func (o *sharedStore) DecideAll(ctx context.Context, key string, limits []sluice.Limit, out []sluice.Decision) (bool, error) {
	if o.down() {
		return false, errOutage
	}
	return o.store.DecideAll(ctx, key, limits, out)
}

// Settle implements sluice.Settler, so that a fleet's real costs (Options.Actual) settle on the
// store its decisions charged: a call like the others, failing in the outage.
func (o *sharedStore) Settle(ctx context.Context, key string, p sluice.Policy, at, reserved, actual int64) error {
	if o.down() {
		return errOutage
	}
	return o.store.Settle(ctx, key, p, at, reserved, actual)
}

// ParseOutage parses an outage FROM-TO, two Go durations of virtual time (0s-30s, 1m-2m30s), as
// `sluice simulate --outage` and the page's outage field take it; the error says what is wrong
// without naming the field (each front end names its own). OnError is left FailClosed.
func ParseOutage(s string) (Outage, error) {
	from, to, ok := strings.Cut(s, "-")
	if !ok {
		return Outage{}, errors.New("want FROM-TO, two durations of virtual time such as 1m-2m")
	}
	var t [2]int64
	for i, d := range []string{from, to} {
		d = strings.TrimSpace(d)
		v, err := time.ParseDuration(d)
		switch {
		case err != nil:
			return Outage{}, errors.New(strconv.Quote(d) + " is not a Go duration (want e.g. 30s, 1m, 1m30s)")
		case v < 0:
			return Outage{}, errors.New(d + " must be ≥ 0")
		case v%time.Microsecond != 0:
			return Outage{}, errors.New(d + " must be a whole number of microseconds")
		case v/time.Microsecond > MaxTimeMicros:
			return Outage{}, errors.New(d + " is past 2^53 µs")
		}
		t[i] = int64(v / time.Microsecond)
	}
	if t[1] <= t[0] {
		return Outage{}, errors.New("the outage must end after it begins")
	}
	return Outage{FromMicros: t[0], ToMicros: t[1]}, nil
}

// FailureModeName is a failure mode as `sluice simulate --on-error` and the page name it.
func FailureModeName(m sluice.FailureMode) string {
	switch m {
	case sluice.FailOpen:
		return "open"
	case sluice.FailLocal:
		return "local"
	}
	return "closed"
}

// ParseFailureMode reads a failure mode as FailureModeName writes it: open, closed or local.
func ParseFailureMode(s string) (sluice.FailureMode, bool) {
	switch s {
	case "open":
		return sluice.FailOpen, true
	case "closed":
		return sluice.FailClosed, true
	case "local":
		return sluice.FailLocal, true
	}
	return sluice.FailClosed, false
}

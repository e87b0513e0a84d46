// Package memory is sluice's in-process store, the embedded default: state lives in this
// process only, so each instance limits on its own (use store/redis to share quota).
//
// It is safe for concurrent use and sharded by key, with one mutex per shard and no global lock.
// A decision on a key it already holds allocates nothing for the counter and bucket algorithms.
//
// Memory follows active clients: a key is dropped once its state is as if never seen (its
// ResetAfter has passed). Each shard sweeps itself for such keys at most once per sweep interval
// of store time, during a decision that lands on it; Sweep forces one. The number of keys is
// bounded (WithMaxKeys, default DefaultMaxKeys, ~150 bytes each plus the key): a new key that
// arrives at a full shard first takes the place of an idle key among a sample of its shard,
// otherwise it evicts the sampled key closest to its reset (the least state lost; that client
// gets a fresh quota early, which errs towards admitting), or, with WithRejectWhenFull, is
// refused with ErrFull instead.
package memory

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
)

// Defaults.
const (
	DefaultMaxKeys       = 1 << 20
	DefaultShards        = 256
	DefaultSweepInterval = time.Second
	evictionSample       = 8
)

// ErrFull is returned, with WithRejectWhenFull, for a new key when its shard holds its share of
// the maximum number of keys and none of them is idle.
var ErrFull = errors.New("memory store: key limit reached")

// Store is the in-process store. Create it with New.
type Store struct {
	clock       sluice.Clock // nil: start + monotonic time elapsed (a wall-clock step never moves windows)
	start       time.Time
	startMicros int64

	seed           maphash.Seed
	shards         []shard
	mask           uint64 // len(shards) - 1; len(shards) is a power of two
	maxPerShard    int
	rejectWhenFull bool
	sweepEvery     int64 // µs of store time between a shard's sweeps
	evictions      atomic.Uint64
}

type shard struct {
	mu        sync.Mutex
	entries   map[entryKey]*entry // guarded by mu
	nextSweep int64               // guarded by mu; store time (µs) of the next sweep
	_         [40]byte            // keeps neighbouring shards' locks off one cache line
}

// entryKey is one key under one policy: a struct, not a concatenated string, so that a lookup
// allocates nothing.
type entryKey struct{ policy, key string }

type entry struct {
	state   algorithm.State
	expires int64 // µs: from then on state is as if never seen (the last approval's now + ResetAfter)
}

// Option configures a Store.
type Option func(*Store)

// WithClock runs the store on c instead of the real clock (tests, the simulator).
func WithClock(c sluice.Clock) Option { return func(s *Store) { s.clock = c } }

// WithMaxKeys bounds the number of keys (key-and-policy pairs) held; n ≤ 0 means DefaultMaxKeys.
// The bound is kept per shard (n divided by the shard count, rounded up).
func WithMaxKeys(n int) Option { return func(s *Store) { s.maxPerShard = n } }

// WithRejectWhenFull makes a new key that finds its shard full fail with ErrFull instead of
// evicting another key.
func WithRejectWhenFull() Option { return func(s *Store) { s.rejectWhenFull = true } }

// WithShards sets the number of shards, rounded up to a power of two (default DefaultShards).
func WithShards(n int) Option {
	return func(s *Store) { s.shards = make([]shard, ceilPow2(max(1, n))) }
}

// WithSweepInterval sets how often (in store time) each shard drops its idle keys.
func WithSweepInterval(d time.Duration) Option {
	return func(s *Store) { s.sweepEvery = max(1, int64(d/time.Microsecond)) }
}

// New returns an empty store.
func New(opts ...Option) *Store {
	s := &Store{start: time.Now(), seed: maphash.MakeSeed(), sweepEvery: int64(DefaultSweepInterval / time.Microsecond)}
	s.startMicros = s.start.UnixMicro()
	for _, o := range opts {
		o(s)
	}
	if s.shards == nil {
		s.shards = make([]shard, DefaultShards)
	}
	s.mask = uint64(len(s.shards) - 1)
	maxKeys := s.maxPerShard
	if maxKeys <= 0 {
		maxKeys = DefaultMaxKeys
	}
	s.maxPerShard = (maxKeys + len(s.shards) - 1) / len(s.shards)
	now := s.now()
	for i := range s.shards {
		s.shards[i].entries = make(map[entryKey]*entry)
		s.shards[i].nextSweep = now + s.sweepEvery
	}
	return s
}

// now is the store's time in µs.
func (s *Store) now() int64 {
	if s.clock != nil {
		return s.clock.Now().UnixMicro()
	}
	return s.startMicros + int64(time.Since(s.start)/time.Microsecond)
}

// Decide implements sluice.Store. It never blocks on I/O, so ctx is not consulted.
func (s *Store) Decide(_ context.Context, key string, p sluice.Policy, cost int64) (sluice.Decision, error) {
	now := s.now()
	sh := &s.shards[maphash.String(s.seed, key)&s.mask]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if now >= sh.nextSweep {
		sh.sweepLocked(now)
		sh.nextSweep = now + s.sweepEvery
	}
	k := entryKey{p.Name, key}
	e := sh.entries[k]
	if e != nil {
		d, err := algorithm.Decide(&p, &e.state, now, cost)
		if d.Allowed && cost > 0 {
			e.expires = now + int64(d.ResetAfter/time.Microsecond)
		}
		return d, err
	}
	// A key never seen (or dropped when idle) starts from the zero state; it is stored only if
	// the decision changed that state, so peeks and refusals cost no memory.
	var st algorithm.State
	d, err := algorithm.Decide(&p, &st, now, cost)
	if st.Alg == 0 {
		return d, err
	}
	if len(sh.entries) >= s.maxPerShard && !s.makeRoomLocked(sh, now) {
		return sluice.Decision{Limit: d.Limit}, fmt.Errorf("%w (%d keys per shard): refusing new key under policy %q", ErrFull, s.maxPerShard, p.Name)
	}
	sh.entries[entryKey{p.Name, strings.Clone(key)}] = &entry{state: st, expires: now + int64(d.ResetAfter/time.Microsecond)}
	return d, err
}

// makeRoomLocked frees one place in a full shard: an idle key from a sample if there is one,
// else (unless the store rejects when full) the sampled key closest to its reset. Sampling
// keeps this O(1) however large the shard; Go randomises where each range over a map begins.
func (s *Store) makeRoomLocked(sh *shard, now int64) bool {
	var victim entryKey
	var soonest int64
	n := 0
	for k, e := range sh.entries {
		if e.expires <= now {
			delete(sh.entries, k)
			return true
		}
		if n == 0 || e.expires < soonest {
			victim, soonest = k, e.expires
		}
		if n++; n == evictionSample {
			break
		}
	}
	if s.rejectWhenFull || n == 0 {
		return false
	}
	delete(sh.entries, victim)
	s.evictions.Add(1)
	return true
}

// sweepLocked drops every key of the shard whose state is as if never seen.
func (sh *shard) sweepLocked(now int64) {
	for k, e := range sh.entries {
		if e.expires <= now {
			delete(sh.entries, k)
		}
	}
}

// Sweep drops every idle key now, in every shard.
func (s *Store) Sweep() {
	now := s.now()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		sh.sweepLocked(now)
		sh.nextSweep = now + s.sweepEvery
		sh.mu.Unlock()
	}
}

// Len returns the number of keys (key-and-policy pairs) held, idle ones not yet swept included.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.entries)
		sh.mu.Unlock()
	}
	return n
}

// Evictions returns how many keys were evicted, before their reset, to make room for new ones.
func (s *Store) Evictions() uint64 { return s.evictions.Load() }

func ceilPow2(n int) int {
	p := 1
	for p < n {
		p <<= 1
	}
	return p
}

var _ sluice.Store = (*Store)(nil)

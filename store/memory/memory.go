// Package memory is sluice's in-process store, the embedded default: state lives in this
// process only, so each instance limits on its own (use store/redis to share quota).
//
// It is safe for concurrent use and sharded by key, with one mutex per shard and no global lock.
// A decision on a key it already holds allocates nothing for the counter and bucket algorithms.
//
// Memory follows active clients: a key is dropped once its state is as if never seen (its
// ResetAfter has passed). Each shard sweeps itself for such keys at most once per sweep interval
// of store time, during a decision that lands on it; Sweep forces one. The number of keys is
// bounded (WithMaxKeys, default DefaultMaxKeys, ~200 bytes each plus the key): a new key that
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
	hashMask       uint64 // all ones; tests set 0 to make every key collide and exercise the chains
	shards         []shard
	mask           uint64 // len(shards) - 1; len(shards) is a power of two
	maxPerShard    int
	rejectWhenFull bool
	sweepEvery     int64 // µs of store time between a shard's sweeps
	evictions      atomic.Uint64
}

type shard struct {
	mu        sync.Mutex
	clients   map[uint64]*client // guarded by mu; by the key's hash, colliding keys chained in next
	slots     int                // guarded by mu; key-and-policy pairs held, what the bound counts
	nextSweep int64              // guarded by mu; store time (µs) of the next sweep
	_         [32]byte           // keeps neighbouring shards' locks off one cache line
}

// client is one key's state under each policy it is held under; the first inline, since most
// keys have one or two. The shard's map is keyed by the key's 64-bit hash, which also picks the
// shard, so a decision hashes the key string once (a map keyed by the string, or by a struct of
// key and policy, hashed it again and cost up to a fifth of a decision).
//
// Layout: a client is 192 bytes, a size class whose objects start on a cache line, and the fields
// a decision writes (first.expires and the state's counters) share the first line.
type client struct {
	first slot
	key   string
	next  *client // another key with the same hash (rare), or nil
	more  []slot
}

type slot struct {
	expires int64 // µs: from then on state is as if never seen (the last approval's now + ResetAfter)
	state   algorithm.State
	policy  string
}

// find returns the client's slot for policy, or nil.
func (c *client) find(policy string) *slot {
	if c.first.policy == policy {
		return &c.first
	}
	for i := range c.more {
		if c.more[i].policy == policy {
			return &c.more[i]
		}
	}
	return nil
}

// removeIf drops the slots for which drop is true and reports how many it dropped and whether
// the client is now empty.
func (c *client) removeIf(drop func(*slot) bool) (dropped int, empty bool) {
	kept := c.more[:0]
	for i := range c.more {
		if drop(&c.more[i]) {
			dropped++
		} else {
			kept = append(kept, c.more[i])
		}
	}
	clear(c.more[len(kept):]) // let dropped slots' strings and logs be collected
	c.more = kept
	if drop(&c.first) {
		dropped++
		if len(c.more) == 0 {
			return dropped, true
		}
		c.first = c.more[len(c.more)-1]
		c.more[len(c.more)-1] = slot{}
		c.more = c.more[:len(c.more)-1]
	}
	return dropped, false
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
	s := &Store{start: time.Now(), seed: maphash.MakeSeed(), hashMask: ^uint64(0), sweepEvery: int64(DefaultSweepInterval / time.Microsecond)}
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
		s.shards[i].clients = make(map[uint64]*client)
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
	h := maphash.String(s.seed, key) & s.hashMask
	sh := &s.shards[h&s.mask]
	var d sluice.Decision
	var err error
	sh.mu.Lock() // unlocked without defer: nothing below can panic, and this is the hot path
	if now >= sh.nextSweep {
		sh.sweepLocked(now)
		sh.nextSweep = now + s.sweepEvery
	}
	c := sh.find(h, key)
	var sl *slot
	if c != nil {
		sl = c.find(p.Name)
	}
	if sl != nil {
		err = algorithm.DecideInto(&p, &sl.state, now, cost, &d)
		if d.Allowed && cost > 0 {
			sl.expires = now + int64(d.ResetAfter/time.Microsecond)
		}
	} else {
		err = s.decideNewLocked(sh, c, h, key, &p, now, cost, &d)
	}
	sh.mu.Unlock()
	return d, err
}

// find returns the client whose key is key and hashes to h, or nil.
func (sh *shard) find(h uint64, key string) *client {
	c := sh.clients[h]
	for c != nil && c.key != key {
		c = c.next
	}
	return c
}

// decideNewLocked decides for a key that has no state under p (c is its client, if it has one
// under other policies). A key never seen, or dropped when idle, starts from the zero state; it
// is stored only if the decision changed that state, so peeks and refusals cost no memory.
func (s *Store) decideNewLocked(sh *shard, c *client, h uint64, key string, p *sluice.Policy, now, cost int64, d *sluice.Decision) error {
	var st algorithm.State
	err := algorithm.DecideInto(p, &st, now, cost, d)
	if st.Alg == 0 {
		return err
	}
	if sh.slots >= s.maxPerShard {
		if !s.makeRoomLocked(sh, now) {
			*d = sluice.Decision{Limit: d.Limit}
			return fmt.Errorf("%w (%d keys per shard): refusing new key under policy %q", ErrFull, s.maxPerShard, p.Name)
		}
		c = sh.find(h, key) // making room may have removed this very client
	}
	added := slot{policy: p.Name, expires: now + int64(d.ResetAfter/time.Microsecond), state: st}
	if c == nil {
		sh.clients[h] = &client{key: strings.Clone(key), next: sh.clients[h], first: added}
	} else {
		c.more = append(c.more, added)
	}
	sh.slots++
	return err
}

// makeRoomLocked frees one place in a full shard: the idle slots of a sample of clients if there
// are any, else (unless the store rejects when full) the sampled slot closest to its reset.
// Sampling keeps this O(1) however large the shard; Go randomises where each range over a map
// begins.
func (s *Store) makeRoomLocked(sh *shard, now int64) bool {
	var victimHash uint64
	var victimClient *client
	var victim *slot
	n := 0
	for h, head := range sh.clients {
		if sh.dropIdleLocked(h, now) > 0 {
			return true
		}
		for c := head; c != nil; c = c.next {
			if victim == nil || c.first.expires < victim.expires {
				victimHash, victimClient, victim = h, c, &c.first
			}
			for i := range c.more {
				if c.more[i].expires < victim.expires {
					victimHash, victimClient, victim = h, c, &c.more[i]
				}
			}
		}
		if n++; n == evictionSample {
			break
		}
	}
	if s.rejectWhenFull || victim == nil {
		return false
	}
	if _, empty := victimClient.removeIf(func(sl *slot) bool { return sl == victim }); empty {
		sh.unlink(victimHash, victimClient)
	}
	sh.slots--
	s.evictions.Add(1)
	return true
}

// unlink removes client c, whose key hashes to h, from the shard.
func (sh *shard) unlink(h uint64, c *client) {
	head := sh.clients[h]
	if head == c {
		if c.next == nil {
			delete(sh.clients, h)
		} else {
			sh.clients[h] = c.next
		}
		return
	}
	for prev := head; prev != nil; prev = prev.next {
		if prev.next == c {
			prev.next = c.next
			return
		}
	}
}

// dropIdleLocked drops the idle slots of the clients whose keys hash to h (and each client that
// is left with none), and returns how many slots it dropped.
func (sh *shard) dropIdleLocked(h uint64, now int64) int {
	total := 0
	for c := sh.clients[h]; c != nil; {
		next := c.next
		dropped, empty := c.removeIf(func(sl *slot) bool { return sl.expires <= now })
		if empty {
			sh.unlink(h, c)
		}
		total += dropped
		c = next
	}
	sh.slots -= total
	return total
}

// sweepLocked drops every key of the shard whose state is as if never seen.
func (sh *shard) sweepLocked(now int64) {
	for h := range sh.clients {
		sh.dropIdleLocked(h, now)
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
		n += sh.slots
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

// DecideAll implements sluice.Store: every limit of key is decided at one instant under the
// key's shard lock, on copies of the states, and the copies are kept only if all allow.
func (s *Store) DecideAll(_ context.Context, key string, limits []sluice.Limit, out []sluice.Decision) (bool, error) {
	if len(out) != len(limits) {
		return false, fmt.Errorf("memory store: DecideAll: %d decisions for %d limits", len(out), len(limits))
	}
	if len(limits) == 1 { // Decide's path: the same decision, without a trial copy
		d, err := s.Decide(context.Background(), key, limits[0].Policy, limits[0].Cost)
		out[0] = d
		return err == nil && d.Allowed, err
	}
	for i := range limits {
		if err := algorithm.CheckCost(&limits[i].Policy, limits[i].Cost, &out[i]); err != nil {
			return false, err
		}
	}
	now := s.now()
	h := maphash.String(s.seed, key) & s.hashMask
	sh := &s.shards[h&s.mask]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	c := sh.find(h, key)
	var inline [4]algorithm.State
	trial := inline[:0]
	if len(limits) > len(inline) {
		trial = make([]algorithm.State, 0, len(limits))
	}
	trial = trial[:len(limits)]
	all := true
	for i := range limits {
		p := &limits[i].Policy
		if c != nil {
			if sl := c.find(p.Name); sl != nil {
				trial[i] = sl.state
				// The copy shares the sliding log's array; a trial append writes past the
				// original's length only, so the original stays intact if the trial is dropped.
				trial[i].Log = sl.state.Log[:len(sl.state.Log):len(sl.state.Log)]
			}
		}
		if err := algorithm.DecideInto(p, &trial[i], now, limits[i].Cost, &out[i]); err != nil {
			return false, err
		}
		all = all && out[i].Allowed
	}
	if !all {
		return false, nil
	}
	for i := range limits {
		p := &limits[i].Policy
		if limits[i].Cost == 0 {
			continue
		}
		if c == nil {
			c = sh.find(h, key)
		}
		var sl *slot
		if c != nil {
			sl = c.find(p.Name)
		}
		if sl != nil {
			sl.state = trial[i]
			sl.expires = now + int64(out[i].ResetAfter/time.Microsecond)
			continue
		}
		var d sluice.Decision
		// Store the new key's state by deciding it again from zero, at the same instant: the
		// same decision, and the bound on keys applies as for Decide.
		if err := s.decideNewLocked(sh, c, h, key, p, now, limits[i].Cost, &d); err != nil {
			return false, err
		}
	}
	return true, nil
}

// Infallible implements sluice.Infallible: the memory store never fails with
// sluice.ErrStoreUnavailable (at its key bound it fails with ErrFull, which is not that).
func (s *Store) Infallible() {}

// Package memory is sluice's in-process store, the embedded default: state lives in this
// process only, so each instance limits on its own (use store/redis to share quota).
//
// It is safe for concurrent use and sharded by key, with no global lock. A decision on a key it
// already holds allocates nothing for the counter and bucket algorithms.
//
// Locking. Each shard has a mutex, and so has each key's client (its state under every policy).
// A decision on a key already held under its policy finds the client without the shard's lock
// (the shard's table is read atomically) and decides under the client's lock alone: one lock per
// decision, in the same cache line as the state it guards, so that from parallel goroutines the
// decision moves one line of the client between cores and none of the shard's. The shard's lock
// guards the table, the shard's counts and which slots each client has: it is taken for a key or
// policy not held yet, a lookup the lock-free read missed, sweeps, eviction and resizes, and every
// change to a client's slots holds it and then the client's lock (always in that order; a call
// holding several clients' locks holds their shards' first, in ascending order, and a decision
// holding one client's lock waits for nothing else). A client removed from the table is marked
// dead under its lock first, so that a lookup that found it before and locks it after decides
// again under the shard's lock.
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
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/keyhash"
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

	hash           keyhash.Hasher
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
	table     atomic.Pointer[[]entry] // written under mu, read without it; the shard's clients, see entry
	clients   int                     // guarded by mu; entries in use in table
	slots     int                     // guarded by mu; key-and-policy pairs held, what the bound counts
	nextSweep atomic.Int64            // written under mu; store time (µs) of the next sweep
	_         [24]byte                // a shard is one cache line: neighbouring shards' locks never share one
}

// entry is a place in a shard's table: an open-addressing hash table with linear probing,
// indexed by the key's 64-bit hash (which also picked the shard), so a decision hashes the key
// string once. Keys whose hashes collide simply take further places. A lookup reads the shard's
// line, one entry and the client, where Go's map (keyed by the hash) cost three more cache lines
// and a fifth of a decision on 10,000 keys.
//
// Places are written under the shard's lock and read without it (atomically, field by field), so
// a lookup may meet a place half written or an entry being shifted back by a removal: it can then
// miss a key that is there (a miss is confirmed under the lock) but never find another key's
// client, since it compares the client's own key, which never changes.
type entry struct {
	hash atomic.Uint64
	c    atomic.Pointer[client] // nil: the place is empty
}

// minTable is a shard's table's size when it holds its first client; tables are powers of two,
// at most three quarters full, and halve when a sweep leaves them an eighth full.
const minTable = 8

// client is one key's state under each policy it is held under; the first inline, since most
// keys have one or two.
//
// Layout: a client is 192 bytes, a size class whose objects start on a cache line. Every field a
// counter or bucket decision writes (the client's lock, the first slot's expiry, and the state's
// Window, Count, Prev, TAT and Frac, which algorithm.State puts first) lies in the first line,
// and nothing the decision only reads (the key, the policy's name, the state's Limit, Period and
// derived cache, the further slots) does: from parallel goroutines, a line written moves to the
// writing core's cache, taking it from the other core's, while lines only read stay in both;
// with the key and the policy beside the state, each decision moved two or three lines instead
// of one. A key of up to 16 bytes is kept in the client itself (inline), sparing a lookup the
// cache miss of a separate string. TestClientLayout checks this.
type client struct {
	mu     sync.Mutex // guards the slots' contents, and dead; see the package's locking
	first  slot
	key    string // its bytes in inline, or allocated if it is longer; never changes
	inline [16]byte
	more   *[]slot // the further slots, if any: a pointer, to keep the client in 192 bytes
	dead   bool    // removed from its shard's table: a lookup that found it looks again under the shard's lock
}

type slot struct {
	expires int64 // µs: from then on state is as if never seen (the last approval's now + ResetAfter)
	state   algorithm.State
	policy  string
}

// expiresAt is when a key decided at now (µs) with ResetAfter reset is as if never seen. A reset
// of time.Duration's most (292 years) may have saturated, the key's true one being later: such a
// key never expires by time (holding a state past its reset changes no decision).
func expiresAt(now int64, reset time.Duration) int64 {
	if reset == 1<<63-1 {
		return 1<<63 - 1
	}
	return now + int64(reset/time.Microsecond)
}

// newClient returns a client for key holding first; it copies key, so a caller's buffer may be reused.
func newClient(key string, first slot) *client {
	c := &client{first: first}
	if len(key) <= len(c.inline) {
		n := copy(c.inline[:], key)
		c.key = unsafe.String(&c.inline[0], n)
	} else {
		c.key = strings.Clone(key)
	}
	return c
}

// find returns the client's slot for policy, or nil.
func (c *client) find(policy string) *slot {
	if c.first.policy == policy {
		return &c.first
	}
	more := c.others()
	for i := range more {
		if more[i].policy == policy {
			return &more[i]
		}
	}
	return nil
}

// others returns the slots after the first.
func (c *client) others() []slot {
	if c.more == nil {
		return nil
	}
	return *c.more
}

// add gives the client another slot.
func (c *client) add(sl slot) {
	if c.more == nil {
		c.more = &[]slot{sl}
		return
	}
	*c.more = append(*c.more, sl)
}

// removeIf drops the slots for which drop is true and reports how many it dropped and whether
// the client is now empty.
func (c *client) removeIf(drop func(*slot) bool) (dropped int, empty bool) {
	more := c.others()
	kept := more[:0]
	for i := range more {
		if drop(&more[i]) {
			dropped++
		} else {
			kept = append(kept, more[i])
		}
	}
	clear(more[len(kept):]) // let dropped slots' strings and logs be collected
	if drop(&c.first) {
		dropped++
		if len(kept) == 0 {
			c.more = nil
			return dropped, true
		}
		c.first = kept[len(kept)-1]
		kept[len(kept)-1] = slot{}
		kept = kept[:len(kept)-1]
	}
	if len(kept) == 0 {
		c.more = nil
	} else {
		*c.more = kept
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
	s := &Store{start: time.Now(), hash: keyhash.New(), hashMask: ^uint64(0), sweepEvery: int64(DefaultSweepInterval / time.Microsecond)}
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
		s.shards[i].nextSweep.Store(now + s.sweepEvery)
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
	var d sluice.Decision
	err := s.decide(key, &p, cost, -1, &d)
	return d, err
}

// decide is Decide for a caller that holds a leaky-bucket request for at most maxDelay µs
// (negative: no bound; see algorithm.DecideWithin), writing the decision into *d.
//
// A key held under p is decided under its client's lock alone (see the package's locking); the shard's
// lock is taken only to sweep, or for a key or policy not held yet.
func (s *Store) decide(key string, p *sluice.Policy, cost, maxDelay int64, d *sluice.Decision) error {
	now := s.now()
	h := s.hash.String(key) & s.hashMask
	sh := &s.shards[h&s.mask]
	if now >= sh.nextSweep.Load() {
		s.sweepDue(sh, now)
	}
	if c := sh.findHash(h); c != nil {
		// Locked before its key is compared: the lock's atomic instruction waits for every read
		// before it, so reading the key first would fetch the client's key line, then its
		// written line, then (after the lock) its state's: three misses one after another.
		// Locked first, the key's line and the state's are fetched together.
		c.mu.Lock() // unlocked without defer: nothing below can panic, and this is the hot path
		if sl := c.find(p.Name); sl != nil && c.key == key && !c.dead {
			err := decideSlot(sl, p, now, cost, maxDelay, d)
			c.mu.Unlock()
			return err
		}
		c.mu.Unlock()
	}
	// A key or policy not held yet, a client removed since the lookup found it, or another key
	// of the same 64-bit hash: again under the shard's lock, which every change to the table or
	// to a client's slots holds.
	sh.mu.Lock()
	c := sh.find(h, key)
	var err error
	if c == nil {
		err = s.decideNewLocked(sh, nil, h, key, p, now, cost, maxDelay, d)
	} else {
		c.mu.Lock()
		if sl := c.find(p.Name); sl != nil {
			err = decideSlot(sl, p, now, cost, maxDelay, d)
		} else {
			err = s.decideNewLocked(sh, c, h, key, p, now, cost, maxDelay, d)
		}
		c.mu.Unlock()
	}
	sh.mu.Unlock()
	return err
}

// decideSlot decides on a held slot, under its client's lock.
func decideSlot(sl *slot, p *sluice.Policy, now, cost, maxDelay int64, d *sluice.Decision) error {
	err := algorithm.DecideWithin(p, &sl.state, now, cost, maxDelay, d)
	// An approval sets the key's expiry; so may a bucket's state converted to a lowered limit,
	// whose use now drains later (algorithm.State: a changed limit keeps what was used).
	if e := expiresAt(now, d.ResetAfter); (d.Allowed && cost > 0) || e > sl.expires {
		sl.expires = e
	}
	return err
}

// sweepDue sweeps sh if its sweep is due at now: once, however many decisions find it due.
func (s *Store) sweepDue(sh *shard, now int64) {
	sh.mu.Lock()
	if now >= sh.nextSweep.Load() {
		sh.sweepLocked(now)
		sh.nextSweep.Store(now + s.sweepEvery)
	}
	sh.mu.Unlock()
}

// home is where in a table of size mask+1 the probe for hash h starts. The low bits of h chose
// the shard, so the table uses the high ones.
func home(h uint64, mask int) int { return int(h>>32) & mask }

// find returns the client whose key is key and hashes to h, or nil, for a caller holding the
// shard's lock (lookups without it use findHash).
func (sh *shard) find(h uint64, key string) *client {
	t := sh.tableLocked()
	if t == nil {
		return nil
	}
	mask := len(t) - 1
	// The table is never full, so a probe ends at an empty place.
	for i := home(h, mask); ; i = (i + 1) & mask {
		e := &t[i]
		c := e.c.Load()
		if c == nil {
			return nil
		}
		if e.hash.Load() == h && c.key == key {
			return c
		}
	}
}

// findHash returns the first client of the shard's table whose key's hash is h, or nil, reading
// the table without the lock (see entry) and not comparing keys: the caller compares the key
// under the client's lock.
func (sh *shard) findHash(h uint64) *client {
	tp := sh.table.Load()
	if tp == nil {
		return nil
	}
	t := *tp
	mask := len(t) - 1
	for i, n := home(h, mask), 0; n <= mask; i, n = (i+1)&mask, n+1 {
		e := &t[i]
		c := e.c.Load()
		if c == nil || e.hash.Load() == h {
			return c
		}
	}
	return nil
}

// tableLocked returns the shard's table, for a caller holding its lock.
func (sh *shard) tableLocked() []entry {
	if tp := sh.table.Load(); tp != nil {
		return *tp
	}
	return nil
}

// insert adds c, a client whose key hashes to h and is not in the shard yet; c is visible to
// lookups from then on, so it must be complete.
func (sh *shard) insert(h uint64, c *client) {
	if n := len(sh.tableLocked()); (sh.clients+1)*4 > n*3 {
		sh.resize(max(minTable, 2*n))
	}
	place(sh.tableLocked(), h, c)
	sh.clients++
}

// place puts c in the first empty place of its probe in t.
func place(t []entry, h uint64, c *client) {
	mask := len(t) - 1
	i := home(h, mask)
	for t[i].c.Load() != nil {
		i = (i + 1) & mask
	}
	t[i].hash.Store(h) // before the client: a lookup that sees the client may compare the hash
	t[i].c.Store(c)
}

// resize moves the shard's clients to a table of size n (a power of two that holds them),
// filled before lookups see it.
func (sh *shard) resize(n int) {
	t, old := make([]entry, n), sh.tableLocked()
	for i := range old {
		e := &old[i]
		if c := e.c.Load(); c != nil {
			place(t, e.hash.Load(), c)
		}
	}
	sh.table.Store(&t)
}

// removeAt empties place i, shifting back the entries after it that it kept from their home
// (so that no probe meets an empty place before its client: no tombstones). Entries move only
// towards i, never past it, which is what lets a forward scan remove as it goes (see sweepLocked).
func (sh *shard) removeAt(i int) {
	t := sh.tableLocked()
	mask := len(t) - 1
	for j := (i + 1) & mask; t[j].c.Load() != nil; j = (j + 1) & mask {
		// The entry at j may fill the hole at i unless its home lies cyclically in (i, j].
		hj := t[j].hash.Load()
		if k := home(hj, mask); (j-k)&mask < (j-i)&mask {
			continue
		}
		t[i].hash.Store(hj)
		t[i].c.Store(t[j].c.Load())
		i = j
	}
	t[i].c.Store(nil)
	t[i].hash.Store(0)
	sh.clients--
}

// decideNewLocked decides for a key that has no state under p (c is its client, if it has one
// under other policies, locked by the caller). A key never seen, or dropped when idle, starts
// from the zero state; it is stored only if the decision changed that state, so peeks and
// refusals cost no memory.
func (s *Store) decideNewLocked(sh *shard, c *client, h uint64, key string, p *sluice.Policy, now, cost, maxDelay int64, d *sluice.Decision) error {
	var st algorithm.State
	err := algorithm.DecideWithin(p, &st, now, cost, maxDelay, d)
	if st.Alg == 0 {
		return err
	}
	if sh.slots >= s.maxPerShard && !s.makeRoomLocked(sh, now, []*client{c}) {
		*d = sluice.Decision{Limit: d.Limit}
		return s.errFull(p)
	}
	sh.addLocked(c, h, key, slot{policy: p.Name, expires: expiresAt(now, d.ResetAfter), state: st}, false)
	return err
}

// addLocked stores sl for key, which hashes to h: in c, its client (locked by the caller), or in a
// new client if c is nil, which it returns locked if lock is true (for a caller that goes on
// writing to it: lookups find it from then on).
func (sh *shard) addLocked(c *client, h uint64, key string, sl slot, lock bool) *client {
	if c == nil {
		c = newClient(key, sl)
		if lock {
			c.mu.Lock()
		}
		sh.insert(h, c)
	} else {
		c.add(sl)
	}
	sh.slots++
	return c
}

func (s *Store) errFull(p *sluice.Policy) error {
	return fmt.Errorf("%w (%d keys per shard): refusing new key under policy %q", ErrFull, s.maxPerShard, p.Name)
}

// makeRoomLocked frees one place in a full shard: the idle slots of a sample of clients if there
// are any, else (unless the store rejects when full) the sampled slot closest to its reset.
// Sampling keeps this O(1) however large the shard: the clients at and after a random place.
// It never touches the clients in except (those of the keys being decided, if they are held
// already, and which the caller has locked), so a decision never evicts a key it is deciding
// for, nor a state it has just read. It locks each other client it reads (the shard's lock
// keeps their slots in place, not their expiries, which decisions write under the client's).
func (s *Store) makeRoomLocked(sh *shard, now int64, except []*client) bool {
	var victimClient *client
	var victim *slot
	var victimExpires int64 // read under victimClient's lock, which is not held after
	victimAt := 0
	if sh.clients == 0 {
		return false
	}
	t := sh.tableLocked()
	mask := len(t) - 1
	for i, n := rand.IntN(len(t)), 0; n < evictionSample && n < sh.clients; i = (i + 1) & mask {
		c := t[i].c.Load()
		if c == nil {
			continue
		}
		n++
		if slices.Contains(except, c) {
			continue
		}
		if sh.dropIdleAt(i, now) > 0 {
			return true
		}
		c.mu.Lock()
		if victim == nil || c.first.expires < victimExpires {
			victimAt, victimClient, victim, victimExpires = i, c, &c.first, c.first.expires
		}
		more := c.others()
		for j := range more {
			if more[j].expires < victimExpires {
				victimAt, victimClient, victim, victimExpires = i, c, &more[j], more[j].expires
			}
		}
		c.mu.Unlock()
	}
	if s.rejectWhenFull || victim == nil {
		return false
	}
	sh.removeSlotsAt(victimAt, victimClient, func(sl *slot) bool { return sl == victim })
	s.evictions.Add(1)
	return true
}

// dropIdleAt drops the idle slots of the client at place i (and the client, if it is left with
// none), and returns how many slots it dropped.
func (sh *shard) dropIdleAt(i int, now int64) int {
	return sh.removeSlotsAt(i, sh.tableLocked()[i].c.Load(), func(sl *slot) bool { return sl.expires <= now })
}

// removeSlotsAt drops the slots of c, the client at place i, for which drop is true, under c's
// lock, and returns how many it dropped. A client left with none is marked dead before it leaves
// the table, so that a lookup that found it, and waits for its lock, looks again.
func (sh *shard) removeSlotsAt(i int, c *client, drop func(*slot) bool) int {
	c.mu.Lock()
	dropped, empty := c.removeIf(drop)
	c.dead = empty
	c.mu.Unlock()
	if empty {
		sh.removeAt(i)
	}
	sh.slots -= dropped
	return dropped
}

// sweepLocked drops every key of the shard whose state is as if never seen, and halves the table
// while it is no more than an eighth full, so that memory follows the active clients.
//
// It scans forward and looks at a place again after emptying it, since removeAt may have
// shifted a later entry into it. An entry from the table's start may be shifted to its end and
// looked at twice, which is harmless; none is skipped, as entries move only backwards.
func (sh *shard) sweepLocked(now int64) {
	t := sh.tableLocked()
	for i := 0; i < len(t); {
		if c := t[i].c.Load(); c != nil && sh.dropIdleAt(i, now) > 0 && t[i].c.Load() != c {
			continue
		}
		i++
	}
	n := len(t)
	for n > minTable && sh.clients*8 <= n {
		n /= 2
	}
	if sh.clients == 0 {
		sh.table.Store(nil)
	} else if n != len(t) {
		sh.resize(n)
	}
}

// Sweep drops every idle key now, in every shard.
func (s *Store) Sweep() {
	now := s.now()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		sh.sweepLocked(now)
		sh.nextSweep.Store(now + s.sweepEvery)
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

// DecideAll implements sluice.Store: every limit is decided at one instant under the lock of its
// key's shard (of every shard involved, when the limits count under several keys), on copies of
// the states; if every enforced limit allows, room is made for the states that are new (or, at
// the key bound, the whole call fails with ErrFull, writing nothing), and only then are the
// approvals written, all of them at once.
func (s *Store) DecideAll(_ context.Context, key string, limits []sluice.Limit, out []sluice.Decision) (bool, error) {
	if len(out) != len(limits) {
		return false, fmt.Errorf("memory store: DecideAll: %d decisions for %d limits", len(out), len(limits))
	}
	if len(limits) == 1 && limits[0].Policy.Algorithm != sluice.Concurrency { // Decide's path: the same decision, without a trial copy
		l := &limits[0]
		err := s.decide(l.EffectiveKey(key), &l.Policy, l.Cost, l.MaxDelayMicros(), &out[0])
		return err == nil && (out[0].Allowed || l.DryRun), err
	}
	for i := range limits {
		if err := algorithm.CheckCost(&limits[i].Policy, limits[i].Cost, &out[i]); err != nil {
			return false, err
		}
	}
	for i := range limits {
		if k := limits[i].Key; k != "" && k != key {
			return s.decideAllKeys(key, limits, out)
		}
	}
	// Every limit counts under key: one shard, one client.
	now := s.now()
	h := s.hash.String(key) & s.hashMask
	sh := &s.shards[h&s.mask]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	c := sh.find(h, key)
	if c != nil {
		c.mu.Lock()
	}
	defer unlockClient(&c) // c may be a client this call makes, locked until it returns
	var inline [4]algorithm.State
	trial := inline[:0]
	if len(limits) > len(inline) {
		trial = make([]algorithm.State, 0, len(limits))
	}
	trial = trial[:len(limits)]
	all, added := true, 0
	for i := range limits {
		l := &limits[i]
		held := false
		if c != nil {
			if sl := c.find(l.Policy.Name); sl != nil {
				held = true
				trial[i] = sl.state
				// The copy shares the sliding log's array; a trial append writes past the
				// original's length only, so the original stays intact if the trial is dropped.
				trial[i].Log = sl.state.Log[:len(sl.state.Log):len(sl.state.Log)]
			}
		}
		if err := decideLimit(l, &trial[i], now, &out[i]); err != nil {
			return false, err
		}
		if !out[i].Allowed && !l.DryRun {
			all = false
		}
		if out[i].Allowed && l.Cost > 0 && !held {
			added++
		}
	}
	if !all {
		return false, nil
	}
	// Room first, so that nothing is written unless everything can be.
	for sh.slots+added > s.maxPerShard {
		if !s.makeRoomLocked(sh, now, []*client{c}) {
			for i := range out {
				out[i] = sluice.Decision{Limit: out[i].Limit}
			}
			return false, s.errFull(&limits[0].Policy)
		}
	}
	for i := range limits {
		l := &limits[i]
		if !out[i].Allowed || l.Cost == 0 {
			if c != nil {
				keepConverted(c.find(l.Policy.Name), &trial[i], now, &out[i])
			}
			continue
		}
		expires := expiresAt(now, out[i].ResetAfter)
		if c != nil {
			if sl := c.find(l.Policy.Name); sl != nil {
				sl.state, sl.expires = trial[i], expires
				continue
			}
		}
		c = sh.addLocked(c, h, key, slot{policy: l.Policy.Name, expires: expires, state: trial[i]}, true)
	}
	return true, nil
}

// keepConverted writes to sl (if held) its trial state when a limit that consumed nothing (a
// refusal of a dry-run limit, a peek) converted it, a bucket's use, to a changed limit
// (algorithm.State): as Decide keeps the conversion, and the Redis scripts write it with the
// approvals. A trial state of the same limit is the held one.
func keepConverted(sl *slot, trial *algorithm.State, now int64, d *sluice.Decision) {
	if sl == nil || sl.state.Limit == trial.Limit {
		return
	}
	sl.state = *trial
	if e := expiresAt(now, d.ResetAfter); e > sl.expires {
		sl.expires = e
	}
}

// unlockClient unlocks *c, if there is one.
func unlockClient(c **client) {
	if *c != nil {
		(*c).mu.Unlock()
	}
}

// keyPlace is where one limit of a DecideAll under several keys counts: its key, the key's hash
// and shard, its client there (nil: none yet), whether that client holds a state under the
// limit's policy, and whether this place locked the client (each client of the call is locked
// once, by the first place that meets it).
type keyPlace struct {
	key    string
	hash   uint64
	sh     *shard
	c      *client
	held   bool
	locked bool
}

// lockClient locks places[i]'s client unless an earlier place of the call has.
func lockClient(places []keyPlace, i int) {
	p := &places[i]
	for j := range places[:i] {
		if places[j].c == p.c && places[j].locked {
			return
		}
	}
	p.c.mu.Lock()
	p.locked = true
}

// unlockClients unlocks the clients the places locked.
func unlockClients(places []keyPlace) {
	for i := range places {
		if places[i].locked {
			places[i].c.mu.Unlock()
		}
	}
}

// decideAllKeys is DecideAll for limits under several keys, whose costs are checked. It locks
// every shard involved, each once and in ascending order, so that two calls never each hold a
// shard the other waits for (Decide and a one-key DecideAll hold one lock at a time); then it
// decides as DecideAll does for one key: on copies, then room in each shard for the states new
// there, sparing every client of the call in it, and only then the approvals, all at once.
func (s *Store) decideAllKeys(key string, limits []sluice.Limit, out []sluice.Decision) (bool, error) {
	n := len(limits)
	var inlinePlaces [4]keyPlace
	var inlineTrial [4]algorithm.State
	var inlineShards [4]uint64
	places, trial, shards := inlinePlaces[:0], inlineTrial[:0], inlineShards[:0]
	if n > len(inlinePlaces) {
		places, trial, shards = make([]keyPlace, 0, n), make([]algorithm.State, 0, n), make([]uint64, 0, n)
	}
	places, trial = places[:n], trial[:n]
	var keyHash uint64
	keyHashed := false
	for i := range limits {
		k := limits[i].EffectiveKey(key)
		var h uint64
		if k == key {
			if !keyHashed {
				keyHash, keyHashed = s.hash.String(key)&s.hashMask, true
			}
			h = keyHash
		} else {
			h = s.hash.String(k) & s.hashMask
		}
		places[i] = keyPlace{key: k, hash: h, sh: &s.shards[h&s.mask]}
		if j, found := slices.BinarySearch(shards, h&s.mask); !found {
			shards = slices.Insert(shards, j, h&s.mask)
		}
	}
	now := s.now()
	for _, i := range shards {
		s.shards[i].mu.Lock()
	}
	defer s.unlock(shards)
	defer unlockClients(places) // (first: a client's lock is taken under its shard's)
	all := true
	for i := range limits {
		l, p := &limits[i], &places[i]
		trial[i] = algorithm.State{}
		if p.c = p.sh.find(p.hash, p.key); p.c != nil {
			lockClient(places, i)
			if sl := p.c.find(l.Policy.Name); sl != nil {
				p.held = true
				trial[i] = sl.state
				trial[i].Log = sl.state.Log[:len(sl.state.Log):len(sl.state.Log)] // (see DecideAll)
			}
		}
		if err := decideLimit(l, &trial[i], now, &out[i]); err != nil {
			return false, err
		}
		if !out[i].Allowed && !l.DryRun {
			all = false
		}
	}
	if !all {
		return false, nil
	}
	// Room first, in every shard, so that nothing is written unless everything can be.
	var inlineExcept [4]*client
	for _, si := range shards {
		sh := &s.shards[si]
		except, added, first := inlineExcept[:0], 0, -1
		for i := range limits {
			p := &places[i]
			if p.sh != sh {
				continue
			}
			if p.c != nil && !slices.Contains(except, p.c) {
				except = append(except, p.c)
			}
			if out[i].Allowed && limits[i].Cost > 0 && !p.held {
				if added++; first < 0 {
					first = i
				}
			}
		}
		for sh.slots+added > s.maxPerShard {
			if !s.makeRoomLocked(sh, now, except) {
				for i := range out {
					out[i] = sluice.Decision{Limit: out[i].Limit}
				}
				return false, s.errFull(&limits[first].Policy)
			}
		}
	}
	for i := range limits {
		l, p := &limits[i], &places[i]
		if !out[i].Allowed || l.Cost == 0 {
			if p.held {
				keepConverted(p.c.find(l.Policy.Name), &trial[i], now, &out[i])
			}
			continue
		}
		expires := expiresAt(now, out[i].ResetAfter)
		if p.held { // its client was spared: the slot is still there
			sl := p.c.find(l.Policy.Name)
			sl.state, sl.expires = trial[i], expires
			continue
		}
		fresh := slot{policy: l.Policy.Name, expires: expires, state: trial[i]}
		if p.c == nil {
			// Made by an earlier limit of this call, if one counts under the key (and then
			// locked by it); else made here, and locked until the call returns.
			if p.c = p.sh.find(p.hash, p.key); p.c == nil {
				p.c, p.locked = p.sh.addLocked(nil, p.hash, p.key, fresh, true), true
				continue
			}
		}
		p.sh.addLocked(p.c, p.hash, p.key, fresh, false)
	}
	return true, nil
}

func (s *Store) unlock(shards []uint64) {
	for _, i := range shards {
		s.shards[i].mu.Unlock()
	}
}

// Infallible implements sluice.Infallible: the memory store never fails with
// sluice.ErrStoreUnavailable (at its key bound it fails with ErrFull, which is not that).
func (s *Store) Infallible() {}

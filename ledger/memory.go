package ledger

import (
	"context"
	"fmt"
	"math"
	"sort"
	"sync"
	"time"

	"github.com/sluicehq/sluice/allot"
)

// Memory is one global policy's ledger in memory, on a clock of its own: store/redis's ledger.lua
// step for step (its records, leases, hold, floor reserve, pending allotments, uses, learning
// mode and epoch; its state's expiry on its clock), the split by allot.Split. The simulator runs
// it for the regions it runs on a virtual clock. Its methods are safe for concurrent use.
type Memory struct {
	policy string
	opts   Options
	now    func() time.Time
	// Slack is added to the state's expiry (ledger.lua's ARGV[9]): 0 in the simulator; the
	// differential test matches a virtual-clock Redis's.
	slack time.Duration
	epoch func() string
	group *MemoryGroup

	mu       sync.Mutex
	recs     map[string]Region // the records, Live and Holding unset
	state    bool              // false: no state (new, flushed or expired)
	since    int64             // µs: when the state began
	epochNow string
	expires  int64 // µs: when the state expires (both keys' PEXPIRE)
}

// MemoryOptions are a Memory ledger's own: its clock and how it names a new state.
type MemoryOptions struct {
	Now   func() time.Time // its clock; time.Now if nil
	Epoch func() string    // a new state's epoch; "1", "2", … if nil
	Slack time.Duration    // added to the state's expiry, as the Redis ledger's TTL slack
	// Group, if set, is the group the ledger is in (store/redis's GroupLedger): a new state is as
	// old as the group.
	Group *MemoryGroup
}

// MemoryGroup is what the Memory ledgers of one group share, as store/redis's GroupLedger's
// share the group's key: since when the group is known. A new state of a ledger in it is as old
// as the group, so a ledger used for the first time does not learn; the group begins anew (and
// its ledgers learn) when it is flushed or has expired with the last of its states.
type MemoryGroup struct {
	mu      sync.Mutex
	set     bool
	since   int64 // µs
	expires int64 // µs; math.MaxInt64: no expiry yet (a key without a TTL)
}

// Flush forgets the group, as a FLUSHALL does (flush its ledgers too).
func (g *MemoryGroup) Flush() {
	g.mu.Lock()
	g.set = false
	g.mu.Unlock()
}

// begin is the since of a new state begun at now.
func (g *MemoryGroup) begin(now int64) int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.set && now >= g.expires {
		g.set = false
	}
	if !g.set {
		g.set, g.since, g.expires = true, now, math.MaxInt64
	}
	return min(g.since, now)
}

// extend makes the group last at least ms from now (ledger.lua: PEXPIRE if PTTL < ms).
func (g *MemoryGroup) extend(now, ms int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.expires == math.MaxInt64 || (g.expires-now)/1000 < ms {
		g.expires = now + ms*1000
	}
}

// NewMemory returns the ledger of the global policy named policy, checking opts as the Redis
// ledger does.
func NewMemory(policy string, opts Options, m MemoryOptions) (*Memory, error) {
	if err := opts.Check(policy); err != nil {
		return nil, err
	}
	if m.Now == nil {
		m.Now = time.Now
	}
	l := &Memory{policy: policy, opts: opts, now: m.Now, slack: m.Slack, epoch: m.Epoch, group: m.Group, recs: map[string]Region{}}
	if l.epoch == nil {
		n := 0
		l.epoch = func() string { n++; return fmt.Sprint(n) }
	}
	return l, nil
}

// Options returns the ledger's options, defaults filled in.
func (l *Memory) Options() Options { return l.opts }

// Flush forgets the ledger's state, as a FLUSHALL or a failover to a replica that lacked it does:
// the next refresh begins a new one, in learning mode.
func (l *Memory) Flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs, l.state, l.since, l.epochNow, l.expires = map[string]Region{}, false, 0, "", 0
}

// expire drops the state once its keys would have expired (under l.mu).
func (l *Memory) expire(now int64) {
	if l.state && now >= l.expires {
		l.recs, l.state, l.since, l.epochNow, l.expires = map[string]Region{}, false, 0, "", 0
	}
}

func micros(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMicro()
}

// Read returns the whole ledger at once.
func (l *Memory) Read(context.Context) (View, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now().UnixMicro()
	l.expire(now)
	regs := make([]Region, 0, len(l.recs))
	for _, r := range l.recs {
		regs = append(regs, r)
	}
	return NewView(l.opts, now, l.since, l.state, l.epochNow, regs), nil
}

// Refresh is one region's refresh: ledger.lua's, in one step under the ledger's lock.
func (l *Memory) Refresh(_ context.Context, region string, r Report) (Grant, error) {
	if err := r.Check(l.policy, region); err != nil {
		return Grant{}, err
	}
	r = l.opts.Clamp(r)
	l.mu.Lock()
	defer l.mu.Unlock()
	sent := l.now()
	now := sent.UnixMicro()
	l.expire(now)
	o := l.opts
	lease, hold, L, N, F := o.Lease.Microseconds(), o.Hold.Microseconds(), o.Limit, int64(o.Regions), o.Floor
	if !l.state {
		// A new state (its meta written before anything can fail, and kept as Redis keeps a key
		// without a TTL until this refresh sets one).
		l.state, l.since, l.epochNow, l.expires = true, now, l.epoch(), math.MaxInt64
		if l.group != nil {
			l.since = l.group.begin(now)
		}
	}
	learning := now < l.since+lease+hold

	var names []string
	holds := map[string]int64{}
	var E, last int64
	for name, rec := range l.recs {
		until, expires := micros(rec.UsedUntil), micros(rec.Expires)
		counts := int64(0)
		if until > now {
			counts = rec.Used
		}
		if expires+hold > now {
			counts = max(counts, rec.Allotment, rec.Pending)
		}
		if expires+hold > now || counts > 0 {
			last = max(last, expires+hold, until)
		}
		switch {
		case name == region:
		case expires > now:
			holds[name] = max(rec.Allotment, counts)
			names = append(names, name)
		case counts > 0:
			E += counts
		default:
			delete(l.recs, name)
		}
	}
	if _, ok := l.recs[region]; !ok && len(l.recs) >= o.Clients {
		return Grant{}, fmt.Errorf("ledger %s: region %s: %w (at most %d)", l.policy, region, ErrTooManyRegions, o.Clients)
	}

	untl := micros(r.UsedUntil)
	usedNow := int64(0)
	if untl > now {
		usedNow = r.Used
	}
	pending := int64(0) // what it enforces until this grant reaches it (its lease's allotment)
	leased := micros(r.HoldsExpires) > now
	if leased {
		pending = r.Holds
	}
	names = append(names, region)
	sort.Strings(names)
	n := int64(len(names))
	R := F * max(0, N-n) // the floor reserved for the regions not live
	var others int64
	for _, name := range names {
		others += holds[name] // 0 for the region itself
	}
	free := max(0, L-R-E-others)
	var share int64
	if learning {
		// Doorman's learning mode: no new quota; what the region reports holding (its lease's
		// allotment, or its floor if it has no lease), capped so that the sum stays within the limit.
		h := F
		if leased {
			h = pending
		}
		share = max(h, usedNow)
		free = max(0, L-E-others)
	} else {
		// The algorithm over the live regions, sorted by name, each want raised to the floor.
		w := make([]int64, len(names))
		me := 0
		for i, name := range names {
			x := l.recs[name].Want
			if name == region {
				x, me = r.Want, i
			}
			w[i] = max(x, F)
		}
		share = allot.Split(o.Algorithm, max(0, L-R-E), w)[me]
	}
	a := min(share, free)

	expires := now + lease
	l.recs[region] = Region{Region: region, Want: r.Want, Allotment: a, Used: r.Used, UsedUntil: time.UnixMicro(untl).UTC(),
		Expires: time.UnixMicro(expires).UTC(), Admitted: r.Admitted, Refused: r.Refused, At: time.UnixMicro(now).UTC(), Pending: pending}
	// The state lives while a lease or a use that counts does, and a lease beyond, in whole ms.
	last = max(last, expires+hold, untl)
	ms := (last - now + lease + l.slack.Microseconds() + 999) / 1000
	l.expires = now + ms*1000
	if l.group != nil {
		l.group.extend(now, ms)
	}
	return Grant{Allotment: a, Expires: time.UnixMicro(expires).UTC(), LocalExpires: sent.Add(o.Lease), Learning: learning,
		Now: time.UnixMicro(now).UTC(), Since: time.UnixMicro(l.since).UTC(), Epoch: l.epochNow, Share: share, Free: free,
		Confirm: r.Confirms(a)}, nil
}

package redis

// The ledger of limits across regions (issue 34; docs/design.md, "Limits across regions: the
// ledger"): a policy with global: true is one limit L for all regions; each region enforces its
// current allotment on its own Redis, and refreshes it in the background from this ledger, on the
// global Redis, which splits L by demand (package allot: Doorman's fair or proportional share) in
// one atomic step per refresh (ledger.lua).
//
// Two keys per global policy, in one slot (one script writes both, on a Redis Cluster too):
//
//	<prefix>{<prefix>ledger:<policy>}:regions  hash: region -> "want allot used until expires admitted refused at pending"
//	<prefix>{<prefix>ledger:<policy>}:meta     hash: since (µs, when this state began), epoch (random)
//
// (With a prefix that has a hash tag of its own, that tag decides the slot: one slot still.) Both
// expire a lease after the last lease or counted use they hold, so a policy no longer global
// leaves nothing; a state that begins anew (no meta: flushed, failed over to a replica that
// lacked it, expired) is in learning mode for one lease and the hold.
//
// What a region holds, for the ledger, is max(allotment, pending, used): used is the part of its
// quota it cannot give back now (the design section says, per algorithm, what it is and until
// when it counts); pending the allotment it enforced when it sent its report, which it keeps
// enforcing until the grant reaches it (until its next refresh says so: Grant.Confirm). The ledger grants a region only out of L − F·max(0, N − live) − (uses of expired
// regions that still count) − (what the other live regions hold), so the sum of what the live
// regions hold, with the reserve and those uses, never exceeds L after a grant.

import (
	"context"
	_ "embed"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/allot"
)

//go:embed ledger.lua
var ledgerLua string

// ledgerScript is common.lua (its exact mul and divmod) and ledger.lua.
var ledgerScript = rueidis.NewLuaScript(luaFile("lua/common.lua") + "\n" + ledgerLua)

// Bounds and defaults of the ledger.
const (
	// MaxLedgerRegions is the most regions one global policy's ledger holds.
	MaxLedgerRegions = 64
	// MaxLedgerLimit bounds a global policy's limit and a region's want (2^47): the script's sums
	// of up to 64 of them stay exact in Lua's doubles.
	MaxLedgerLimit = 1 << 47
	// MaxLedgerName bounds a region's and a policy's name.
	MaxLedgerName = 128
	// DefaultLedgerLease is a grant's lease (and the learning mode's length) if none is set.
	DefaultLedgerLease = 30 * time.Second
)

// LedgerOptions configures one global policy's ledger. Every region must pass the same.
type LedgerOptions struct {
	// Limit is the policy's limit L: the sum of the outstanding allotments never exceeds it.
	// 1 to MaxLedgerLimit.
	Limit int64
	// Regions is N, the number of regions expected (1 to MaxLedgerRegions): the ledger reserves
	// the Floor for each of the N that holds no lease, so that a new region, or one whose lease
	// ran out, can take its floor without waiting (docs/design.md). Default 1.
	Regions int
	// Floor is F: what a region enforces before its first grant (a request never waits for the
	// ledger), the least a live region's want is raised to (an idle region keeps F), and what is
	// reserved for each region expected but not live. 0 to Limit/Regions. Default 0.
	Floor int64
	// Safe is the safe share S: what a region enforces once its lease ran out without a refresh
	// (cut off from the ledger). 0 to Limit. Default Floor (then a partition admits nothing
	// beyond L, as long as at most Regions regions run: docs/design.md).
	Safe int64
	// Lease is how long a grant holds without a refresh; the learning mode lasts Lease + Hold.
	// Default DefaultLedgerLease; at least 1 ms. Regions should refresh at least twice a lease.
	Lease time.Duration
	// Algorithm splits the limit: allot.Fair (default) or allot.Proportional.
	Algorithm allot.Algorithm
	// Hold is how long after a region's lease ended without a refresh its allotment still counts
	// in full: what it admitted under the lease since its last report is not known, and cannot be
	// given back within its window. LedgerHold gives it per algorithm. 0 to 2^40 µs.
	Hold time.Duration
}

// LedgerHold is LedgerOptions.Hold for a policy (docs/design.md): a fixed window's use lasts
// until its window ends, at most a period after the lease; a sliding window's counts as the
// previous window's for one more period; a token bucket's units in use drain within
// period·capacity/limit (capacity: burst, or the limit if 0). Other algorithms: the period.
func LedgerHold(alg algorithm.Algorithm, period time.Duration, limit, burst int64) time.Duration {
	switch alg {
	case algorithm.SlidingWindow:
		return 2 * period
	case algorithm.TokenBucket:
		if burst > limit && limit > 0 {
			return time.Duration(float64(period) * float64(burst) / float64(limit))
		}
	}
	return period
}

// Ledger is one global policy's ledger on the store's Redis (the global one). Its methods are
// safe for concurrent use.
type Ledger struct {
	s             *Store
	policy        string
	regions, meta string
	opts          LedgerOptions
}

// Ledger returns the ledger of the global policy named policy (1 to MaxLedgerName of A-Z, a-z,
// 0-9, '.', '_' and '-'), checking opts.
func (s *Store) Ledger(policy string, opts LedgerOptions) (*Ledger, error) {
	if err := checkLedgerName("policy", policy); err != nil {
		return nil, err
	}
	if opts.Regions == 0 {
		opts.Regions = 1
	}
	if opts.Lease == 0 {
		opts.Lease = DefaultLedgerLease
	}
	if opts.Algorithm == "" {
		opts.Algorithm = allot.Fair
	}
	switch {
	case opts.Limit < 1 || opts.Limit > MaxLedgerLimit:
		return nil, fmt.Errorf("redis store: ledger %s: limit %d; 1 to %d", policy, opts.Limit, int64(MaxLedgerLimit))
	case opts.Regions < 1 || opts.Regions > MaxLedgerRegions:
		return nil, fmt.Errorf("redis store: ledger %s: %d regions; 1 to %d", policy, opts.Regions, MaxLedgerRegions)
	case opts.Floor < 0 || opts.Floor > opts.Limit/int64(opts.Regions):
		return nil, fmt.Errorf("redis store: ledger %s: floor %d; 0 to limit/regions = %d", policy, opts.Floor, opts.Limit/int64(opts.Regions))
	case opts.Safe < 0 || opts.Safe > opts.Limit:
		return nil, fmt.Errorf("redis store: ledger %s: safe share %d; 0 to the limit %d", policy, opts.Safe, opts.Limit)
	case opts.Lease < time.Millisecond:
		return nil, fmt.Errorf("redis store: ledger %s: lease %v; at least 1ms", policy, opts.Lease)
	case opts.Hold < 0 || opts.Hold > time.Duration(1<<40)*time.Microsecond:
		return nil, fmt.Errorf("redis store: ledger %s: hold %v; 0 to 2^40 µs", policy, opts.Hold)
	case opts.Algorithm != allot.Fair && opts.Algorithm != allot.Proportional:
		return nil, fmt.Errorf("redis store: ledger %s: algorithm %q; %q or %q", policy, opts.Algorithm, allot.Fair, allot.Proportional)
	}
	if opts.Safe == 0 {
		opts.Safe = opts.Floor
	}
	tag := s.prefix + "{" + s.prefix + "ledger:" + policy + "}:"
	return &Ledger{s: s, policy: policy, regions: tag + "regions", meta: tag + "meta", opts: opts}, nil
}

// Keys returns the ledger's two keys: the regions' hash and the meta hash.
func (l *Ledger) Keys() (regions, meta string) { return l.regions, l.meta }

// Options returns the ledger's options, defaults filled in.
func (l *Ledger) Options() LedgerOptions { return l.opts }

func checkLedgerName(what, name string) error {
	if name == "" || len(name) > MaxLedgerName {
		return fmt.Errorf("redis store: ledger: %s name of %d bytes; 1 to %d", what, len(name), MaxLedgerName)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("redis store: ledger: %s name %q: byte %d is not one of A-Z, a-z, 0-9, '.', '_' and '-'", what, name, i)
		}
	}
	return nil
}

// Report is what a region tells the ledger on a refresh: its demand and what it holds.
type Report struct {
	// Want is its demand, in quota units per period (Demand computes it from an interval's
	// counts): 0 to MaxLedgerLimit.
	Want int64
	// Admitted and Refused are its counts of its last interval (for the stats): ≥ 0.
	Admitted, Refused int64
	// Holds is the allotment it enforces now, and HoldsExpires its lease's end (zero: it holds
	// no lease — new, restarted, or past its lease). The learning mode grants no more than this.
	Holds        int64
	HoldsExpires time.Time
	// Used is the part of what it holds that it cannot give back now (per algorithm:
	// docs/design.md), counted by the ledger while its clock is before UsedUntil. 0 to the limit.
	Used      int64
	UsedUntil time.Time
}

// Grant is the ledger's answer to a refresh.
type Grant struct {
	// Allotment is what the region may enforce until Expires (the ledger's clock).
	Allotment int64
	Expires   time.Time
	// LocalExpires is Expires on the caller's clock, taken safely: the time the refresh was sent
	// plus the lease (the ledger's lease starts later), whatever the clocks' skew.
	LocalExpires time.Time
	// Learning: the ledger's state is new and it hands out no new quota (for a lease and the
	// hold from Since: until every lease it does not know of has ended, and its hold).
	Learning bool
	// Confirm: the allotment is less than the region reported holding, which the ledger counts
	// until the region's next refresh says it enforces the new one: refresh again at once
	// (reporting Holds = Allotment) to give the difference back to the others.
	Confirm bool
	// Share is the algorithm's share for the region (Allotment is less while others still hold
	// what it would take), and Free what the ledger could grant it.
	Share, Free int64
	// Now is the ledger's clock at the refresh; Since when its state began; Epoch names it.
	Now, Since time.Time
	Epoch      string
}

// Refresh is one region's refresh: one atomic step on the ledger that records its report and
// returns its new allotment and lease.
func (l *Ledger) Refresh(ctx context.Context, region string, r Report) (Grant, error) {
	if err := checkLedgerName("region", region); err != nil {
		return Grant{}, err
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"want", r.Want}, {"admitted", r.Admitted}, {"refused", r.Refused}, {"holds", r.Holds}, {"used", r.Used}} {
		if f.v < 0 || f.v > MaxLedgerLimit {
			return Grant{}, fmt.Errorf("redis store: ledger %s: region %s: %s %d; 0 to %d", l.policy, region, f.name, f.v, int64(MaxLedgerLimit))
		}
	}
	c, err := l.s.connected()
	if err != nil {
		return Grant{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, l.s.timeout)
	defer cancel()
	sent := l.localNow()
	args := append(l.args("refresh"), region, itoa(r.Want), itoa(r.Used), itoa(unixMicros(r.UsedUntil)),
		itoa(r.Admitted), itoa(r.Refused), itoa(r.Holds), itoa(unixMicros(r.HoldsExpires)))
	vals, err := ledgerScript.Exec(ctx, c.client, []string{l.regions, l.meta}, args).ToArray()
	if err != nil {
		if msg := err.Error(); strings.Contains(msg, "ledger:") {
			return Grant{}, fmt.Errorf("redis store: ledger %s: region %s: %s", l.policy, region, msg[strings.Index(msg, "ledger:")+len("ledger: "):])
		}
		return Grant{}, unavailable(err)
	}
	if len(vals) != 8 {
		return Grant{}, fmt.Errorf("redis store: ledger %s: the script answered %d values", l.policy, len(vals))
	}
	var n [8]int64
	for i, v := range vals {
		if i == 5 {
			continue
		}
		if n[i], err = v.AsInt64(); err != nil {
			return Grant{}, fmt.Errorf("redis store: ledger %s: the script's answer %d: %w", l.policy, i, err)
		}
	}
	epoch, _ := vals[5].ToString()
	return Grant{Allotment: n[0], Expires: time.UnixMicro(n[1]).UTC(), LocalExpires: sent.Add(l.opts.Lease),
		Learning: n[2] == 1, Now: time.UnixMicro(n[3]).UTC(), Since: time.UnixMicro(n[4]).UTC(), Epoch: epoch,
		Share: n[6], Free: n[7], Confirm: n[0] < r.Holds && !r.HoldsExpires.IsZero()}, nil
}

func (l *Ledger) args(mode string) []string {
	return []string{mode, l.s.now(), itoa(l.opts.Lease.Microseconds()), itoa(l.opts.Limit), strconv.Itoa(l.opts.Regions),
		itoa(l.opts.Floor), map[allot.Algorithm]string{allot.Fair: "fair", allot.Proportional: "proportional"}[l.opts.Algorithm],
		strconv.Itoa(MaxLedgerRegions), l.s.slack, newEpoch(), itoa(l.opts.Hold.Microseconds())}
}

func (l *Ledger) localNow() time.Time {
	if l.s.clock != nil {
		return l.s.clock.Now()
	}
	return time.Now()
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func unixMicros(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMicro()
}

// Enforce is the allotment a region enforces at t (its own clock) given its last grant (the
// zero Grant if it has none yet): the grant's allotment until its LocalExpires; the floor before
// any grant (a new or restarted region, which never waits for the ledger); the safe share once
// the lease ran out (cut off from the ledger). safe says it is on the safe share.
func (l *Ledger) Enforce(last Grant, t time.Time) (allotment int64, safe bool) {
	switch {
	case last.LocalExpires.IsZero():
		return l.opts.Floor, false
	case t.Before(last.LocalExpires):
		return last.Allotment, false
	}
	return l.opts.Safe, true
}

// Demand is a want in quota units per period from an interval's counts: (admitted + refused)
// scaled from interval to period, rounded up, at most MaxLedgerLimit.
func Demand(admitted, refused int64, interval, period time.Duration) int64 {
	if interval <= 0 || admitted+refused <= 0 {
		return 0
	}
	d := float64(admitted+refused) * float64(period) / float64(interval)
	if d >= MaxLedgerLimit {
		return MaxLedgerLimit
	}
	return int64(d + 0.999999)
}

// LedgerRegion is one region's record in the ledger.
type LedgerRegion struct {
	Region            string
	Want              int64
	Allotment         int64
	Used              int64
	UsedUntil         time.Time
	Expires           time.Time // its lease's end (the ledger's clock)
	Admitted, Refused int64
	At                time.Time // its last refresh
	Pending           int64     // what it enforced when it sent its last report (counted until the next)
	// Live: its lease has not ended. Holding is what the ledger counts for it: max(Allotment,
	// Pending, Used) while live and for the hold after, then Used while that counts.
	Live    bool
	Holding int64
}

// LedgerView is the whole ledger at one instant, for stats.
type LedgerView struct {
	Now, Since time.Time // the ledger's clock; when its state began (zero: no state)
	Epoch      string
	Learning   bool
	Regions    []LedgerRegion // sorted by name
}

// Outstanding is the sum of the live regions' allotments: never above the limit.
func (v LedgerView) Outstanding() int64 {
	var sum int64
	for _, r := range v.Regions {
		if r.Live {
			sum += r.Allotment
		}
	}
	return sum
}

// Held is the sum of what the ledger counts as held: the live regions' max(allotment, pending, used),
// and the others' while they still count.
func (v LedgerView) Held() int64 {
	var sum int64
	for _, r := range v.Regions {
		sum += r.Holding
	}
	return sum
}

// Read returns the whole ledger, as one atomic read (with the ledger's clock).
func (l *Ledger) Read(ctx context.Context) (LedgerView, error) {
	c, err := l.s.connected()
	if err != nil {
		return LedgerView{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, l.s.timeout)
	defer cancel()
	vals, err := ledgerScript.Exec(ctx, c.client, []string{l.regions, l.meta}, l.args("read")).ToArray()
	if err != nil {
		return LedgerView{}, unavailable(err)
	}
	if len(vals) != 4 {
		return LedgerView{}, fmt.Errorf("redis store: ledger %s: the read answered %d values", l.policy, len(vals))
	}
	var v LedgerView
	nowS, _ := vals[0].ToString()
	now, _ := strconv.ParseInt(nowS, 10, 64)
	v.Now = time.UnixMicro(now).UTC()
	if s, _ := vals[1].ToString(); s != "" {
		since, _ := strconv.ParseInt(s, 10, 64)
		v.Since = time.UnixMicro(since).UTC()
		v.Learning = now < since+(l.opts.Lease+l.opts.Hold).Microseconds()
	}
	v.Epoch, _ = vals[2].ToString()
	flat, err := vals[3].AsStrSlice()
	if err != nil {
		return LedgerView{}, fmt.Errorf("redis store: ledger %s: %w", l.policy, err)
	}
	for i := 0; i+1 < len(flat); i += 2 {
		f := strings.Fields(flat[i+1])
		if len(f) != 9 {
			return LedgerView{}, fmt.Errorf("redis store: ledger %s: region %s: record %q", l.policy, flat[i], flat[i+1])
		}
		var n [9]int64
		for j := range f {
			if n[j], err = strconv.ParseInt(f[j], 10, 64); err != nil {
				return LedgerView{}, fmt.Errorf("redis store: ledger %s: region %s: record %q", l.policy, flat[i], flat[i+1])
			}
		}
		r := LedgerRegion{Region: flat[i], Want: n[0], Allotment: n[1], Used: n[2], UsedUntil: time.UnixMicro(n[3]).UTC(),
			Expires: time.UnixMicro(n[4]).UTC(), Admitted: n[5], Refused: n[6], At: time.UnixMicro(n[7]).UTC(), Pending: n[8], Live: n[4] > now}
		counts := int64(0)
		if n[3] > now {
			counts = n[2]
		}
		if n[4]+l.opts.Hold.Microseconds() > now {
			counts = max(counts, r.Allotment, r.Pending) // live, or within the hold after its lease
		}
		r.Holding = counts
		v.Regions = append(v.Regions, r)
	}
	slices.SortFunc(v.Regions, func(a, b LedgerRegion) int { return strings.Compare(a.Region, b.Region) })
	return v, nil
}

// UseState is what a region knows of its own use of a global policy's allotment, from its state
// on its own Redis, for LedgerUse.
type UseState struct {
	// The window algorithms: the current window's start, its count Cur and the previous one's
	// Prev (the sliding window's).
	WindowStart time.Time
	Prev, Cur   int64
	// The token bucket: the units in use (capacity − tokens) and when the bucket is full again
	// (its theoretical arrival time).
	InUse int64
	Full  time.Time
}

// LedgerUse is a region's Report.Used and UsedUntil under a policy of algorithm alg (period,
// limit, burst: the global policy's) at now (docs/design.md, "What an allotment means"):
//
//   - fixed window: the window's count, until its end;
//   - sliding window: ⌈prev·(P − e)/P⌉ + cur (e the time into the window), until the next
//     window's end, when cur stops counting as the previous window's;
//   - token bucket: the units in use in the limit's units, ⌈inUse·limit/capacity⌉, until full;
//   - any other: the window's count, until a period after the window's start.
//
// The times are the region's; shift them to the ledger's clock (by the last Grant's Now minus the
// time its refresh was sent) before reporting.
func LedgerUse(alg algorithm.Algorithm, period time.Duration, limit, burst int64, now time.Time, st UseState) (int64, time.Time) {
	switch alg {
	case algorithm.SlidingWindow:
		e := min(max(now.Sub(st.WindowStart), 0), period)
		w := float64(st.Prev) * float64(period-e) / float64(period)
		return int64(math.Ceil(w)) + st.Cur, st.WindowStart.Add(2 * period)
	case algorithm.TokenBucket:
		capacity := burst
		if capacity <= 0 {
			capacity = limit
		}
		return int64(math.Ceil(float64(st.InUse) * float64(limit) / float64(capacity))), st.Full
	}
	return st.Cur, st.WindowStart.Add(period)
}

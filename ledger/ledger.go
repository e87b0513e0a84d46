// Package ledger holds what both ledgers of limits across regions share (issue 34; docs/design.md,
// "Limits across regions: the ledger"): the region's report, the ledger's grant and view, the
// options, and the rules a region applies to them (Enforce, Demand, Use, Hold). The ledger on a
// global Redis is store/redis's Ledger (ledger.lua); Memory is the same ledger in Go, for the
// simulator, which runs regions on a virtual clock without Redis. Both split the limit with
// package allot; TestLedgerMemoryDifferential (store/redis) checks they answer alike.
package ledger

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/allot"
)

// Ledger is one limit's ledger as its clients use it: store/redis's, on a Redis every client
// reaches, or Memory. The clients are regions (package region) or Envoys (package rlqs).
type Ledger interface {
	Refresh(ctx context.Context, client string, r Report) (Grant, error)
	Read(ctx context.Context) (View, error)
	Options() Options
}

// Ledgers returns the ledger of the limit named name with opts.
type Ledgers func(name string, opts Options) (Ledger, error)

// Bounds and defaults of a ledger.
const (
	// MaxRegions is the most regions one global policy's ledger holds.
	MaxRegions = 64
	// MaxLimit bounds a global policy's limit and a region's want (2^47): the script's sums of
	// up to 64 of them stay exact in Lua's doubles.
	MaxLimit = 1 << 47
	// MaxName bounds a region's and a policy's name.
	MaxName = 128
	// DefaultLease is a grant's lease (and the learning mode's length) if none is set.
	DefaultLease = 30 * time.Second
	// MaxClients is the most clients a ledger with a small limit holds (Options.Clients): 1024
	// sums of up to MaxClientsLimit stay exact in Lua's doubles.
	MaxClients = 1024
	// MaxClientsLimit bounds the limit of a ledger of more than MaxRegions clients (2^43).
	MaxClientsLimit = 1 << 43
)

// ErrTooManyRegions is the error of a refresh by a new client when the ledger holds
// Options.Clients.
var ErrTooManyRegions = errors.New("too many clients")

// Options configures one global policy's ledger. Every region must pass the same.
type Options struct {
	// Limit is the policy's limit L: the sum of the outstanding allotments never exceeds it.
	// 1 to MaxLimit.
	Limit int64
	// Regions is N, the number of regions expected (1 to MaxRegions): the ledger reserves the
	// Floor for each of the N that holds no lease, so that a new region, or one whose lease ran
	// out, can take its floor without waiting (docs/design.md). Default 1.
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
	// Default DefaultLease; at least 1 ms. Regions should refresh at least twice a lease.
	Lease time.Duration
	// Algorithm splits the limit: allot.Fair (default) or allot.Proportional.
	Algorithm allot.Algorithm
	// Hold is how long after a region's lease ended without a refresh its allotment still counts
	// in full: what it admitted under the lease since its last report is not known, and cannot be
	// given back within its window. Hold gives it per algorithm. 0 to 2^40 µs.
	Hold time.Duration
	// Clients is the most clients (regions, Envoys) the ledger holds: MaxRegions if 0; up to
	// MaxClients with a limit of at most MaxClientsLimit, when a report's want, holds and use
	// are taken as at most the limit (Clamp), so that the sums stay exact.
	Clients int
}

// Clamp is the report as a ledger of opts takes it: with more than MaxRegions clients, its want,
// holds and use at most the limit (no client holds more; the fair share caps a want at what
// can be shared anyway; the proportional share weighs wants above the limit as the limit).
func (opts Options) Clamp(r Report) Report {
	if opts.Clients > MaxRegions {
		r.Want, r.Holds, r.Used = min(r.Want, opts.Limit), min(r.Holds, opts.Limit), min(r.Used, opts.Limit)
	}
	return r
}

// Check fills in opts's defaults and checks it for the ledger of policy; its errors begin
// "ledger <policy>: ".
func (opts *Options) Check(policy string) error {
	if err := CheckName("policy", policy); err != nil {
		return err
	}
	if opts.Regions == 0 {
		opts.Regions = 1
	}
	if opts.Lease == 0 {
		opts.Lease = DefaultLease
	}
	if opts.Algorithm == "" {
		opts.Algorithm = allot.Fair
	}
	if opts.Clients == 0 {
		opts.Clients = MaxRegions
	}
	switch {
	case opts.Limit < 1 || opts.Limit > MaxLimit:
		return fmt.Errorf("ledger %s: limit %d; 1 to %d", policy, opts.Limit, int64(MaxLimit))
	case opts.Clients < 1 || opts.Clients > MaxClients:
		return fmt.Errorf("ledger %s: %d clients; 1 to %d", policy, opts.Clients, MaxClients)
	case opts.Clients > MaxRegions && opts.Limit > MaxClientsLimit:
		return fmt.Errorf("ledger %s: limit %d with %d clients; at most %d with more than %d", policy, opts.Limit, opts.Clients, int64(MaxClientsLimit), MaxRegions)
	case opts.Regions < 1 || opts.Regions > min(MaxRegions, opts.Clients):
		return fmt.Errorf("ledger %s: %d regions; 1 to %d", policy, opts.Regions, min(MaxRegions, opts.Clients))
	case opts.Floor < 0 || opts.Floor > opts.Limit/int64(opts.Regions):
		return fmt.Errorf("ledger %s: floor %d; 0 to limit/regions = %d", policy, opts.Floor, opts.Limit/int64(opts.Regions))
	case opts.Safe < 0 || opts.Safe > opts.Limit:
		return fmt.Errorf("ledger %s: safe share %d; 0 to the limit %d", policy, opts.Safe, opts.Limit)
	case opts.Lease < time.Millisecond:
		return fmt.Errorf("ledger %s: lease %v; at least 1ms", policy, opts.Lease)
	case opts.Hold < 0 || opts.Hold > time.Duration(1<<40)*time.Microsecond:
		return fmt.Errorf("ledger %s: hold %v; 0 to 2^40 µs", policy, opts.Hold)
	case opts.Algorithm != allot.Fair && opts.Algorithm != allot.Proportional:
		return fmt.Errorf("ledger %s: algorithm %q; %q or %q", policy, opts.Algorithm, allot.Fair, allot.Proportional)
	}
	if opts.Safe == 0 {
		opts.Safe = opts.Floor
	}
	return nil
}

// CheckName checks a policy's or a region's name: 1 to MaxName of A-Z, a-z, 0-9, '.', '_' and '-'.
func CheckName(what, name string) error {
	if name == "" || len(name) > MaxName {
		return fmt.Errorf("ledger: %s name of %d bytes; 1 to %d", what, len(name), MaxName)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("ledger: %s name %q: byte %d is not one of A-Z, a-z, 0-9, '.', '_' and '-'", what, name, i)
		}
	}
	return nil
}

// Hold is Options.Hold for a policy (docs/design.md): a fixed window's use lasts until its window
// ends, at most a period after the lease; a sliding window's counts as the previous window's for
// one more period; a token bucket's units in use drain within period·capacity/limit (capacity:
// burst, or the limit if 0). Other algorithms: the period.
func Hold(alg algorithm.Algorithm, period time.Duration, limit, burst int64) time.Duration {
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

// Report is what a region tells the ledger on a refresh: its demand and what it holds.
type Report struct {
	// Want is its demand, in quota units per period (Demand computes it from an interval's
	// counts): 0 to MaxLimit.
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

// Check checks region's name and the report's numbers; its errors begin "ledger <policy>: ".
func (r Report) Check(policy, region string) error {
	if err := CheckName("region", region); err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"want", r.Want}, {"admitted", r.Admitted}, {"refused", r.Refused}, {"holds", r.Holds}, {"used", r.Used}} {
		if f.v < 0 || f.v > MaxLimit {
			return fmt.Errorf("ledger %s: region %s: %s %d; 0 to %d", policy, region, f.name, f.v, int64(MaxLimit))
		}
	}
	return nil
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

// Confirms reports whether a grant of allotment a answers report r with Grant.Confirm.
func (r Report) Confirms(a int64) bool { return a < r.Holds && !r.HoldsExpires.IsZero() }

// Enforce is the allotment a region enforces at t (its own clock) under opts given its last grant
// (the zero Grant if it has none yet): the grant's allotment until its LocalExpires; the floor
// before any grant (a new or restarted region, which never waits for the ledger); the safe share
// once the lease ran out (cut off from the ledger). safe says it is on the safe share.
func Enforce(opts Options, last Grant, t time.Time) (allotment int64, safe bool) {
	switch {
	case last.LocalExpires.IsZero():
		return opts.Floor, false
	case t.Before(last.LocalExpires):
		return last.Allotment, false
	}
	return opts.Safe, true
}

// Demand is a want in quota units per period from an interval's counts: (admitted + refused)
// scaled from interval to period, rounded up, at most MaxLimit.
func Demand(admitted, refused int64, interval, period time.Duration) int64 {
	if interval <= 0 || admitted+refused <= 0 {
		return 0
	}
	d := float64(admitted+refused) * float64(period) / float64(interval)
	if d >= MaxLimit {
		return MaxLimit
	}
	return int64(d + 0.999999)
}

// Region is one region's record in the ledger.
type Region struct {
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

// View is the whole ledger at one instant, for stats.
type View struct {
	Now, Since time.Time // the ledger's clock; when its state began (zero: no state)
	Epoch      string
	Learning   bool
	Regions    []Region // sorted by name
}

// Outstanding is the sum of the live regions' allotments: never above the limit.
func (v View) Outstanding() int64 {
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
func (v View) Held() int64 {
	var sum int64
	for _, r := range v.Regions {
		sum += r.Holding
	}
	return sum
}

// NewView is the view of a ledger under opts at now (µs of its clock) whose state, if it has one
// (state), began at since with epoch, holding regs (each with its record's fields; Live and Holding are
// computed here): the view both ledgers' Read return.
func NewView(opts Options, now, since int64, state bool, epoch string, regs []Region) View {
	v := View{Now: time.UnixMicro(now).UTC(), Epoch: epoch}
	if state {
		v.Since = time.UnixMicro(since).UTC()
		v.Learning = now < since+(opts.Lease+opts.Hold).Microseconds()
	}
	for _, r := range regs {
		r.Live = r.Expires.UnixMicro() > now
		counts := int64(0)
		if r.UsedUntil.UnixMicro() > now {
			counts = r.Used
		}
		if r.Expires.UnixMicro()+opts.Hold.Microseconds() > now {
			counts = max(counts, r.Allotment, r.Pending) // live, or within the hold after its lease
		}
		r.Holding = counts
		v.Regions = append(v.Regions, r)
	}
	slices.SortFunc(v.Regions, func(a, b Region) int { return strings.Compare(a.Region, b.Region) })
	return v
}

// UseState is what a region knows of its own use of a global policy's allotment, from its state
// on its own store, for Use.
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

// Use is a region's Report.Used and UsedUntil under a policy of algorithm alg (period, limit,
// burst: the global policy's) at now (docs/design.md, "What an allotment means"):
//
//   - fixed window: the window's count, until its end;
//   - sliding window: ⌈prev·(P − e)/P⌉ + cur (e the time into the window), until the next
//     window's end, when cur stops counting as the previous window's;
//   - token bucket: the units in use in the limit's units, ⌈inUse·limit/capacity⌉, until full;
//   - any other: the window's count, until a period after the window's start.
//
// The times are the region's; shift them to the ledger's clock (by the last Grant's Now minus the
// time its refresh was sent) before reporting.
func Use(alg algorithm.Algorithm, period time.Duration, limit, burst int64, now time.Time, st UseState) (int64, time.Time) {
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

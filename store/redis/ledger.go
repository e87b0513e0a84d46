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
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/allot"
	"github.com/sluicehq/sluice/ledger"
)

//go:embed ledger.lua
var ledgerLua string

// ledgerScript is common.lua (its exact mul and divmod) and ledger.lua.
var ledgerScript = rueidis.NewLuaScript(luaFile("lua/common.lua") + "\n" + ledgerLua)

// Bounds and defaults of the ledger (package ledger's).
const (
	MaxLedgerRegions   = ledger.MaxRegions
	MaxLedgerLimit     = ledger.MaxLimit
	MaxLedgerName      = ledger.MaxName
	DefaultLedgerLease = ledger.DefaultLease
)

// The ledger's types are package ledger's, which the Go ledger (ledger.Memory) and package region
// share.
type (
	LedgerOptions = ledger.Options
	Report        = ledger.Report
	Grant         = ledger.Grant
	LedgerRegion  = ledger.Region
	LedgerView    = ledger.View
	UseState      = ledger.UseState
)

// LedgerHold is ledger.Hold; Demand ledger.Demand; LedgerUse ledger.Use.
var (
	LedgerHold = ledger.Hold
	Demand     = ledger.Demand
	LedgerUse  = ledger.Use
)

// Ledger is one global policy's ledger on the store's Redis (the global one). Its methods are
// safe for concurrent use.
type Ledger struct {
	s             *Store
	policy        string
	regions, meta string
	keys          []string // regions, meta and, in a group, the group's key
	opts          LedgerOptions
}

// Ledger returns the ledger of the global policy named policy (1 to MaxLedgerName of A-Z, a-z,
// 0-9, '.', '_' and '-'), checking opts.
func (s *Store) Ledger(policy string, opts LedgerOptions) (*Ledger, error) {
	if err := opts.Check(policy); err != nil {
		return nil, fmt.Errorf("redis store: %w", err)
	}
	tag := s.prefix + "{" + s.prefix + "ledger:" + policy + "}:"
	l := &Ledger{s: s, policy: policy, regions: tag + "regions", meta: tag + "meta", opts: opts}
	l.keys = []string{l.regions, l.meta}
	return l, nil
}

// GroupLedger returns the ledger named name in group (both names as Ledger's): the quota
// service's buckets of one rule, whose number is not known ahead. Its keys share the group's
// slot, with the group's key beside them:
//
//	<prefix>{<prefix>ledgers:<group>}:<name>:regions, …:<name>:meta  as Ledger's two
//	<prefix>{<prefix>ledgers:<group>}:since                          µs since when the group is known
//
// A ledger's new state is as old as its group's, so that a bucket seen for the first time does not
// begin in learning mode (no lease of it can be unknown: the group key would be gone with it), while
// every ledger of a group flushed or failed over with it does.
func (s *Store) GroupLedger(group, name string, opts LedgerOptions) (*Ledger, error) {
	if err := checkLedgerName("group", group); err != nil {
		return nil, err
	}
	if err := opts.Check(name); err != nil {
		return nil, fmt.Errorf("redis store: %w", err)
	}
	tag := s.prefix + "{" + s.prefix + "ledgers:" + group + "}:"
	l := &Ledger{s: s, policy: name, regions: tag + name + ":regions", meta: tag + name + ":meta", opts: opts}
	l.keys = []string{l.regions, l.meta, tag + "since"}
	return l, nil
}

// Keys returns the ledger's two keys: the regions' hash and the meta hash.
func (l *Ledger) Keys() (regions, meta string) { return l.regions, l.meta }

// Options returns the ledger's options, defaults filled in.
func (l *Ledger) Options() LedgerOptions { return l.opts }

// Refresh is one region's refresh: one atomic step on the ledger that records its report and
// returns its new allotment and lease.
func (l *Ledger) Refresh(ctx context.Context, region string, r Report) (Grant, error) {
	if err := r.Check(l.policy, region); err != nil {
		return Grant{}, fmt.Errorf("redis store: %w", err)
	}
	r = l.opts.Clamp(r)
	c, err := l.s.connected()
	if err != nil {
		return Grant{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, l.s.timeout)
	defer cancel()
	sent := l.localNow()
	args := append(l.args("refresh"), region, itoa(r.Want), itoa(r.Used), itoa(unixMicros(r.UsedUntil)),
		itoa(r.Admitted), itoa(r.Refused), itoa(r.Holds), itoa(unixMicros(r.HoldsExpires)))
	vals, err := ledgerScript.Exec(ctx, c.client, l.keys, args).ToArray()
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
		Share: n[6], Free: n[7], Confirm: r.Confirms(n[0])}, nil
}

func (l *Ledger) args(mode string) []string {
	return []string{mode, l.s.now(), itoa(l.opts.Lease.Microseconds()), itoa(l.opts.Limit), strconv.Itoa(l.opts.Regions),
		itoa(l.opts.Floor), map[allot.Algorithm]string{allot.Fair: "fair", allot.Proportional: "proportional"}[l.opts.Algorithm],
		strconv.Itoa(l.opts.Clients), l.s.slack, newEpoch(), itoa(l.opts.Hold.Microseconds())}
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

func checkLedgerName(what, name string) error {
	if err := ledger.CheckName(what, name); err != nil {
		return fmt.Errorf("redis store: %w", err)
	}
	return nil
}

// Enforce is ledger.Enforce under the ledger's options.
func (l *Ledger) Enforce(last Grant, t time.Time) (allotment int64, safe bool) {
	return ledger.Enforce(l.opts, last, t)
}

// Read returns the whole ledger, as one atomic read (with the ledger's clock).
func (l *Ledger) Read(ctx context.Context) (LedgerView, error) {
	c, err := l.s.connected()
	if err != nil {
		return LedgerView{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, l.s.timeout)
	defer cancel()
	vals, err := ledgerScript.Exec(ctx, c.client, l.keys, l.args("read")).ToArray()
	if err != nil {
		return LedgerView{}, unavailable(err)
	}
	if len(vals) != 4 {
		return LedgerView{}, fmt.Errorf("redis store: ledger %s: the read answered %d values", l.policy, len(vals))
	}
	nowS, _ := vals[0].ToString()
	now, _ := strconv.ParseInt(nowS, 10, 64)
	s, _ := vals[1].ToString()
	since, _ := strconv.ParseInt(s, 10, 64)
	epoch, _ := vals[2].ToString()
	flat, err := vals[3].AsStrSlice()
	if err != nil {
		return LedgerView{}, fmt.Errorf("redis store: ledger %s: %w", l.policy, err)
	}
	var regs []LedgerRegion
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
		regs = append(regs, LedgerRegion{Region: flat[i], Want: n[0], Allotment: n[1], Used: n[2], UsedUntil: time.UnixMicro(n[3]).UTC(),
			Expires: time.UnixMicro(n[4]).UTC(), Admitted: n[5], Refused: n[6], At: time.UnixMicro(n[7]).UTC(), Pending: n[8]})
	}
	return ledger.NewView(l.opts, now, since, s != "", epoch, regs), nil
}

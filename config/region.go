// This file reads the region section and checks the policies marked global: true (issue 34):
// one limit for all regions, each enforcing its allotment from a ledger on a global Redis
// (store/redis/ledger.go; docs/design.md, "Limits across regions: the ledger").

package config

import (
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice"
)

// Defaults and bounds of the region section.
const (
	DefaultRegionRefresh = time.Second
	DefaultRegionLease   = 10 * time.Second
	DefaultRegionAlgo    = "fair"
	// MaxRegions is the most regions a global policy's ledger holds (the Redis ledger's own
	// bound, checked by cmd/sluice's tests).
	MaxRegions = 64
	// MaxGlobalLimit bounds a global policy's limit (2^47: the ledger's sums of 64 of them stay
	// exact in Lua's doubles; the Redis ledger's own bound).
	MaxGlobalLimit = 1 << 47
)

// Region is the region section: this instance's region, and the ledger on the global Redis that
// allots each global policy's limit between the regions by their demand.
type Region struct {
	Name    string // this region's name: A-Z, a-z, 0-9, '.', '_', '-'; every instance of the region the same
	Global  Store  // the global Redis, where the ledger is (type redis)
	Regions int    // N: the regions expected; the ledger reserves the floor for each one not yet seen
	// Refresh is how often the region reports its demand and takes its allotment; Lease how long
	// a grant holds without a refresh (≥ 2·Refresh).
	Refresh, Lease time.Duration
	// Hold is how long after a lapsed lease the ledger still counts a region's allotment; 0: per
	// policy, by its algorithm (a fixed window's period, a sliding window's two, a bucket's drain).
	Hold time.Duration
	// Floor is each global policy's share a region enforces before its first grant (and keeps when
	// idle), as a fraction of the limit, 0 … 1/Regions; SafeShare the fraction it enforces once
	// its lease has run out without a refresh (0 … 1; default Floor, which keeps the worldwide
	// bound under a partition).
	Floor, SafeShare float64
	Algorithm        string // the ledger's split: fair (Doorman's FAIR_SHARE) or proportional
	Line             int
}

// region reads the region section; the store must be Redis (each region enforces on its own).
func (p *parser) region(n *yaml.Node, c *Config) *Region {
	const path = "region"
	m := p.mapping(n, n, "", "region")
	if m == nil {
		return nil
	}
	p.checkKnown(m, path, regionFields...)
	r := &Region{Refresh: DefaultRegionRefresh, Lease: DefaultRegionLease, Algorithm: DefaultRegionAlgo, Line: m.node.Line, Floor: -1, SafeShare: -1,
		Global: Store{Type: StoreRedis, Prefix: DefaultStorePrefix, Timeout: DefaultSlowTimeout, SlowTimeout: DefaultSlowTimeout, Fleet: DefaultFleet}}
	if c.Store.Type != StoreRedis {
		p.errorf(m.node, path, nil, "region needs a Redis store (store: {type: redis, ...}): each region enforces its allotments on its own Redis")
	}
	if n := p.get(m, "name"); n != nil {
		if v, ok := p.plainName(n, path, "name"); ok {
			r.Name = v
		}
	} else {
		p.errorf(m.node, path, nil, "region needs name: this region's, the same on every instance of it (e.g. name: eu)")
	}
	if n := p.get(m, "global"); n != nil {
		p.storeAt(n, path, "global", &r.Global)
		if r.Global.Type != StoreRedis {
			p.errorf(n, path+".global", nil, "type must be redis: the ledger is kept on a Redis every region reaches")
		}
	} else {
		p.errorf(m.node, path, nil, "region needs global: the Redis of the ledger every region reaches (global: {type: redis, addrs: [redis.global.internal:6379]})")
	}
	if n := p.get(m, "regions"); n != nil {
		if v, ok := p.int(n, path, "regions"); ok {
			if v < 1 || v > MaxRegions {
				p.errorf(n, path, nil, "regions %d must be from 1 to %d: how many regions run this configuration", v, MaxRegions)
			} else {
				r.Regions = int(v)
			}
		}
	} else {
		p.errorf(m.node, path, nil, "region needs regions: how many regions run this configuration (the ledger reserves a floor for each)")
	}
	p.durationIn(m, path, "refresh", 10*time.Millisecond, time.Hour, "how often the region reports its demand and takes its allotment", &r.Refresh)
	p.durationIn(m, path, "lease", 20*time.Millisecond, 24*time.Hour, "how long a grant holds without a refresh", &r.Lease)
	p.durationIn(m, path, "hold", time.Millisecond, 24*time.Hour, "how long a lapsed lease's allotment still counts", &r.Hold)
	if r.Lease < 2*r.Refresh {
		at := m.values["lease"]
		if at == nil {
			at = m.node
		}
		p.errorf(at, path, nil, "lease %v must be at least twice refresh (%v): a region refreshes at least twice a lease", r.Lease, r.Refresh)
	}
	frac := func(field string, max float64, why string, dst *float64) {
		if n := p.get(m, field); n != nil {
			if v, ok := p.float(n, path, field); ok {
				if !(v >= 0 && v <= max) {
					p.errorf(n, path, nil, "%s %s must be from 0 to %.4g: %s", field, n.Value, max, why)
				} else {
					*dst = v
				}
			}
		}
	}
	if r.Regions > 0 {
		frac("floor", 1/float64(r.Regions), "a fraction of each global policy's limit, at most 1/regions (the ledger reserves it for every region)", &r.Floor)
	}
	frac("safe_share", 1, "a fraction of each global policy's limit", &r.SafeShare)
	if r.Floor < 0 && r.Regions > 0 {
		r.Floor = DefaultFloor(r.Regions)
	}
	if r.SafeShare < 0 {
		r.SafeShare = max(r.Floor, 0)
	}
	if n := p.get(m, "algorithm"); n != nil {
		if v, ok := p.str(n, path, "algorithm"); ok {
			if v != "fair" && v != "proportional" {
				p.errorf(n, path, nil, "algorithm %q must be fair (Doorman's fair share) or proportional", v)
			} else {
				r.Algorithm = v
			}
		}
	}
	return r
}

// globalPolicy checks a policy's global: true (at n): a region section, a window or bucket
// algorithm, a limit the ledger takes, and no calendar or local_budget.
func (p *parser) globalPolicy(n *yaml.Node, path string, pol *Policy, c *Config, m *mapping) {
	g, ok := p.bool(n, path, "global")
	if !ok || !g {
		return
	}
	pol.Global = true
	switch a := pol.Algorithm; {
	case c.Region == nil:
		p.errorf(n, path, nil, "global: true needs a region section (region: {name: eu, regions: 3, global: {type: redis, addrs: [...]}}): the ledger that allots the limit between regions")
	case a != sluice.FixedWindow && a != sluice.SlidingWindow && a != sluice.TokenBucket && a != 0:
		p.errorf(n, path, nil, "global: true is for fixed-window, sliding-window and token-bucket, not %v", a)
	case pol.Limit > MaxGlobalLimit:
		p.errorf(n, path, nil, "global: true takes a limit up to 2^47 (%d), not %d", int64(MaxGlobalLimit), pol.Limit)
	case m.has("calendar"):
		p.errorf(n, path, nil, "global: true and calendar exclude each other: the ledger counts in the policy's period")
	case m.has("local_budget"):
		p.errorf(n, path, nil, "global: true and local_budget exclude each other: the region's allotment changes under a budget taken")
	}
}

// DefaultFloor is region.floor's default for n regions: 1/(2·n) of the limit, half of an even
// share, so that a region starting (or idle) has some quota at once and the others most of it.
func DefaultFloor(n int) float64 { return 1 / float64(2*n) }

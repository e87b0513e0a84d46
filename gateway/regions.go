package gateway

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// regionCollector is the sluice_region_* metrics: per global policy, this region's allotment,
// demand, use, lease and whether it runs on its safe share, read at each scrape.
type regionCollector struct{ regions func() RegionStats }

var (
	regionAllotment = prometheus.NewDesc("sluice_region_allotment",
		"What this region enforces now of a global: true policy's limit (its allotment from the ledger; the floor before any grant; the safe share once a lease ran out).", []string{"region", "policy"}, nil)
	regionLimit = prometheus.NewDesc("sluice_region_limit",
		"A global: true policy's limit for all regions together.", []string{"region", "policy"}, nil)
	regionWant = prometheus.NewDesc("sluice_region_demand",
		"This region's demand for a global policy, per period, as last reported to the ledger.", []string{"region", "policy"}, nil)
	regionUsed = prometheus.NewDesc("sluice_region_used",
		"This region's use of a global policy in the current window, as last reported to the ledger.", []string{"region", "policy"}, nil)
	regionLease = prometheus.NewDesc("sluice_region_lease_seconds",
		"Seconds until this region's lease of a global policy's allotment ends without a refresh (0: none, or ended).", []string{"region", "policy"}, nil)
	regionSafe = prometheus.NewDesc("sluice_region_safe_share",
		"1 while this region runs a global policy on its safe share (its lease ran out without a refresh: the ledger unreachable), else 0.", []string{"region", "policy"}, nil)
)

func (c regionCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{regionAllotment, regionLimit, regionWant, regionUsed, regionLease, regionSafe} {
		ch <- d
	}
}

func (c regionCollector) Collect(ch chan<- prometheus.Metric) {
	rs := c.regions()
	now := time.Now()
	for _, p := range rs.Policies {
		safe, lease := 0.0, 0.0
		if p.Safe {
			safe = 1
		}
		if !p.Lease.IsZero() && p.Lease.After(now) {
			lease = p.Lease.Sub(now).Seconds()
		}
		for _, m := range []struct {
			d *prometheus.Desc
			v float64
		}{{regionAllotment, float64(p.Allotment)}, {regionLimit, float64(p.Limit)}, {regionWant, float64(p.Want)},
			{regionUsed, float64(p.Used)}, {regionLease, lease}, {regionSafe, safe}} {
			ch <- prometheus.MustNewConstMetric(m.d, prometheus.GaugeValue, m.v, rs.Region, p.Policy)
		}
	}
}

// regionFindings are the diagnosis's findings of the global policies: this region on its safe
// share (the ledger unreachable for a lease, or the region's Redis, where its instances pool,
// for a follow window); a limit short of what the regions want. (Several instances of a region
// are no fault: they pool on the region's Redis, docs/design.md.)
func regionFindings(rs RegionStats) []Finding {
	var out []Finding
	for _, p := range rs.Policies {
		if p.Safe {
			out = append(out, Finding{Kind: "region_safe_share", Subject: "policy " + p.Policy,
				Summary: fmt.Sprintf("region %s runs global policy %s on its safe share (%d of %d): its lease ran out without a refresh from the ledger (%s)", rs.Region, p.Policy, p.Allotment, p.Limit, p.Error),
				Do:      "make the global Redis (region.global) reachable from this region; until then the region admits its safe share, and the worldwide bound is the limit plus each cut-off region's safe share beyond its floor"})
		}
		if p.Slow {
			out = append(out, Finding{Kind: "region_refresh_slow", Subject: "policy " + p.Policy,
				Summary: fmt.Sprintf("region %s's refresh of global policy %s took %v, more than half its instances' lock (%v, three refresh intervals): a slower one loses the lock midway, and the instances take turns refreshing", rs.Region, p.Policy, p.RefreshTook.Round(time.Millisecond), p.LockTTL),
				Do:      "raise region.refresh (the lock lasts three), or bring the global Redis closer (a lower round trip); region.global.timeout bounds one call of it"})
		}
		if p.WorldWant > p.Limit {
			out = append(out, Finding{Kind: "global_limit_short", Subject: "policy " + p.Policy,
				Summary: fmt.Sprintf("the regions want %d of global policy %s per period together; its limit is %d: the ledger splits it, and every region refuses part of its demand", p.WorldWant, p.Policy, p.Limit),
				Do:      "raise the policy's limit if the demand is legitimate; else the refusals are the limit working"})
		}
	}
	return out
}

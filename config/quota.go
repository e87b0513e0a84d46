// This file reads rls.quota: Envoy's Rate Limit Quota Service (RLQS, StreamRateLimitQuotas) on
// the rate limit service's listener (issue 35; docs/envoy.md, "Quota by demand: RLQS"). Envoys
// report their buckets' usage; each rule gives a bucket a limit, split between the Envoys that
// report it by their demand (the ledger of package ledger), or a blanket answer.

package config

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Defaults and bounds of rls.quota.
const (
	// DefaultQuotaReportInterval is Envoy's reporting interval: its filter reports on a fixed
	// 5 s timer today, whatever its bucket settings say.
	DefaultQuotaReportInterval = 5 * time.Second
	// DefaultQuotaIdle is how long a bucket an Envoy reports without a request is kept before it
	// is abandoned.
	DefaultQuotaIdle = time.Minute
	// MaxQuotaLimit bounds a bucket's limit and burst: an assignment's token bucket counts in
	// uint32.
	MaxQuotaLimit = 1<<32 - 1
	// MaxQuotaMatch bounds a rule's keys.
	MaxQuotaMatch = 16
	// MaxQuotaValue bounds a rule's key or value (as the service bounds a bucket id's).
	MaxQuotaValue = 256
)

// Quota is rls.quota: the Rate Limit Quota Service's rules and timing.
type Quota struct {
	// Domain, if set, is the only domain the Envoys' reports may name (their filter's domain);
	// "" accepts any.
	Domain string
	// ReportInterval is how often the Envoys report (Envoy's filter: 5 s); the service refreshes
	// a bucket's assignment for an Envoy that has not reported within it.
	ReportInterval time.Duration
	// TTL is an assignment's time to live, and its lease in the ledger: an Envoy that stops
	// reporting gives its share back this long after its last assignment (and a second's
	// margin for the assignment's way to it). At least twice ReportInterval; default three times.
	TTL time.Duration
	// Idle is how long a bucket reported without a request stays subscribed before the service
	// abandons it.
	Idle time.Duration
	// Algorithm splits a bucket's limit between the Envoys: fair or proportional.
	Algorithm string
	Buckets   []QuotaBucket
	Line      int
}

// QuotaBucket is one rule: the bucket ids it matches, and their limit or blanket answer.
type QuotaBucket struct {
	// Name names the rule in stats, metrics and the ledger's keys: A-Z, a-z, 0-9, '.', '_', '-';
	// unique. Default "bucket-<i>".
	Name string
	// Match is the bucket id's entries: a value "*" matches any value and makes one bucket per
	// distinct value. A bucket id matches if it has exactly these keys; among the rules that
	// match it, the one with the most exact values wins, then the first.
	Match map[string]string
	// Blanket is "allow" or "deny" (ALLOW_ALL or DENY_ALL), or "" for a limit.
	Blanket string
	// Limit per Period is each bucket's rate, split between the Envoys; Burst (default Limit) the
	// tokens its Envoys' buckets hold in all. Period is whole seconds: Envoy's token bucket fills
	// in whole seconds.
	Limit, Burst int64
	Period       time.Duration
	Line         int
}

// MatchString is the rule's match as text, keys sorted: {name: chat, user: *}.
func (b QuotaBucket) MatchString() string { return FormatMatch(b.Match) }

// FormatMatch is a bucket id or a rule's match as text, in one line, keys sorted:
// {name: chat, user: *}.
func FormatMatch(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + ": " + m[k]
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// quota reads rls.quota.
func (p *parser) quota(n *yaml.Node) *Quota {
	const path = "rls.quota"
	m := p.mapping(n, n, "rls", "quota")
	if m == nil {
		return nil
	}
	p.checkKnown(m, path, quotaFields...)
	q := &Quota{ReportInterval: DefaultQuotaReportInterval, Idle: DefaultQuotaIdle, Algorithm: DefaultRegionAlgo, Line: m.node.Line}
	if n := p.get(m, "domain"); n != nil {
		if v, ok := p.str(n, path, "domain"); ok {
			q.Domain = v
		}
	}
	p.durationIn(m, path, "report_interval", 10*time.Millisecond, time.Hour, "how often the Envoys report (Envoy's filter: 5s)", &q.ReportInterval)
	q.TTL = 3 * q.ReportInterval
	p.durationIn(m, path, "assignment_ttl", 20*time.Millisecond, 24*time.Hour, "an assignment's time to live", &q.TTL)
	p.durationIn(m, path, "idle", time.Millisecond, 30*24*time.Hour, "how long a bucket without requests stays subscribed", &q.Idle)
	if q.TTL < 2*q.ReportInterval {
		at := m.values["assignment_ttl"]
		if at == nil {
			at = m.node
		}
		p.errorf(at, path, nil, "assignment_ttl %v must be at least twice report_interval (%v): an assignment must outlive a late report", q.TTL, q.ReportInterval)
	}
	if n := p.get(m, "algorithm"); n != nil {
		if v, ok := p.str(n, path, "algorithm"); ok {
			if v != "fair" && v != "proportional" {
				p.errorf(n, path, nil, "algorithm %q must be fair (Doorman's fair share) or proportional", v)
			} else {
				q.Algorithm = v
			}
		}
	}
	bn := p.get(m, "buckets")
	if bn == nil {
		p.errorf(m.node, path, nil, "buckets is required: the rules that give the Envoys' buckets their limits, e.g. buckets: [{match: {name: chat, user: \"*\"}, limit: 100, period: 1m}]")
		return q
	}
	seen := map[string]*yaml.Node{}
	exact := map[string]*yaml.Node{}
	p.listItems(bn, path+".buckets", func(i int, item *yaml.Node, bm *mapping) {
		bpath := p.itemPath(path+".buckets", i, bm)
		p.checkKnown(bm, bpath, quotaBucketFields...)
		b := QuotaBucket{Name: fmt.Sprintf("bucket-%d", i), Line: item.Line}
		if n := p.get(bm, "name"); n != nil {
			if v, ok := p.plainName(n, bpath, "name"); ok {
				b.Name = v
			}
		}
		if prev := seen[b.Name]; prev != nil {
			p.errorf(item, bpath, nil, "name %q is also the rule's at line %d: rule names are unique", b.Name, prev.Line)
		}
		seen[b.Name] = item
		if mn := p.get(bm, "match"); mn == nil {
			p.errorf(item, bpath, nil, "match is required: the bucket id's entries, e.g. match: {name: chat, user: \"*\"} (\"*\": one bucket per value)")
		} else if mm := p.mapping(mn, mn, bpath, "match"); mm != nil {
			b.Match = map[string]string{}
			if len(mm.keys) == 0 || len(mm.keys) > MaxQuotaMatch {
				p.errorf(mn, bpath, nil, "match has %d entries; 1 to %d", len(mm.keys), MaxQuotaMatch)
			}
			for _, k := range mm.keys {
				vn := p.get(mm, k.Value)
				v, ok := p.str(vn, bpath, "match."+k.Value)
				if !ok {
					continue
				}
				if k.Value == "" || len(k.Value) > MaxQuotaValue || v == "" || len(v) > MaxQuotaValue {
					p.errorf(vn, bpath, nil, "match.%s: keys and values are 1 to %d bytes (\"*\" for any value)", k.Value, MaxQuotaValue)
					continue
				}
				b.Match[k.Value] = v
			}
		}
		if n := p.get(bm, "blanket"); n != nil {
			if v, ok := p.str(n, bpath, "blanket"); ok {
				if v != "allow" && v != "deny" {
					p.errorf(n, bpath, nil, "blanket %q must be allow (ALLOW_ALL) or deny (DENY_ALL)", v)
				}
				b.Blanket = v
			}
			for _, f := range []string{"limit", "period", "burst"} {
				if bm.has(f) {
					p.errorf(bm.values[f], bpath, nil, "%s and blanket are both set: a rule is a blanket answer or a limit, not both", f)
				}
			}
		} else {
			if n := p.get(bm, "limit"); n == nil {
				p.errorf(item, bpath, nil, "limit is required (or blanket: allow/deny): the requests each bucket admits per period, across its Envoys")
			} else if v, ok := p.int(n, bpath, "limit"); ok {
				if v < 1 || v > MaxQuotaLimit {
					p.errorf(n, bpath, nil, "limit %d must be from 1 to %d", v, int64(MaxQuotaLimit))
				} else {
					b.Limit = v
				}
			}
			if n := p.get(bm, "period"); n == nil {
				p.errorf(item, bpath, nil, "period is required with a limit, in whole seconds (e.g. period: 1m)")
			} else if d, ok := p.duration(n, bpath, "period"); ok {
				if d < time.Second || d%time.Second != 0 || d > 24*time.Hour {
					p.errorf(n, bpath, nil, "period %v must be whole seconds from 1s to 24h: Envoy's token bucket fills in whole seconds", d)
				} else {
					b.Period = d
				}
			}
			b.Burst = b.Limit
			if n := p.get(bm, "burst"); n != nil {
				if v, ok := p.int(n, bpath, "burst"); ok {
					if v < 1 || v > MaxQuotaLimit {
						p.errorf(n, bpath, nil, "burst %d must be from 1 to %d", v, int64(MaxQuotaLimit))
					} else {
						b.Burst = v
					}
				}
			}
		}
		if b.Match != nil {
			k := b.MatchString()
			if prev := exact[k]; prev != nil {
				p.errorf(item, bpath, nil, "match %s is also the rule's at line %d: it would never match", k, prev.Line)
			}
			exact[k] = item
		}
		q.Buckets = append(q.Buckets, b)
	})
	return q
}

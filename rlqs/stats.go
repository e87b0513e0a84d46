package rlqs

import (
	"sort"
	"time"
)

// Stats is the service at one instant, as this instance sees it: its Envoys' streams and the
// buckets they report, for /v1/stats, the metrics and the operator page.
type Stats struct {
	Clients []ClientStats `json:"clients"`
	Buckets []BucketStats `json:"buckets"`
	// Counters since the start.
	Reports        int64 `json:"reports"`
	Assignments    int64 `json:"assignments"`
	LedgerErrors   int64 `json:"ledger_errors"`
	RefusedBuckets int64 `json:"refused_buckets"`
	// LastLedgerError is the last refresh the ledger did not answer, if any.
	LastLedgerError *LedgerError `json:"last_ledger_error,omitempty"`
	// The rules in force and their timing: an assignment's time to live (an Envoy keeps its
	// assignment that long without an answer) and the Envoys' report interval.
	Rules           []RuleStats `json:"rules"`
	AssignmentTTLS  float64     `json:"assignment_ttl_s"`
	ReportIntervalS float64     `json:"report_interval_s"`
	// Ledgers is each bucket's ledger across the instances that share it, the busiest first
	// (View fills it; Stats does not), and LedgersOmitted the buckets over ViewBuckets not read.
	Ledgers        []BucketLedger `json:"ledgers,omitempty"`
	LedgersOmitted int            `json:"ledgers_omitted,omitempty"`
	// BucketsOmitted is the buckets over StatsBuckets, the least busy, not listed.
	BucketsOmitted int `json:"buckets_omitted,omitempty"`
}

// ClientStats is one Envoy's stream.
type ClientStats struct {
	ID         string    `json:"id"`
	Peer       string    `json:"peer"`
	Domain     string    `json:"domain"`
	Since      time.Time `json:"since"`
	LastReport time.Time `json:"last_report,omitzero"`
	Reports    int64     `json:"reports"`
	Buckets    int       `json:"buckets"`
}

// BucketStats is one bucket, with each Envoy (of this instance) that reports it.
type BucketStats struct {
	Rule string `json:"rule"`
	// ID is the bucket id; a value a wildcard matched is shown as the start of its SHA-256.
	ID       map[string]string `json:"id"`
	Ledger   string            `json:"ledger,omitempty"` // its name in the ledger ("" for a blanket rule)
	Blanket  string            `json:"blanket,omitempty"`
	Limit    int64             `json:"limit,omitempty"`
	Period   time.Duration     `json:"-"`
	PeriodS  float64           `json:"period_s,omitempty"`
	Want     int64             `json:"want"`     // the Envoys' demand, units per period
	Assigned int64             `json:"assigned"` // the rates assigned to them, units per period
	Envoys   []EnvoyBucket     `json:"envoys"`
}

// EnvoyBucket is one Envoy's part of a bucket.
type EnvoyBucket struct {
	Client    string    `json:"client"`
	Want      int64     `json:"want"`       // its demand, units per period
	Allotment int64     `json:"allotment"`  // the ledger's grant
	Share     int64     `json:"share"`      // the algorithm's share (more than the allotment while others give theirs back)
	Assigned  int64     `json:"assigned"`   // the rate it was sent (units per period; 0 for a blanket)
	MaxTokens int64     `json:"max_tokens"` // its token bucket's size
	Strategy  string    `json:"strategy"`   // token_bucket, allow_all, deny_all or none
	Expires   time.Time `json:"expires,omitzero"`
	Learning  bool      `json:"learning,omitempty"`
	Allowed   uint64    `json:"allowed"` // in its last report
	Denied    uint64    `json:"denied"`
	LedgerErr int64     `json:"ledger_errors,omitempty"`
}

// Stats returns the service's view.
func (s *Service) Stats() Stats {
	st := Stats{Reports: s.counters.reports.Load(), Assignments: s.counters.assignments.Load(),
		LedgerErrors: s.counters.ledgerErrors.Load(), RefusedBuckets: s.counters.refusedBuckets.Load(), Clients: []ClientStats{}, Buckets: []BucketStats{}}
	rs := s.rules.Load()
	st.AssignmentTTLS, st.ReportIntervalS = rs.quota.TTL.Seconds(), rs.quota.ReportInterval.Seconds()
	st.Rules = make([]RuleStats, 0, len(rs.rules))
	for _, r := range rs.rules {
		st.Rules = append(st.Rules, RuleStats{Name: r.Name, Match: r.MatchString(), Blanket: r.Blanket, Limit: r.Limit, PeriodS: r.Period.Seconds(), Burst: r.Burst})
	}
	s.mu.Lock()
	if s.lastErr.At != (time.Time{}) {
		e := s.lastErr
		st.LastLedgerError = &e
	}
	clients := make([]*Client, 0, len(s.clients))
	for c := range s.clients {
		clients = append(clients, c)
	}
	s.mu.Unlock()
	byKey := map[string]*BucketStats{}
	for _, c := range clients {
		c.mu.Lock()
		st.Clients = append(st.Clients, ClientStats{ID: c.ID, Peer: c.Peer, Domain: c.domain, Since: c.Since, LastReport: c.lastReport, Reports: c.reports, Buckets: len(c.buckets)})
		for k, b := range c.buckets {
			bs := byKey[k]
			if bs == nil {
				bs = &BucketStats{ID: b.rule.shown(b.id), Ledger: b.name}
				if b.rule != nil {
					bs.Rule, bs.Blanket, bs.Limit, bs.Period, bs.PeriodS = b.rule.Name, b.rule.Blanket, b.rule.Limit, b.rule.Period, b.rule.Period.Seconds()
				}
				byKey[k] = bs
			}
			e := EnvoyBucket{Client: c.ID, Want: b.want, Allotment: b.grant.Allotment, Share: b.grant.Share, Learning: b.grant.Learning,
				Allowed: b.last[0], Denied: b.last[1], LedgerErr: b.errors, Strategy: "none"}
			if b.sent != nil {
				e.Expires = b.sentExpiry
				switch {
				case b.sent.GetTokenBucket() != nil:
					e.Strategy, e.Assigned, e.MaxTokens = "token_bucket", b.sentAllot, int64(b.sent.GetTokenBucket().GetMaxTokens())
				case b.sent.GetBlanketRule() == 0:
					e.Strategy = "allow_all"
				default:
					e.Strategy = "deny_all"
				}
			}
			bs.Want += e.Want
			bs.Assigned += e.Assigned
			bs.Envoys = append(bs.Envoys, e)
		}
		c.mu.Unlock()
	}
	sort.Slice(st.Clients, func(i, j int) bool { return st.Clients[i].ID < st.Clients[j].ID })
	for _, bs := range byKey {
		sort.Slice(bs.Envoys, func(i, j int) bool { return bs.Envoys[i].Client < bs.Envoys[j].Client })
		st.Buckets = append(st.Buckets, *bs)
	}
	if len(st.Buckets) > StatsBuckets {
		// The busiest (a fleet may hold millions of buckets; the stats hold a page's worth).
		sort.Slice(st.Buckets, func(i, j int) bool { return st.Buckets[i].Want > st.Buckets[j].Want })
		st.BucketsOmitted = len(st.Buckets) - StatsBuckets
		st.Buckets = st.Buckets[:StatsBuckets]
	}
	sort.Slice(st.Buckets, func(i, j int) bool {
		if st.Buckets[i].Rule != st.Buckets[j].Rule {
			return st.Buckets[i].Rule < st.Buckets[j].Rule
		}
		return st.Buckets[i].Ledger < st.Buckets[j].Ledger
	})
	return st
}

// StatsBuckets bounds Stats's buckets: the busiest this many (by demand), the rest counted.
const StatsBuckets = 1000

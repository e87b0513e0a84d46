package gateway

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/rlqs"
)

// Quota is the Rate Limit Quota Service as the Server shows it (*rlqs.Service): its Stats for the
// sluice_rlqs_* metrics, read at each scrape, and for GET /v1/stats; if it has a
// View(context.Context) rlqs.Stats method too, /v1/stats shows View's (Stats with each bucket's
// ledger across the instances that share it).
type Quota interface{ Stats() rlqs.Stats }

// quotaViewer is a Quota that reads its buckets' ledgers.
type quotaViewer interface {
	View(ctx context.Context) rlqs.Stats
}

// SetQuota shows the Rate Limit Quota Service: in GET /v1/stats (rlqs), its diagnosis's findings
// and the operator page, and in the sluice_rlqs_* metrics (registered at the first call; a later
// call replaces the service they read).
func (s *Server) SetQuota(q Quota) {
	s.quota.Store(&q)
	s.quotaOnce.Do(func() { s.registry.MustRegister(rlqsCollector{s.quotaStats}) })
}

// quotaStats is the quota service's Stats; false if there is none.
func (s *Server) quotaStats() (rlqs.Stats, bool) {
	q := s.quota.Load()
	if q == nil {
		return rlqs.Stats{}, false
	}
	return (*q).Stats(), true
}

// quotaView is the quota service's view for GET /v1/stats: View's if it has one, else Stats's.
func (s *Server) quotaView(ctx context.Context) (rlqs.Stats, bool) {
	q := s.quota.Load()
	if q == nil {
		return rlqs.Stats{}, false
	}
	if v, ok := (*q).(quotaViewer); ok {
		return v.View(ctx), true
	}
	return (*q).Stats(), true
}

// rlqsCollector is the sluice_rlqs_* metrics, read at each scrape from this instance's view (no
// ledger is read): its streams, buckets and counters, and per rule its buckets' demand,
// assignments and limit. The labels are rule names, never a bucket id's values (a user's id, a
// key).
type rlqsCollector struct{ stats func() (rlqs.Stats, bool) }

var (
	rlqsStreams = prometheus.NewDesc("sluice_rlqs_streams",
		"Envoy streams (one per Envoy) on this instance's Rate Limit Quota Service.", nil, nil)
	rlqsBuckets = prometheus.NewDesc("sluice_rlqs_buckets",
		"Buckets this instance's Envoys report, of every rule.", nil, nil)
	rlqsReports = prometheus.NewDesc("sluice_rlqs_reports_total",
		"Usage reports received from the Envoys.", nil, nil)
	rlqsAssignments = prometheus.NewDesc("sluice_rlqs_assignments_total",
		"Quota assignments sent to the Envoys (token buckets and blanket answers).", nil, nil)
	rlqsLedgerErrors = prometheus.NewDesc("sluice_rlqs_ledger_errors_total",
		"Refreshes of a bucket's ledger that failed: the Envoy keeps its assignment until it expires, then follows its expired_assignment_behavior.", nil, nil)
	rlqsRefused = prometheus.NewDesc("sluice_rlqs_refused_buckets_total",
		"Buckets refused (abandoned at once): an id over the bounds, or a stream over its buckets.", nil, nil)
	rlqsDemand = prometheus.NewDesc("sluice_rlqs_demand",
		"The Envoys' demand for a rule's buckets together, in units per period, as they last reported it here.", []string{"rule"}, nil)
	rlqsAssigned = prometheus.NewDesc("sluice_rlqs_assigned",
		"The rates assigned to this instance's Envoys for a rule's buckets together, in units per period.", []string{"rule"}, nil)
	rlqsLimit = prometheus.NewDesc("sluice_rlqs_limit",
		"A limit rule's limit per bucket, per period, split between the Envoys that report the bucket.", []string{"rule"}, nil)
	rlqsRuleBuckets = prometheus.NewDesc("sluice_rlqs_rule_buckets",
		"Buckets of a rule that this instance's Envoys report.", []string{"rule"}, nil)
)

func (c rlqsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{rlqsStreams, rlqsBuckets, rlqsReports, rlqsAssignments, rlqsLedgerErrors, rlqsRefused,
		rlqsDemand, rlqsAssigned, rlqsLimit, rlqsRuleBuckets} {
		ch <- d
	}
}

func (c rlqsCollector) Collect(ch chan<- prometheus.Metric) {
	st, ok := c.stats()
	if !ok {
		return
	}
	ch <- prometheus.MustNewConstMetric(rlqsStreams, prometheus.GaugeValue, float64(len(st.Clients)))
	ch <- prometheus.MustNewConstMetric(rlqsBuckets, prometheus.GaugeValue, float64(len(st.Buckets)))
	for _, m := range []struct {
		d *prometheus.Desc
		v int64
	}{{rlqsReports, st.Reports}, {rlqsAssignments, st.Assignments}, {rlqsLedgerErrors, st.LedgerErrors}, {rlqsRefused, st.RefusedBuckets}} {
		ch <- prometheus.MustNewConstMetric(m.d, prometheus.CounterValue, float64(m.v))
	}
	type sums struct{ demand, assigned, buckets int64 }
	byRule := map[string]*sums{}
	for _, r := range st.Rules {
		byRule[r.Name] = &sums{}
		if r.Blanket == "" {
			ch <- prometheus.MustNewConstMetric(rlqsLimit, prometheus.GaugeValue, float64(r.Limit), r.Name)
		}
	}
	for _, b := range st.Buckets {
		x := byRule[b.Rule]
		if x == nil { // a rule gone with a reload, until its buckets are abandoned
			continue
		}
		x.demand += b.Want
		x.assigned += b.Assigned
		x.buckets++
	}
	for rule, x := range byRule {
		ch <- prometheus.MustNewConstMetric(rlqsDemand, prometheus.GaugeValue, float64(x.demand), rule)
		ch <- prometheus.MustNewConstMetric(rlqsAssigned, prometheus.GaugeValue, float64(x.assigned), rule)
		ch <- prometheus.MustNewConstMetric(rlqsRuleBuckets, prometheus.GaugeValue, float64(x.buckets), rule)
	}
}

// rlqsRecent is how long a ledger error stays a finding: the assignments' time to live (the
// Envoys hold theirs that long) and at least a minute.
func rlqsRecent(st rlqs.Stats) time.Duration {
	return max(time.Minute, time.Duration(st.AssignmentTTLS*float64(time.Second)))
}

// rlqsFindings are the diagnosis's findings of the quota service at now: a bucket whose Envoys
// want more than its limit (the fleet's demand from its ledger when View read it, else this
// instance's), and a ledger that did not answer lately (a refresh, or View's read).
func rlqsFindings(st rlqs.Stats, now time.Time) []Finding {
	var out []Finding
	ttl := time.Duration(st.AssignmentTTLS * float64(time.Second))
	var unread []rlqs.BucketLedger
	if e := st.LastLedgerError; e != nil && now.Sub(e.At) < rlqsRecent(st) {
		out = append(out, Finding{Kind: "rlqs_ledger_unreachable", Subject: "rule " + e.Rule,
			Summary: fmt.Sprintf("the quota service's ledger did not answer a refresh of rule %s's bucket %s ago (%s; %d ledger errors since the start): its Envoys keep their assignments until they expire (assignment_ttl %v), then follow their filter's expired_assignment_behavior",
				e.Rule, max(0, now.Sub(e.At)).Round(time.Second), e.Error, st.LedgerErrors, ttl),
			Do: "make the store's Redis reachable from this instance (the ledger is on it); set the filter's expired_assignment_behavior (fallback_rate_limit, or reuse_last_assignment) to what the Envoys should do meanwhile"})
	}
	for _, l := range st.Ledgers {
		if l.Error != "" && !strings.HasPrefix(l.Error, "no ledger yet") {
			unread = append(unread, l)
		}
	}
	if len(unread) > 0 && (st.LastLedgerError == nil || now.Sub(st.LastLedgerError.At) >= rlqsRecent(st)) {
		l := unread[0]
		out = append(out, Finding{Kind: "rlqs_ledger_unreachable", Subject: "rule " + l.Rule,
			Summary: fmt.Sprintf("%d of the quota service's bucket ledgers could not be read now (rule %s's: %s): the next refreshes will likely fail too, and the Envoys then keep their assignments until they expire (assignment_ttl %v), then follow their filter's expired_assignment_behavior",
				len(unread), l.Rule, l.Error, ttl),
			Do: "make the store's Redis reachable from this instance (the ledger is on it); set the filter's expired_assignment_behavior (fallback_rate_limit, or reuse_last_assignment) to what the Envoys should do meanwhile"})
	}
	fleet := map[string]rlqs.BucketLedger{}
	for _, l := range st.Ledgers {
		if l.Error == "" {
			fleet[l.Ledger] = l
		}
	}
	type over struct {
		b         rlqs.BucketStats
		want      int64
		envoys    int
		fleetWide bool
	}
	var overs []over
	for _, b := range st.Buckets {
		if b.Blanket != "" || b.Limit <= 0 {
			continue
		}
		o := over{b: b, want: b.Want, envoys: len(b.Envoys)}
		if l, ok := fleet[b.Ledger]; ok {
			o.want, o.fleetWide, o.envoys = l.Want, true, 0
			for _, e := range l.Envoys {
				if e.Live {
					o.envoys++
				}
			}
		}
		if o.want > b.Limit {
			overs = append(overs, o)
		}
	}
	sort.Slice(overs, func(i, j int) bool {
		x, y := overs[i], overs[j]
		if a, b := x.want*y.b.Limit, y.want*x.b.Limit; a != b { // the most over its limit first
			return a > b
		}
		return x.b.Ledger < y.b.Ledger
	})
	for _, o := range overs[:min(perKindShown, len(overs))] {
		where := "this instance's"
		if o.fleetWide {
			where = "all instances'"
		}
		out = append(out, Finding{Kind: "rlqs_demand_over_limit", Subject: "rule " + o.b.Rule + " " + shownID(o.b.ID),
			Summary: fmt.Sprintf("%s %d Envoys want %d per %s of rule %s's bucket %s together; its limit is %d: the ledger splits it by demand, and each Envoy refuses part of its requests",
				where, o.envoys, o.want, periodText(o.b.PeriodS), o.b.Rule, shownID(o.b.ID), o.b.Limit),
			Do: fmt.Sprintf("raise rule %s's limit in rls.quota if the demand is legitimate (it applies to each of its buckets); else the refusals are the limit working", o.b.Rule)})
	}
	return out
}

// periodText is a rule's period (whole seconds) to read: 1s, 1m, 1h30m.
func periodText(s float64) string {
	t := time.Duration(s * float64(time.Second)).String()
	if strings.HasSuffix(t, "m0s") {
		t = strings.TrimSuffix(t, "0s")
	}
	if strings.HasSuffix(t, "h0m") {
		t = strings.TrimSuffix(t, "0m")
	}
	return t
}

// shownID is a bucket id as stats show it, in one line: {name: chat, user: sha256:…}.
func shownID(id map[string]string) string { return config.FormatMatch(id) }

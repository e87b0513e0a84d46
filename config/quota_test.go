package config

import (
	"reflect"
	"testing"
	"time"
)

// rls.quota's errors, each at its line (they join errorCases: TestErrors checks them and
// FuzzParse starts from them).
var quotaErrorCases = []struct {
	name string
	yaml string
	want []wantErr
}{
	{"quota: no buckets", up + "rls:\n  quota: {domain: edge}\n", []wantErr{at(3, "rls.quota: buckets is required")}},
	{"quota: unknown field", up + "rls:\n  quota: {bucket: [], buckets: []}\n", []wantErr{at(3, `unknown field "bucket"; did you mean "buckets"?`)}},
	{"quota: ttl below twice the interval", up + "rls:\n  quota:\n    report_interval: 5s\n    assignment_ttl: 6s\n    buckets: []\n", []wantErr{at(5, "assignment_ttl 6s must be at least twice report_interval (5s)")}},
	{"quota: bad algorithm", up + "rls:\n  quota: {algorithm: even, buckets: []}\n", []wantErr{at(3, `algorithm "even" must be fair`)}},
	{"quota: no match", up + "rls:\n  quota:\n    buckets:\n      - {name: a, limit: 1, period: 1s}\n", []wantErr{at(5, `rls.quota.buckets[0] "a": match is required`)}},
	{"quota: no limit", up + "rls:\n  quota:\n    buckets:\n      - {name: a, match: {k: v}, period: 1s}\n", []wantErr{at(5, "limit is required (or blanket: allow/deny)")}},
	{"quota: limit and blanket", up + "rls:\n  quota:\n    buckets:\n      - {name: a, match: {k: v}, blanket: allow, limit: 5}\n", []wantErr{at(5, "limit and blanket are both set")}},
	{"quota: bad blanket", up + "rls:\n  quota:\n    buckets:\n      - {name: a, match: {k: v}, blanket: maybe}\n", []wantErr{at(5, `blanket "maybe" must be allow (ALLOW_ALL) or deny (DENY_ALL)`)}},
	{"quota: period not whole seconds", up + "rls:\n  quota:\n    buckets:\n      - {name: a, match: {k: v}, limit: 5, period: 1500ms}\n", []wantErr{at(5, "period 1.5s must be whole seconds from 1s to 24h")}},
	{"quota: limit too large", up + "rls:\n  quota:\n    buckets:\n      - {name: a, match: {k: v}, limit: 4294967296, period: 1s}\n", []wantErr{at(5, "limit 4294967296 must be from 1 to 4294967295")}},
	{"quota: same name", up + "rls:\n  quota:\n    buckets:\n      - {name: a, match: {k: v}, blanket: allow}\n      - {name: a, match: {k: w}, blanket: deny}\n", []wantErr{at(6, `name "a" is also the rule's at line 5`)}},
	{"quota: same match", up + "rls:\n  quota:\n    buckets:\n      - {match: {k: \"*\", j: v}, blanket: allow}\n      - {match: {j: v, k: \"*\"}, blanket: deny}\n", []wantErr{at(6, "match {j: v, k: *} is also the rule's at line 5")}},
	{"quota: empty match", up + "rls:\n  quota:\n    buckets:\n      - {match: {}, blanket: allow}\n", []wantErr{at(5, "match has 0 entries; 1 to 16")}},
	{"quota: empty value", up + "rls:\n  quota:\n    buckets:\n      - {match: {k: \"\"}, blanket: allow}\n", []wantErr{at(5, "match.k: keys and values are 1 to 256 bytes")}},
}

func init() {
	errorCases = append(errorCases, quotaErrorCases...)
}

// Every field of rls.quota is read, defaults fill the rest, and the quota service alone needs no
// envoy_config.
func TestRLSQuota(t *testing.T) {
	cfg, err := parseTest(t, up+`rls:
  listen: 127.0.0.1:8081
  quota:
    domain: edge
    report_interval: 2s
    idle: 30s
    algorithm: proportional
    buckets:
      - {name: per-user, match: {name: api, user: "*"}, limit: 600, period: 1m, burst: 60}
      - {match: {name: health}, blanket: allow}
`)
	if err != nil {
		t.Fatal(err)
	}
	q := cfg.RLS.Quota
	if q == nil || len(cfg.RLS.EnvoyConfig) != 0 || cfg.RLS.XDS != nil {
		t.Fatalf("rls %+v", cfg.RLS)
	}
	want := Quota{Domain: "edge", ReportInterval: 2 * time.Second, TTL: 6 * time.Second, Idle: 30 * time.Second, Algorithm: "proportional", Line: q.Line,
		Buckets: []QuotaBucket{
			{Name: "per-user", Match: map[string]string{"name": "api", "user": "*"}, Limit: 600, Burst: 60, Period: time.Minute, Line: q.Buckets[0].Line},
			{Name: "bucket-1", Match: map[string]string{"name": "health"}, Blanket: "allow", Line: q.Buckets[1].Line},
		}}
	if !reflect.DeepEqual(*q, want) {
		t.Fatalf("quota\n%+v\nwant\n%+v", *q, want)
	}
	if q.Buckets[0].MatchString() != "{name: api, user: *}" {
		t.Fatalf("MatchString %q", q.Buckets[0].MatchString())
	}
	cfg, err = parseTest(t, up+"rls:\n  quota:\n    buckets: [{match: {a: b}, limit: 5, period: 1s}]\n")
	if err != nil {
		t.Fatal(err)
	}
	if q := cfg.RLS.Quota; q.ReportInterval != DefaultQuotaReportInterval || q.TTL != 3*DefaultQuotaReportInterval || q.Idle != DefaultQuotaIdle || q.Algorithm != "fair" || q.Buckets[0].Burst != 5 {
		t.Fatalf("defaults %+v", q)
	}
}

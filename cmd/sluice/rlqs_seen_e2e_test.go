package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gateway"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/rlqstest"
)

// quotaServe is a configuration serving only the quota service (and the admin listener) on the
// Redis at redisAddr, where the buckets' ledgers are; it tells where the service listens.
func quotaServe(t *testing.T, redisAddr string, addr *string) configFunc {
	return func(_, admin string) string {
		a, err := freeAddr()
		if err != nil {
			t.Fatal(err)
		}
		*addr = a
		return fmt.Sprintf(`listen: ""
admin_listen: %s
store: {type: redis, addrs: [%s]}
rls:
  listen: %s
  quota:
    domain: seen
    report_interval: 500ms
    buckets:
      - {name: chat, match: {name: chat, user: "*"}, limit: 10, period: 1m}
`, admin, redisAddr, a)
	}
}

// Two `sluice serve` instances with rls.quota on one Redis, an Envoy (rlqstest) on each, both
// reporting alice's chat bucket: instance a's /v1/stats shows its stream and the bucket (its id's
// wildcard value hashed), and the bucket's ledger on Redis with both Envoys, a's marked here; the
// demand of both over the limit is a finding; a's /metrics has the sluice_rlqs_* series by rule.
// Neither shows the value alice.
func TestServeE2ERLQSSeen(t *testing.T) {
	rs := redistest.Start(t)
	var addrA, addrB string
	a := startSluice(t, t.TempDir(), "sluice.yaml", quotaServe(t, rs.Addr, &addrA))
	startSluice(t, t.TempDir(), "sluice.yaml", quotaServe(t, rs.Addr, &addrB))
	alice := map[string]string{"name": "chat", "user": "alice"}
	for _, addr := range []string{addrA, addrB} {
		ticks := make(chan time.Time)
		f, err := rlqstest.New(rlqstest.Config{Addr: addr, Domain: "seen", Ticks: ticks})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = f.Close() })
		for range 20 {
			f.Decide(alice) // the first reported at once
		}
		ticks <- time.Now() // the other 19
	}

	var st gateway.Stats
	var body string
	waitUntil(t, time.Minute, "a's view of alice's bucket across both instances", func() bool {
		r := get(t, a.admin, "/v1/stats")
		body = string(r.body)
		st = gateway.Stats{}
		if err := json.Unmarshal(r.body, &st); err != nil {
			t.Fatalf("/v1/stats: %v %s", err, r.body)
		}
		if st.RLQS == nil || len(st.RLQS.Ledgers) != 1 {
			return false
		}
		l := st.RLQS.Ledgers[0]
		return l.Error == "" && len(l.Envoys) == 2 && l.Envoys[0].Live && l.Envoys[1].Live && l.Envoys[0].Here != l.Envoys[1].Here
	})
	q := st.RLQS
	if len(q.Clients) != 1 || q.Clients[0].Domain != "seen" || len(q.Buckets) != 1 {
		t.Fatalf("a's rlqs: %d streams, %d buckets: %+v; want its one stream (domain seen) and alice's bucket", len(q.Clients), len(q.Buckets), q)
	}
	if b := q.Buckets[0]; b.Rule != "chat" || b.Limit != 10 || b.ID["name"] != "chat" || !strings.HasPrefix(b.ID["user"], "sha256:") {
		t.Errorf("a's bucket: %+v; want rule chat, limit 10, its user hashed", b)
	}
	if l := q.Ledgers[0]; l.Want <= l.Limit || l.Outstanding > l.Limit {
		t.Errorf("alice's ledger: want %d, outstanding %d of %d; want the demand over the limit, the allotments within it", l.Want, l.Outstanding, l.Limit)
	}
	found := false
	for _, f := range st.Diagnosis.Findings {
		found = found || (f.Kind == "rlqs_demand_over_limit" && strings.Contains(f.Summary, "all instances' 2 Envoys"))
	}
	if !found {
		t.Errorf("findings %+v; want rlqs_demand_over_limit of both instances' Envoys", st.Diagnosis.Findings)
	}

	a.waitMetric(t, "sluice_rlqs_assignments_total", nil, 1, time.Minute)
	text := a.metricsText(t)
	for _, m := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{{"sluice_rlqs_streams", nil, 1}, {"sluice_rlqs_buckets", nil, 1}, {"sluice_rlqs_rule_buckets", map[string]string{"rule": "chat"}, 1},
		{"sluice_rlqs_limit", map[string]string{"rule": "chat"}, 10}, {"sluice_rlqs_ledger_errors_total", nil, 0}} {
		if got := sampleSum(text, m.name, m.labels); got != m.want {
			t.Errorf("%s%v = %v, want %v", m.name, m.labels, got, m.want)
		}
	}
	if d := sampleSum(text, "sluice_rlqs_demand", map[string]string{"rule": "chat"}); d <= 10 {
		t.Errorf(`sluice_rlqs_demand{rule="chat"} = %v, want over the limit 10`, d)
	}
	if n := sampleSum(text, "sluice_rlqs_reports_total", nil); n < 2 {
		t.Errorf("sluice_rlqs_reports_total = %v, want at least 2", n)
	}
	if strings.Contains(text, "alice") || strings.Contains(body, "alice") {
		t.Errorf("/metrics or /v1/stats shows the bucket id value alice")
	}
}

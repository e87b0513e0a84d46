package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/gateway"
	"github.com/sluicehq/sluice/internal/rlqstest"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/rlqs"
	"github.com/sluicehq/sluice/store/memory"
)

// quotaYAML runs the quota service: chat gives each user's bucket 10 a minute, which two users'
// traffic wants far more of; search a limit no test reaches; health a blanket allow.
const quotaYAML = `upstream: http://127.0.0.1:9
rls:
  listen: 127.0.0.1:0
  quota:
    domain: seen
    report_interval: 500ms
    buckets:
      - {name: chat, match: {name: chat, user: "*"}, limit: 10, period: 1m}
      - {name: search, match: {name: search}, limit: 1000000, period: 1s}
      - {name: health, match: {name: health}, blanket: allow}
`

// sharedLedgers are Memory ledgers that several services share, as instances share the Redis
// store's; down makes every call fail, as an unreachable Redis does.
type sharedLedgers struct {
	mu   sync.Mutex
	m    map[string]*ledger.Memory
	down atomic.Bool
}

func (s *sharedLedgers) get(name string, opts ledger.Options) (ledger.Ledger, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]*ledger.Memory{}
	}
	l := s.m[name]
	if l == nil {
		var err error
		if l, err = ledger.NewMemory(name, opts, ledger.MemoryOptions{}); err != nil {
			return nil, err
		}
		s.m[name] = l
	}
	return flaky{l, &s.down}, nil
}

type flaky struct {
	*ledger.Memory
	down *atomic.Bool
}

var errLedgerDown = errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")

func (f flaky) Refresh(ctx context.Context, client string, r ledger.Report) (ledger.Grant, error) {
	if f.down.Load() {
		return ledger.Grant{}, errLedgerDown
	}
	return f.Memory.Refresh(ctx, client, r)
}

func (f flaky) Read(ctx context.Context) (ledger.View, error) {
	if f.down.Load() {
		return ledger.View{}, errLedgerDown
	}
	return f.Memory.Read(ctx)
}

// startQuotaService serves q's quota service on ledgers on a loopback gRPC server.
func startQuotaService(t *testing.T, q *config.Quota, ledgers ledger.Ledgers) (*rlqs.Service, string) {
	t.Helper()
	svc := rlqs.New(q, rlqs.Options{Ledgers: ledgers})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	svc.Register(gs)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(func() { svc.Close(); gs.Stop() })
	return svc, ln.Addr().String()
}

// envoy is one simulated Envoy whose reports the test sends (ticks).
type envoy struct {
	*rlqstest.Filter
	ticks chan time.Time
}

func newEnvoy(t *testing.T, addr string) envoy {
	t.Helper()
	ticks := make(chan time.Time)
	f, err := rlqstest.New(rlqstest.Config{Addr: addr, Domain: "seen", Ticks: ticks})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return envoy{f, ticks}
}

// report sends the Envoy's report of its buckets' usage since its last one.
func (e envoy) report() { e.ticks <- time.Now() }

// quotaFleet is two instances on one set of ledgers: a, whose Server the test reads (its admin
// listener at admin), with two Envoys, and b with one. Alice's chat bucket is on all three
// Envoys, bob's on a1, search's and health's on a1 too, and a1 reports a bucket id over the
// bounds (refused).
type quotaFleet struct {
	srv          *gateway.Server
	admin        string
	a, b         *rlqs.Service
	a1, a2, b1   envoy
	ledgers      *sharedLedgers
	alice, bob   map[string]string
	search, heal map[string]string
}

func startQuotaFleet(t *testing.T, mount http.Handler) *quotaFleet {
	t.Helper()
	cfg, err := config.Parse([]byte(quotaYAML), "quota.yaml")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := gateway.NewServer(cfg, "", gateway.Store{Store: memory.New()}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	if mount != nil {
		srv.Mount("GET /", mount)
	}
	hs := httptest.NewServer(srv.Admin())
	t.Cleanup(hs.Close)
	f := &quotaFleet{srv: srv, admin: hs.URL, ledgers: &sharedLedgers{},
		alice: map[string]string{"name": "chat", "user": "alice"}, bob: map[string]string{"name": "chat", "user": "bob"},
		search: map[string]string{"name": "search"}, heal: map[string]string{"name": "health"}}
	var addrA, addrB string
	f.a, addrA = startQuotaService(t, cfg.RLS.Quota, f.ledgers.get)
	f.b, addrB = startQuotaService(t, cfg.RLS.Quota, f.ledgers.get)
	srv.SetQuota(f.a)
	f.a1, f.a2, f.b1 = newEnvoy(t, addrA), newEnvoy(t, addrA), newEnvoy(t, addrB)
	// Each bucket's first request is reported at once; the rest at the next tick.
	for _, e := range []envoy{f.a1, f.a2, f.b1} {
		for range 20 {
			e.Decide(f.alice)
		}
	}
	for range 5 {
		f.a1.Decide(f.bob)
	}
	f.a1.Decide(f.search)
	f.a1.Decide(f.heal)
	big := map[string]string{}
	for i := range rlqs.MaxIDEntries + 1 {
		big["k"+strconv.Itoa(i)] = "v"
	}
	f.a1.Decide(big)
	for _, e := range []envoy{f.a1, f.a2, f.b1} {
		e.report()
	}
	// Every bucket of a limit rule assigned (past the new ledgers' learning), on both instances.
	assigned := func(s *rlqs.Service, want int) bool {
		n := 0
		for _, b := range s.Stats().Buckets {
			for _, e := range b.Envoys {
				if e.Strategy == "none" {
					return false
				}
				n++
			}
		}
		return n == want
	}
	waitFor(t, "every Envoy's buckets assigned", func() bool { return assigned(f.a, 5) && assigned(f.b, 1) })
	return f
}

var sample = regexp.MustCompile(`(?m)^(sluice_rlqs_[a-z_]+(?:\{[^}]*\})?) (\S+)$`)

// rlqsMetrics scrapes the sluice_rlqs_* samples of admin's /metrics, and the whole text.
func rlqsMetrics(t *testing.T, admin string) (map[string]float64, string) {
	t.Helper()
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	out := map[string]float64{}
	for _, m := range sample.FindAllStringSubmatch(string(b), -1) {
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			t.Fatalf("%s: %v", m[0], err)
		}
		out[m[1]] = v
	}
	return out, string(b)
}

// quotaStats reads admin's GET /v1/stats, decoded and as it came.
func quotaStats(t *testing.T, admin string) (gateway.Stats, string) {
	t.Helper()
	resp, err := http.Get(admin + "/v1/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var st gateway.Stats
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return st, string(b)
}

func findings(st gateway.Stats, kind string) []gateway.Finding {
	var out []gateway.Finding
	for _, f := range st.Diagnosis.Findings {
		if f.Kind == kind {
			out = append(out, f)
		}
	}
	return out
}

// The sluice_rlqs_* metrics of instance a: its two streams and four buckets (alice's, bob's,
// search's and health's; the one over the bounds refused), the counters, and per rule the
// buckets, demand, assignments and limit (none for a blanket rule); no label holds a bucket id's
// value (alice, bob). A second SetQuota replaces the service the metrics read.
func TestRLQSMetrics(t *testing.T) {
	t.Parallel()
	f := startQuotaFleet(t, nil)
	var m map[string]float64
	var text string
	waitFor(t, "the metrics of a's Envoys", func() bool {
		m, text = rlqsMetrics(t, f.admin)
		return m["sluice_rlqs_streams"] == 2 && m["sluice_rlqs_buckets"] == 4 && m["sluice_rlqs_refused_buckets_total"] >= 1 &&
			m[`sluice_rlqs_rule_buckets{rule="chat"}`] == 2
	})
	for series, want := range map[string]float64{
		`sluice_rlqs_rule_buckets{rule="chat"}`:   2,
		`sluice_rlqs_rule_buckets{rule="search"}`: 1,
		`sluice_rlqs_rule_buckets{rule="health"}`: 1,
		`sluice_rlqs_limit{rule="chat"}`:          10,
		`sluice_rlqs_limit{rule="search"}`:        1000000,
		`sluice_rlqs_assigned{rule="health"}`:     0,
		`sluice_rlqs_ledger_errors_total`:         0,
	} {
		if got, ok := m[series]; !ok || got != want {
			t.Errorf("%s = %v (present: %v), want %v", series, got, ok, want)
		}
	}
	if _, ok := m[`sluice_rlqs_limit{rule="health"}`]; ok {
		t.Errorf("a blanket rule has a limit metric")
	}
	// Alice's two Envoys here and bob's want far more than 10 a minute each; what is assigned
	// to a bucket's Envoys never adds up to more than its limit.
	if d := m[`sluice_rlqs_demand{rule="chat"}`]; d <= 20 {
		t.Errorf(`sluice_rlqs_demand{rule="chat"} = %v, want more than the two buckets' limits (20)`, d)
	}
	if a := m[`sluice_rlqs_assigned{rule="chat"}`]; a < 1 || a > 20 {
		t.Errorf(`sluice_rlqs_assigned{rule="chat"} = %v, want 1 to 20 (two buckets of 10)`, a)
	}
	if m["sluice_rlqs_reports_total"] < 4 || m["sluice_rlqs_assignments_total"] < 4 {
		t.Errorf("reports %v, assignments %v; want at least 4 of each", m["sluice_rlqs_reports_total"], m["sluice_rlqs_assignments_total"])
	}
	for _, v := range []string{"alice", "bob"} {
		if strings.Contains(text, v) {
			t.Errorf("/metrics holds the bucket id value %q", v)
		}
	}
	// One home for the service: SetQuota again (a restart of the service, say) replaces the one
	// the metrics read, and does not register them twice.
	f.srv.SetQuota(f.b)
	waitFor(t, "the metrics of b's Envoy", func() bool {
		m, _ = rlqsMetrics(t, f.admin)
		return m["sluice_rlqs_streams"] == 1 && m[`sluice_rlqs_rule_buckets{rule="chat"}`] == 1
	})
}

// GET /v1/stats "rlqs" of instance a: its streams and buckets, and each bucket's ledger across
// both instances (alice's: a's two Envoys here, b's from the ledger); the finding of alice's
// bucket wanted beyond its limit by all three Envoys, none for search's; no bucket id's value in
// the body. Then the ledger goes down: its read errors are shown, and rlqs_ledger_unreachable is
// found (a refresh failed), with the Envoys' fallback named.
func TestRLQSStatsAndFindings(t *testing.T) {
	t.Parallel()
	f := startQuotaFleet(t, nil)
	var st gateway.Stats
	var body string
	var alice rlqs.BucketLedger
	waitFor(t, "alice's bucket's ledger with its three Envoys, live", func() bool {
		st, body = quotaStats(t, f.admin)
		if st.RLQS == nil {
			t.Fatal("/v1/stats has no rlqs")
		}
		for _, l := range st.RLQS.Ledgers {
			if l.Rule == "chat" && len(l.Envoys) == 3 && l.Error == "" {
				live, here := 0, 0
				for _, e := range l.Envoys {
					if e.Live {
						live++
					}
					if e.Here {
						here++
					}
				}
				if live == 3 && here == 2 {
					alice = l
					return len(findings(st, "rlqs_demand_over_limit")) > 0
				}
			}
		}
		return false
	})
	q := st.RLQS
	if len(q.Clients) != 2 || len(q.Buckets) != 4 || len(q.Rules) != 3 || q.AssignmentTTLS != 1.5 || q.ReportIntervalS != 0.5 {
		t.Errorf("rlqs: %d clients, %d buckets, %d rules, ttl %v, report interval %v; want 2, 4, 3, 1.5 and 0.5",
			len(q.Clients), len(q.Buckets), len(q.Rules), q.AssignmentTTLS, q.ReportIntervalS)
	}
	if alice.Want <= alice.Limit || alice.Outstanding > alice.Limit || alice.Limit != 10 {
		t.Errorf("alice's ledger: want %d, outstanding %d, limit %d; want the want over the limit, the outstanding within it", alice.Want, alice.Outstanding, alice.Limit)
	}
	if len(q.Ledgers) != 3 { // alice's, bob's and search's: health's is a blanket, without a ledger
		t.Errorf("%d ledgers read, want 3: %+v", len(q.Ledgers), q.Ledgers)
	}
	over := findings(st, "rlqs_demand_over_limit")
	var aliceFinding *gateway.Finding
	for i, x := range over {
		if strings.Contains(x.Summary, "search") {
			t.Errorf("search's bucket (2 of 1000000 a second) found over its limit: %+v", x)
		}
		if strings.Contains(x.Summary, "all instances' 3 Envoys") {
			aliceFinding = &over[i]
		}
	}
	if aliceFinding == nil || !strings.HasPrefix(aliceFinding.Subject, "rule chat {name: chat, user: sha256:") ||
		!strings.Contains(aliceFinding.Summary, "per 1m of rule chat's bucket") || !strings.Contains(aliceFinding.Summary, "its limit is 10") || !strings.Contains(aliceFinding.Do, "raise rule chat's limit") {
		t.Errorf("rlqs_demand_over_limit findings %+v; want alice's bucket's, by all instances' 3 Envoys, its limit 10, raise rule chat's", over)
	}
	if len(findings(st, "rlqs_ledger_unreachable")) != 0 {
		t.Errorf("a ledger unreachable with the ledger up: %+v", findings(st, "rlqs_ledger_unreachable"))
	}
	for _, v := range []string{"alice", "bob"} {
		if strings.Contains(body, v) {
			t.Errorf("/v1/stats holds the bucket id value %q", v)
		}
	}

	f.ledgers.down.Store(true)
	f.a1.Decide(f.alice)
	f.a1.report()
	waitFor(t, "the ledger found unreachable", func() bool {
		st, _ = quotaStats(t, f.admin)
		return len(findings(st, "rlqs_ledger_unreachable")) > 0 && st.RLQS.LastLedgerError != nil
	})
	u := findings(st, "rlqs_ledger_unreachable")[0]
	if !strings.Contains(u.Summary, "connection refused") || !strings.Contains(u.Summary, "expired_assignment_behavior") || !strings.Contains(u.Do, "Redis") {
		t.Errorf("rlqs_ledger_unreachable: %+v; want the error, the Envoys' expired_assignment_behavior and what to do", u)
	}
	for _, l := range st.RLQS.Ledgers {
		if !strings.Contains(l.Error, "connection refused") {
			t.Errorf("ledger %s read with the ledger down: error %q", l.Ledger, l.Error)
		}
	}
	if m, _ := rlqsMetrics(t, f.admin); m["sluice_rlqs_ledger_errors_total"] < 1 {
		t.Errorf("sluice_rlqs_ledger_errors_total = %v with the ledger down", m["sluice_rlqs_ledger_errors_total"])
	}
}

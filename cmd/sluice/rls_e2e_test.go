package main

// End-to-end tests of Envoy's rate limit service: the real binary serving
// envoy.service.ratelimit.v3 over gRPC on a real redis-server, called by a real gRPC client.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/peertest"
	"github.com/sluicehq/sluice/internal/redistest"
)

// rlsFile is an envoyproxy/ratelimit configuration with one rule per algorithm (sluice's
// extension beside rate_limit), all per value of their key.
const rlsFile = `domain: e2e
descriptors:
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: sliding-log
    algorithm: sliding-log
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: sliding-window
    algorithm: sliding-window
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: token-bucket
    algorithm: token-bucket
    burst: 3
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: leaky-bucket
    algorithm: leaky-bucket
    burst: 2
    rate_limit: {unit: minute, requests_per_unit: 3}
`

// rlsConfig is a sluice configuration serving only the rate limit service (and the admin
// listener) on store; it writes the Envoy file beside it and tells where the service listens.
func rlsConfig(t *testing.T, dir, envoy, store string, addr *string) configFunc {
	if err := os.WriteFile(filepath.Join(dir, "envoy.yaml"), []byte(envoy), 0o644); err != nil {
		t.Fatal(err)
	}
	return func(listen, admin string) string {
		a, err := freeAddr()
		if err != nil {
			t.Fatal(err)
		}
		*addr = a
		return fmt.Sprintf("listen: \"\"\nadmin_listen: %s\nrls: {listen: %s, envoy_config: [envoy.yaml]}\n%s", admin, a, store)
	}
}

func rlsAsk(t *testing.T, c *peertest.Client, domain string, hits uint32, entries ...peertest.Entry) (*rlspb.RateLimitResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.ShouldRateLimit(ctx, domain, [][]peertest.Entry{entries}, hits)
}

func rlsCode(t *testing.T, c *peertest.Client, domain string, entries ...peertest.Entry) rlspb.RateLimitResponse_Code {
	t.Helper()
	resp, err := rlsAsk(t, c, domain, 0, entries...)
	if err != nil {
		t.Fatalf("ShouldRateLimit %v: %v", entries, err)
	}
	return resp.OverallCode
}

// Every algorithm through gRPC on Redis; the health service; a reload that changes a limit, and
// one that is invalid (the running files stay, the error names the file and line).
func TestServeE2ERLS(t *testing.T) {
	rs := redistest.Start(t)
	dir := t.TempDir()
	var addr string
	p := startSluice(t, dir, "sluice.yaml", rlsConfig(t, dir, rlsFile, "store: {type: redis, addrs: ["+rs.Addr+"]}\n", &addr))
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, svc := range []string{"", "envoy.service.ratelimit.v3.RateLimitService"} {
		h, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health %q: %v %v", svc, h, err)
		}
	}
	c := peertest.NewClient(t, addr)
	const OK, OVER = rlspb.RateLimitResponse_OK, rlspb.RateLimitResponse_OVER_LIMIT
	// 5 requests at once against 3 per minute: the first three pass for every algorithm but the
	// leaky bucket, which answers at once or not at all (Envoy cannot hold a request): one now,
	// and the queue of 2 behind it would hold the next ones, so they are refused.
	want := map[string][]rlspb.RateLimitResponse_Code{
		"fixed":          {OK, OK, OK, OVER, OVER},
		"sliding-log":    {OK, OK, OK, OVER, OVER},
		"sliding-window": {OK, OK, OK, OVER, OVER},
		"token-bucket":   {OK, OK, OK, OVER, OVER},
		"leaky-bucket":   {OK, OVER, OVER, OVER, OVER},
	}
	for alg, codes := range want {
		var got []rlspb.RateLimitResponse_Code
		for range codes {
			got = append(got, rlsCode(t, c, "e2e", peertest.E(alg, "v")))
		}
		if fmt.Sprint(got) != fmt.Sprint(codes) {
			t.Errorf("%s: %v, want %v", alg, got, codes)
		}
	}
	if keys, err := rs.Do("KEYS", "*"); err != nil || !strings.Contains(keys, "e2e:") {
		t.Errorf("Redis keys %q (%v): want the counters' keys", keys, err)
	}

	// A reload with a larger limit takes effect for new counters of that rule at once.
	writeFile(t, filepath.Join(dir, "envoy.yaml"), strings.Replace(rlsFile, "- key: fixed\n    rate_limit: {unit: minute, requests_per_unit: 3}", "- key: fixed\n    rate_limit: {unit: minute, requests_per_unit: 5}", 1))
	p.signal(syscall.SIGHUP)
	waitLog(t, p, "Envoy rate limit service configuration reloaded")
	resp, err := rlsAsk(t, c, "e2e", 0, peertest.E("fixed", "w"))
	if err != nil || resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 5 {
		t.Fatalf("after reload: %v %v", resp, err)
	}
	// An invalid file: the reload fails whole, naming the file and line; the service answers on
	// the running files.
	writeFile(t, filepath.Join(dir, "envoy.yaml"), "domain: e2e\ndescriptors:\n  - key: fixed\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	p.signal(syscall.SIGHUP)
	waitLog(t, p, "configuration not reloaded")
	if !strings.Contains(p.stderr.String(), "envoy.yaml:4") {
		t.Errorf("the reload error does not name envoy.yaml:4:\n%s", p.stderr.String())
	}
	resp, err = rlsAsk(t, c, "e2e", 0, peertest.E("fixed", "x"))
	if err != nil || resp.OverallCode != OK || resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 5 {
		t.Fatalf("after a failed reload: %v %v", resp, err)
	}
	// The service's decisions are on /metrics like the proxy's, its domain as the client.
	if v := p.metric(t, "sluice_decisions_total", map[string]string{"client": "rls/e2e", "policy": "e2e/fixed", "result": "refused"}); v != 2 {
		t.Errorf("sluice_decisions_total{client=rls/e2e,policy=e2e/fixed,result=refused} = %v, want 2", v)
	}
}

// An invalid Envoy file at start: exit code 2 and the file and line on stderr.
func TestServeE2ERLSBadFileAtStart(t *testing.T) {
	dir := t.TempDir()
	var addr string
	cfg := rlsConfig(t, dir, "domain: e2e\ndescriptors:\n  - value: no-key\n", "", &addr)
	_, err := launch(t, dir, "sluice.yaml", cfg, "/healthz")
	if err == nil {
		t.Fatal("sluice served with an invalid Envoy file")
	}
	if !strings.Contains(err.Error(), "envoy.yaml:3") {
		t.Errorf("the error does not name envoy.yaml:3: %v", err)
	}
}

// Redis down, under each failure mode: fail-closed is a gRPC error Envoy maps with its
// failure_mode_deny (never OVER_LIMIT); fail-open answers OK; local decides on this instance's
// share of each limit.
func TestServeE2ERLSRedisDown(t *testing.T) {
	for _, mode := range []string{"fail-closed", "fail-open", "local"} {
		t.Run(mode, func(t *testing.T) {
			rs := redistest.Start(t)
			dir := t.TempDir()
			var addr string
			store := fmt.Sprintf("store: {type: redis, addrs: [%s], on_error: %s, timeout: 200ms", rs.Addr, mode)
			if mode == "local" {
				store += ", local_share: 0.34"
			}
			startSluice(t, dir, "sluice.yaml", rlsConfig(t, dir, rlsFile, store+"}\n", &addr))
			c := peertest.NewClient(t, addr)
			if code := rlsCode(t, c, "e2e", peertest.E("fixed", "up")); code != rlspb.RateLimitResponse_OK {
				t.Fatalf("with Redis up: %v", code)
			}
			rs.Kill()
			var codes []string
			for range 3 {
				resp, err := rlsAsk(t, c, "e2e", 0, peertest.E("fixed", "down"))
				switch {
				case err != nil:
					codes = append(codes, status.Code(err).String())
				default:
					codes = append(codes, resp.OverallCode.String())
				}
			}
			want := map[string]string{
				"fail-closed": "[Unavailable Unavailable Unavailable]",
				"fail-open":   "[OK OK OK]",
				"local":       "[OK OVER_LIMIT OVER_LIMIT]", // 0.34 of 3 per minute: 1
			}[mode]
			if fmt.Sprint(codes) != want {
				t.Fatalf("with Redis down: %v, want %v", codes, want)
			}
		})
	}
}

// waitLog waits until the process's log says s.
func waitLog(t *testing.T, p *sluiceProc, s string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.stderr.String(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("the log never said %q:\n%s", s, p.stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// On a Redis Cluster: every algorithm as on one server, and a request whose descriptors' counters
// lie in different hash slots is still over if one is, consuming nothing on the others.
func TestServeE2ERLSCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	dir := t.TempDir()
	var addr string
	startSluice(t, dir, "sluice.yaml", rlsConfig(t, dir, rlsFile, "store: {type: redis, timeout: 2s, addrs: ["+strings.Join(cl.Addrs(), ", ")+"]}\n", &addr))
	c := peertest.NewClient(t, addr)
	const OK, OVER = rlspb.RateLimitResponse_OK, rlspb.RateLimitResponse_OVER_LIMIT
	for _, alg := range []string{"fixed", "sliding-log", "sliding-window", "token-bucket"} {
		var got []rlspb.RateLimitResponse_Code
		for range 4 {
			got = append(got, rlsCode(t, c, "e2e", peertest.E(alg, "v")))
		}
		if want := []rlspb.RateLimitResponse_Code{OK, OK, OK, OVER}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s on the cluster: %v, want %v", alg, got, want)
		}
	}
	// "fixed"/"a" is spent; a request of it and of ten fresh values (their counters in other
	// slots) is over, and the fresh ones keep all of their quota.
	for range 3 {
		rlsCode(t, c, "e2e", peertest.E("fixed", "a"))
	}
	ds := [][]peertest.Entry{{peertest.E("fixed", "a")}}
	for i := range 10 {
		ds = append(ds, []peertest.Entry{peertest.E("fixed", fmt.Sprintf("fresh-%d", i))})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, "e2e", ds, 0)
	if err != nil || resp.OverallCode != OVER || resp.Statuses[0].Code != OVER {
		t.Fatalf("mixed request: %v %v", resp, err)
	}
	for i := range 10 {
		r, err := rlsAsk(t, c, "e2e", 0, peertest.E("fixed", fmt.Sprintf("fresh-%d", i)))
		if err != nil || r.Statuses[0].LimitRemaining != 2 {
			t.Errorf("fresh-%d after the refused request: %v %v (want 2 remaining: the refused request consumed nothing)", i, r, err)
		}
	}
}

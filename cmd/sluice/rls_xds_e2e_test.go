package main

// Rules over xDS, side by side: envoyproxy/ratelimit (CONFIG_TYPE=GRPC_XDS_SOTW) and sluice serve
// (rls.xds) subscribe over mutual TLS to one management server (go-control-plane's, as Envoy
// Gateway's controller embeds it), on one real redis-server, and are sent the same requests as
// the server's rules change; both must give the same answers.

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	rlsconfpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc/codes"

	"github.com/sluicehq/sluice/internal/peertest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/xdstest"
)

// xdsDomain is a RateLimitConfig of one domain whose descriptor key k is limited to n a unit u,
// and, below it, k's sub-descriptor s to sub a unit u.
func xdsDomain(name string, n, sub uint32, u rlsconfpb.RateLimitUnit) *rlsconfpb.RateLimitConfig {
	return &rlsconfpb.RateLimitConfig{Name: name, Domain: name, Descriptors: []*rlsconfpb.RateLimitDescriptor{{
		Key: "k", RateLimit: &rlsconfpb.RateLimitPolicy{Unit: u, RequestsPerUnit: n},
		Descriptors: []*rlsconfpb.RateLimitDescriptor{{Key: "s", RateLimit: &rlsconfpb.RateLimitPolicy{Unit: u, RequestsPerUnit: sub}}},
	}}}
}

// xdsStep is a request of one descriptor in domain and its answer.
func xdsStep(note, domain string, want peertest.Status, entries ...peertest.Entry) peertest.Step {
	code := want.Code
	return peertest.Step{Note: note, Req: peertest.Request{Domain: domain, Descriptors: []peertest.Descriptor{peertest.D(entries...)}},
		Want: peertest.Want{Overall: code, Statuses: []peertest.Status{want}}}
}

func xdsOK(n uint32, u peertest.Unit, remaining uint32) peertest.Status {
	return peertest.Status{Code: peertest.OK, Limit: &peertest.Limit{RequestsPerUnit: n, Unit: u}, Remaining: remaining}
}

func xdsOver(n uint32, u peertest.Unit) peertest.Status {
	return peertest.Status{Code: peertest.OverLimit, Limit: &peertest.Limit{RequestsPerUnit: n, Unit: u}}
}

var (
	xdsNoRule = peertest.Status{Code: peertest.OK} // a domain or descriptor without a rule
	kx        = peertest.E("k", "x")
	sy        = peertest.E("s", "y")
)

func TestRLSXDSMatchesPeer(t *testing.T) {
	rs := redistest.Start(t)
	xs := xdstest.Start(t, true)

	// Both start before the server has any rules for them.
	var addr string
	p := startSluice(t, t.TempDir(), "sluice.yaml", func(listen, admin string) string {
		a, err := freeAddr()
		if err != nil {
			t.Fatal(err)
		}
		addr = a
		return fmt.Sprintf(`listen: ""
admin_listen: %s
rls:
  listen: %s
  xds:
    server: %s
    node_id: %s
    node_metadata: {role: test}
    tls: {ca_file: %s, cert_file: %s, key_file: %s, server_name: %s}
    connect_retry: {initial: 100ms, max: 1s}
store: {type: redis, addrs: [%s], refusal_cache: 0}
`, admin, a, xs.Addr, xs.NodeID, xs.CA, xs.Cert, xs.Key, xs.ServerName, rs.Addr)
	})
	sluice := peertest.NewClient(t, addr)
	sluice.Extras = true // its RateLimit fields and problem bodies: checked in TestServeE2ERLS and package rls
	peer := peertest.NewClient(t, peertest.StartWith(t, peertest.Options{Env: xs.PeerEnv()}, rs.Addr))
	flush := func() error {
		if r, err := rs.Do("FLUSHALL"); err != nil || r != "OK" {
			return fmt.Errorf("FLUSHALL: %q %v", r, err)
		}
		return nil
	}
	both := func(t *testing.T, s peertest.Sequence) {
		t.Helper()
		peertest.Check(t, s, peer, flush)
		peertest.Check(t, s, sluice, flush)
	}

	t.Run("before any rules", func(t *testing.T) {
		both(t, peertest.Sequence{Name: "xds/no-rules", Steps: []peertest.Step{
			{Note: "no configuration loaded", Req: peertest.Request{Domain: "a", Descriptors: []peertest.Descriptor{peertest.D(kx)}},
				Want: peertest.Want{Err: codes.Unknown}},
		}})
	})

	v := xs.Set(t, xdsDomain("a", 3, 1, rlsconfpb.RateLimitUnit_MINUTE), xdsDomain("b", 2, 5, rlsconfpb.RateLimitUnit_HOUR))
	xs.WaitAcked(t, v, 2)
	t.Run("two domains", func(t *testing.T) {
		both(t, peertest.Sequence{Name: "xds/two-domains", Steps: []peertest.Step{
			xdsStep("a: 1 of 3", "a", xdsOK(3, peertest.Minute, 2), kx),
			xdsStep("a: 2 of 3", "a", xdsOK(3, peertest.Minute, 1), kx),
			xdsStep("a: 3 of 3", "a", xdsOK(3, peertest.Minute, 0), kx),
			xdsStep("a: over", "a", xdsOver(3, peertest.Minute), kx),
			xdsStep("a, nested: 1 of 1", "a", xdsOK(1, peertest.Minute, 0), kx, sy),
			xdsStep("a, nested: over", "a", xdsOver(1, peertest.Minute), kx, sy),
			xdsStep("b: 1 of 2", "b", xdsOK(2, peertest.Hour, 1), kx),
			xdsStep("b: a key without a rule", "b", xdsNoRule, peertest.E("other", "x")),
			xdsStep("an unknown domain", "c", xdsNoRule, kx),
		}})
	})

	v = xs.Set(t, xdsDomain("a", 1, 1, rlsconfpb.RateLimitUnit_MINUTE)) // a's limit changed, b removed
	xs.WaitAcked(t, v, 2)
	changed := peertest.Sequence{Name: "xds/changed", Steps: []peertest.Step{
		xdsStep("a: 1 of 1", "a", xdsOK(1, peertest.Minute, 0), kx),
		xdsStep("a: over", "a", xdsOver(1, peertest.Minute), kx),
		xdsStep("b was removed", "b", xdsNoRule, kx),
	}}
	t.Run("a limit changed, a domain removed", func(t *testing.T) { both(t, changed) })

	bad := xdsDomain("c", 1, 1, rlsconfpb.RateLimitUnit_MINUTE)
	bad.Descriptors[0].RateLimit.Unit = rlsconfpb.RateLimitUnit_UNKNOWN
	v = xs.Set(t, xdsDomain("a", 9, 9, rlsconfpb.RateLimitUnit_MINUTE), bad)
	msgs := xs.WaitNacked(t, v, 2)
	t.Logf("NACKs: %q", msgs)
	p.waitMetric(t, "sluice_rls_xds_updates_total", map[string]string{"result": "rejected"}, 1, 10*time.Second)
	t.Run("an invalid update is refused whole", func(t *testing.T) { both(t, changed) })

	xs.Stop()
	xs.Restart(t)
	v = xs.Set(t, xdsDomain("b", 2, 5, rlsconfpb.RateLimitUnit_HOUR))
	xs.WaitAcked(t, v, 2)
	t.Run("after the server restarted", func(t *testing.T) {
		both(t, peertest.Sequence{Name: "xds/restarted", Steps: []peertest.Step{
			xdsStep("b is back: 1 of 2", "b", xdsOK(2, peertest.Hour, 1), kx),
			xdsStep("a was removed", "a", xdsNoRule, kx),
		}})
	})
	if got := p.metric(t, "sluice_rls_xds_connected", nil); got != 1 {
		t.Errorf("sluice_rls_xds_connected %v, want 1", got)
	}
}

// A reload that changes rls.xds, or turns it into files, keeps the running subscription (logged):
// the rules still come from the server, as the node first subscribed.
func TestRLSXDSReload(t *testing.T) {
	rs := redistest.Start(t)
	xs := xdstest.Start(t, false)
	var addr string
	cfg := func(rlsPart string) configFunc {
		return func(listen, admin string) string {
			if addr == "" {
				a, err := freeAddr()
				if err != nil {
					t.Fatal(err)
				}
				addr = a
			}
			return fmt.Sprintf("listen: \"\"\nadmin_listen: %s\nrls:\n  listen: %s\n%sstore: {type: redis, addrs: [%s], refusal_cache: 0}\n", admin, addr, rlsPart, rs.Addr)
		}
	}
	dir := t.TempDir()
	p := startSluice(t, dir, "sluice.yaml", cfg(fmt.Sprintf("  xds: {server: %s, node_id: %s}\n", xs.Addr, xs.NodeID)))
	c := peertest.NewClient(t, addr)
	xs.WaitAcked(t, xs.Set(t, xdsDomain("a", 3, 1, rlsconfpb.RateLimitUnit_MINUTE)), 1)
	admin := strings.TrimPrefix(p.admin, "http://")

	envoy := filepath.Join(dir, "envoy.yaml")
	writeFile(t, envoy, "domain: files\ndescriptors: [{key: k, rate_limit: {unit: minute, requests_per_unit: 1}}]\n")
	for i, part := range []string{
		fmt.Sprintf("  xds: {server: %s, node_id: another}\n", xs.Addr),
		"  envoy_config: [" + envoy + "]\n",
	} {
		writeFile(t, p.config, cfg(part)("", admin))
		p.signal(syscall.SIGHUP)
		p.waitMetric(t, "sluice_config_reloads_total", map[string]string{"result": "ok"}, float64(i+1), 10*time.Second)
		if n := strings.Count(p.stderr.String(), "rls.xds (and whether the rules come from files or xDS) takes effect at the next restart"); n != i+1 {
			t.Fatalf("reload %d: %d warnings:\n%s", i+1, n, p.stderr.String())
		}
		v := xs.Set(t, xdsDomain("a", uint32(5+i), 1, rlsconfpb.RateLimitUnit_MINUTE))
		xs.WaitAcked(t, v, 1)
		resp, err := rlsAsk(t, c, "a", 0, kx)
		if err != nil || resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != uint32(5+i) {
			t.Fatalf("reload %d: the rules are not the subscription's: %v %v", i+1, resp, err)
		}
	}
}

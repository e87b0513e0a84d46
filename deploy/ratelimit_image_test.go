package deploy

// sluice's image where envoyproxy/ratelimit's is deployed: started the way Envoy Gateway starts
// the reference (its command, its environment, its certificate files, rules from an xDS
// management server over mutual TLS) and the way Istio's sample does (its command, its
// environment, a ConfigMap at /data/ratelimit/config), by podman for real, beside the reference
// started with the same environment on the same redis-server: both must give the same answers.

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	rlsconfpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/sluicehq/sluice/internal/peertest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/xdstest"
)

// envoyGatewayEnv is the environment Envoy Gateway gives its rate limit deployment (its
// controller's rendering of the Deployment, as of its v1.x releases), with the addresses of this
// test: the xDS server, Redis and the ports (host networking).
func envoyGatewayEnv(xdsAddr, redisAddr string, grpcPort, httpPort int) []string {
	return []string{
		"RUNTIME_ROOT=/data",
		"RUNTIME_SUBDIRECTORY=ratelimit",
		"RUNTIME_IGNOREDOTFILES=true",
		"RUNTIME_WATCH_ROOT=false",
		"LOG_LEVEL=info",
		"USE_STATSD=true",
		"STATSD_PORT=9125",
		"CONFIG_TYPE=GRPC_XDS_SOTW",
		"CONFIG_GRPC_XDS_SERVER_URL=" + xdsAddr,
		"CONFIG_GRPC_XDS_NODE_ID=envoy-ratelimit",
		"GRPC_SERVER_USE_TLS=true",
		"GRPC_SERVER_TLS_CERT=/certs/tls.crt",
		"GRPC_SERVER_TLS_KEY=/certs/tls.key",
		"GRPC_SERVER_TLS_CA_CERT=/certs/ca.crt",
		"CONFIG_GRPC_XDS_SERVER_USE_TLS=true",
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT=/certs/tls.crt",
		"CONFIG_GRPC_XDS_CLIENT_TLS_KEY=/certs/tls.key",
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT=/certs/ca.crt",
		"FORCE_START_WITHOUT_INITIAL_CONFIG=true",
		"REDIS_SOCKET_TYPE=tcp",
		"REDIS_URL=" + redisAddr,
		fmt.Sprintf("GRPC_PORT=%d", grpcPort),
		fmt.Sprintf("PORT=%d", httpPort),
	}
}

// egRoute is what Envoy Gateway's controller sends for a BackendTrafficPolicy of limit a minute
// per value of the x-user-id header on one HTTPRoute rule: a domain per listener, a descriptor
// for the rule, and under it one for the header's value.
func egRoute(limit uint32) *rlsconfpb.RateLimitConfig {
	const rule = "httproute/default/backend/rule/0/match/0"
	return &rlsconfpb.RateLimitConfig{Name: "default/eg/http", Domain: "default/eg/http",
		Descriptors: []*rlsconfpb.RateLimitDescriptor{{Key: rule, Value: rule,
			Descriptors: []*rlsconfpb.RateLimitDescriptor{{Key: "rule-0-match-0",
				RateLimit: &rlsconfpb.RateLimitPolicy{Unit: rlsconfpb.RateLimitUnit_MINUTE, RequestsPerUnit: limit}}}}}}
}

// egSequences are Envoy Gateway's requests for egRoute(3): per user, and usage charged as its
// "rate limit cost" does (a check of 0 before the request, the cost at its end).
func egSequences() []peertest.Sequence {
	const rule = "httproute/default/backend/rule/0/match/0"
	user := func(name string, hits *uint64) peertest.Descriptor {
		d := peertest.D(peertest.E(rule, rule), peertest.E("rule-0-match-0", name))
		d.HitsAddend = hits
		return d
	}
	ask := func(note string, d peertest.Descriptor, code peertest.Code, remaining uint32) peertest.Step {
		st := peertest.Status{Code: code, Limit: &peertest.Limit{RequestsPerUnit: 3, Unit: peertest.Minute}, Remaining: remaining}
		return peertest.Step{Note: note, Req: peertest.Request{Domain: "default/eg/http", Descriptors: []peertest.Descriptor{d}},
			Want: peertest.Want{Overall: code, Statuses: []peertest.Status{st}}}
	}
	n := func(v uint64) *uint64 { return &v }
	return []peertest.Sequence{
		{Name: "envoy-gateway/per-user", Steps: []peertest.Step{
			ask("alice 1 of 3", user("alice", nil), peertest.OK, 2),
			ask("alice 2 of 3", user("alice", nil), peertest.OK, 1),
			ask("alice 3 of 3", user("alice", nil), peertest.OK, 0),
			ask("alice over", user("alice", nil), peertest.OverLimit, 0),
			ask("bob has his own", user("bob", nil), peertest.OK, 2),
		}},
		{Name: "envoy-gateway/cost", Steps: []peertest.Step{
			ask("check", user("carol", n(0)), peertest.OK, 3),
			ask("charge 2", user("carol", n(2)), peertest.OK, 1),
			ask("check", user("carol", n(0)), peertest.OK, 1),
			ask("charge 2: past the limit, counted", user("carol", n(2)), peertest.OverLimit, 0),
			ask("check: refused", user("carol", n(0)), peertest.OverLimit, 0),
		}},
	}
}

func TestImageAsEnvoyGatewayRateLimit(t *testing.T) {
	pm := containerPodman(t)
	imageAsEnvoyGatewayRateLimit(t, pm, pm.build(t))
}

// imageAsEnvoyGatewayRateLimit is TestImageAsEnvoyGatewayRateLimit's checks of the image (an ID or a name in pm's storage): the
// image built here, and a release's (TestReleaseSnapshot).
func imageAsEnvoyGatewayRateLimit(t *testing.T, pm *containerEngine, image string) {
	rs := redistest.Start(t)
	xs := xdstest.Start(t, true)
	certs := xs.PodCerts(t)
	grpcPort, httpPort := containerFreePort(t), containerFreePort(t)

	args := []string{"--read-only", "--user", "65534:65534", "--volume", certs + ":/certs:ro", "--entrypoint", "/bin/ratelimit"}
	for _, kv := range envoyGatewayEnv(xs.Addr, rs.Addr, grpcPort, httpPort) {
		args = append(args, "--env", kv)
	}
	name := pm.start(t, append(args, image)...)
	// Healthy before any rules (FORCE_START_WITHOUT_INITIAL_CONFIG), as the reference.
	containerWaitReady(t, pm, name, fmt.Sprintf("http://127.0.0.1:%d/healthcheck", httpPort))

	// The reference, subscribed to the same server with the same environment: its gRPC in
	// plaintext (peertest's client), everything else as Envoy Gateway sets it.
	var peerEnv []string
	for _, kv := range envoyGatewayEnv(xs.Addr, rs.Addr, 0, 0) {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "GRPC_SERVER_"), strings.HasPrefix(k, "RUNTIME_"), k == "GRPC_PORT", k == "PORT", k == "USE_STATSD", k == "STATSD_PORT":
			continue // (peertest's own listeners and directory; no statsd here)
		}
		peerEnv = append(peerEnv, strings.NewReplacer("/certs/ca.crt", filepath.Join(certs, "ca.crt"),
			"/certs/tls.crt", filepath.Join(certs, "tls.crt"), "/certs/tls.key", filepath.Join(certs, "tls.key")).Replace(kv))
	}
	// (peertest's environment says HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED, for files; Envoy
	// Gateway leaves the reference's default, false.)
	peerEnv = append(peerEnv, "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=false")
	peer := peertest.NewClient(t, peertest.StartWith(t, peertest.Options{Env: peerEnv}, rs.Addr))

	// sluice's gRPC is TLS with a client certificate required (GRPC_SERVER_TLS_CA_CERT), as Envoy
	// Gateway's Envoy calls it.
	ca, err := os.ReadFile(filepath.Join(certs, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	cert, err := tls.LoadX509KeyPair(filepath.Join(certs, "tls.crt"), filepath.Join(certs, "tls.key"))
	if err != nil {
		t.Fatal(err)
	}
	sluice := peertest.NewClientTLS(t, fmt.Sprintf("127.0.0.1:%d", grpcPort),
		&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	sluice.Extras = true
	noCert := peertest.NewClientTLS(t, fmt.Sprintf("127.0.0.1:%d", grpcPort), &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
	if _, err := noCert.ShouldRateLimit(t.Context(), "default/eg/http", [][]peertest.Entry{{peertest.E("k", "v")}}, 0); err == nil {
		t.Fatal("a call without a client certificate was answered; GRPC_SERVER_TLS_CA_CERT requires one")
	}

	xs.NodeID = "envoy-ratelimit" // Envoy Gateway's node: both subscribe as it
	xs.WaitAcked(t, xs.Set(t, egRoute(3)), 2)
	flush := func() error {
		if r, err := rs.Do("FLUSHALL"); err != nil || r != "OK" {
			return fmt.Errorf("FLUSHALL: %q %v", r, err)
		}
		return nil
	}
	for _, s := range egSequences() {
		t.Run(s.Name, func(t *testing.T) {
			peertest.Check(t, s, peer, flush) // the expected answers are the reference's
			peertest.Check(t, s, sluice, flush)
		})
	}
	logs, _ := pm.output("logs", name)
	if !strings.Contains(logs, "USE_STATSD") {
		t.Errorf("no warning names USE_STATSD, which sluice does not support:\n%s", logs)
	}
}

// istioEnv is the environment of Istio's rate limit sample (samples/ratelimit), with this test's
// Redis and ports (host networking).
func istioEnv(redisAddr string, grpcPort, httpPort int) []string {
	return []string{
		"LOG_LEVEL=debug",
		"REDIS_SOCKET_TYPE=tcp",
		"REDIS_URL=" + redisAddr,
		"USE_STATSD=false",
		"RUNTIME_ROOT=/data",
		"RUNTIME_SUBDIRECTORY=ratelimit",
		"RUNTIME_WATCH_ROOT=false",
		"RUNTIME_IGNOREDOTFILES=true",
		"HOST=::",
		"GRPC_HOST=::",
		fmt.Sprintf("GRPC_PORT=%d", grpcPort),
		fmt.Sprintf("PORT=%d", httpPort),
	}
}

// configMapVolume lays files out as Kubernetes mounts a ConfigMap: each name a link into ..data,
// itself a link to a directory of this version's files; readable by every user.
func configMapVolume(t *testing.T, files []string) string {
	t.Helper()
	dir := t.TempDir()
	version := filepath.Join(dir, "..2026_12_02_00_00_00.000000001")
	if err := os.Mkdir(version, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(f)
		if err := os.WriteFile(filepath.Join(version, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Base(version), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestImageAsIstioRateLimit(t *testing.T) {
	pm := containerPodman(t)
	imageAsIstioRateLimit(t, pm, pm.build(t))
}

// imageAsIstioRateLimit is TestImageAsIstioRateLimit's checks of the image (an ID or a name in pm's storage): the
// image built here, and a release's (TestReleaseSnapshot).
func imageAsIstioRateLimit(t *testing.T, pm *containerEngine, image string) {
	rs := redistest.Start(t)
	seqs := peertest.Sequences()
	files := peertest.ConfigFiles(t, seqs...)
	volume := configMapVolume(t, files)
	grpcPort, httpPort := containerFreePort(t), containerFreePort(t)

	args := []string{"--read-only", "--volume", volume + ":/data/ratelimit/config:ro", "--entrypoint", "/bin/ratelimit"}
	for _, kv := range istioEnv(rs.Addr, grpcPort, httpPort) {
		args = append(args, "--env", kv)
	}
	name := pm.start(t, append(args, image)...)
	containerWaitReady(t, pm, name, fmt.Sprintf("http://127.0.0.1:%d/healthcheck", httpPort))

	peer := peertest.NewClient(t, peertest.Start(t, rs.Addr, files...))
	sluice := peertest.NewClient(t, fmt.Sprintf("127.0.0.1:%d", grpcPort))
	sluice.Extras = true
	flush := func() error {
		if r, err := rs.Do("FLUSHALL"); err != nil || r != "OK" {
			return fmt.Errorf("FLUSHALL: %q %v", r, err)
		}
		return nil
	}
	alike := 0
	for _, s := range seqs {
		t.Run(s.Name, func(t *testing.T) {
			peertest.Check(t, s, peer, flush) // the recorded answers are the reference's
			if _, differs := peertest.Differences[s.Name]; differs {
				return // (TestRLSMatchesPeer checks that these still differ as documented)
			}
			peertest.Check(t, s, sluice, flush)
			alike++
		})
	}
	t.Logf("%d of %d sequences answered alike; %d differ as documented", alike, len(seqs), len(seqs)-alike)
	// The sample's variables are all understood: no warning.
	if logs, _ := pm.output("logs", name); strings.Contains(logs, "does not support") {
		t.Errorf("a warning of unsupported settings for Istio's sample environment:\n%s", logs)
	}
}

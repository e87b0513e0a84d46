package main

// sluice started as /bin/ratelimit, configured by envoyproxy/ratelimit's environment as Istio's
// sample starts the reference, beside the reference itself started with that environment.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/peertest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/xdstest"
)

// istioEnv is the environment Istio's sample (samples/ratelimit/rate-limit-service.yaml) gives
// envoyproxy/ratelimit, with redisAddr for its redis:6379 and runtimeRoot for its /data (its
// ConfigMap is mounted at runtimeRoot/ratelimit/config). Its ports are the reference's defaults
// (8080, 8081, 6070) unless PORT, GRPC_PORT and DEBUG_PORT are added.
func istioEnv(redisAddr, runtimeRoot string) []string {
	return []string{
		"LOG_LEVEL=debug",
		"REDIS_SOCKET_TYPE=tcp",
		"REDIS_URL=" + redisAddr,
		"USE_STATSD=false",
		"RUNTIME_ROOT=" + runtimeRoot,
		"RUNTIME_SUBDIRECTORY=ratelimit",
		"RUNTIME_WATCH_ROOT=false",
		"RUNTIME_IGNOREDOTFILES=true",
		"HOST=::",
		"GRPC_HOST=::",
	}
}

// ratelimitProc is sluice running as /bin/ratelimit.
type ratelimitProc struct {
	cmd    *exec.Cmd
	grpc   string // 127.0.0.1:GRPC_PORT
	health string // http://127.0.0.1:PORT/healthcheck
	stderr *syncBuffer
	done   chan struct{}
}

// startRatelimit starts the test's sluice binary linked as DIR/ratelimit, with no arguments and
// only env (and PATH) for its environment, on free PORT, GRPC_PORT and DEBUG_PORT, and waits
// until GET /healthcheck answers 200 "OK". It is stopped with SIGTERM when the test ends, and
// must exit 0.
func startRatelimit(t *testing.T, env ...string) *ratelimitProc {
	t.Helper()
	p := launchRatelimit(t, env...)
	p.waitHealthy(t)
	return p
}

// launchRatelimit is startRatelimit without the wait for /healthcheck.
func launchRatelimit(t *testing.T, env ...string) *ratelimitProc {
	t.Helper()
	// Its ports are free when drawn, but another test's process may bind one before this one
	// does (the suite starts many at once): then it is started again on others.
	for attempt := 1; ; attempt++ {
		p := launchRatelimitOnce(t, env...)
		if attempt == 5 || !p.lostPort() {
			return p
		}
		t.Logf("ratelimit lost one of its ports to another process; starting it again (%d)", attempt)
	}
}

// lostPort waits until the process listens on its gRPC port or exits, and reports whether it
// exited because a port it was given was in use.
func (p *ratelimitProc) lostPort() bool {
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); {
		select {
		case <-p.done:
			return strings.Contains(p.stderr.String(), "address already in use")
		default:
		}
		if c, err := net.DialTimeout("tcp", p.grpc, 100*time.Millisecond); err == nil {
			c.Close()
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

func launchRatelimitOnce(t *testing.T, env ...string) *ratelimitProc {
	t.Helper()
	bin := ratelimitBinary(t)
	ports := peertest.FreePorts(t, 3)
	p := &ratelimitProc{grpc: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])),
		health: "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1])) + "/healthcheck",
		stderr: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin)
	p.cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "GORACE=atexit_sleep_ms=0"}, env...)
	p.cmd.Env = append(p.cmd.Env, "GRPC_PORT="+strconv.Itoa(ports[0]), "PORT="+strconv.Itoa(ports[1]), "DEBUG_PORT="+strconv.Itoa(ports[2]))
	p.cmd.Stdout, p.cmd.Stderr = p.stderr, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Signal(os.Interrupt)
			<-p.done
			if code := p.cmd.ProcessState.ExitCode(); code != 0 {
				t.Errorf("ratelimit exited with code %d; want 0\n%s", code, p.stderr.String())
			}
		}
		if strings.Contains(p.stderr.String(), "DATA RACE") {
			t.Errorf("ratelimit reported a data race:\n%s", p.stderr.String())
		}
	})
	return p
}

// waitHealthy waits until GET /healthcheck answers 200 "OK".
func (p *ratelimitProc) waitHealthy(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, body := p.healthcheck()
		if code == http.StatusOK && body == "OK" {
			return
		}
		select {
		case <-p.done:
			t.Fatalf("ratelimit exited (%v):\n%s", p.cmd.ProcessState, p.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("ratelimit's /healthcheck did not answer 200 OK (last %d %q):\n%s", code, body, p.stderr.String())
		}
	}
}

// ratelimitBinary is the test's sluice binary as DIR/ratelimit: a hard link, or a copy.
func ratelimitBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), ratelimitName)
	if err := os.Link(sluiceBinary(t), bin); err != nil {
		data, err := os.ReadFile(sluiceBinary(t))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(bin, data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return bin
}

// Bad values exit with code 2 before anything starts, each variable named, and no secret shown.
func TestRatelimitBadEnvironment(t *testing.T) {
	cmd := exec.Command(ratelimitBinary(t))
	cmd.Env = []string{"GORACE=atexit_sleep_ms=0", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=127.0.0.1:1", "REDIS_AUTH=user:pw-Not-Shown",
		"GRPC_PORT=grpc", "LOG_FORMAT=xml", "RUNTIME_ROOT=" + t.TempDir()}
	out, err := cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); code != 2 {
		t.Fatalf("exit code %d (%v), want 2:\n%s", code, err, out)
	}
	for _, want := range []string{`GRPC_PORT "grpc" must be a port number`, `LOG_FORMAT "xml" must be text or json`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "pw-Not-Shown") {
		t.Errorf("the password is shown:\n%s", out)
	}
}

// healthcheck is GET /healthcheck's status and body (0 if it did not answer).
func (p *ratelimitProc) healthcheck() (int, string) {
	resp, err := e2eClient.Get(p.health)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Istio's sample: sluice as /bin/ratelimit with the sample's environment on a ConfigMap directory
// answers every sequence as the reference started with the same environment does (but for the
// documented differences), names the variables it ignores in one warning, and follows the
// ConfigMap's update (its ..data swap).
func TestRatelimitIstioMatchesPeer(t *testing.T) {
	rs := redistest.Start(t)
	seqs := peertest.Sequences()
	files := peertest.ConfigFiles(t, seqs...)
	root := t.TempDir()
	cm := map[string]string{"swap.yaml": swapConfig(1)}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		cm[filepath.Base(f)] = string(b)
	}
	swap := configMapDir(t, filepath.Join(root, "ratelimit", "config"), cm)

	// The peer's own runtime directory (peertest lays it out), otherwise the same environment.
	var peerEnv []string
	for _, kv := range istioEnv(rs.Addr, root) {
		if !strings.HasPrefix(kv, "RUNTIME_ROOT=") {
			peerEnv = append(peerEnv, kv)
		}
	}
	peer := peertest.NewClient(t, peertest.StartWith(t, peertest.Options{Env: peerEnv}, rs.Addr, files...))
	p := startRatelimit(t, istioEnv(rs.Addr, root)...)
	if n := strings.Count(p.stderr.String(), "not support"); n != 1 || !strings.Contains(p.stderr.String(), `variables=DEBUG_PORT`) {
		t.Errorf("want one warning naming DEBUG_PORT (%d):\n%s", n, p.stderr.String())
	}
	sluice := peertest.NewClient(t, p.grpc)
	sluice.Extras = true
	flush := func() error {
		if r, err := rs.Do("FLUSHALL"); err != nil || r != "OK" {
			return fmt.Errorf("FLUSHALL: %q %v", r, err)
		}
		return nil
	}
	for _, s := range seqs {
		t.Run(s.Name, func(t *testing.T) {
			peertest.Check(t, s, peer, flush)
			res := s.Run(t.Context(), sluice, flush)
			if _, excepted := peerExceptions[s.Name]; excepted {
				return // TestRLSMatchesPeer holds these to their documented differences
			}
			for _, d := range res.Diffs {
				t.Errorf("sluice: %v", d)
			}
		})
	}

	// The ConfigMap is updated: the new limit is answered within the watch's second or so.
	if got := swapLimit(t, sluice); got != 1 {
		t.Fatalf("limit %d before the update; want 1", got)
	}
	swap(map[string]string{"swap.yaml": swapConfig(5)})
	deadline := time.Now().Add(10 * time.Second)
	for swapLimit(t, sluice) != 5 {
		if time.Now().After(deadline) {
			t.Fatalf("the ConfigMap's update was not applied within 10s:\n%s", p.stderr.String())
		}
		time.Sleep(50 * time.Millisecond) // polling for the reload, which happens within a second
	}
}

// swapConfig is a domain with one limit of n an hour.
func swapConfig(n int) string {
	return fmt.Sprintf("domain: swap\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: %d}\n", n)
}

// swapLimit is the limit the service answers domain swap with (hits 0: nothing counted).
func swapLimit(t *testing.T, c *peertest.Client) uint32 {
	t.Helper()
	resp, err := rlsAsk(t, c, "swap", 0, peertest.E("k", "v"))
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
}

// GRPC_SERVER_USE_TLS with GRPC_CLIENT_TLS_CACERT, as Envoy Gateway starts the reference: the rate
// limit service speaks gRPC over TLS and lets in only clients with a certificate of that CA. With
// it, REDIS_AUTH on a Redis that wants a password (which no log line shows, at LOG_LEVEL=debug),
// USE_PROMETHEUS with a path of its own, and the reference's POST /json.
func TestRatelimitTLS(t *testing.T) {
	const password = "rl-Redis-pw-7f3a"
	rs := redistest.Start(t, "--requirepass", password)
	metrics := "127.0.0.1:" + strconv.Itoa(peertest.FreePorts(t, 1)[0])
	dir := t.TempDir()
	ca, other := newTestCA(t, "eg-ca"), newTestCA(t, "other-ca")
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cert, key := ca.issue(t, "envoy-ratelimit", true)
	cm := filepath.Join(dir, "ratelimit", "config")
	os.MkdirAll(cm, 0o755)
	write("ratelimit/config/swap.yaml", []byte(swapConfig(2)))
	p := startRatelimit(t, "RUNTIME_ROOT="+dir, "RUNTIME_SUBDIRECTORY=ratelimit", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+rs.Addr,
		"GRPC_HOST=127.0.0.1", "HOST=127.0.0.1", "GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT="+write("tls.crt", cert),
		"GRPC_SERVER_TLS_KEY="+write("tls.key", key), "GRPC_CLIENT_TLS_CACERT="+write("ca.crt", ca.pem),
		"REDIS_AUTH="+password, "LOG_LEVEL=debug", "USE_PROMETHEUS=true", "PROMETHEUS_ADDR="+metrics, "PROMETHEUS_PATH=/stats/prometheus")

	ask := func(clientCA *testCA) error { return askTLS(t, p.grpc, ca, clientCA) }
	if err := ask(ca); err != nil {
		t.Errorf("a client with the CA's certificate: %v", err)
	}
	if err := ask(nil); err == nil {
		t.Error("a client without a certificate was answered")
	}
	if err := ask(other); err == nil {
		t.Error("a client with another CA's certificate was answered")
	}
	plain, err := peertest.Dial(p.grpc)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, err := rlsAsk(t, plain, "swap", 1, peertest.E("k", "v")); err == nil {
		t.Error("a plaintext client was answered")
	}
	// The reference's POST /json beside /healthcheck: the limit of 2 has one left, then none.
	for _, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
		resp, err := e2eClient.Post(strings.TrimSuffix(p.health, "healthcheck")+"json", "application/json",
			strings.NewReader(`{"domain":"swap","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || !strings.Contains(string(body), `"overallCode"`) {
			t.Errorf("POST /json: %d %s, want %d", resp.StatusCode, body, want)
		}
	}
	if n, err := rs.DoAuth(password, "DBSIZE"); err != nil || n == "0" {
		t.Errorf("Redis holds %s keys (%v): the answer was not decided on it", n, err)
	}
	resp, err := e2eClient.Get("http://" + metrics + "/stats/prometheus")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "sluice_decisions_total") {
		t.Errorf("PROMETHEUS_PATH: %d\n%s", resp.StatusCode, body)
	}
	if strings.Contains(p.stderr.String(), password) {
		t.Errorf("the Redis password is in the log:\n%s", p.stderr.String())
	}
}

// askTLS sends domain swap's descriptor k=v over TLS to addr, trusting ca, with a client
// certificate of clientCA (nil: none), and returns the call's error; an answer other than OK
// fails the test.
func askTLS(t *testing.T, addr string, ca, clientCA *testCA) error {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.pem)
	c := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if clientCA != nil {
		cp, kp := clientCA.issue(t, "envoy", false)
		pair, err := tls.X509KeyPair(cp, kp)
		if err != nil {
			t.Fatal(err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(c)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	resp, err := rlspb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx,
		peertest.Request{Domain: "swap", Descriptors: []peertest.Descriptor{peertest.D(peertest.E("k", "v"))}}.Proto())
	if err == nil && resp.GetOverallCode() != rlspb.RateLimitResponse_OK {
		t.Errorf("answer %v", resp)
	}
	return err
}

// sluice serve's rls.tls: gRPC over TLS, and with client_ca_file only for clients with a
// certificate of that CA.
func TestServeE2ERLSTLS(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, "envoy-ca")
	cert, key := ca.issue(t, "sluice", true)
	for name, b := range map[string][]byte{"cert.pem": cert, "key.pem": key, "ca.pem": ca.pem} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var addr string
	cfg := rlsConfig(t, dir, swapConfig(3), "store: {type: memory}\n", &addr)
	startSluice(t, dir, "sluice.yaml", func(listen, admin string) string {
		return strings.Replace(cfg(listen, admin), "envoy_config: [envoy.yaml]}", "envoy_config: [envoy.yaml], tls: {cert_file: cert.pem, key_file: key.pem, client_ca_file: ca.pem}}", 1)
	})
	if err := askTLS(t, addr, ca, ca); err != nil {
		t.Errorf("a client with the CA's certificate: %v", err)
	}
	if err := askTLS(t, addr, ca, nil); err == nil {
		t.Error("a client without a certificate was answered")
	}
}

// Rules over xDS with HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED: /healthcheck answers 500 until the
// first update from the management server is applied, then 200, as the reference's does.
func TestRatelimitXDSHealthyOnceLoaded(t *testing.T) {
	rs := redistest.Start(t)
	xs := xdstest.Start(t, false)
	p := launchRatelimit(t, "REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+rs.Addr, "USE_STATSD=false",
		"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL="+xs.Addr, "CONFIG_GRPC_XDS_NODE_ID="+xs.NodeID,
		"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true", "FORCE_START_WITHOUT_INITIAL_CONFIG=true")
	c := peertest.NewClient(t, p.grpc)
	// Serving (it answers), but not healthy: the request fails as without rules.
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := c.ShouldRateLimit(t.Context(), "a", [][]peertest.Entry{{peertest.E("k", "x")}}, 0)
		if status.Code(err) == codes.Unknown {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("before any rules: %v, want Unknown\n%s", err, p.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code, _ := p.healthcheck(); code != http.StatusInternalServerError {
		t.Fatalf("/healthcheck before any rules: %d, want 500", code)
	}
	xs.WaitAcked(t, xs.Set(t, xdsDomain("a", 3, 1, rlsconfpb.RateLimitUnit_MINUTE)), 1)
	p.waitHealthy(t)
}

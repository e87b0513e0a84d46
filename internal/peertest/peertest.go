// Package peertest runs envoyproxy/ratelimit, the reference implementation of Envoy's
// envoy.service.ratelimit.v3 rate limit service, beside sluice's own: it builds the peer at a
// pinned version (Binary), starts it on a real redis-server with a given set of its YAML files
// (Start), talks to any rate limit service over gRPC (Client), and holds the request sequences
// whose answers the peer gives (Sequences), so that a test can require the same answers of sluice.
//
// It also runs Gubernator (github.com/gubernator-io/gubernator, gubernator.go), the peer that
// issue 34's limit across regions is compared with: StartGubernators starts a cluster of its
// instances, and GubernatorClient sends them GetRateLimits requests, GLOBAL ones among them.
//
// Both peers are built from source with `go install` through the Go module proxy, once per
// machine (into os.UserCacheDir()/sluice-peertest/, a directory per version). There is no
// fallback and no skipping: a machine without the proxy fails the tests that need a peer, with a
// message saying why.
package peertest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

const (
	// Module is the peer's Go module.
	Module = "github.com/envoyproxy/ratelimit"
	// Version is the peer's version that every test and scripts/bench-rls.sh run: the one
	// `go install github.com/envoyproxy/ratelimit/src/service_cmd@latest` resolved when this was
	// written (the module has no release tags the proxy serves, so it is a pseudo-version: commit
	// 3fb702589d36 of 2026-01-22). Its answers are what Sequences records; moving it means running
	// TestPeerPassesItsOwnSequences and updating the recorded answers that changed.
	Version = "v1.4.1-0.20260122083618-3fb702589d36"
	// Package is the peer's server command.
	Package = Module + "/src/service_cmd"
)

var buildMu sync.Mutex // one build at a time in this process; builds in other processes rename atomically

// Binary returns the path of the peer's server binary at Version, building it first if this
// machine has not (see install). It fails the test (never skips it) when the build fails, e.g.
// without network to the proxy.
func Binary(tb testing.TB) string {
	tb.Helper()
	return install(tb, Package, Version, "service_cmd", Version)
}

// install returns the path of the binary that `go install pkg@version` builds, named name, kept
// at os.UserCacheDir()/sluice-peertest/<dir>/<name>, building it first if this machine has not:
// `go install` with GOBIN in a fresh directory under the cache, then an atomic rename into place,
// so that concurrent test processes never see half a file. It fails the test when the build does.
func install(tb testing.TB, pkg, version, name, dir string) string {
	tb.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	bin, err := binaryPath(dir, name)
	if err != nil {
		tb.Fatalf("peertest: %v", err)
	}
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() && fi.Size() > 0 {
		return bin
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		tb.Fatalf("peertest: creating the peer's build cache: %v", err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(bin), "build-")
	if err != nil {
		tb.Fatalf("peertest: %v", err)
	}
	defer os.RemoveAll(tmp)
	goBin, err := goCommand()
	if err != nil {
		tb.Fatalf("peertest: building the peer needs the go command: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, "install", pkg+"@"+version)
	cmd.Dir = tmp // outside any module: `go install pkg@version` builds the peer's own module
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "GOWORK=off", "GOFLAGS=-buildvcs=false")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		proxy, _ := exec.Command(goBin, "env", "GOPROXY").Output()
		tb.Fatalf("peertest: building the peer (%s install %s@%s) failed after %v: %v\n%s\n"+
			"It needs the Go module proxy (GOPROXY=%s) or a module cache holding the peer's modules.",
			goBin, pkg, version, time.Since(start).Round(time.Second), err, out, strings.TrimSpace(string(proxy)))
	}
	if err := os.Rename(filepath.Join(tmp, name), bin); err != nil {
		tb.Fatalf("peertest: installing the peer's binary: %v", err)
	}
	tb.Logf("peertest: built %s@%s in %v", pkg, version, time.Since(start).Round(time.Second))
	return bin
}

// binaryPath is where install keeps a peer's binary: os.UserCacheDir()/sluice-peertest/dir/name
// (for envoyproxy/ratelimit, dir is its Version and name service_cmd: scripts/bench-rls.sh
// computes the same path).
func binaryPath(dir, name string) (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no user cache directory for the peer's binary: %w", err)
	}
	return filepath.Join(cache, "sluice-peertest", dir, name), nil
}

func goCommand() (string, error) {
	if p, err := exec.LookPath("go"); err == nil {
		return p, nil
	}
	p := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(p); err != nil {
		return "", errors.New("go is not on PATH nor in GOROOT/bin")
	}
	return p, nil
}

// Start starts the peer on redisAddr (a redis-server's host:port, e.g. a redistest.Server's Addr)
// with configFiles (the peer's YAML rate limit configurations, e.g. from ConfigFiles), and
// returns its gRPC address. See StartWith.
func Start(tb testing.TB, redisAddr string, configFiles ...string) string {
	tb.Helper()
	return StartWith(tb, Options{}, redisAddr, configFiles...)
}

// Options are the peer's settings beyond Start's defaults.
type Options struct {
	// Env holds extra KEY=VALUE settings (the peer is configured by its environment, see its
	// src/settings/settings.go), applied after the defaults, so that they can override them.
	Env []string
}

// Env is the peer's environment that StartWith starts it with, before Options.Env: Redis over
// TCP, its files read from runtimeRoot/ratelimit/config/*.yaml, its three listeners on the given
// loopback ports, statsd off and its stats discarded, its local cache of over-limit keys off (it
// would answer OVER_LIMIT from memory after a FLUSHALL), and healthy only once a configuration
// with at least one domain has loaded, so that a health check passing means the files loaded.
func Env(redisAddr, runtimeRoot string, grpcPort, httpPort, debugPort int) []string {
	return []string{
		"REDIS_SOCKET_TYPE=tcp",
		"REDIS_TYPE=SINGLE",
		"REDIS_URL=" + redisAddr,
		"BACKEND_TYPE=redis",
		"LOCAL_CACHE_SIZE_IN_BYTES=0",
		"RUNTIME_ROOT=" + runtimeRoot,
		"RUNTIME_SUBDIRECTORY=ratelimit",
		"RUNTIME_APPDIRECTORY=config",
		"RUNTIME_WATCH_ROOT=false",
		"RUNTIME_IGNOREDOTFILES=true",
		"USE_STATSD=false",
		"DISABLE_STATS=true",
		"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true",
		"GRPC_HOST=127.0.0.1",
		"GRPC_PORT=" + strconv.Itoa(grpcPort),
		"HOST=127.0.0.1",
		"PORT=" + strconv.Itoa(httpPort),
		"DEBUG_HOST=127.0.0.1",
		"DEBUG_PORT=" + strconv.Itoa(debugPort),
		"LOG_LEVEL=info",
	}
}

// configLoadError is what the peer logs when its files do not load.
const configLoadError = "Error loading new configuration"

// StartWith starts the peer: it copies configFiles into a fresh runtime directory laid out as the
// peer reads it (RUNTIME_ROOT/ratelimit/config/<name>.yaml), starts the binary on free loopback
// ports with Env and opts.Env, and waits, polling with a deadline, until its gRPC health service
// answers SERVING for "ratelimit" (which, with HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED, means
// its files loaded). It fails the test at once if the peer exits or logs that its files did not
// load. The peer is stopped (SIGTERM, then SIGKILL) when the test ends, and its log goes into the
// test's output if the test failed.
func StartWith(tb testing.TB, opts Options, redisAddr string, configFiles ...string) string {
	tb.Helper()
	bin := Binary(tb)
	dir := tb.TempDir()
	confDir := filepath.Join(dir, "runtime", "ratelimit", "config")
	if err := os.MkdirAll(confDir, 0o755); err != nil {
		tb.Fatal(err)
	}
	seen := map[string]string{}
	for _, f := range configFiles {
		name := filepath.Base(f)
		if other, dup := seen[name]; dup {
			tb.Fatalf("peertest: %s and %s have the same name; the peer's config directory holds one file of a name", other, f)
		}
		seen[name] = f
		data, err := os.ReadFile(f)
		if err != nil {
			tb.Fatalf("peertest: reading the peer's configuration: %v", err)
		}
		if !strings.HasSuffix(name, ".yaml") {
			name += ".yaml"
		}
		if err := os.WriteFile(filepath.Join(confDir, name), data, 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	ports := FreePorts(tb, 3)
	grpcAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
	cmd := exec.Command(bin)
	cmd.Dir = dir
	// A clean environment: the peer reads dozens of variables (PORT, LOG_LEVEL, REDIS_*), and the
	// test's own must not leak into it.
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir},
		Env(redisAddr, filepath.Join(dir, "runtime"), ports[0], ports[1], ports[2])...)
	cmd.Env = append(cmd.Env, opts.Env...)
	p := startProcess(tb, cmd, filepath.Join(dir, "peer.log"), grpcAddr)
	if err := waitHealthy(grpcAddr, p.logPath, p.exited, 30*time.Second); err != nil {
		p.fatal(tb, fmt.Sprintf("the peer on %s did not become healthy", grpcAddr), err)
	}
	return grpcAddr
}

// process is a peer's process, started by startProcess.
type process struct {
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{} // closed once it has exited
	err     error         // Wait's answer, set before exited is closed
}

// startProcess starts cmd with its output going to logPath; the process is stopped (see stop)
// when tb ends, and its log goes into tb's output if tb failed (named by what).
func startProcess(tb testing.TB, cmd *exec.Cmd, logPath, what string) *process {
	tb.Helper()
	logf, err := os.Create(logPath)
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		tb.Fatalf("peertest: starting %s: %v", cmd.Path, err)
	}
	p := &process{cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	go func() { p.err = cmd.Wait(); logf.Close(); close(p.exited) }()
	// Cleanups run last-registered first: stop the peer, then show its complete log.
	tb.Cleanup(func() {
		if tb.Failed() {
			log, _ := os.ReadFile(logPath)
			tb.Logf("peertest: the peer's log (%s):\n%s", what, log)
		}
	})
	tb.Cleanup(func() { stop(cmd, p.exited) })
	return p
}

// fatal fails tb with msg and err, saying whether the process exited, and with its log.
func (p *process) fatal(tb testing.TB, msg string, err error) {
	tb.Helper()
	select {
	case <-p.exited:
		err = fmt.Errorf("%v (it exited: %v)", err, p.err)
	default:
	}
	log, _ := os.ReadFile(p.logPath)
	tb.Fatalf("peertest: %s: %v\n%s", msg, err, log)
}

// stop ends the peer: SIGTERM (it drains and exits), and SIGKILL if it has not within 5 s.
func stop(cmd *exec.Cmd, exited <-chan struct{}) { stopWithin(cmd, exited, 5*time.Second) }

// stopWithin is stop with a grace period of its own.
func stopWithin(cmd *exec.Cmd, exited <-chan struct{}, grace time.Duration) {
	select {
	case <-exited:
		return
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// waitHealthy polls the gRPC health service at addr until the peer's "ratelimit" service is
// SERVING, the process exits, its log shows its files did not load, or timeout passes.
func waitHealthy(addr, logPath string, exited <-chan struct{}, timeout time.Duration) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	deadline := time.Now().Add(timeout)
	last := errors.New("no answer yet")
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return errors.New("the peer exited")
		default:
		}
		if line := findLine(logPath, configLoadError); line != "" {
			return fmt.Errorf("its configuration did not load: %s", line)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: "ratelimit"})
		cancel()
		switch {
		case err != nil:
			last = err
		case resp.GetStatus() == healthpb.HealthCheckResponse_SERVING:
			return nil
		default:
			last = fmt.Errorf("health: %v", resp.GetStatus())
		}
		select {
		case <-exited:
		case <-time.After(20 * time.Millisecond):
		}
	}
	return fmt.Errorf("not healthy within %v: %v", timeout, last)
}

// findLine returns the first line of the file at path that contains s, or "".
func findLine(path, s string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, 1<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if bytes.Contains(sc.Bytes(), []byte(s)) {
			return sc.Text()
		}
	}
	return ""
}

// FreePorts returns n distinct free ports on 127.0.0.1 (held open together while chosen, so
// that they differ; another process may still take one before it is used, as with any such helper).
func FreePorts(tb testing.TB, n int) []int {
	tb.Helper()
	return freePortsOn(tb, "127.0.0.1", n)
}

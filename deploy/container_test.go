package deploy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/internal/redistest"
)

// The image's own configuration (deploy/container/sluice.yaml) is valid, and is what its
// comments and the README say: no proxy, the admin listener on every interface, memory store.
func TestContainerDefaultConfig(t *testing.T) {
	cfg, err := config.Load(filepath.Join("container", "sluice.yaml"))
	if err != nil {
		t.Fatalf("the image's default configuration: %v", err)
	}
	if cfg.Listen != "" || cfg.AdminListen != "0.0.0.0:9090" || cfg.Store.Type != "memory" {
		t.Fatalf("the image's default configuration: listen %q, admin_listen %q, store %q; want \"\", 0.0.0.0:9090, memory",
			cfg.Listen, cfg.AdminListen, cfg.Store.Type)
	}
}

// The image, built by scripts/build-image.sh and run by podman for real: a configuration
// mounted at /etc/sluice, the Redis store on a real redis-server, an upstream on the host. It
// proxies, refuses with 429 and Retry-After, counts in /metrics, runs as 65532 (not root) with
// a read-only root file system, has the time zone database, and stops cleanly at SIGTERM. The
// image's default configuration starts too.
func TestContainerServesThroughRedis(t *testing.T) {
	pm := containerPodman(t)
	containerServesThroughRedis(t, pm, pm.build(t))
}

// containerServesThroughRedis is TestContainerServesThroughRedis's checks of the image (an ID
// or a name in pm's storage): the image built here, and a release's (TestReleaseSnapshot).
func containerServesThroughRedis(t *testing.T, pm *containerEngine, image string) {
	rds := redistest.Start(t)
	var forwarded atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		forwarded.Add(1)
		fmt.Fprintf(w, "upstream saw %s %s", r.Method, r.URL.Path)
	}))
	t.Cleanup(upstream.Close)

	// --network host: the container shares the host's loopback, so it reaches Redis and the
	// upstream on 127.0.0.1, and the test reaches it on the free ports below.
	proxyPort, adminPort := containerFreePort(t), containerFreePort(t)
	dir := t.TempDir()
	// The container's user (65532) must be able to read the mounted directory and file.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf(`listen: 127.0.0.1:%d
admin_listen: 127.0.0.1:%d
upstream: %s
store: {type: redis, addrs: [%s]}
policies:
  # A token bucket of 3 that refills one every 20 s: the 4th request of the test is refused
  # whenever it runs (a window could reset between two requests).
  - {name: anonymous, algorithm: token-bucket, limit: 3, period: 1m}
default_policy: anonymous
`, proxyPort, adminPort, upstream.URL, rds.Addr)
	if err := os.WriteFile(filepath.Join(dir, "sluice.yaml"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}

	name := pm.start(t, "--read-only", "--volume", dir+":/etc/sluice:ro", "--env", "TZ=Asia/Kolkata", image)

	admin := fmt.Sprintf("http://127.0.0.1:%d", adminPort)
	proxy := fmt.Sprintf("http://127.0.0.1:%d", proxyPort)
	containerWaitReady(t, pm, name, admin+"/readyz")

	for i := 1; i <= 3; i++ {
		code, h, body := containerGet(t, proxy+"/hello")
		if code != http.StatusOK || body != "upstream saw GET /hello" {
			t.Fatalf("request %d: %d %q, want 200 from the upstream", i, code, body)
		}
		want := fmt.Sprintf(`"anonymous";r=%d;`, 3-i)
		if got := h.Get("RateLimit"); !strings.HasPrefix(got, want) {
			t.Fatalf("request %d: RateLimit %q, want it to start %s", i, got, want)
		}
		if got := h.Get("RateLimit-Policy"); !strings.HasPrefix(got, `"anonymous";q=3;w=60`) {
			t.Fatalf("request %d: RateLimit-Policy %q, want \"anonymous\";q=3;w=60", i, got)
		}
	}
	code, h, _ := containerGet(t, proxy+"/hello")
	if code != http.StatusTooManyRequests || h.Get("Retry-After") == "" {
		t.Fatalf("request 4: %d, Retry-After %q; want 429 with a Retry-After", code, h.Get("Retry-After"))
	}
	if n := forwarded.Load(); n != 3 {
		t.Fatalf("the upstream saw %d requests, want 3 (the refused one is not forwarded)", n)
	}
	// The decisions were the Redis store's: its counter is in the redis-server.
	if keys, err := rds.Do("KEYS", "rate-limit:*"); err != nil || !strings.Contains(keys, "anonymous") {
		t.Fatalf("redis-server holds %q (%v), want the anonymous policy's key", keys, err)
	}

	_, _, metrics := containerGet(t, admin+"/metrics")
	for _, want := range []string{
		`sluice_decisions_total{client="anonymous",policy="anonymous",result="allowed"} 3`,
		`sluice_decisions_total{client="anonymous",policy="anonymous",result="refused"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Fatalf("/metrics has no line %s", want)
		}
	}

	// Not root: the process's real, effective, saved and file-system user and group are 65532.
	pid := strings.TrimSpace(pm.run(t, "inspect", "--format", "{{.State.Pid}}", name))
	status, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		t.Fatalf("the container's process %s: %v", pid, err)
	}
	for _, field := range []string{"Uid:", "Gid:"} {
		line := containerLine(string(status), field)
		if got := strings.Fields(line); len(got) != 5 || got[1] != "65532" || got[2] != "65532" || got[3] != "65532" || got[4] != "65532" {
			t.Fatalf("the container's process: %q, want 65532 four times", line)
		}
	}
	if top := pm.run(t, "top", name, "user", "args"); !strings.Contains(top, "sluice") || !strings.Contains(top, "/sluice serve --config /etc/sluice/sluice.yaml") {
		t.Fatalf("podman top:\n%s\nwant the user sluice running /sluice serve --config /etc/sluice/sluice.yaml", top)
	}

	// The time zone database is in the binary (the image has no /usr/share/zoneinfo): TZ
	// applies, so the log's times are India's, +05:30 all year.
	if logs, _ := pm.output("logs", name); !strings.Contains(logs, "+05:30 level=INFO") {
		t.Fatalf("the log's times are not in TZ=Asia/Kolkata (+05:30):\n%s", logs)
	}

	// SIGTERM (podman stop) shuts down cleanly, exit code 0: nothing is in flight to drain.
	pm.run(t, "stop", "--time", "20", name)
	if code := strings.TrimSpace(pm.run(t, "inspect", "--format", "{{.State.ExitCode}}", name)); code != "0" {
		t.Fatalf("after podman stop the container exited with %s, want 0", code)
	}

	t.Run("default config", func(t *testing.T) {
		// No network at all (its admin port, 9090, would be the host's with --network host):
		// the image's own configuration starts and serves, as a user's would.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		name := containerName(t)
		cmd := pm.command(ctx, "run", "--rm", "--name", name, "--network", "none", "--read-only", image)
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() {
			_, _ = pm.output("rm", "--force", "--time", "0", name)
			_ = cmd.Wait()
		}()
		var seen []string
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			seen = append(seen, sc.Text())
			if strings.Contains(sc.Text(), `msg="sluice serving, with no proxy listener`) {
				return
			}
		}
		t.Fatalf("the image's default configuration did not start:\n%s", strings.Join(seen, "\n"))
	})
}

// containerEngine runs podman with a storage and configuration of the test's own, in a
// temporary directory: nothing is read from or left in the machine's podman state.
type containerEngine struct {
	env []string
}

// containerPodman finds podman and runc, and writes the configuration they need here: runc
// (crun fails on these machines' cgroups and rlimits), cgroupfs, no default ulimits, the vfs
// storage driver (it works everywhere, overlay does not), events to a file, its state and
// network configuration all under a temporary directory.
func containerPodman(t *testing.T) *containerEngine {
	t.Helper()
	for _, bin := range []string{"podman", "runc"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s is not installed: the container tests need podman and runc (Debian: apt-get install podman runc; scripts/test.sh installs them)", bin)
		}
	}
	runc, _ := exec.LookPath("runc")
	dir := t.TempDir()
	containers := fmt.Sprintf(`[containers]
default_ulimits = []

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = %q
tmp_dir = %q
[engine.runtimes]
runc = [%q]

[network]
network_config_dir = %q
`, filepath.Join(dir, "events.log"), filepath.Join(dir, "tmp"), runc, filepath.Join(dir, "networks"))
	storage := fmt.Sprintf(`[storage]
driver = "vfs"
graphroot = %q
runroot = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "run"))
	for name, text := range map[string]string{"containers.conf": containers, "storage.conf": storage} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pm := &containerEngine{env: append(os.Environ(),
		"CONTAINERS_CONF="+filepath.Join(dir, "containers.conf"),
		"CONTAINERS_STORAGE_CONF="+filepath.Join(dir, "storage.conf"),
		"TMPDIR="+dir)}
	// Before the directory goes: any container left running in it. Its end is not the end of
	// the writing: conmon and the `podman container cleanup` it starts write their last files
	// into the directory a moment after rm returns (later still on a loaded machine), which made
	// the test's own removal fail now and then ("directory not empty"). So the directory is
	// removed here, again until the writers are done.
	t.Cleanup(func() {
		_, _ = pm.output("rm", "--all", "--force", "--time", "0")
		deadline := time.Now().Add(60 * time.Second)
		for {
			err := os.RemoveAll(dir)
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("podman's directory could not be removed in a minute: %v", err)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	return pm
}

func (pm *containerEngine) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "podman", args...)
	cmd.Env = pm.env
	return cmd
}

// output runs podman and returns its standard output and error together.
func (pm *containerEngine) output(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := pm.command(ctx, args...).CombinedOutput()
	return string(out), err
}

// run runs podman and returns its standard output; a failure fails the test.
func (pm *containerEngine) run(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := pm.command(ctx, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("podman %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out)
}

// build builds the image with scripts/build-image.sh, as a user would, and returns its ID.
func (pm *containerEngine) build(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute) // a cold Go build cache
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join("..", "scripts", "build-image.sh"))
	cmd.Env = append(pm.env, "IMAGE=localhost/sluice-test")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("scripts/build-image.sh: %v\n%s%s", err, out, stderr.String())
	}
	lines := strings.Fields(string(out))
	if len(lines) == 0 {
		t.Fatalf("scripts/build-image.sh printed no image ID\n%s", stderr.String())
	}
	id := lines[len(lines)-1]
	pm.checkImage(t, id)
	return id
}

// checkImage checks that the image is what the Containerfile says: its user, entrypoint and
// ports.
func (pm *containerEngine) checkImage(t *testing.T, image string) {
	t.Helper()
	got := pm.run(t, "image", "inspect", "--format", "{{.Config.User}} {{.Config.Entrypoint}} {{.Config.ExposedPorts}}", image)
	for _, want := range []string{"65532:65532", "[/sluice serve --config /etc/sluice/sluice.yaml]", "8080/tcp", "9090/tcp", "8081/tcp"} {
		if !strings.Contains(got, want) {
			t.Fatalf("the image's user, entrypoint and ports: %s; want %s in it", strings.TrimSpace(got), want)
		}
	}
}

// containerWaitReady waits for the admin listener's /readyz to answer 200 (sluice in the
// container is another process: there is nothing to wait on but its answer), failing at once
// if the container stops.
func containerWaitReady(t *testing.T, pm *containerEngine, name, url string) {
	t.Helper()
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if state := strings.TrimSpace(pm.run(t, "inspect", "--format", "{{.State.Status}}", name)); state != "running" {
			t.Fatalf("the container is %s, not running", state)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not ready after 30 s (last: %v)", url, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func containerGet(t *testing.T, url string) (int, http.Header, string) {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, resp.Header, string(body)
}

func containerFreePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// start runs a container of args (podman run's options, the image and its arguments) in the
// background, on the host's network, under a name no other test's has, which it returns. The
// container is removed when the test ends, its log shown if the test failed.
func (pm *containerEngine) start(t *testing.T, args ...string) string {
	t.Helper()
	name := containerName(t)
	pm.run(t, append([]string{"run", "--detach", "--name", name, "--network", "host"}, args...)...)
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := pm.output("logs", name)
			t.Logf("podman logs %s:\n%s", name, out)
		}
		_, _ = pm.output("rm", "--force", "--time", "0", name)
	})
	return name
}

// containerName is a name no other test's container has.
func containerName(t *testing.T) string {
	return fmt.Sprintf("sluice-test-%d-%d", os.Getpid(), time.Now().UnixNano())
}

func containerLine(text, prefix string) string {
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, prefix) {
			return line
		}
	}
	return ""
}

package main

// Tests of operating the CLI: sluice check, the version and its build info, the listen addresses
// of the command line and the environment over the file's, and the shells' completion scripts.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/config"
)

// --- version ----------------------------------------------------------------------------------

func TestVersionFromBuildInfo(t *testing.T) {
	defer func(v, c, d string) { version, commit, date = v, c, d }(version, commit, date)
	stamped := &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
		{Key: "vcs", Value: "git"},
		{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
		{Key: "vcs.time", Value: "2026-12-01T12:21:00Z"},
		{Key: "vcs.modified", Value: "true"},
	}}
	for _, tc := range []struct {
		name                  string
		version, commit, date string
		bi                    *debug.BuildInfo
		ok                    bool
		want                  string
	}{
		{"stamped by go build", "", "", "", stamped, true, "devel (commit 0123456789abcdef0123456789abcdef01234567+modified, 2026-12-01T12:21:00Z)"},
		{"go install @version", "", "", "", &debug.BuildInfo{Main: debug.Module{Version: "v1.4.0"}}, true, "v1.4.0"},
		{"no build info", "", "", "", nil, false, "devel"},
		{"-X wins", "v1.2.3", "abc", "2020-01-02T03:04:05Z", stamped, true, "v1.2.3 (commit abc, 2020-01-02T03:04:05Z)"},
		{"-X version only", "v1.2.3", "", "", stamped, true, "v1.2.3 (commit 0123456789abcdef0123456789abcdef01234567+modified, 2026-12-01T12:21:00Z)"},
		{"-X commit only: not the stamped time", "", "abc", "", stamped, true, "devel (commit abc)"},
	} {
		version, commit, date = tc.version, tc.commit, tc.date
		if got := fromBuildInfo(tc.bi, tc.ok).String(); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestVersionFlag(t *testing.T) {
	if a, b := ok(t, "", "version"), ok(t, "", "--version"); a != b || !strings.HasPrefix(a, "sluice ") {
		t.Errorf("sluice version printed %q, sluice --version %q; want the same line", a, b)
	}
}

// buildSluice builds the sluice binary with the given go build flags.
func buildSluice(t *testing.T, flags ...string) string {
	t.Helper()
	bin, err := goBuild(t.TempDir(), flags...)
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

func output(t *testing.T, bin string, args ...string) string {
	t.Helper()
	out, err := exec.Command(bin, args...).Output()
	if err != nil {
		t.Fatalf("sluice %q: %v", args, err)
	}
	return string(out)
}

// TestBinaryVersion: the commit go build stamps (from a git checkout) and the values of a
// release build's -ldflags -X.
func TestBinaryVersion(t *testing.T) {
	t.Parallel()
	// -buildvcs=auto, go build's default, said on the command line over a GOFLAGS that turns
	// it off.
	bin := buildSluice(t, "-buildvcs=auto")
	got := output(t, bin, "version")
	if flag := output(t, bin, "--version"); flag != got {
		t.Errorf("--version printed %q, version %q", flag, got)
	}
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	top, err2 := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	inCheckout := false
	if err == nil && err2 == nil {
		// Go stamps a checkout whose .git is a directory (a clone), not a `git worktree` one.
		fi, err := os.Stat(filepath.Join(strings.TrimSpace(string(top)), ".git"))
		inCheckout = err == nil && fi.IsDir()
	}
	if inCheckout {
		if want := "commit " + strings.TrimSpace(string(head)); !strings.Contains(got, want) {
			t.Errorf("sluice version built in a git checkout printed %q; want %q in it", got, want)
		}
		ct, err := exec.Command("git", "show", "-s", "--format=%ct", "HEAD").Output()
		if err != nil {
			t.Fatal(err)
		}
		sec, err := strconv.ParseInt(strings.TrimSpace(string(ct)), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if want := time.Unix(sec, 0).UTC().Format(time.RFC3339); !strings.Contains(got, want) {
			t.Errorf("sluice version printed %q; want the commit's date %s in it", got, want)
		}
	} else if got != "sluice devel\n" {
		t.Errorf("sluice version built outside a git clone printed %q, want %q", got, "sluice devel\n")
	}

	bin = buildSluice(t, "-ldflags", "-X main.version=v1.2.3 -X main.commit=0a1b2c3d -X main.date=2026-01-02T03:04:05Z")
	const want = "sluice v1.2.3 (commit 0a1b2c3d, 2026-01-02T03:04:05Z)\n"
	for _, args := range [][]string{{"version"}, {"--version"}} {
		if got := output(t, bin, args...); got != want {
			t.Errorf("sluice %q of a -ldflags -X build printed %q, want %q", args, got, want)
		}
	}
}

// --- completion -------------------------------------------------------------------------------

func TestCompletion(t *testing.T) {
	for _, shell := range []string{"bash", "zsh", "fish"} {
		out := ok(t, "", "completion", shell)
		if len(out) < 100 || !strings.Contains(out, "sluice") {
			t.Errorf("sluice completion %s printed %d bytes, want a script for sluice:\n%s", shell, len(out), out)
		}
		if shell == "bash" {
			cmd := exec.Command("bash", "-n")
			cmd.Stdin = strings.NewReader(out)
			if msg, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("bash -n rejects the bash completion script: %v\n%s", err, msg)
			}
		}
	}
	code, _, stderr := runCLI(t, "", "completion", "tcsh")
	if code != 2 || !strings.HasPrefix(stderr, "sluice: ") {
		t.Errorf("sluice completion tcsh: exit code %d, stderr %q; want 2 and an error", code, stderr)
	}
}

// --- check ------------------------------------------------------------------------------------

const checkHead = "listen: 127.0.0.1:18080\nadmin_listen: 127.0.0.1:19090\nupstream: http://127.0.0.1:9\n" // lines 1-3

func TestCheck(t *testing.T) {
	for _, v := range []string{envConfig, envListen, envAdminListen, "SLUICE_TEST_UNSET_SECRET"} {
		t.Setenv(v, "")
	}
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	writeFile(t, good, checkHead+"policies:\n  - {name: std, algorithm: fixed-window, limit: 5, period: 1m}\ndefault_policy: std\n")
	envoy := filepath.Join(dir, "envoy.yaml")
	writeFile(t, envoy, "domain: api\ndescriptors:\n  - key: path\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")
	badEnvoy := filepath.Join(dir, "bad-envoy.yaml")
	writeFile(t, badEnvoy, "domain: api\ndescriptors:\n  - key: path\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n")

	out := ok(t, "", "check", "--config", good)
	if !strings.HasPrefix(out, good+": ok\n") || !strings.Contains(out, "listen 127.0.0.1:18080") || strings.Count(out, "\n") != 3 ||
		!strings.Contains(out, "\nclients: 0 in the file; a client the clients API also names runs as the API's") {
		t.Errorf("check of a good file printed %q; want %q, a summary line and which clients win", out, good+": ok")
	}
	withRLS := filepath.Join(dir, "rls.yaml")
	writeFile(t, withRLS, checkHead+"rls:\n  listen: 127.0.0.1:18081\n  envoy_config: ["+envoy+"]\n")
	if out := ok(t, "", "check", "--config", withRLS); !strings.Contains(out, "rls 127.0.0.1:18081") {
		t.Errorf("check of a file with rls printed %q", out)
	}

	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"a wrong type", checkHead + "policies:\n  - {name: std, algorithm: fixed-window, limit: abc, period: 1m}\n",
			[]string{":5:", `limit "abc" must be an integer`}},
		{"an unknown field", checkHead + "store:\n  type: memory\n  tpye: redis\n", []string{":6:", `unknown field "tpye"`}},
		{"a bad Envoy file", checkHead + "rls:\n  envoy_config: [" + badEnvoy + "]\n", []string{badEnvoy + ":4:", "fortnight"}},
		{"a missing Envoy file", checkHead + "rls:\n  envoy_config: [" + filepath.Join(dir, "nope.yaml") + "]\n", []string{"nope.yaml", "no such file"}},
		{"an HS256 jwt with its secret unset", checkHead + "identity:\n  - jwt:\n      algorithms: [HS256]\n      secret_env: SLUICE_TEST_UNSET_SECRET\n",
			[]string{":7:", "SLUICE_TEST_UNSET_SECRET"}},
		{"a missing certificate", checkHead + "tls:\n  cert_file: " + filepath.Join(dir, "no.crt") + "\n  key_file: " + filepath.Join(dir, "no.key") + "\n",
			[]string{"tls:", "no.crt"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".yaml")
			writeFile(t, path, tc.yaml)
			code, stdout, stderr := runCLI(t, "", "check", "--config", path)
			if code != 2 || stdout != "" || !strings.HasPrefix(stderr, "sluice: the configuration has errors:\n") {
				t.Errorf("exit code %d, stdout %q, stderr %q; want 2, nothing, the errors", code, stdout, stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr does not say %q:\n%s", w, stderr)
				}
			}
		})
	}

	// The file SLUICE_CONFIG names, when --config is not given; --config beats it.
	t.Setenv(envConfig, good)
	if out := ok(t, "", "check"); !strings.HasPrefix(out, good+": ok\n") {
		t.Errorf("check with %s=%s printed %q", envConfig, good, out)
	}
	t.Setenv(envConfig, filepath.Join(dir, "nope.yaml"))
	if out := ok(t, "", "check", "--config", good); !strings.HasPrefix(out, good+": ok\n") {
		t.Errorf("check --config over %s printed %q", envConfig, out)
	}
	code, _, stderr := runCLI(t, "", "check")
	if code != 2 || !strings.Contains(stderr, "nope.yaml") {
		t.Errorf("check of a missing SLUICE_CONFIG file: exit code %d, stderr %q", code, stderr)
	}
	// As serve runs it: the addresses of the environment over the file's.
	t.Setenv(envConfig, good)
	t.Setenv(envAdminListen, "127.0.0.1:18080")
	code, _, stderr = runCLI(t, "", "check")
	if code != 2 || !strings.Contains(stderr, `SLUICE_ADMIN_LISTEN "127.0.0.1:18080" is also listen`) {
		t.Errorf("check with SLUICE_ADMIN_LISTEN on listen's port: exit code %d, stderr %q", code, stderr)
	}
	t.Setenv(envAdminListen, "nohost")
	code, _, stderr = runCLI(t, "", "check")
	if code != 2 || stderr != "sluice: SLUICE_ADMIN_LISTEN \"nohost\" is not host:port (e.g. 127.0.0.1:8080, :8080)\n" {
		t.Errorf("check with a bad SLUICE_ADMIN_LISTEN: exit code %d, stderr %q", code, stderr)
	}

	t.Setenv(envConfig, "")
	t.Setenv(envAdminListen, "")
	code, stdout, stderr := runCLI(t, "", "check")
	if code != 2 || stdout != "" || !strings.Contains(stderr, "--config FILE or SLUICE_CONFIG") {
		t.Errorf("check with no configuration: exit code %d, stdout %q, stderr %q; want 2 and a usage error", code, stdout, stderr)
	}
}

// --- listen addresses over the file's ------------------------------------------------------

// startServe starts the sluice binary with args and extra environment variables, and waits
// until ready (a URL) answers 200. The process is stopped (SIGTERM) when the test ends.
func startServe(t *testing.T, ready string, env []string, args ...string) *sluiceProc {
	t.Helper()
	p := &sluiceProc{t: t, stderr: &syncBuffer{}, stdout: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(sluiceBinary(t), args...)
	p.cmd.Env = append(sluiceEnv(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			if code := p.stop(); code != 0 {
				t.Errorf("sluice exited with code %d after SIGTERM; want 0\nstderr:\n%s", code, p.stderr.String())
			}
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case <-p.done:
			t.Fatalf("sluice %q exited (%v)\nstderr:\n%s", args, p.cmd.ProcessState, p.stderr.String())
		default:
		}
		if r, err := tryGet(ready, ""); err == nil && r.status == 200 {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("no 200 from %s within 20s\nstderr:\n%s", ready, p.stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	var addrs []string
	for len(addrs) < n {
		a, err := freeAddr()
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(strings.Join(addrs, " "), a) {
			addrs = append(addrs, a)
		}
	}
	return addrs
}

func TestServeE2EListenOverrides(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	a := freeAddrs(t, 6)
	fileListen, fileAdmin := a[0], a[1]
	file := func(listen, admin string) string {
		return fmt.Sprintf("listen: %s\nadmin_listen: %s\nupstream: %s\n", listen, admin, up.URL)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "sluice.yaml")
	writeFile(t, path, file(fileListen, fileAdmin))
	clear := []string{envListen + "=", envAdminListen + "=", envConfig + "="}

	t.Run("flags over the file, kept at a reload", func(t *testing.T) {
		p := startServe(t, "http://"+a[3]+"/readyz", clear, "serve", "--config", path, "--watch", "0", "--listen", a[2], "--admin-listen", a[3])
		if r := get(t, "http://"+a[2], "/flags"); r.status != 200 || up.count("/flags") != 1 {
			t.Fatalf("the proxy on --listen %s: %d", a[2], r.status)
		}
		if _, err := tryGet("http://"+fileAdmin, "/readyz"); err == nil {
			t.Errorf("the file's admin_listen %s answers; want only --admin-listen's", fileAdmin)
		}
		// A reload of a file with other addresses keeps the flags' and says nothing of a
		// change of listeners: there is none.
		writeFile(t, path, file(a[4], a[5])+"policies:\n  - {name: anon, algorithm: fixed-window, limit: 7, period: 1m}\ndefault_policy: anon\n")
		p.signal(syscall.SIGHUP)
		waitMetricAt(t, p, "http://"+a[3], "sluice_config_reloads_total", "ok")
		if r := get(t, "http://"+a[2], "/after"); !strings.Contains(r.header.Get("RateLimit-Policy"), "q=7") {
			t.Errorf("after the reload: RateLimit-Policy %q, want q=7", r.header.Get("RateLimit-Policy"))
		}
		if log := p.stderr.String(); strings.Contains(log, "next restart") {
			t.Errorf("the reload warned of a change of listeners with the flags' in force:\n%s", log)
		}
		stats := get(t, "http://"+a[3], "/v1/stats")
		if !strings.Contains(string(stats.body), a[2]) || !strings.Contains(string(stats.body), a[3]) {
			t.Errorf("/v1/stats does not show the flags' addresses %s, %s: %s", a[2], a[3], stats.body)
		}
		writeFile(t, path, file(fileListen, fileAdmin))
	})

	t.Run("environment, the flag beats it", func(t *testing.T) {
		env := []string{envConfig + "=" + path, envListen + "=" + a[4], envAdminListen + "=" + a[5]}
		// --admin-listen "" turns the admin listener off, over SLUICE_ADMIN_LISTEN.
		p := startServe(t, "http://"+a[4]+"/readyz", env, "serve", "--watch", "0", "--admin-listen", "")
		if r := get(t, "http://"+a[4], "/env"); r.status != 200 || up.count("/env") != 1 {
			t.Fatalf("the proxy on SLUICE_LISTEN %s: %d", a[4], r.status)
		}
		for _, addr := range []string{a[5], fileAdmin} {
			if _, err := tryGet("http://"+addr, "/readyz"); err == nil {
				t.Errorf("an admin listener answers on %s; want none (--admin-listen \"\")", addr)
			}
		}
		p.stop()
		p = startServe(t, "http://"+a[5]+"/readyz", env, "serve", "--watch", "0", "--listen", a[2])
		if r := get(t, "http://"+a[2], "/flag"); r.status != 200 {
			t.Errorf("the proxy on --listen %s over SLUICE_LISTEN: %d", a[2], r.status)
		}
		if _, err := tryGet("http://"+a[4], "/"); err == nil {
			t.Errorf("SLUICE_LISTEN's %s answers with --listen given", a[4])
		}
	})

	t.Run("bad values", func(t *testing.T) {
		for _, tc := range []struct {
			env  []string
			args []string
			want string
		}{
			{nil, []string{"--listen", "8080"}, `--listen "8080" is not host:port`},
			{nil, []string{"--admin-listen", "127.0.0.1:99999"}, `--admin-listen "127.0.0.1:99999": port "99999" must be a number from 0 to 65535`},
			{[]string{envListen + "=localhost"}, nil, `SLUICE_LISTEN "localhost" is not host:port`},
			{[]string{envAdminListen + "=" + fileListen}, nil, fmt.Sprintf(`SLUICE_ADMIN_LISTEN %q is also listen`, fileListen)},
			{nil, []string{"--listen", a[2], "--admin-listen", a[2]}, "is also --listen"},
		} {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			cmd := exec.CommandContext(ctx, sluiceBinary(t), append([]string{"serve", "--config", path}, tc.args...)...)
			cmd.Env = append(append(sluiceEnv(), clear...), tc.env...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			cancel()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("env %q, flags %q: %v; want exit code 2 and %q\nstderr:\n%s", tc.env, tc.args, err, tc.want, stderr.String())
			}
		}
	})
}

// waitMetricAt waits until the admin listener at admin counts a reload with result.
func waitMetricAt(t *testing.T, p *sluiceProc, admin, name, result string) {
	t.Helper()
	p.admin = admin
	p.waitMetric(t, name, map[string]string{"result": result}, 1, 10*time.Second)
}

// TestCheckRegistry: sluice check --registry reads the clients API's records (here the memory
// store's journal, admin.clients_file) and says what would run of them with the file: the file's
// client the API's replaces, the API's client that cannot run and why. It never writes the journal.
// TestCheckSchema: check --schema prints the configuration's JSON Schema, alone.
func TestCheckSchema(t *testing.T) {
	out := ok(t, "", "check", "--schema")
	if out != string(config.JSONSchema()) {
		t.Errorf("check --schema printed %.200q..., want config.JSONSchema", out)
	}
	var s map[string]any
	if err := json.Unmarshal([]byte(out), &s); err != nil || s["$schema"] != "http://json-schema.org/draft-07/schema#" {
		t.Errorf("check --schema: not a draft-07 JSON Schema (%v)", err)
	}
	if code, _, stderr := runCLI(t, "", "check", "--schema", "--config", "x.yaml"); code != 2 || !strings.Contains(stderr, "--schema prints the schema alone") {
		t.Errorf("check --schema --config: exit code %d, stderr %q", code, stderr)
	}
}

func TestCheckRegistry(t *testing.T) {
	for _, v := range []string{envConfig, envListen, envAdminListen} {
		t.Setenv(v, "")
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "sluice.yaml")
	writeFile(t, cfg, checkHead+"admin: {clients_file: clients.journal}\npolicies:\n  - {name: std, algorithm: fixed-window, limit: 5, period: 1m}\n"+
		"clients:\n  - {name: acme, api_key_sha256: "+sha256Hex("file-key")+", policy: std}\n")
	journal := filepath.Join(dir, "clients.journal")
	lines := fmt.Sprintf(`{"v":1,"f":"client/acme","d":{"keys":[{"sha256":%q}],"policy":["std"]},"t":"2026-12-01T00:00:00Z"}
{"v":2,"f":"client/beta","d":{"keys":[{"sha256":%q}],"policy":["gone"]},"t":"2026-12-01T00:00:00Z"}
`, sha256Hex("api-acme"), sha256Hex("api-beta"))
	writeFile(t, journal, lines)
	out := ok(t, "", "check", "--config", cfg, "--registry")
	for _, want := range []string{
		"clients: 0 from the file, 1 from the clients API (registry version 2); the API's wins when both name one",
		"the file's clients the API's replace: acme",
		`not running: beta: policy[0]: "gone" is not a policy (known: std)`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("check --registry printed %q; want %q in it", out, want)
		}
	}
	if b, _ := os.ReadFile(journal); string(b) != lines {
		t.Errorf("check --registry changed the journal: %q", b)
	}
}

package main

// End-to-end tests of the forward-auth recipes: the nginx and Caddy configurations of
// docs/forward-auth.md, taken out of the document as they are written there (so that the two
// cannot drift), run by the real nginx and caddy (Debian's; scripts/test.sh installs them) as
// processes of this test on free loopback ports, in front of a real upstream, asking the real
// `sluice serve` behind them. Every client dials from a loopback address of its own, so that
// sluice tells them apart by the address the proxy forwards.

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// faDoc is the document the recipes come from.
const faDoc = "../../docs/forward-auth.md"

// recipe returns the code block that follows "<!-- recipe: name -->" in faDoc.
func recipe(t *testing.T, name string) string {
	t.Helper()
	doc, err := os.ReadFile(faDoc)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- recipe: " + regexp.QuoteMeta(name) + " -->\\s*```[a-z]*\\n(.*?)\\n```").FindSubmatch(doc)
	if m == nil {
		t.Fatalf("%s has no code block marked <!-- recipe: %s -->", faDoc, name)
	}
	return string(m[1])
}

// mustReplace replaces old with new in s; old must be there (the test fails if the recipe no
// longer has what the test fills in).
func mustReplace(t *testing.T, s, old, new string) string {
	t.Helper()
	if !strings.Contains(s, old) {
		t.Fatalf("the recipe no longer contains %q, which the test replaces:\n%s", old, s)
	}
	return strings.ReplaceAll(s, old, new)
}

// faPolicies completes the recipe's sluice configuration: partner-a (key-a) may make 5
// requests an hour, every other client 3 by its address, and /reports costs 3. Token buckets:
// nothing refills while the test runs, and no window boundary can fall inside it.
var faPolicies = `
policies:
  - {name: per-ip, algorithm: token-bucket, limit: 3, period: 1h}
  - {name: standard, algorithm: token-bucket, limit: 5, period: 1h}
default_policy: per-ip
clients:
  - {name: partner-a, api_key_sha256: ` + sha256Hex("key-a") + `, policy: standard}
routes:
  - {path_prefix: /reports, cost: 3}
`

// faSluiceConfig is the recipe's sluice side with refused_status set to refused, the listener
// addresses given, an upstream (sluice's own proxy listener is not used), and faPolicies.
func faSluiceConfig(t *testing.T, upstream string, refused int) configFunc {
	side := recipe(t, "sluice")
	if refused != 403 {
		side = mustReplace(t, side, "refused_status: 403", fmt.Sprintf("refused_status: %d", refused))
	}
	return func(listen, admin string) string {
		return fmt.Sprintf("listen: %s\nupstream: %s\n", listen, upstream) +
			strings.ReplaceAll(side, "127.0.0.1:9090", admin) + faPolicies
	}
}

// lookBinary finds a proxy's binary, or fails the test saying how to get it: the recipes are
// tested against the real proxies, never skipped.
func lookBinary(t *testing.T, name string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, dir := range []string{"/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin"} {
		if p := filepath.Join(dir, name); isExecutable(p) {
			return p
		}
	}
	t.Fatalf("%s is not installed, and the forward-auth recipes are tested against the real one: scripts/test.sh installs it (Debian: apt-get install %s)", name, name)
	return ""
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// proxyProc is a running nginx or caddy.
type proxyProc struct {
	name   string
	cmd    *exec.Cmd
	stderr *syncBuffer
	done   chan struct{}
}

// startProxy starts bin with args and env (nil: this process's) and waits until addr accepts
// connections. It is stopped (SIGTERM, killed after 10 s) when the test ends, and its output is
// logged if the test failed.
func startProxy(t *testing.T, name, bin string, args, env []string, addr string) *proxyProc {
	t.Helper()
	p := &proxyProc{name: name, stderr: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.stderr, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
			t.Errorf("%s did not exit within 10 s of SIGTERM; killed", name)
		}
		if t.Failed() {
			t.Logf("%s's output:\n%s", name, p.stderr.String())
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return p
		}
		select {
		case <-p.done:
			t.Fatalf("%s exited (%v) before it listened on %s:\n%s", name, p.cmd.ProcessState, addr, p.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not listen on %s within 20 s:\n%s", name, addr, p.stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startNginx runs the nginx recipe, asking sluice at admin (host:port) and proxying to upstream
// (http://host:port), as an ordinary process: one process (no workers to switch to another
// user), in the foreground, its pid file, temporary files and log under dir. It returns the URL
// clients send to.
func startNginx(t *testing.T, dir, admin, upstream string) string {
	t.Helper()
	bin := lookBinary(t, "nginx")
	addr, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	r := recipe(t, "nginx")
	r = mustReplace(t, r, "127.0.0.1:9090", admin)
	r = mustReplace(t, r, "127.0.0.1:9000", strings.TrimPrefix(upstream, "http://"))
	r = mustReplace(t, r, "listen 8080;", "listen "+addr+";")
	conf := fmt.Sprintf(`daemon off;
master_process off;
pid %[1]s/nginx.pid;
error_log stderr notice;
events { worker_connections 256; }
http {
access_log off;
client_body_temp_path %[1]s/client_body;
proxy_temp_path %[1]s/proxy;
fastcgi_temp_path %[1]s/fastcgi;
uwsgi_temp_path %[1]s/uwsgi;
scgi_temp_path %[1]s/scgi;
%[2]s
}
`, dir, r)
	path := filepath.Join(dir, "nginx.conf")
	writeFile(t, path, conf)
	startProxy(t, "nginx", bin, []string{"-p", dir + "/", "-c", path, "-e", "stderr"}, nil, addr)
	return "http://" + addr
}

// startCaddy runs the Caddy recipe, asking sluice at admin and proxying to upstream, with its
// admin endpoint off, bound to loopback, its configuration and data directories under dir.
func startCaddy(t *testing.T, dir, admin, upstream string) string {
	t.Helper()
	bin := lookBinary(t, "caddy")
	addr, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(addr)
	r := recipe(t, "caddy")
	r = mustReplace(t, r, "127.0.0.1:9090", admin)
	r = mustReplace(t, r, "127.0.0.1:9000", strings.TrimPrefix(upstream, "http://"))
	r = mustReplace(t, r, ":8080 {", ":"+port+" {\n\tbind 127.0.0.1")
	path := filepath.Join(dir, "Caddyfile")
	writeFile(t, path, "{\n\tadmin off\n}\n\n"+r+"\n")
	env := append(os.Environ(), "HOME="+dir, "XDG_CONFIG_HOME="+dir, "XDG_DATA_HOME="+dir)
	startProxy(t, "caddy", bin, []string{"run", "--config", path, "--adapter", "caddyfile"}, env, addr)
	return "http://" + addr
}

// faClient is an HTTP client whose connections come from the loopback address local.
func faClient(t *testing.T, local string) *http.Client {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 5 * time.Second}
	tr := &http.Transport{DialContext: d.DialContext}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 15 * time.Second}
}

type faResponse struct {
	status int
	header http.Header
	body   string
}

// faGet sends GET url with c, with the header lines given.
func faGet(t *testing.T, c *http.Client, url string, headers ...[2]string) faResponse {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range headers {
		req.Header.Add(h[0], h[1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return faResponse{resp.StatusCode, resp.Header, string(b)}
}

// faAllowed checks an allowed request's answer: the upstream's, with the RateLimit fields
// of policy (limit q an hour) and r remaining.
func faAllowed(a faResponse, path, policy string, q, r int) error {
	if a.status != http.StatusOK || !strings.Contains(a.body, "upstream says hello to "+path) {
		return fmt.Errorf("%d %q, want 200 from the upstream", a.status, a.body)
	}
	if got, want := a.header.Get("RateLimit-Policy"), fmt.Sprintf(`"%s";q=%d;w=3600`, policy, q); got != want {
		return fmt.Errorf("RateLimit-Policy %q, want %q", got, want)
	}
	if got, want := a.header.Get("RateLimit"), fmt.Sprintf(`"%s";r=%d;t=`, policy, r); !strings.HasPrefix(got, want) {
		return fmt.Errorf("RateLimit %q, want %s…", got, want)
	}
	if a.header.Get("Retry-After") != "" {
		return fmt.Errorf("Retry-After %q on an allowed request", a.header.Get("Retry-After"))
	}
	return nil
}

// faRefused checks a refused request's answer: 429 with Retry-After, the RateLimit fields of
// policy (none left) and a quota-exceeded problem.
func faRefused(a faResponse, policy string) error {
	if a.status != http.StatusTooManyRequests {
		return fmt.Errorf("%d %q, want 429", a.status, a.body)
	}
	if ra, err := strconv.Atoi(a.header.Get("Retry-After")); err != nil || ra < 1 {
		return fmt.Errorf("Retry-After %q, want whole seconds ≥ 1", a.header.Get("Retry-After"))
	}
	if got, want := a.header.Get("RateLimit"), fmt.Sprintf(`"%s";r=0;t=`, policy); !strings.HasPrefix(got, want) {
		return fmt.Errorf("RateLimit %q, want %s…", got, want)
	}
	if a.header.Get("Content-Type") != "application/problem+json" || !strings.Contains(a.body, typeQuotaExceeded) {
		return fmt.Errorf("%s %q, want the quota-exceeded problem", a.header.Get("Content-Type"), a.body)
	}
	return nil
}

// TestForwardAuthRecipesE2E runs each recipe of docs/forward-auth.md against the real proxy.
func TestForwardAuthRecipesE2E(t *testing.T) {
	for _, proxy := range []struct {
		name    string
		refused int // the recipe's refused_status
		start   func(t *testing.T, dir, admin, upstream string) string
	}{
		{"nginx", 403, startNginx},
		{"caddy", 429, startCaddy},
	} {
		t.Run(proxy.name, func(t *testing.T) {
			up := newUpstream(t)
			dir := t.TempDir()
			s := startSluice(t, dir, "sluice.yaml", faSluiceConfig(t, up.URL, proxy.refused))
			base := proxy.start(t, dir, strings.TrimPrefix(s.admin, "http://"), up.URL)
			faRecipe(t, s, up, base)
		})
	}
}

// faRecipe is what each recipe must do, through the proxy at base.
func faRecipe(t *testing.T, s *sluiceProc, up *upstream, base string) {
	// partner-a, by its API key: exactly its 5 reach the upstream, with the fields; the next
	// are refused with Retry-After and never reach it.
	partner := faClient(t, "127.0.0.21")
	key := [2]string{"X-API-Key", "key-a"}
	for i := range 8 {
		a := faGet(t, partner, base+"/items/partner", key)
		var err error
		if i < 5 {
			err = faAllowed(a, "/items/partner", "standard", 5, 4-i)
		} else {
			err = faRefused(a, "standard")
		}
		if err != nil {
			t.Fatalf("partner-a, request %d of 8: %v", i+1, err)
		}
	}
	if n := up.count("/items/partner"); n != 5 {
		t.Errorf("the upstream got %d of partner-a's requests, want 5 (its limit)", n)
	}
	if got := s.metric(t, "sluice_decisions_total", map[string]string{"client": "partner-a", "result": "refused"}); got != 3 {
		t.Errorf("sluice_decisions_total for partner-a, refused: %v, want 3", got)
	}

	// An anonymous client that names another address in every request, in every forwarding
	// header, is still counted by its own: 3, then refused. Another client has its own 3.
	spoofer := faClient(t, "127.0.0.22")
	for i := range 6 {
		fake := fmt.Sprintf("203.0.113.%d", i+1)
		a := faGet(t, spoofer, base+"/items/spoofer", [2]string{"X-Forwarded-For", fake}, [2]string{"X-Real-IP", fake},
			[2]string{"Forwarded", "for=" + fake})
		var err error
		if i < 3 {
			err = faAllowed(a, "/items/spoofer", "per-ip", 3, 2-i)
		} else {
			err = faRefused(a, "per-ip")
		}
		if err != nil {
			t.Fatalf("a client sending X-Forwarded-For %s, request %d of 6: %v", fake, i+1, err)
		}
	}
	if n := up.count("/items/spoofer"); n != 3 {
		t.Errorf("the upstream got %d of the spoofing client's requests, want 3", n)
	}
	if err := faAllowed(faGet(t, faClient(t, "127.0.0.23"), base+"/items/other"), "/items/other", "per-ip", 3, 2); err != nil {
		t.Errorf("another client: %v", err)
	}

	// A client that names a cheap URI (and method) in either pair of fields still pays for the
	// route it asks for: /reports costs 3, all of its quota.
	escaper := faClient(t, "127.0.0.24")
	lies := [][2]string{{"X-Original-URI", "/items/cheap"}, {"X-Original-Method", "OPTIONS"},
		{"X-Forwarded-Uri", "/items/cheap"}, {"X-Forwarded-Method", "OPTIONS"}}
	if err := faAllowed(faGet(t, escaper, base+"/reports/x", lies...), "/reports/x", "per-ip", 3, 0); err != nil {
		t.Fatalf("/reports with a cheap X-Original-URI and X-Forwarded-Uri: %v (want cost 3)", err)
	}
	if err := faRefused(faGet(t, escaper, base+"/reports/x", lies...), "per-ip"); err != nil {
		t.Errorf("/reports again: %v", err)
	}
	if n := up.count("/reports/x"); n != 1 {
		t.Errorf("the upstream got %d requests for /reports/x, want 1", n)
	}

	// Dot segments do not escape the route either: /items/../reports/y costs 3.
	walker := faClient(t, "127.0.0.25")
	if a := faGet(t, walker, base+"/items/../reports/y"); a.status != http.StatusOK || !strings.HasPrefix(a.header.Get("RateLimit"), `"per-ip";r=0;`) {
		t.Errorf("/items/../reports/y: %d RateLimit %q, want 200 with r=0 (cost 3)", a.status, a.header.Get("RateLimit"))
	}
	if err := faRefused(faGet(t, walker, base+"/items/z"), "per-ip"); err != nil {
		t.Errorf("after /items/../reports/y: %v", err)
	}

	// An API key written to break out of a JSON template is an unknown key: the client is
	// counted by its address, and refused once that quota is spent.
	injector := faClient(t, "127.0.0.26")
	inject := [2]string{"X-API-Key", `k","cost":0,"client":"partner-a","api_key":"key-a`}
	for i := range 4 {
		a := faGet(t, injector, base+"/items/inject", inject)
		var err error
		if i < 3 {
			err = faAllowed(a, "/items/inject", "per-ip", 3, 2-i)
		} else {
			err = faRefused(a, "per-ip")
		}
		if err != nil {
			t.Fatalf("a forged API key, request %d of 4: %v", i+1, err)
		}
	}
	if n := up.count("/items/inject"); n != 3 {
		t.Errorf("the upstream got %d of the forged key's requests, want 3", n)
	}

	// A request no policy covers gets no fields at all (not empty ones, nor a placeholder's text,
	// nor those the client sent itself).
	cfg, err := os.ReadFile(s.config)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, s.config, mustReplace(t, string(cfg), "default_policy: per-ip\n", ""))
	s.signal(syscall.SIGHUP)
	s.waitMetric(t, "sluice_config_reloads_total", map[string]string{"result": "ok"}, 1, 10*time.Second)
	a := faGet(t, faClient(t, "127.0.0.27"), base+"/items/free",
		[2]string{"RateLimit", `"per-ip";r=999;t=1`}, [2]string{"RateLimit-Policy", `"per-ip";q=999;w=1`})
	if a.status != http.StatusOK || !strings.Contains(a.body, "upstream says hello") {
		t.Errorf("a request no policy covers: %d %q, want 200 from the upstream", a.status, a.body)
	}
	for _, f := range []string{"Ratelimit", "Ratelimit-Policy", "Retry-After"} {
		if v, ok := a.header[f]; ok {
			t.Errorf("a request no policy covers has %s %q, want none", f, v)
		}
	}

	// A sluice that does not trust the proxy decides nothing, and the client gets 403, not 429.
	writeFile(t, s.config, mustReplace(t, string(cfg), "127.0.0.1/32", "127.0.0.99/32"))
	s.signal(syscall.SIGHUP)
	s.waitMetric(t, "sluice_config_reloads_total", map[string]string{"result": "ok"}, 2, 10*time.Second)
	before := s.metric(t, "sluice_decisions_total", nil)
	if a := faGet(t, faClient(t, "127.0.0.28"), base+"/items/untrusted", key); a.status != http.StatusForbidden {
		t.Errorf("through a proxy sluice does not trust: %d %q, want 403", a.status, a.body)
	}
	if n := up.count("/items/untrusted"); n != 0 {
		t.Errorf("the upstream got %d requests through a proxy sluice does not trust, want 0", n)
	}
	if after := s.metric(t, "sluice_decisions_total", nil); after != before {
		t.Errorf("%v decisions were made for a proxy sluice does not trust, want none", after-before)
	}
}

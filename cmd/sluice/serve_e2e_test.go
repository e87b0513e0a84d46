package main

// End-to-end tests of `sluice serve`: the real binary, run as real processes, in front of a real
// upstream (an httptest.Server in this process that counts what reaches it) and, where the test
// says so, a real redis-server (internal/redistest). Nothing is faked and nothing is waited for by
// a fixed sleep, except the one wait that is the feature under test (a retry after Retry-After).
//
// The binary is built once per test run; when the tests run with -race it is built with -race
// too, so that a data race in the gateway fails the test of the process that hit it.

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"

	"github.com/sluicehq/sluice/gateway"
	"github.com/sluicehq/sluice/internal/redistest"
)

// Problem types the gateway answers with (package answer).
const (
	typeQuotaExceeded    = "https://iana.org/assignments/http-problem-types#quota-exceeded"
	typeStoreUnavailable = "https://sluice.dev/problems/store-unavailable"
)

// The binary, built once per run.
var (
	e2eBuildOnce sync.Once
	e2eBin       string
	e2eBuildErr  error
)

// sluiceBinary returns the path of a sluice binary built from this package (with -race when
// this test binary was), building it on first use, in a temporary directory that TestMain
// removes.
func sluiceBinary(t *testing.T) string {
	t.Helper()
	e2eBuildOnce.Do(func() { e2eBin, e2eBuildErr = buildTemp(raceEnabled()) })
	if e2eBuildErr != nil {
		t.Fatal(e2eBuildErr)
	}
	return e2eBin
}

// plainBinary returns the path of a sluice binary built from this package without -race, for
// tests that measure its memory (the race detector's shadow memory would be most of it).
func plainBinary(t *testing.T) string {
	t.Helper()
	plainBuildOnce.Do(func() { plainBin, plainBuildErr = buildTemp(false) })
	if plainBuildErr != nil {
		t.Fatal(plainBuildErr)
	}
	return plainBin
}

var (
	plainBuildOnce sync.Once
	plainBin       string
	plainBuildErr  error
)

// buildTemp builds this package (with -race if race) into a temporary directory of its own.
func buildTemp(race bool) (string, error) {
	dir, err := os.MkdirTemp("", "sluice-e2e-bin-")
	if err != nil {
		return "", err
	}
	var flags []string
	if race {
		flags = append(flags, "-race")
	}
	bin, err := goBuild(dir, flags...)
	if err != nil {
		os.RemoveAll(dir)
	}
	return bin, err
}

// goBuild builds this package with the go build flags into dir/sluice.
func goBuild(dir string, flags ...string) (string, error) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(dir, "sluice")
	out, err := exec.Command(goTool, append(append([]string{"build", "-o", bin}, flags...), ".")...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build %q: %v\n%s", flags, err, out)
	}
	return bin, nil
}

// raceEnabled reports whether this test binary was built with -race.
func raceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" && s.Value == "true" {
			return true
		}
	}
	return false
}

// sluiceEnv is the environment of the sluice processes: this one's, and for a -race binary
// no 1 s pause at exit (the race runtime's default atexit_sleep_ms), which would only slow the
// tests down.
func sluiceEnv() []string {
	env := os.Environ()
	if _, set := os.LookupEnv("GORACE"); !set {
		env = append(env, "GORACE=atexit_sleep_ms=0")
	}
	return env
}

// TestMain removes the built binary after the run.
func TestMain(m *testing.M) {
	code := m.Run()
	for _, bin := range []string{e2eBin, plainBin} {
		if bin != "" {
			os.RemoveAll(filepath.Dir(bin))
		}
	}
	os.Exit(code)
}

// e2eClient is the HTTP client of the tests: keep-alive, bounded.
var e2eClient = &http.Client{
	Timeout:   10 * time.Second,
	Transport: &http.Transport{MaxIdleConnsPerHost: 32, IdleConnTimeout: 30 * time.Second},
}

// --- the upstream ---------------------------------------------------------------------------

// upstream is the API behind sluice: it counts the requests it receives per path (each test gives
// each client its own paths), and holds requests to /slow... for slow before answering.
type upstream struct {
	*httptest.Server
	slow    time.Duration
	started chan string // a /slow request arrived (buffered; never blocks the handler)

	mu     sync.Mutex
	counts map[string]int // path → requests received
	total  atomic.Int64
}

func newUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{counts: map[string]int{}, slow: 300 * time.Millisecond, started: make(chan string, 16)}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.counts[r.URL.Path]++
		u.mu.Unlock()
		u.total.Add(1)
		if strings.HasPrefix(r.URL.Path, "/slow") {
			select {
			case u.started <- r.URL.Path:
			default:
			}
			time.Sleep(u.slow)
		}
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(w, "upstream says hello to %s", r.URL.Path)
	}))
	t.Cleanup(u.Close)
	return u
}

// count returns how many requests to path reached the upstream.
func (u *upstream) count(path string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.counts[path]
}

// --- sluice processes -----------------------------------------------------------------------

// syncBuffer is a bytes.Buffer safe for a process writing and a test reading.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// sluiceProc is one running `sluice serve --config FILE`.
type sluiceProc struct {
	t      *testing.T
	cmd    *exec.Cmd
	config string // the configuration file
	proxy  string // http://host:port of the proxy listener
	admin  string // http://host:port of the admin listener
	stderr *syncBuffer
	stdout *syncBuffer
	done   chan struct{} // closed when the process has exited
	client *http.Client  // what waitFor asks the admin listener with; nil: e2eClient
}

// configFunc writes a configuration for the given listen and admin_listen addresses.
type configFunc func(listen, admin string) string

// freeAddr returns a loopback address with a port that was free a moment ago.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// startSluice writes the configuration made by cfg (on two ports it picks) to a file in dir
// named name, starts `sluice serve --config FILE --watch 0` (reloads on SIGHUP only, so that the
// tests decide when) and waits until its admin /readyz answers 200. A port taken between picking
// and binding is retried with new ports. The process is stopped (SIGTERM) when the test ends.
func startSluice(t *testing.T, dir, name string, cfg configFunc) *sluiceProc {
	return startSluiceArgs(t, dir, name, cfg, "--watch", "0")
}

// startSluiceArgs is startSluice with other flags after --config FILE.
func startSluiceArgs(t *testing.T, dir, name string, cfg configFunc, args ...string) *sluiceProc {
	t.Helper()
	p, err := launch(t, dir, name, cfg, "/readyz", args...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// launch is startSluice returning its error, for any goroutine.
func launch(t *testing.T, dir, name string, cfg configFunc, ready string, args ...string) (*sluiceProc, error) {
	return launchWith(t, dir, name, cfg, ready, launchOpts{}, args...)
}

// launchOpts are launchWith's choices beside the configuration.
type launchOpts struct {
	// client: the admin listener is served over HTTPS and asked with it (nil: plain HTTP, asked
	// with e2eClient).
	client *http.Client
	// bin is the sluice binary to run ("": sluiceBinary's, with -race when this test binary has it).
	bin string
	// env is added to the process's environment (NAME=value).
	env []string
}

// launchWith is launch with the choices of opts. A nil cfg starts the demo (no --config) on the
// two ports.
func launchWith(t *testing.T, dir, name string, cfg configFunc, ready string, opts launchOpts, args ...string) (*sluiceProc, error) {
	if len(args) == 0 {
		args = []string{"--watch", "0"}
	}
	client, bin := opts.client, opts.bin
	if bin == "" {
		bin = sluiceBinary(t)
	}
	path := filepath.Join(dir, name)
	for attempt := 1; ; attempt++ {
		listen, err := freeAddr()
		if err != nil {
			return nil, err
		}
		admin, err := freeAddr()
		if err != nil {
			return nil, err
		}
		if listen == admin {
			continue
		}
		serve := []string{"serve", "--listen", listen, "--admin-listen", admin} // the demo
		if cfg != nil {
			if err := writeFileErr(path, cfg(listen, admin)); err != nil {
				return nil, err
			}
			serve = []string{"serve", "--config", path}
		}
		p := &sluiceProc{t: t, config: path, proxy: "http://" + listen, admin: "http://" + admin,
			stderr: &syncBuffer{}, stdout: &syncBuffer{}, done: make(chan struct{}), client: client}
		if client != nil {
			p.admin = "https://" + admin
		}
		p.cmd = exec.Command(bin, append(serve, args...)...)
		p.cmd.Env = append(sluiceEnv(), opts.env...)
		p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
		if err := p.cmd.Start(); err != nil {
			return nil, err
		}
		go func() { _ = p.cmd.Wait(); close(p.done) }()
		t.Cleanup(func() {
			select {
			case <-p.done:
			default:
				if code := p.stop(); code != 0 {
					t.Errorf("sluice (%s) exited with code %d after SIGTERM; want 0\nstderr:\n%s", p.proxy, code, p.stderr.String())
				}
			}
			if strings.Contains(p.stderr.String(), "DATA RACE") {
				t.Errorf("sluice (%s) reported a data race:\n%s", p.proxy, p.stderr.String())
			}
		})
		err = p.waitFor(ready, 20*time.Second)
		if err == nil {
			return p, nil
		}
		if attempt < 3 && strings.Contains(p.stderr.String(), "address already in use") {
			continue
		}
		return nil, fmt.Errorf("sluice serve did not become ready: %v\nstderr:\n%s", err, p.stderr.String())
	}
}

// waitReady polls the admin /readyz until it answers 200, the process exits or timeout passes.
func (p *sluiceProc) waitReady(timeout time.Duration) error { return p.waitFor("/readyz", timeout) }

// waitFor polls the admin path until it answers 200, the process exits or timeout passes.
func (p *sluiceProc) waitFor(path string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return fmt.Errorf("the process exited (%v)", p.cmd.ProcessState)
		default:
		}
		c := p.client
		if c == nil {
			c = e2eClient
		}
		resp, err := c.Get(p.admin + path)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("no 200 from %s%s within %v (last: %s)", p.admin, path, timeout, last)
}

// signal sends sig to the process.
func (p *sluiceProc) signal(sig os.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal %v: %v", sig, err)
	}
}

// stop sends SIGTERM and waits for the process to exit; it returns the exit code (-1 if a signal
// ended it). A process that does not exit within 15 s is killed and the test fails.
func (p *sluiceProc) stop() int {
	p.t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	return p.wait(15 * time.Second)
}

// wait waits for the process to exit, killing it (and failing the test) after timeout.
func (p *sluiceProc) wait(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		p.t.Errorf("sluice (%s) did not exit within %v of SIGTERM; killed\nstderr:\n%s", p.proxy, timeout, p.stderr.String())
	}
	return p.cmd.ProcessState.ExitCode()
}

// metric returns the value of the samples of name whose labels include labels, summed; 0 if
// there is none.
func (p *sluiceProc) metric(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	return sampleSum(p.metricsText(t), name, labels)
}

// sampleSum is the sum of the samples of name whose labels include labels in text, a /metrics
// page.
func sampleSum(text, name string, labels map[string]string) float64 {
	var sum float64
	for _, line := range strings.Split(text, "\n") {
		n, ls, v, ok := parseSample(line)
		if !ok || n != name {
			continue
		}
		match := true
		for k, want := range labels {
			match = match && ls[k] == want
		}
		if match {
			sum += v
		}
	}
	return sum
}

// metricsText returns the admin listener's /metrics page.
func (p *sluiceProc) metricsText(t *testing.T) string {
	t.Helper()
	resp, err := e2eClient.Get(p.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s/metrics: %s %v", p.admin, resp.Status, err)
	}
	return string(b)
}

var sampleRE = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)`)
var labelRE = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)

// parseSample parses one line of the Prometheus text format.
func parseSample(line string) (name string, labels map[string]string, value float64, ok bool) {
	m := sampleRE.FindStringSubmatch(line)
	if m == nil {
		return "", nil, 0, false
	}
	v, err := strconv.ParseFloat(m[3], 64)
	if err != nil {
		return "", nil, 0, false
	}
	labels = map[string]string{}
	for _, l := range labelRE.FindAllStringSubmatch(m[2], -1) {
		labels[l[1]] = l[2]
	}
	return m[1], labels, v, true
}

// waitMetric polls until the metric reaches at least atLeast, or fails after timeout.
func (p *sluiceProc) waitMetric(t *testing.T, name string, labels map[string]string, atLeast float64, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		v := p.metric(t, name, labels)
		if v >= atLeast {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s%v = %v after %v; want ≥ %v\nstderr:\n%s", name, labels, v, timeout, atLeast, p.stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// --- requests and answers -------------------------------------------------------------------

// reply is one response, read whole.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// get sends GET base+path with the given headers (name, value, name, value, ...).
func get(t *testing.T, base, path string, headers ...string) reply {
	t.Helper()
	r, err := tryGet(base, path, headers...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func tryGet(base, path string, headers ...string) (reply, error) {
	req, err := http.NewRequest(http.MethodGet, base+path, nil)
	if err != nil {
		return reply{}, err
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := e2eClient.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, err
	}
	return reply{resp.StatusCode, resp.Header, body}, nil
}

// problem is a problem details body (RFC 9457) with sluice's extension members.
type problem struct {
	Type             string   `json:"type"`
	Title            string   `json:"title"`
	Status           int      `json:"status"`
	Detail           string   `json:"detail"`
	Instance         string   `json:"instance"`
	ViolatedPolicies []string `json:"violated-policies"`
	Client           string   `json:"client"`
	RetryAfter       int64    `json:"retry-after"`
}

// parseProblem checks that r is application/problem+json, one JSON object with the members of
// RFC 9457 (extension members beyond sluice's are allowed), and decodes it.
func parseProblem(r reply) (problem, error) {
	var p problem
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		return p, fmt.Errorf("Content-Type %q; want application/problem+json", ct)
	}
	if err := json.Unmarshal(r.body, &p); err != nil {
		return p, fmt.Errorf("body %q is not a problem details object: %v", r.body, err)
	}
	if p.Status != r.status {
		return p, fmt.Errorf("body status %d, response status %d", p.Status, r.status)
	}
	if p.Title == "" || p.Detail == "" {
		return p, fmt.Errorf("body %q: want a title and a detail", r.body)
	}
	return p, nil
}

var delaySeconds = regexp.MustCompile(`^[0-9]+$`)

// retryAfter parses a Retry-After field that must be delay-seconds (RFC 9110, section 10.2.3:
// 1*DIGIT), at least 1.
func retryAfter(h http.Header) (int64, error) {
	vs := h.Values("Retry-After")
	if len(vs) != 1 {
		return 0, fmt.Errorf("Retry-After %q; want one field line", vs)
	}
	if !delaySeconds.MatchString(vs[0]) {
		return 0, fmt.Errorf("Retry-After %q is not delay-seconds", vs[0])
	}
	n, err := strconv.ParseInt(vs[0], 10, 64)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("Retry-After %q; want ≥ 1", vs[0])
	}
	return n, nil
}

// sfMember is one member of a RateLimit-Policy or RateLimit list: the policy's name and its
// integer parameters.
type sfMember struct {
	name   string
	params map[string]int64
}

// parseRateLimitField parses a RateLimit-Policy or RateLimit field (all its lines) as a
// Structured Fields List whose members are Strings (policy names) with Integer parameters, and
// checks that each member has exactly the parameters want (e.g. "q", "w").
func parseRateLimitField(h http.Header, field string, want ...string) ([]sfMember, error) {
	lines := h.Values(field)
	if len(lines) == 0 {
		return nil, fmt.Errorf("no %s field", field)
	}
	list, err := httpsfv.UnmarshalList(lines)
	if err != nil {
		return nil, fmt.Errorf("%s %q is not a Structured Fields List: %v", field, lines, err)
	}
	var out []sfMember
	for _, m := range list {
		item, ok := m.(httpsfv.Item)
		if !ok {
			return nil, fmt.Errorf("%s %q: a member is an inner list, want an item", field, lines)
		}
		name, ok := item.Value.(string)
		if !ok {
			return nil, fmt.Errorf("%s %q: member %v is a %T, want a String (the policy's name)", field, lines, item.Value, item.Value)
		}
		sm := sfMember{name: name, params: map[string]int64{}}
		names := item.Params.Names()
		if strings.Join(names, ",") != strings.Join(want, ",") {
			return nil, fmt.Errorf("%s %q: member %q has parameters %v, want %v", field, lines, name, names, want)
		}
		for _, k := range names {
			v, _ := item.Params.Get(k)
			n, ok := v.(int64)
			if !ok || n < 0 {
				return nil, fmt.Errorf("%s %q: member %q parameter %s=%v is not a non-negative Integer", field, lines, name, k, v)
			}
			sm.params[k] = n
		}
		out = append(out, sm)
	}
	return out, nil
}

// checkQuotaExceeded checks that r is a complete, parseable 429 from sluice for client (""
// for anonymous) refused by the one policy named policy, of limit q per w seconds.
func checkQuotaExceeded(r reply, policy, client string, q, w int64) error {
	if r.status != http.StatusTooManyRequests {
		return fmt.Errorf("status %d; want 429", r.status)
	}
	ra, err := retryAfter(r.header)
	if err != nil {
		return err
	}
	rl, err := parseFields(r.header, policy, q, w)
	if err != nil {
		return err
	}
	if len(rl) != 1 || rl[0].name != policy || rl[0].params["r"] != 0 || rl[0].params["t"] < 1 {
		return fmt.Errorf("RateLimit %q; want %q;r=0;t=(≥ 1)", r.header.Values("RateLimit"), policy)
	}
	// The draft: Retry-After should not point before the end of the effective window.
	if ra < rl[0].params["t"] {
		return fmt.Errorf("Retry-After %d is before the end of RateLimit's effective window t=%d", ra, rl[0].params["t"])
	}
	p, err := parseProblem(r)
	if err != nil {
		return err
	}
	if p.Type != typeQuotaExceeded {
		return fmt.Errorf("problem type %q; want %q", p.Type, typeQuotaExceeded)
	}
	if len(p.ViolatedPolicies) != 1 || p.ViolatedPolicies[0] != policy {
		return fmt.Errorf("violated-policies %q; want [%q]", p.ViolatedPolicies, policy)
	}
	if p.Client != client {
		return fmt.Errorf("client %q; want %q", p.Client, client)
	}
	if p.RetryAfter != ra {
		return fmt.Errorf("body retry-after %d, Retry-After field %d: they must agree", p.RetryAfter, ra)
	}
	return nil
}

// checkAllowed checks that r is the upstream's answer with the RateLimit fields of the one policy
// named policy (limit q per w seconds) added.
func checkAllowed(r reply, path, policy string, q, w int64) error {
	if r.status != http.StatusOK {
		return fmt.Errorf("status %d (%s); want 200", r.status, r.body)
	}
	if want := "upstream says hello to " + path; string(r.body) != want {
		return fmt.Errorf("body %q; want %q", r.body, want)
	}
	rl, err := parseFields(r.header, policy, q, w)
	if err != nil {
		return err
	}
	if len(rl) != 1 || rl[0].name != policy || rl[0].params["r"] >= q {
		return fmt.Errorf("RateLimit %q; want %q;r=(< %d)", r.header.Values("RateLimit"), policy, q)
	}
	if r.header.Get("Retry-After") != "" {
		return fmt.Errorf("Retry-After %q on an allowed request", r.header.Get("Retry-After"))
	}
	return nil
}

// --- configuration files --------------------------------------------------------------------

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	if err := writeFileErr(path, text); err != nil {
		t.Fatal(err)
	}
}

// writeFileErr writes text to a temporary name and renames it to path, so that a reader (a
// reload) never sees half a file.
func writeFileErr(path, text string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(text), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// partnerKey is partner-a's API key in the Redis tests; only its SHA-256 is configured.
const partnerKey = "e2e-partner-a-key-7c1f0b"

// redisConfig is three instances' shared configuration: partner-a, by API key, may make 30
// requests per hour. The policy is a sliding log, exact over any hour: a fixed window is aligned
// to the clock's hours and could roll over during the test, letting 60 through. The store's
// timeouts are the defaults: a healthy Redis call that a loaded CI machine (2 cores, -race, a
// dozen processes) makes later than the 50 ms timeout still waits for its reply, up to
// slow_timeout, and only a Redis that answers nothing opens the breaker.
func redisConfig(upstreamURL, redisAddr, onError string) configFunc {
	return func(listen, admin string) string {
		return fmt.Sprintf(`listen: %s
admin_listen: %s
upstream: %s
store:
  type: redis
  addrs: [%s]
  on_error: %s
identity:
  - api_key: {header: X-API-Key}
  - ip: {}
policies:
  - {name: partner-hourly, algorithm: sliding-log, limit: 30, period: 1h}
clients:
  - {name: partner-a, api_key_sha256: %q, policy: partner-hourly}
`, listen, admin, upstreamURL, redisAddr, onError, sha256Hex(partnerKey))
	}
}

// startThree starts three instances of the same configuration (each its own file and ports),
// concurrently.
func startThree(t *testing.T, cfg configFunc) []*sluiceProc {
	t.Helper()
	return startThreeWith(t, cfg, launchOpts{})
}

// startThreeWith is startThree with the choices of opts.
func startThreeWith(t *testing.T, cfg configFunc, opts launchOpts) []*sluiceProc {
	t.Helper()
	dir := t.TempDir()
	procs := make([]*sluiceProc, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			procs[i], errs[i] = launchWith(t, dir, fmt.Sprintf("sluice-%d.yaml", i), cfg, "/readyz", opts)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return procs
}

// --- the tests ------------------------------------------------------------------------------

// TestServeE2EThreeInstancesOneRedis: a partner sending round-robin to three instances on one
// Redis gets exactly its quota through, and every refusal is a complete, parseable 429. Separate
// counters per instance would let 90 through (30 each).
func TestServeE2EThreeInstancesOneRedis(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	up := newUpstream(t)
	procs := startThree(t, redisConfig(up.URL, rs.Addr, "fail-closed"))

	const n, workers, path = 90, 6, "/partner-a/orders"
	replies := make([]reply, n)
	errs := make([]error, n)
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				replies[i], errs[i] = tryGet(procs[i%3].proxy, path, "X-API-Key", partnerKey)
			}
		}()
	}
	for i := range n {
		jobs <- i
	}
	close(jobs)
	wg.Wait()

	statuses := map[int]int{}
	perInstance := [3]map[int]int{{}, {}, {}}
	for i, r := range replies {
		if errs[i] != nil {
			t.Fatalf("request %d: %v", i, errs[i])
		}
		statuses[r.status]++
		perInstance[i%3][r.status]++
	}
	if got := up.count(path); got != 30 {
		t.Errorf("the upstream received %d of partner-a's requests; want exactly its quota, 30 (statuses %v)", got, statuses)
	}
	if statuses[200] != 30 || statuses[429] != 60 || len(statuses) != 2 {
		t.Errorf("statuses %v; want 30×200 and 60×429", statuses)
	}
	t.Logf("statuses per instance: %v", perInstance)

	bad := 0
	for i, r := range replies {
		var err error
		switch r.status {
		case http.StatusOK:
			err = checkAllowed(r, path, "partner-hourly", 30, 3600)
		default:
			err = checkQuotaExceeded(r, "partner-hourly", "partner-a", 30, 3600)
			if err == nil {
				// A sliding log of 30 per hour: the first of the 30 leaves the log after about an hour.
				if ra, _ := retryAfter(r.header); ra < 3500 || ra > 3600 {
					err = fmt.Errorf("Retry-After %d; want about an hour (3500..3600)", ra)
				}
			}
		}
		if err != nil {
			if bad++; bad <= 5 {
				t.Errorf("request %d to instance %d: %v\nheaders %v\nbody %s", i, i%3, err, r.header, r.body)
			}
		}
	}

	// The decision API on any instance sees the same, shared state.
	resp, err := e2eClient.Post(procs[1].admin+"/v1/check", "application/json", strings.NewReader(`{"client":"partner-a"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(string(body), `"allowed":false`) {
		t.Errorf("POST /v1/check for partner-a after the flood: %s %s; want 429, allowed false", resp.Status, body)
	}

	// What operators see, summed over the instances; the plaintext key is nowhere.
	var allowed, refused float64
	for _, p := range procs {
		labels := map[string]string{"client": "partner-a", "policy": "partner-hourly"}
		labels["result"] = "allowed"
		allowed += p.metric(t, "sluice_decisions_total", labels)
		labels["result"] = "refused"
		refused += p.metric(t, "sluice_decisions_total", labels)
		if text := p.metricsText(t); strings.Contains(text, partnerKey) {
			t.Errorf("/metrics of %s contains the plaintext API key", p.admin)
		}
		if strings.Contains(p.stderr.String(), partnerKey) {
			t.Errorf("the log of %s contains the plaintext API key", p.proxy)
		}
	}
	if allowed != 30 || refused != 61 { // 60 proxied refusals and the /v1/check one
		t.Errorf("sluice_decisions_total over the three instances: allowed %v, refused %v; want 30 and 61", allowed, refused)
	}
	keys, err := rs.Do("KEYS", "*")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(keys, partnerKey) || !strings.Contains(keys, "partner-a") {
		t.Errorf("Redis keys %q: want partner-a's, without its plaintext API key", keys)
	}
}

// TestServeE2EFailClosedRedisKilled: with on_error: fail-closed, once Redis is killed every
// request is answered 503 with the store-unavailable problem (not a 429), none reaches the
// upstream, and /readyz says not ready; when Redis comes back, so does the gateway.
func TestServeE2EFailClosedRedisKilled(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	up := newUpstream(t)
	procs := startThree(t, redisConfig(up.URL, rs.Addr, "fail-closed"))
	const path = "/partner-a/claims"

	for i, p := range procs {
		if r := get(t, p.proxy, path, "X-API-Key", partnerKey); r.status != http.StatusOK {
			t.Fatalf("instance %d before the kill: %d %s", i, r.status, r.body)
		}
	}
	before := up.total.Load()

	rs.Kill()
	const n = 30
	statuses := map[int]int{}
	for i := range n {
		r := get(t, procs[i%3].proxy, path, "X-API-Key", partnerKey)
		statuses[r.status]++
		if r.status != http.StatusServiceUnavailable {
			if statuses[r.status] <= 3 {
				t.Errorf("request %d after the kill: %d %s; want 503", i, r.status, r.body)
			}
			continue
		}
		p, err := parseProblem(r)
		if err == nil && p.Type != typeStoreUnavailable {
			err = fmt.Errorf("problem type %q; want %q (its own type, not quota-exceeded)", p.Type, typeStoreUnavailable)
		}
		if err == nil && p.Client != "partner-a" {
			err = fmt.Errorf("problem client %q; want partner-a", p.Client)
		}
		if err == nil && len(p.ViolatedPolicies) != 0 {
			err = fmt.Errorf("violated-policies %q in a 503", p.ViolatedPolicies)
		}
		if err == nil {
			var ra int64
			if ra, err = retryAfter(r.header); err == nil && p.RetryAfter != ra {
				err = fmt.Errorf("body retry-after %d, Retry-After field %d", p.RetryAfter, ra)
			}
		}
		if err != nil {
			t.Errorf("request %d after the kill: %v\nbody %s", i, err, r.body)
		}
	}
	if after := up.total.Load(); after != before {
		t.Errorf("the upstream received %d requests after Redis was killed; want none (fail-closed)", after-before)
	}
	t.Logf("after the kill: %v", statuses)

	// Every request was answered 503 (sluice_undecided_total's unavailable); the calls that found
	// Redis dead are store errors: each instance's first 3 (its breaker's threshold), then a
	// probe now and then, /readyz's among them.
	var storeErrors, unavailable float64
	for i, p := range procs {
		if r := get(t, p.admin, "/readyz"); r.status == http.StatusOK {
			t.Errorf("instance %d: /readyz %d %s with Redis dead; want not ready", i, r.status, r.body)
		}
		storeErrors += p.metric(t, "sluice_store_errors_total", nil)
		unavailable += p.metric(t, "sluice_undecided_total", map[string]string{"kind": "unavailable"})
	}
	if unavailable != n {
		t.Errorf("sluice_undecided_total{kind=unavailable} over the instances = %v; want %d", unavailable, n)
	}
	if storeErrors < 3*3 || storeErrors > n+3 {
		t.Errorf("sluice_store_errors_total over the instances = %v; want 3 per instance at least, at most one per request and /readyz, %d", storeErrors, n+3)
	}

	// Recovery is automatic: the breaker lets one decision probe the store every 250ms, a
	// request's or /readyz's own (TestServeE2EReadyzFollowsDecisions: /readyz comes back without
	// traffic too, so a load balancer that stopped sending requests brings the instance back).
	rs.Restart()
	for i, p := range procs {
		deadline := time.Now().Add(5 * time.Second)
		for {
			r := get(t, p.proxy, path, "X-API-Key", partnerKey)
			if r.status == http.StatusOK {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("instance %d still answers %d %s 5 s after Redis came back", i, r.status, r.body)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err := p.waitReady(5 * time.Second); err != nil {
			t.Fatalf("instance %d after Redis came back and a request passed: %v", i, err)
		}
	}
}

// TestServeE2ERetryAfterRetrySucceeds: a token bucket of 1 per second refuses the second request
// with Retry-After: 1; a client that comes back early is refused again (and counted as an early
// retry); one that waits the Retry-After it was given succeeds.
func TestServeE2ERetryAfterRetrySucceeds(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	p := startSluice(t, t.TempDir(), "sluice.yaml", func(listen, admin string) string {
		return fmt.Sprintf(`listen: %s
admin_listen: %s
upstream: %s
identity:
  - ip: {}
policies:
  - {name: one-per-second, algorithm: token-bucket, limit: 1, period: 1s, burst: 1}
default_policy: one-per-second
`, listen, admin, up.URL)
	})
	const path = "/retry"
	if r := get(t, p.proxy, path); checkAllowed(r, path, "one-per-second", 1, 1) != nil {
		t.Fatalf("first request: %v", checkAllowed(r, path, "one-per-second", 1, 1))
	}
	r := get(t, p.proxy, path)
	if err := checkQuotaExceeded(r, "one-per-second", "", 1, 1); err != nil {
		t.Fatalf("second request: %v\n%s", err, r.body)
	}
	if ra, _ := retryAfter(r.header); ra != 1 {
		t.Fatalf("second request: Retry-After %d; want 1", ra)
	}
	r = get(t, p.proxy, path) // the classic mistake: retrying at once
	if err := checkQuotaExceeded(r, "one-per-second", "", 1, 1); err != nil {
		t.Fatalf("an immediate retry: %v\n%s", err, r.body)
	}
	ra, _ := retryAfter(r.header)
	time.Sleep(time.Duration(ra) * time.Second) // the feature under test: waiting as told works
	if r := get(t, p.proxy, path); checkAllowed(r, path, "one-per-second", 1, 1) != nil {
		t.Fatalf("retry after Retry-After (%d s): %v\nheaders %v\nbody %s", ra, checkAllowed(r, path, "one-per-second", 1, 1), r.header, r.body)
	}
	if got := up.count(path); got != 2 {
		t.Errorf("the upstream received %d requests; want 2 (the refused ones never reach it)", got)
	}
	if got := p.metric(t, "sluice_early_retries_total", map[string]string{"client": "anonymous"}); got != 1 {
		t.Errorf("sluice_early_retries_total{client=anonymous} = %v; want 1 (the immediate retry; not the one that waited)", got)
	}
}

// TestServeE2EBadConfigFiles: a bad configuration file stops sluice at start with exit code 2
// and an error naming the file's line.
func TestServeE2EBadConfigFiles(t *testing.T) {
	t.Parallel()
	bin := sluiceBinary(t)
	dir := t.TempDir()
	const unsetSecret = "SLUICE_E2E_UNSET_JWT_SECRET"
	listen, err1 := freeAddr()
	admin, err2 := freeAddr()
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	head := fmt.Sprintf("listen: %s\nadmin_listen: %s\nupstream: http://127.0.0.1:9\n", listen, admin) // lines 1-3
	cases := []struct {
		name  string
		yaml  string
		line  int
		words []string
	}{
		{"wrong type", head + "policies:\n  - {name: std, algorithm: fixed-window, limit: abc, period: 1m}\n",
			5, []string{`limit "abc" must be an integer`}},
		{"unknown field", head + "store:\n  type: memory\n  tpye: redis\n",
			6, []string{`unknown field "tpye"`, `did you mean "type"`}},
		{"unknown policy name in a client", head + "policies:\n  - {name: std, algorithm: fixed-window, limit: 5, period: 1m}\n" +
			"clients:\n  - {name: partner-a, api_key_sha256: " + sha256Hex("k") + ", policy: gold}\n",
			7, []string{`policy "gold" is not defined`}},
		{"bad CIDR in trusted_proxies", head + "identity:\n  - ip: {trusted_proxies: [10.1.2.3/8]}\n",
			5, []string{`"10.1.2.3/8" has bits set past the prefix`, "10.0.0.0/8"}},
		{"unparseable CIDR in trusted_proxies", head + "identity:\n  - api_key: {}\n  - ip:\n      trusted_proxies: [10.0.0.0/33]\n",
			7, []string{`"10.0.0.0/33" is not a CIDR`}},
		{"HS256 jwt with an unset secret", head + "identity:\n  - jwt:\n      algorithms: [HS256]\n      secret_env: " + unsetSecret + "\n",
			7, []string{"missing secret", unsetSecret}},
	}
	env := []string{}
	for _, kv := range sluiceEnv() {
		if !strings.HasPrefix(kv, unsetSecret+"=") {
			env = append(env, kv)
		}
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(dir, fmt.Sprintf("bad-%d.yaml", i))
			writeFile(t, path, c.yaml)
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, "serve", "--config", path)
			cmd.Env = env
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if ctx.Err() != nil {
				t.Fatalf("sluice serve did not exit on a bad file (it started?)\nstderr:\n%s", stderr.String())
			}
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("exit: %v; want exit code 2\nstderr:\n%s", err, stderr.String())
			}
			errText := stderr.String()
			if want := fmt.Sprintf("%s:%d:", path, c.line); !strings.Contains(errText, want) {
				t.Errorf("stderr does not name the line (%q):\n%s", want, errText)
			}
			for _, w := range c.words {
				if !strings.Contains(errText, w) {
					t.Errorf("stderr does not say %q:\n%s", w, errText)
				}
			}
			if !strings.HasPrefix(errText, "sluice: ") {
				t.Errorf("stderr does not start with \"sluice: \":\n%s", errText)
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout %q; want nothing", stdout.String())
			}
		})
	}
}

// TestServeE2EReloadKeepsOldConfigOnError: SIGHUP with an invalid file logs the error with its
// line, counts it, and keeps the running limits; SIGHUP with a valid file swaps in the new ones.
func TestServeE2EReloadKeepsOldConfigOnError(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	var listen, admin string
	// Every route has its own scope, so each phase starts from a fresh key under the same policy.
	cfg := func(limit string) string {
		return fmt.Sprintf(`listen: %s
admin_listen: %s
upstream: %s
identity:
  - ip: {}
policies:
  - {name: anon, algorithm: sliding-log, limit: %s, period: 1h}
default_policy: anon
routes:
  - {path_prefix: /one, scope: one}
  - {path_prefix: /two, scope: two}
  - {path_prefix: /three, scope: three}
`, listen, admin, up.URL, limit)
	}
	p := startSluice(t, t.TempDir(), "sluice.yaml", func(l, a string) string {
		listen, admin = l, a
		return cfg("2")
	})

	// expect sends limit+1 requests to path and checks that limit pass and the last is refused,
	// every answer naming the policy with q=limit.
	expect := func(phase, path string, limit int64) {
		t.Helper()
		for i := range limit {
			if r := get(t, p.proxy, path); checkAllowed(r, path, "anon", limit, 3600) != nil {
				t.Fatalf("%s: request %d of %d: %v", phase, i+1, limit, checkAllowed(r, path, "anon", limit, 3600))
			}
		}
		r := get(t, p.proxy, path)
		if err := checkQuotaExceeded(r, "anon", "", limit, 3600); err != nil {
			t.Fatalf("%s: request %d: %v\nbody %s", phase, limit+1, err, r.body)
		}
		if got := up.count(path); got != int(limit) {
			t.Fatalf("%s: the upstream received %d requests to %s; want %d", phase, got, path, limit)
		}
	}
	expect("the first configuration", "/one", 2)

	// An invalid file (line 7: limit abc) and SIGHUP: logged with the line, counted, ignored.
	writeFile(t, p.config, cfg("abc"))
	p.signal(syscall.SIGHUP)
	p.waitMetric(t, "sluice_config_reloads_total", map[string]string{"result": "failed"}, 1, 10*time.Second)
	if log := p.stderr.String(); !strings.Contains(log, p.config+":7:") || !strings.Contains(log, "must be an integer") {
		t.Errorf("the log does not name the bad line (%s:7:):\n%s", p.config, log)
	}
	if r := get(t, p.admin, "/readyz"); r.status != http.StatusOK {
		t.Errorf("/readyz after a failed reload: %d", r.status)
	}
	expect("after a failed reload", "/two", 2)

	// A valid file with limit 5 and SIGHUP: the new limit applies.
	writeFile(t, p.config, cfg("5"))
	p.signal(syscall.SIGHUP)
	p.waitMetric(t, "sluice_config_reloads_total", map[string]string{"result": "ok"}, 1, 10*time.Second)
	expect("after a good reload", "/three", 5)
	if got := p.metric(t, "sluice_config_reloads_total", map[string]string{"result": "failed"}); got != 1 {
		t.Errorf("sluice_config_reloads_total{result=failed} = %v; want 1", got)
	}
	if code := p.stop(); code != 0 {
		t.Errorf("exit code %d after SIGTERM; want 0\nstderr:\n%s", code, p.stderr.String())
	}
}

// TestServeE2EGracefulShutdown: SIGTERM while a request is in flight lets it finish (200, whole
// body), and the process exits 0.
func TestServeE2EGracefulShutdown(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	p := startSluice(t, t.TempDir(), "sluice.yaml", func(listen, admin string) string {
		return fmt.Sprintf(`listen: %s
admin_listen: %s
upstream: %s
identity:
  - ip: {}
policies:
  - {name: anon, algorithm: token-bucket, limit: 100, period: 1s}
default_policy: anon
`, listen, admin, up.URL)
	})
	const path = "/slow/report"
	type result struct {
		r   reply
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := tryGet(p.proxy, path)
		done <- result{r, err}
	}()
	select {
	case <-up.started: // the request is at the upstream, in flight through sluice
	case <-time.After(10 * time.Second):
		t.Fatal("the request did not reach the upstream")
	}
	sent := time.Now()
	p.signal(syscall.SIGTERM)
	res := <-done
	answered := time.Since(sent)
	if res.err != nil {
		t.Fatalf("the request in flight at SIGTERM failed: %v\nstderr:\n%s", res.err, p.stderr.String())
	}
	if err := checkAllowed(res.r, path, "anon", 100, 1); err != nil {
		t.Errorf("the request in flight at SIGTERM: %v", err)
	}
	if code := p.wait(15 * time.Second); code != 0 {
		t.Errorf("exit code %d after SIGTERM; want 0\nstderr:\n%s", code, p.stderr.String())
	}
	t.Logf("after SIGTERM: the request in flight was answered in %v, the process exited in %v",
		answered.Round(time.Millisecond), time.Since(sent).Round(time.Millisecond))
	if _, err := tryGet(p.proxy, path); err == nil {
		t.Errorf("the proxy still answers after the process exited")
	}
}

// TestServeE2EHelp: `sluice serve --help` exits 0 and documents --config. (The demo itself binds
// 127.0.0.1:8080, which may be taken where the tests run; the in-process tests cover it.)
func TestServeE2EHelp(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(sluiceBinary(t), "serve", "--help")
	cmd.Env = sluiceEnv()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("sluice serve --help: %v\nstderr:\n%s", err, stderr.String())
	}
	if !strings.Contains(stdout.String(), "--config") {
		t.Errorf("sluice serve --help does not mention --config:\n%s", stdout.String())
	}
}

// TestServeE2EBreakerProbeAbandoned: the breaker's probe belongs to a request whose client gives
// up while Redis hangs. The probe must be handed back, so that once Redis answers again the next
// request probes and the instance recovers (it once stayed on 503 for good).
func TestServeE2EBreakerProbeAbandoned(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	up := newUpstream(t)
	p := startSluice(t, t.TempDir(), "sluice.yaml", redisConfig(up.URL, rs.Addr, "fail-closed")) // (the default timeouts)
	const path = "/partner-a/probe"
	if r := get(t, p.proxy, path, "X-API-Key", partnerKey); r.status != 200 {
		t.Fatalf("before Redis hangs: %d", r.status)
	}
	if _, err := rs.Do("CLIENT", "PAUSE", "2000", "ALL"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if r := get(t, p.proxy, path, "X-API-Key", partnerKey); r.status != 503 {
			t.Fatalf("while Redis hangs, request %d: %d, want 503", i, r.status)
		}
	}
	time.Sleep(400 * time.Millisecond) // past the breaker's 250ms cooldown: the next request probes
	req, _ := http.NewRequest(http.MethodGet, p.proxy+path, nil)
	req.Header.Set("X-API-Key", partnerKey)
	if resp, err := (&http.Client{Timeout: 20 * time.Millisecond}).Do(req); err == nil {
		resp.Body.Close() // the probe's client gives up before the store's 50ms timeout
	}
	if _, err := rs.Do("CLIENT", "UNPAUSE"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		r := get(t, p.proxy, path, "X-API-Key", partnerKey)
		if r.status == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("5s after Redis answers again the instance still says %d: the abandoned probe was never handed back", r.status)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestServeE2EReloadOnFileChange: with --watch, writing a new valid file is enough: its limit
// applies without a signal.
func TestServeE2EReloadOnFileChange(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	withLimit := func(limit int) configFunc {
		return func(listen, admin string) string {
			return fmt.Sprintf("listen: %s\nadmin_listen: %s\nupstream: %s\npolicies:\n  - {name: anonymous, algorithm: sliding-log, limit: %d, period: 1h}\ndefault_policy: anonymous\n", listen, admin, up.URL, limit)
		}
	}
	dir := t.TempDir()
	p := startSluiceArgs(t, dir, "sluice.yaml", withLimit(2), "--watch", "50ms")
	if r := get(t, p.proxy, "/watch"); !strings.Contains(r.header.Get("RateLimit-Policy"), "q=2") {
		t.Fatalf("before the change: RateLimit-Policy %q, want q=2", r.header.Get("RateLimit-Policy"))
	}
	listen, admin := strings.TrimPrefix(p.proxy, "http://"), strings.TrimPrefix(p.admin, "http://")
	time.Sleep(20 * time.Millisecond) // a new modification time even on coarse file systems
	writeFile(t, p.config, withLimit(7)(listen, admin))
	deadline := time.Now().Add(5 * time.Second)
	for {
		if r := get(t, p.proxy, "/watch"); strings.Contains(r.header.Get("RateLimit-Policy"), "q=7") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("5s after the file changed the old limit still applies\nstderr:\n%s", p.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestServeE2ETLS: with tls in the configuration the proxy listener speaks only TLS, with the
// configured certificate.
func TestServeE2ETLS(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	dir := t.TempDir()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	writeFile(t, certFile, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
	writeFile(t, keyFile, string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})))
	p := startSluice(t, dir, "sluice.yaml", func(listen, admin string) string {
		return fmt.Sprintf("listen: %s\nadmin_listen: %s\nupstream: %s\ntls: {cert_file: %s, key_file: %s}\npolicies:\n  - {name: anonymous, algorithm: token-bucket, limit: 5, period: 1s}\ndefault_policy: anonymous\n",
			listen, admin, up.URL, certFile, keyFile)
	})
	pool := x509.NewCertPool()
	cert, _ := x509.ParseCertificate(der)
	pool.AddCert(cert)
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	resp, err := client.Get("https://" + strings.TrimPrefix(p.proxy, "http://") + "/tls")
	if err != nil {
		t.Fatalf("https to the proxy: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("RateLimit") == "" {
		t.Fatalf("https: %d, RateLimit %q", resp.StatusCode, resp.Header.Get("RateLimit"))
	}
	if resp, err := e2eClient.Get(p.proxy + "/plain"); err == nil && resp.StatusCode == 200 {
		resp.Body.Close()
		t.Fatal("plain HTTP to a TLS listener was served")
	}
}

// parseFields checks that RateLimit-Policy names one policy with exactly quota q and window w, and
// returns the parsed RateLimit field (its r and t) for the caller's own checks.
func parseFields(h http.Header, policy string, q, w int64) ([]sfMember, error) {
	pol, err := parseRateLimitField(h, "RateLimit-Policy", "q", "w")
	if err != nil {
		return nil, err
	}
	if len(pol) != 1 || pol[0].name != policy || pol[0].params["q"] != q || pol[0].params["w"] != w {
		return nil, fmt.Errorf("RateLimit-Policy %q; want %q;q=%d;w=%d", h.Values("RateLimit-Policy"), policy, q, w)
	}
	return parseRateLimitField(h, "RateLimit", "r", "t")
}

// TestServeE2ERedisDownAtStart: sluice starts while Redis does not answer — a restart during a
// Redis outage must not take the gateway down too. Until Redis answers, the failure mode decides
// (fail-closed: 503, none forwarded) and /readyz says not ready; once Redis is back, decisions go
// to it without a restart.
func TestServeE2ERedisDownAtStart(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	rs.Kill()
	up := newUpstream(t)
	up.slow = 0
	p, err := launch(t, t.TempDir(), "sluice.yaml", redisConfig(up.URL, rs.Addr, "fail-closed"), "/healthz", "--watch", "0")
	if err != nil {
		t.Fatal(err)
	}
	const path = "/partner-a/down-at-start"
	if r := get(t, p.proxy, path, "X-API-Key", partnerKey); r.status != http.StatusServiceUnavailable {
		t.Fatalf("Redis down since the start, fail-closed: %d, want 503", r.status)
	}
	if n := up.count(path); n != 0 {
		t.Fatalf("the upstream saw %d requests while Redis was down", n)
	}
	if resp, err := e2eClient.Get(p.admin + "/readyz"); err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/readyz with Redis down: %v %v", resp, err)
	}
	resp, err := e2eClient.Get(p.admin + "/v1/stats")
	if err != nil {
		t.Fatal(err)
	}
	var st gateway.Stats
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil || st.Store.Reachable || st.Store.Unavailable != 1 || st.Store.Errors != 2 {
		t.Fatalf("/v1/stats with Redis down, after one 503 and a /readyz: %+v %v; want unreachable, 1 request answered 503, 2 store errors (the request's call and /readyz's)", st.Store, err)
	}
	rs.Restart()
	if err := p.waitReady(15 * time.Second); err != nil {
		t.Fatalf("after Redis came back: %v\nstderr:\n%s", err, p.stderr.String())
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		r := get(t, p.proxy, path, "X-API-Key", partnerKey)
		if r.status == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after Redis answers, still %d", r.status)
		}
		time.Sleep(50 * time.Millisecond) // the breaker's next probe
	}
	if n, err := rs.Do("DBSIZE"); err != nil || n == "0" {
		t.Fatalf("Redis holds %q keys (%v): the decision was not made on it", n, err)
	}
	if !strings.Contains(p.stderr.String(), "Redis does not answer; serving anyway") {
		t.Fatalf("the log does not say Redis was down at start:\n%s", p.stderr.String())
	}
}

// TestServeE2EShutdownDelay: with server.shutdown_delay, SIGTERM first makes /readyz answer 503
// while the proxy still serves (a load balancer takes the instance out meanwhile); a second
// signal ends the wait, and the process drains and exits 0.
func TestServeE2EShutdownDelay(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	p := startSluice(t, t.TempDir(), "sluice.yaml", func(listen, admin string) string {
		return fmt.Sprintf(`listen: %s
admin_listen: %s
upstream: %s
server: {shutdown_delay: 10m}
identity:
  - ip: {}
policies:
  - {name: anon, algorithm: token-bucket, limit: 100, period: 1s}
default_policy: anon
`, listen, admin, up.URL)
	})
	p.signal(syscall.SIGTERM)
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := e2eClient.Get(p.admin + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusServiceUnavailable {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz after SIGTERM: %v %v, want 503\nstderr:\n%s", resp, err, p.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Unready, and still serving: well within the 10 minutes.
	r, err := tryGet(p.proxy, "/during-the-delay")
	if err != nil {
		t.Fatalf("a request during shutdown_delay: %v", err)
	}
	if err := checkAllowed(r, "/during-the-delay", "anon", 100, 1); err != nil {
		t.Errorf("a request during shutdown_delay: %v", err)
	}
	p.signal(syscall.SIGTERM) // the second signal: no more waiting
	if code := p.wait(15 * time.Second); code != 0 {
		t.Errorf("exit code %d after the second SIGTERM; want 0\nstderr:\n%s", code, p.stderr.String())
	}
	if !strings.Contains(p.stderr.String(), "shutdown_delay") {
		t.Errorf("the log does not say it waits for shutdown_delay:\n%s", p.stderr.String())
	}
}

package gateway_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/gateway"
)

// upstream is a real HTTP server that counts what reaches it, per path.
type upstream struct {
	*httptest.Server
	mu    sync.Mutex
	count map[string]int
	delay time.Duration
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{count: map[string]int{}}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u.delay > 0 {
			time.Sleep(u.delay) // the upstream's own work, not synchronisation
		}
		u.mu.Lock()
		u.count[r.URL.Path]++
		u.mu.Unlock()
		fmt.Fprintf(w, "xff=%s", r.Header.Get("X-Forwarded-For"))
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) got(path string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.count[path]
}

func sum(key string) string { s := sha256.Sum256([]byte(key)); return hex.EncodeToString(s[:]) }

// frontend is a gateway listening on loopback.
type frontend struct{ URL string }

// engines are the gateway's two front ends: every test runs on each. sluice serve runs fasthttp;
// net/http is the Gateway as an http.Handler.
var engines = []string{"fasthttp", "nethttp"}

// forEachEngine runs test once per engine, as subtests.
func forEachEngine(t *testing.T, test func(t *testing.T, engine string)) {
	for _, e := range engines {
		t.Run(e, func(t *testing.T) { test(t, e) })
	}
}

// start runs a gateway server for the YAML (upstream filled in) behind a real server of the
// engine's kind on a loopback port.
func start(t *testing.T, engine, yaml string, up *upstream) (*frontend, *gateway.Server) {
	t.Helper()
	return startLoggingTo(t, engine, yaml, up, io.Discard)
}

// startLoggingTo is start with the server's log (level info) written to w.
func startLoggingTo(t *testing.T, engine, yaml string, up *upstream, w io.Writer) (*frontend, *gateway.Server) {
	t.Helper()
	cfg, err := config.Parse([]byte(strings.ReplaceAll(yaml, "UPSTREAM", up.URL)), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := gateway.NewTestServer(cfg, "", slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	if engine == "nethttp" {
		hs := httptest.NewServer(srv)
		t.Cleanup(hs.Close)
		return &frontend{hs.URL}, srv
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fs := srv.FastServer()
	done := make(chan error, 1)
	go func() { done <- fs.Serve(ln) }()
	t.Cleanup(func() {
		if err := fs.Shutdown(); err != nil {
			t.Error(err)
		}
		if err := <-done; err != nil {
			t.Errorf("fasthttp server: %v", err)
		}
	})
	return &frontend{"http://" + ln.Addr().String()}, srv
}

func get(t *testing.T, url string, headers ...string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

const base = `
upstream: UPSTREAM
identity:
  - api_key: {header: X-API-Key}
  - jwt: {secret_env: SLUICE_TEST_JWT, algorithms: [HS256]}
  - ip: {trusted_proxies: [TRUSTED]}
policies:
  - {name: anonymous, algorithm: fixed-window, limit: 2, period: 1h}
  - {name: standard, algorithm: fixed-window, limit: 10, period: 1h}
  - {name: per-second, algorithm: token-bucket, limit: 3, period: 1s}
  - {name: per-day, algorithm: fixed-window, limit: 5, period: 24h}
  - {name: queue, algorithm: leaky-bucket, limit: 10, period: 1s, burst: 2}
  - {name: trial, algorithm: fixed-window, limit: 1, period: 1h, dry_run: true}
default_policy: anonymous
clients:
  - {name: partner-a, api_key_sha256: ` + "KEY_A" + `, policy: standard}
  - {name: partner-b, api_key_sha256: ` + "KEY_B" + `, jwt_subject: partner-b, policy: standard}
  - {name: partner-c, api_key_sha256: ` + "KEY_C" + `, policy: [per-second, per-day]}
routes:
  - {method: POST, path_prefix: /reports, cost: 5, policy: standard}
  - {path_prefix: /queue, policy: queue}
  - {path_prefix: /trial, policy: trial}
`

func yamlFor(trusted string) string {
	r := strings.NewReplacer("KEY_A", sum("key-a"), "KEY_B", sum("key-b"), "KEY_C", sum("key-c"), "TRUSTED", trusted)
	return r.Replace(base)
}

const jwtSecret = "a-test-secret-that-is-32-bytes-long!"

func TestMain(m *testing.M) {
	// The jwt source reads its secret from the environment at load.
	if err := setenv("SLUICE_TEST_JWT", jwtSecret); err != nil {
		panic(err)
	}
	m.Run()
}

// A spoofed X-Forwarded-For from a peer that is not a trusted proxy does not change the client
// (all requests count against 127.0.0.1); from a trusted proxy it does.
func TestForwardedForOnlyFromTrustedProxies(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		up := newUpstream(t)
		untrusted, _ := start(t, engine, yamlFor("127.0.0.2/32"), up)
		codes := ""
		for i := 0; i < 3; i++ {
			codes += fmt.Sprint(get(t, untrusted.URL+"/x", "X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i)).StatusCode, " ")
		}
		if codes != "200 200 429 " {
			t.Fatalf("spoofed addresses from an untrusted peer: %s, want 200 200 429 (one client)", codes)
		}
		trusted, _ := start(t, engine, yamlFor("127.0.0.1/32"), up)
		for i := 0; i < 3; i++ {
			if code := get(t, trusted.URL+"/y", "X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i)).StatusCode; code != 200 {
				t.Fatalf("address %d through a trusted proxy: %d, want 200 (each its own client)", i, code)
			}
		}
	})
}

func token(t *testing.T, secret string, exp time.Time) string {
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "partner-b", "exp": exp.Unix()}).SignedString([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	return "Bearer " + s
}

// A valid JWT names partner-b (its contract: 10); an expired or badly signed one names nobody,
// and the request falls through to the anonymous limit of 2.
func TestJWTNamesClientOnlyWhenValid(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		up := newUpstream(t)
		gw, _ := start(t, engine, yamlFor("127.0.0.2/32"), up)
		if r := get(t, gw.URL+"/a", "Authorization", token(t, jwtSecret, time.Now().Add(time.Hour))); !strings.Contains(r.Header.Get("RateLimit-Policy"), `"standard"`) {
			t.Fatalf("valid token: RateLimit-Policy %q, want partner-b's standard", r.Header.Get("RateLimit-Policy"))
		}
		for _, bad := range []string{token(t, jwtSecret, time.Now().Add(-time.Minute)), token(t, "another-secret-that-is-32-bytes-long", time.Now().Add(time.Hour))} {
			if r := get(t, gw.URL+"/a", "Authorization", bad); !strings.Contains(r.Header.Get("RateLimit-Policy"), `"anonymous"`) {
				t.Fatalf("bad token: RateLimit-Policy %q, want the anonymous policy", r.Header.Get("RateLimit-Policy"))
			}
		}
	})
}

// A report costs 5 of partner-a's 10; two reports spend it, the third is refused and never
// reaches the upstream.
func TestRouteCost(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		up := newUpstream(t)
		gw, _ := start(t, engine, yamlFor("127.0.0.2/32"), up)
		post := func() *http.Response {
			req, _ := http.NewRequest(http.MethodPost, gw.URL+"/reports", strings.NewReader("{}"))
			req.Header.Set("X-API-Key", "key-a")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp
		}
		if r := post(); r.StatusCode != 200 || !strings.Contains(r.Header.Get("RateLimit"), "r=5") {
			t.Fatalf("first report: %d %q, want 200 with 5 left", r.StatusCode, r.Header.Get("RateLimit"))
		}
		post()
		if r := post(); r.StatusCode != 429 {
			t.Fatalf("third report: %d, want 429", r.StatusCode)
		}
		if n := up.got("/reports"); n != 2 {
			t.Fatalf("upstream saw %d reports, want 2", n)
		}
	})
}

// Two policies on one client: a refusal by per-second consumes nothing from per-day.
func TestSeveralPoliciesAllOrNothing(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		up := newUpstream(t)
		gw, _ := start(t, engine, yamlFor("127.0.0.2/32"), up)
		codes := ""
		for i := 0; i < 4; i++ {
			codes += fmt.Sprint(get(t, gw.URL+"/m", "X-API-Key", "key-c").StatusCode, " ")
		}
		if codes != "200 200 200 429 " {
			t.Fatalf("4 at once on 3/s and 5/day: %s", codes)
		}
		r := get(t, gw.URL+"/m", "X-API-Key", "key-c")
		if !strings.Contains(r.Header.Get("RateLimit"), `"per-second"`) {
			t.Fatalf("refusal names %q, want per-second", r.Header.Get("RateLimit"))
		}
		// per-day still has 2 (3 consumed): after the bucket refills, exactly 2 more pass.
		time.Sleep(700 * time.Millisecond) // the bucket's refill is what is tested: 3 per second
		codes = ""
		for i := 0; i < 3; i++ {
			codes += fmt.Sprint(get(t, gw.URL+"/m", "X-API-Key", "key-c").StatusCode, " ")
		}
		if codes != "200 200 429 " {
			t.Fatalf("after a refill, per-day's last 2: %s, want 200 200 429", codes)
		}
	})
}

// The leaky bucket holds instead of refusing while its queue has room, then refuses; a client
// that leaves while held is not forwarded.
func TestLeakyBucketHoldsThenRefuses(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		up := newUpstream(t)
		gw, srv := start(t, engine, yamlFor("127.0.0.2/32"), up)
		var wg sync.WaitGroup
		var ok, refused atomic.Int32
		var slowest atomic.Int64
		for i := 0; i < 5; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				start := time.Now()
				switch get(t, gw.URL+"/queue").StatusCode {
				case 200:
					ok.Add(1)
					if d := int64(time.Since(start)); d > slowest.Load() {
						slowest.Store(d)
					}
				case 429:
					refused.Add(1)
				}
			}()
		}
		wg.Wait()
		if ok.Load() != 3 || refused.Load() != 2 {
			t.Fatalf("5 at once on a queue of 10/s with room for 2: %d forwarded, %d refused; want 3 and 2", ok.Load(), refused.Load())
		}
		if d := time.Duration(slowest.Load()); d < 190*time.Millisecond {
			t.Fatalf("the last queued request was served after %v, want ≥ 200ms (held, not forwarded at once)", d)
		}
		// A client that gives up while held is not forwarded.
		time.Sleep(300 * time.Millisecond) // let the queue drain (its drain rate is the subject)
		before := up.got("/queue")
		get(t, gw.URL+"/queue") // takes the free slot; the next is held 100ms
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, gw.URL+"/queue", nil)
		if _, err := http.DefaultClient.Do(req); err == nil {
			t.Fatal("a request held 100ms returned before its client's 20ms deadline")
		}
		time.Sleep(150 * time.Millisecond) // past the hold: had it been forwarded, it would be by now
		if n := up.got("/queue") - before; n != 1 {
			t.Fatalf("upstream saw %d requests, want 1 (the abandoned one must not be forwarded)", n)
		}
		_ = srv
	})
}

// A dry-run policy decides and counts, adds the headers, and never refuses.
func TestDryRunNeverRefuses(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		up := newUpstream(t)
		gw, srv := start(t, engine, yamlFor("127.0.0.2/32"), up)
		for i := 0; i < 3; i++ {
			r := get(t, gw.URL+"/trial")
			if r.StatusCode != 200 || !strings.Contains(r.Header.Get("RateLimit-Policy"), `"trial"`) {
				t.Fatalf("dry-run request %d: %d %q", i, r.StatusCode, r.Header.Get("RateLimit-Policy"))
			}
		}
		metrics := httptest.NewServer(srv.Admin())
		defer metrics.Close()
		resp, err := http.Get(metrics.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(body), `sluice_decisions_total{client="anonymous",policy="trial",result="dry_run_refused"} 2`) {
			t.Fatalf("metrics do not count the 2 dry-run refusals:\n%s", grep(string(body), "sluice_decisions_total"))
		}
	})
}

// Partner A flooding does not slow or refuse partner B.
func TestFloodingPartnerDoesNotHurtAnother(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		up := newUpstream(t)
		gw, srv := start(t, engine, yamlFor("127.0.0.2/32"), up)
		stop := make(chan struct{})
		retried := make(chan struct{}) // closed at partner-a's second refusal: an early retry
		var refusals atomic.Int32
		var once sync.Once
		var wg sync.WaitGroup
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
						if get(t, gw.URL+"/flood", "X-API-Key", "key-a").StatusCode == 429 && refusals.Add(1) == 2 {
							once.Do(func() { close(retried) })
						}
					}
				}
			}()
		}
		var worst time.Duration
		for i := 0; i < 10; i++ {
			start := time.Now()
			if code := get(t, gw.URL+"/b", "X-API-Key", "key-b").StatusCode; code != 200 {
				t.Errorf("partner-b request %d during partner-a's flood: %d", i, code)
			}
			worst = max(worst, time.Since(start))
		}
		select { // the flood has come back early at least once before it stops
		case <-retried:
		case <-time.After(10 * time.Second):
			t.Fatal("partner-a's flood was not refused twice in 10s")
		}
		close(stop)
		wg.Wait()
		t.Logf("partner-b's slowest request during the flood: %v", worst)
		if worst > time.Second {
			t.Fatalf("partner-b waited %v during partner-a's flood", worst)
		}
		// And the flood's retries are counted as early retries of partner-a.
		admin := httptest.NewServer(srv.Admin())
		defer admin.Close()
		resp, _ := http.Get(admin.URL + "/metrics")
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(body), `sluice_early_retries_total{client="partner-a"}`) || strings.Contains(string(body), `sluice_early_retries_total{client="partner-b"}`) {
			t.Fatalf("early retries:\n%s", grep(string(body), "early_retries"))
		}
	})
}

func grep(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// A streamed response reaches the client as it is written: the first chunk arrives while the
// upstream still holds the second.
func TestStreamsResponses(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		release := make(chan struct{})
		up := &upstream{count: map[string]int{}}
		up.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, "first\n")
			w.(http.Flusher).Flush()
			<-release
			fmt.Fprint(w, "second\n")
		}))
		defer up.Close()
		gw, _ := start(t, engine, yamlFor("127.0.0.2/32"), up)
		// If the gateway held the first chunk back, reading it would wait for the second: the client's
		// timeout turns that into a failure.
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(gw.URL + "/stream")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		buf := make([]byte, 6)
		if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "first\n" {
			close(release)
			t.Fatalf("first chunk: %q %v", buf, err)
		}
		close(release)
		rest, _ := io.ReadAll(resp.Body)
		if string(rest) != "second\n" {
			t.Fatalf("second chunk: %q", rest)
		}
	})
}

package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/gateway"
	"github.com/sluicehq/sluice/internal/redistest"
)

// The forward-auth tests' parties: the proxy sends its sub-requests from faProxy, the only
// trusted proxy; faStranger is any other address.
const (
	faProxy    = "127.0.0.2"
	faStranger = "127.0.0.3"
)

// faYAML: partner-a (key-a) has 10 an hour; anonymous clients 5 each an hour (token buckets:
// nothing refills while a test runs, and no window boundary can fall inside one); POST /reports
// costs 5; /queue is a leaky bucket of one request every 250 ms with room for 5 waiting, and
// /slow-queue one of one every 30 s with room for one waiting (max_delay 1m lets it wait).
const faYAML = `
upstream: http://127.0.0.1:9
identity:
  - api_key: {header: X-API-Key}
  - ip: {trusted_proxies: [` + faProxy + `/32]}
policies:
  - {name: per-ip, algorithm: token-bucket, limit: 5, period: 1h}
  - {name: standard, algorithm: token-bucket, limit: 10, period: 1h}
  - {name: queue, algorithm: leaky-bucket, limit: 4, period: 1s, burst: 5}
  - {name: slow-queue, algorithm: leaky-bucket, limit: 1, period: 30s, burst: 1}
default_policy: per-ip
clients:
  - {name: partner-a, api_key_sha256: KEY_A, policy: standard}
routes:
  - {method: POST, path_prefix: /reports, cost: 5}
  - {path_prefix: /queue, policy: queue}
  - {path_prefix: /slow-queue, policy: slow-queue}
limits: {max_delay: 1m}
`

// faServer runs a Server for yaml (KEY_A filled in) and serves its admin listener on loopback.
func faServer(t *testing.T, yaml string) (*gateway.Server, string) {
	t.Helper()
	cfg, err := config.Parse([]byte(strings.ReplaceAll(yaml, "KEY_A", sum("key-a"))), "forward-auth.yaml")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := gateway.NewTestServer(cfg, "", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return srv, httptestServer(t, srv)
}

// faAnswer is a sub-request's answer, its body read.
type faAnswer struct {
	status int
	header http.Header
	body   string
}

// subRequest sends a sub-request to /v1/forward-auth with c, as a proxy would: method (the
// sub-request's own) and the header lines given, each added.
func subRequest(t *testing.T, c *http.Client, admin, method string, headers ...[2]string) faAnswer {
	t.Helper()
	return subRequestCtx(t, context.Background(), c, admin, method, headers...)
}

func subRequestCtx(t *testing.T, ctx context.Context, c *http.Client, admin, method string, headers ...[2]string) faAnswer {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, admin+"/v1/forward-auth", nil)
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
	return faAnswer{resp.StatusCode, resp.Header, string(b)}
}

// The two ways proxies report the original request.
var faFamilies = []struct {
	name             string
	method, uri, xff string // the header names
}{
	{"Traefik and Caddy", "X-Forwarded-Method", "X-Forwarded-Uri", "X-Forwarded-For"},
	{"nginx", "X-Original-Method", "X-Original-URI", "X-Forwarded-For"},
}

// original returns the header lines of one family for a request of method on uri.
func original(f int, method, uri string, more ...[2]string) [][2]string {
	return append([][2]string{{faFamilies[f].method, method}, {faFamilies[f].uri, uri}}, more...)
}

// peekPartner returns partner-a's remaining quota, peeked (cost 0) through /v1/check.
func peekPartner(t *testing.T, admin string) int64 {
	t.Helper()
	code, body := postCheck(t, admin, `{"client":"partner-a","cost":0}`)
	var out struct {
		Decisions []struct{ Remaining int64 }
	}
	if err := json.Unmarshal(body, &out); err != nil || code != http.StatusOK || len(out.Decisions) != 1 {
		t.Fatalf("peek: %d %v %s", code, err, body)
	}
	return out.Decisions[0].Remaining
}

// metricSum sums the samples of name in the admin listener's /metrics whose labels include
// every one of labels (`client="partner-a"`).
func metricSum(t *testing.T, admin, name string, labels ...string) float64 {
	t.Helper()
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var total float64
lines:
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(line, l) {
				continue lines
			}
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		total += v
	}
	return total
}

// Both header families decide the original request exactly as the proxy listener would: the
// client by its forwarded credential, else by the address in X-Forwarded-For (the sub-request
// comes from a trusted proxy); 200 with an empty body and the RateLimit fields while allowed,
// then 429 with Retry-After, the fields and the problem; whatever method the sub-request itself
// has. The decisions are counted in the metrics like the proxy's.
func TestForwardAuthHeaderFamilies(t *testing.T) {
	for f, fam := range faFamilies {
		t.Run(fam.name, func(t *testing.T) {
			_, admin := faServer(t, faYAML)
			proxy := from(t, faProxy)
			for i, method := range []string{http.MethodGet, http.MethodPost, http.MethodHead, http.MethodPut} {
				a := subRequest(t, proxy, admin, method, original(f, "GET", "/items/7?q=1", [2]string{"X-API-Key", "key-a"})...)
				if a.status != http.StatusOK || a.body != "" {
					t.Fatalf("partner-a, sub-request %d (%s): %d %q, want 200 and no body", i+1, method, a.status, a.body)
				}
				if got, want := a.header.Get("RateLimit-Policy"), `"standard";q=10;w=3600`; got != want {
					t.Errorf("RateLimit-Policy %q, want %q", got, want)
				}
				if got, want := a.header.Get("RateLimit"), `"standard";r=`+strconv.Itoa(9-i)+`;t=`; !strings.HasPrefix(got, want) {
					t.Errorf("RateLimit %q, want %s…", got, want)
				}
			}
			if got := metricSum(t, admin, "sluice_decisions_total", `client="partner-a"`, `result="allowed"`); got != 4 {
				t.Errorf("sluice_decisions_total for partner-a, allowed: %v, want 4", got)
			}
			// Anonymous clients, told apart by the address the proxy forwards.
			for i := range 5 {
				if a := subRequest(t, proxy, admin, "GET", original(f, "GET", "/items", [2]string{fam.xff, "198.51.100.7"})...); a.status != http.StatusOK {
					t.Fatalf("198.51.100.7, request %d of 5: %d %s", i+1, a.status, a.body)
				}
			}
			a := subRequest(t, proxy, admin, "GET", original(f, "GET", "/items", [2]string{fam.xff, "198.51.100.7"})...)
			if a.status != http.StatusTooManyRequests {
				t.Fatalf("198.51.100.7, request 6: %d %s, want 429", a.status, a.body)
			}
			if ra, err := strconv.Atoi(a.header.Get("Retry-After")); err != nil || ra < 1 {
				t.Errorf("Retry-After %q, want whole seconds ≥ 1", a.header.Get("Retry-After"))
			}
			if !strings.HasPrefix(a.header.Get("RateLimit"), `"per-ip";r=0;t=`) || a.header.Get("RateLimit-Policy") != `"per-ip";q=5;w=3600` {
				t.Errorf("refused: RateLimit %q, RateLimit-Policy %q", a.header.Get("RateLimit"), a.header.Get("RateLimit-Policy"))
			}
			var p struct {
				Type   string `json:"type"`
				Status int    `json:"status"`
			}
			if err := json.Unmarshal([]byte(a.body), &p); err != nil || p.Type != "https://iana.org/assignments/http-problem-types#quota-exceeded" || p.Status != 429 ||
				a.header.Get("Content-Type") != "application/problem+json" {
				t.Errorf("refused: %s %q, want the quota-exceeded problem", a.header.Get("Content-Type"), a.body)
			}
			if a := subRequest(t, proxy, admin, "GET", original(f, "GET", "/items", [2]string{fam.xff, "198.51.100.8"})...); a.status != http.StatusOK {
				t.Errorf("another address, 198.51.100.8: %d, want 200 (a quota of its own)", a.status)
			}
			if got := metricSum(t, admin, "sluice_decisions_total", `client="anonymous"`, `result="refused"`); got != 1 {
				t.Errorf("sluice_decisions_total for anonymous, refused: %v, want 1", got)
			}
		})
	}
}

// A sub-request from an address that is not a trusted proxy is answered 403, saying so, and
// nothing is decided or consumed: otherwise anyone who can reach the admin listener could spend
// any client's quota, and name any address and URI. Without an ip source, no proxy is trusted.
func TestForwardAuthUntrustedPeer(t *testing.T) {
	_, admin := faServer(t, faYAML)
	stranger := from(t, faStranger)
	for f := range faFamilies {
		for _, xff := range []string{"", faProxy, "198.51.100.7"} {
			headers := original(f, "POST", "/reports", [2]string{"X-API-Key", "key-a"})
			if xff != "" {
				headers = append(headers, [2]string{"X-Forwarded-For", xff})
			}
			a := subRequest(t, stranger, admin, "GET", headers...)
			if a.status != http.StatusForbidden || !strings.Contains(a.body, "trusted_proxies") || !strings.Contains(a.body, faStranger) ||
				a.header.Get("Content-Type") != "application/problem+json" || a.header.Get("RateLimit") != "" {
				t.Errorf("from %s (X-Forwarded-For %q): %d %v %s, want 403 naming trusted_proxies and the address, no fields", faStranger, xff, a.status, a.header, a.body)
			}
		}
	}
	if got := peekPartner(t, admin); got != 10 {
		t.Errorf("partner-a has %d left after refused sub-requests, want 10 (nothing consumed)", got)
	}
	if got := metricSum(t, admin, "sluice_decisions_total"); got != 1 { // the peek
		t.Errorf("%v decisions counted, want only the peek's", got)
	}

	_, admin = faServer(t, strings.Replace(faYAML, "  - ip: {trusted_proxies: ["+faProxy+"/32]}\n", "", 1))
	a := subRequest(t, from(t, faProxy), admin, "GET", original(0, "GET", "/items", [2]string{"X-API-Key", "key-a"})...)
	if a.status != http.StatusForbidden || !strings.Contains(a.body, faProxy) {
		t.Errorf("no ip source: %d %s, want 403", a.status, a.body)
	}
	if got := peekPartner(t, admin); got != 10 {
		t.Errorf("no ip source: partner-a has %d left, want 10", got)
	}
}

// A trusted proxy that does not say what the original request was gets 400, naming the headers
// it should send, and nothing is decided: missing fields, half a pair, a field twice, the two
// pairs disagreeing (each proxy passes the other pair on from the client), a URI that is not
// one, a method that is not one.
func TestForwardAuthMissingHeaders(t *testing.T) {
	_, admin := faServer(t, faYAML)
	proxy := from(t, faProxy)
	key := [2]string{"X-API-Key", "key-a"}
	for _, tt := range []struct {
		name    string
		headers [][2]string
		words   []string
	}{
		{"none", [][2]string{key}, []string{"X-Forwarded-Method", "X-Forwarded-Uri", "X-Original-Method", "X-Original-URI"}},
		{"X-Forwarded-Method alone", [][2]string{key, {"X-Forwarded-Method", "GET"}}, []string{"without X-Forwarded-Uri"}},
		{"X-Forwarded-Uri alone", [][2]string{key, {"X-Forwarded-Uri", "/items"}}, []string{"without X-Forwarded-Method"}},
		{"X-Original-URI alone", [][2]string{key, {"X-Original-URI", "/items"}}, []string{"without X-Original-Method"}},
		{"X-Original-Method alone", [][2]string{key, {"X-Original-Method", "GET"}}, []string{"without X-Original-URI"}},
		{"X-Original-URI twice", [][2]string{key, {"X-Original-Method", "GET"}, {"X-Original-URI", "/items"}, {"X-Original-URI", "/reports"}}, []string{"X-Original-URI was sent 2 times"}},
		{"the pairs disagree", append(original(0, "POST", "/reports", key), original(1, "POST", "/items")...), []string{"disagree"}},
		{"not a URI", original(1, "GET", "items?key=secret"), []string{"X-Original-URI is not a request URI"}},
		{"not a method", original(0, "GE T", "/items"), []string{"not an HTTP method"}},
	} {
		a := subRequest(t, proxy, admin, "GET", tt.headers...)
		if a.status != http.StatusBadRequest || a.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s: %d %s, want 400", tt.name, a.status, a.body)
			continue
		}
		for _, w := range tt.words {
			if !strings.Contains(a.body, w) {
				t.Errorf("%s: %s does not say %q", tt.name, a.body, w)
			}
		}
		if strings.Contains(a.body, "secret") || strings.Contains(a.body, "key-a") {
			t.Errorf("%s: %s quotes what the client sent", tt.name, a.body)
		}
	}
	if got := peekPartner(t, admin); got != 10 {
		t.Errorf("partner-a has %d left, want 10 (nothing decided)", got)
	}
	// The pairs agreeing is one request (a proxy that sets both).
	if a := subRequest(t, proxy, admin, "GET", append(original(0, "GET", "/items", key), original(1, "GET", "/items")...)...); a.status != http.StatusOK {
		t.Errorf("both pairs, agreeing: %d %s, want 200", a.status, a.body)
	}
}

// forward_auth.refused_status is the status of a refusal (nginx's auth_request passes only 401
// and 403 on), with everything else of the answer unchanged.
func TestForwardAuthRefusedStatus(t *testing.T) {
	_, admin := faServer(t, faYAML+"forward_auth: {refused_status: 403}\n")
	proxy := from(t, faProxy)
	xff := [2]string{"X-Forwarded-For", "198.51.100.7"}
	for range 5 {
		if a := subRequest(t, proxy, admin, "GET", original(1, "GET", "/items", xff)...); a.status != http.StatusOK {
			t.Fatalf("allowed: %d %s", a.status, a.body)
		}
	}
	a := subRequest(t, proxy, admin, "GET", original(1, "GET", "/items", xff)...)
	if a.status != http.StatusForbidden || a.header.Get("Retry-After") == "" || !strings.HasPrefix(a.header.Get("RateLimit"), `"per-ip";r=0;`) ||
		!strings.Contains(a.body, `"status":403`) || !strings.Contains(a.body, "quota-exceeded") {
		t.Errorf("refused: %d %v %s, want 403 with Retry-After, RateLimit and the quota-exceeded problem", a.status, a.header, a.body)
	}
}

// Routes and costs apply to the original method and path, cleaned as the proxy listener cleans
// it: "/a/../reports" is /reports (an upstream that resolves dot segments serves it as such),
// and so is its percent-encoded form; the query is not the path.
func TestForwardAuthRouteCost(t *testing.T) {
	for f, fam := range faFamilies {
		t.Run(fam.name, func(t *testing.T) {
			_, admin := faServer(t, faYAML)
			proxy := from(t, faProxy)
			key := [2]string{"X-API-Key", "key-a"}
			for _, tt := range []struct {
				method, uri string
				remaining   int
			}{
				{"GET", "/reports", 9},                     // GET is not the POST route: cost 1
				{"POST", "/a/../reports?x=/items", 4},      // cost 5
				{"POST", "/items/%2e%2e/reports/7", -1},    // cost 5 again: refused (4 left)
				{"POST", "//reports", -1},                  // cleaned to /reports
				{"POST", "/items?/reports", 3},             // cost 1: the query is not the path
				{"POST", "http://api.example/reports", -1}, // an absolute-form URI's path
			} {
				a := subRequest(t, proxy, admin, "GET", original(f, tt.method, tt.uri, key)...)
				switch {
				case tt.remaining < 0 && a.status != http.StatusTooManyRequests:
					t.Errorf("%s %s: %d, want 429 (cost 5, fewer left)", tt.method, tt.uri, a.status)
				case tt.remaining >= 0 && (a.status != http.StatusOK || !strings.HasPrefix(a.header.Get("RateLimit"), `"standard";r=`+strconv.Itoa(tt.remaining)+`;`)):
					t.Errorf("%s %s: %d RateLimit %q, want 200 with r=%d", tt.method, tt.uri, a.status, a.header.Get("RateLimit"), tt.remaining)
				}
			}
		})
	}
}

// A leaky bucket's hold holds the sub-request (the proxy waits for it), then answers 200; a
// sub-request given up while held (its client left) is counted as abandoned and not answered.
func TestForwardAuthHold(t *testing.T) {
	_, admin := faServer(t, faYAML)
	proxy := from(t, faProxy)
	xff := [2]string{"X-Forwarded-For", "198.51.100.7"}
	start := time.Now()
	if a := subRequest(t, proxy, admin, "GET", original(0, "GET", "/queue", xff)...); a.status != http.StatusOK {
		t.Fatalf("first: %d %s", a.status, a.body)
	}
	a := subRequest(t, proxy, admin, "GET", original(0, "GET", "/queue", xff)...)
	took := time.Since(start)
	if a.status != http.StatusOK || !strings.HasPrefix(a.header.Get("RateLimit-Policy"), `"queue";`) {
		t.Fatalf("second: %d %v %s, want 200", a.status, a.header, a.body)
	}
	// One every 250 ms: the second is let through no sooner than 250 ms after the first was
	// decided (after start), however late it came.
	if took < 250*time.Millisecond {
		t.Errorf("the second was answered %v after the first was sent, want at least 250 ms (held)", took)
	}
	if got := metricSum(t, admin, "sluice_decisions_total", `result="delayed"`); got != 1 {
		t.Fatalf("delayed decisions: %v, want 1", got)
	}

	// On /slow-queue the second waits about 30 s; its client leaves once it is held.
	if a := subRequest(t, proxy, admin, "GET", original(0, "GET", "/slow-queue", xff)...); a.status != http.StatusOK {
		t.Fatalf("slow-queue, first: %d %s", a.status, a.body)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var answered atomic.Bool
	var failed atomic.Value // the error that ended it, once it ended
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, admin+"/v1/forward-auth", nil)
		for _, h := range original(0, "GET", "/slow-queue", xff) {
			req.Header.Set(h[0], h[1])
		}
		resp, err := proxy.Do(req)
		if err != nil {
			failed.Store(err)
			return
		}
		resp.Body.Close()
		answered.Store(true)
	}()
	for metricSum(t, admin, "sluice_decisions_total", `result="delayed"`) < 2 {
		select {
		case <-done:
			t.Fatalf("the held sub-request ended before it was held (answered %v, error %v)", answered.Load(), failed.Load())
		case <-time.After(5 * time.Millisecond): // polling the metric until the hold begins
		}
	}
	cancel()
	<-done
	if answered.Load() {
		t.Fatal("the abandoned sub-request was answered")
	}
	deadline := time.Now().Add(5 * time.Second)
	for metricSum(t, admin, "sluice_abandoned_total", `client="anonymous"`) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("sluice_abandoned_total did not count the abandoned sub-request")
		}
		time.Sleep(5 * time.Millisecond) // polling: the server notices the closed connection on its own
	}
}

// A request the store cannot decide gets the decision layer's answer: with Redis down and the
// store failing closed, 503 with Retry-After and the store-unavailable problem.
func TestForwardAuthStoreDown(t *testing.T) {
	rs := redistest.Start(t)
	rs.Kill()
	_, admin := faServer(t, faYAML+"store: {type: redis, addrs: ["+rs.Addr+"], on_error: fail-closed}\n")
	a := subRequest(t, from(t, faProxy), admin, "GET", original(0, "GET", "/items", [2]string{"X-API-Key", "key-a"})...)
	if a.status != http.StatusServiceUnavailable || a.header.Get("Retry-After") == "" || !strings.Contains(a.body, "https://sluice.dev/problems/store-unavailable") {
		t.Errorf("Redis down: %d %v %s, want 503 with Retry-After and the store-unavailable problem", a.status, a.header, a.body)
	}
	if n := metricSum(t, admin, "sluice_undecided_total", `kind="unavailable"`); n != 1 {
		t.Errorf("sluice_undecided_total{kind=unavailable} = %v, want 1", n)
	}
}

// A body is not read beyond a small bound (the proxies send none): a sub-request with a large
// one is answered after at most a few KiB of it were read.
func TestForwardAuthBodyBounded(t *testing.T) {
	srv, _ := faServer(t, faYAML)
	body := &countingReader{r: bytes.NewReader(make([]byte, 8<<20))}
	req := httptest.NewRequest(http.MethodPost, "/v1/forward-auth", body)
	req.RemoteAddr = faProxy + ":4711"
	for _, h := range original(0, "GET", "/items", [2]string{"X-API-Key", "key-a"}) {
		req.Header.Set(h[0], h[1])
	}
	rec := httptest.NewRecorder()
	srv.Admin().ServeHTTP(rec, req)
	if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Header().Get("RateLimit"), `"standard";r=9;`) {
		t.Fatalf("with an 8 MiB body: %d %v %s, want 200", rec.Code, rec.Header(), rec.Body)
	}
	if n := body.n.Load(); n > 8<<10 {
		t.Errorf("%d bytes of the body were read, want at most a few KiB", n)
	}
}

type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// A policy keyed by a query parameter counts by the original request's query, not the
// sub-request's (which has none).
func TestForwardAuthKeyByQuery(t *testing.T) {
	_, admin := faServer(t, `
upstream: http://127.0.0.1:9
identity:
  - ip: {trusted_proxies: [`+faProxy+`/32]}
policies:
  - {name: per-region, algorithm: fixed-window, limit: 2, period: 1h, key_by: [{query: region}]}
default_policy: per-region
`)
	proxy := from(t, faProxy)
	xff := [2]string{"X-Forwarded-For", "198.51.100.7"}
	var got []int
	for _, uri := range []string{"/a?region=eu", "/b?region=eu", "/c?region=eu", "/d?region=us", "/e?region=us", "/f"} {
		got = append(got, subRequest(t, proxy, admin, "GET", original(0, "GET", uri, xff)...).status)
	}
	if want := []int{200, 200, 429, 200, 200, 200}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("statuses %v, want %v: eu's two, then refused; us its own two; no region its own", got, want)
	}
}

package gateway_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/gateway"
)

// logBuffer is a log's output, safe to read while the server writes it.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startLogged is start for the fasthttp engine (as sluice serve runs it) with the server's log
// written to a buffer.
func startLogged(t *testing.T, yaml string, up *upstream) (*frontend, *gateway.Server, *logBuffer) {
	t.Helper()
	logs := &logBuffer{}
	fe, srv := startLoggingTo(t, "fasthttp", yaml, up, logs)
	return fe, srv, logs
}

// metricValue reads one sample of the admin listener's /metrics.
func metricValue(t *testing.T, admin, name string) string {
	t.Helper()
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("no %s in /metrics", name)
	}
	return string(m[1])
}

// A client's malformed chunked body is the client's fault: 400 with a problem body, not a 502,
// and not counted as an upstream error.
func TestMalformedChunkedBody(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		up := newEcho(t)
		gw, srv := start(t, engine, forwardYAML, up)
		admin := httptestServer(t, srv)
		resp, _, _, err := rawExchange(t, gw, "POST /upload HTTP/1.1\r\nHost: api.example\r\nTransfer-Encoding: chunked\r\n\r\n"+
			"5\r\nhello\r\nZZ-not-a-size\r\n\r\n")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Content-Type") != "application/problem+json" ||
			!strings.Contains(string(body), "chunked") {
			t.Fatalf("malformed chunked body: %d %q %s; want 400, a problem saying so", resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
		if v := metricValue(t, admin, "sluice_upstream_errors_total"); v != "0" {
			t.Fatalf("sluice_upstream_errors_total = %s after a client's malformed body; want 0", v)
		}
	})
}

// Requests that cannot be read are logged with the client's address and what was wrong, never
// with what they carried (a credential), and at most 10 lines a second: the rest are counted
// in one summary line.
func TestMalformedRequestsLogged(t *testing.T) {
	up := newEcho(t)
	gw, _, logs := startLogged(t, forwardYAML, up)
	const n = 40
	for i := range n {
		raw := "GET / HTTP/1.1\r\nHost: a\r\nX-API-Key: secret-key-4711\r\nAuthorization: Bearer secret-token-4711\r\nNo colon in this line secret-4711\r\n\r\n"
		if i%2 == 1 {
			raw = "NOT HTTP secret-key-4711\r\n\r\n"
		}
		resp, _, _, err := rawExchange(t, gw, raw)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("request %d: %d, want 400", i, resp.StatusCode)
		}
	}
	// The summary comes a second after the first line left out; wait for it, with a bound.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "lines suppressed") {
		if time.Now().After(deadline) {
			t.Fatalf("no summary of the suppressed lines:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond) // polling the log the server writes on its own timer
	}
	text := logs.String()
	lines := regexp.MustCompile(`(?m)^.*msg="malformed request" .*$`).FindAllString(text, -1)
	summary := regexp.MustCompile(`lines suppressed" suppressed=(\d+)`).FindStringSubmatch(text)
	if len(lines) == 0 || len(lines) > 10*3 { // 10 a second; the 40 requests may span a few seconds
		t.Fatalf("%d lines for %d malformed requests; want 1..30:\n%s", len(lines), n, text)
	}
	var suppressed int
	for _, m := range regexp.MustCompile(`lines suppressed" suppressed=(\d+)`).FindAllStringSubmatch(text, -1) {
		var k int
		fmt.Sscan(m[1], &k)
		suppressed += k
	}
	if summary == nil || len(lines)+suppressed != n {
		t.Fatalf("%d lines logged and %d suppressed; want %d in all:\n%s", len(lines), suppressed, n, text)
	}
	for _, l := range lines {
		if !strings.Contains(l, "peer=127.0.0.1:") || !strings.Contains(l, "problem=") {
			t.Fatalf("a line without the peer or the problem: %s", l)
		}
	}
	if strings.Contains(text, "secret") {
		t.Fatalf("the log quotes the requests' credentials:\n%s", text)
	}
}

// The admin listener does not wait for ever: a header that never ends, or comes a byte at a
// time, is cut at the header timeout; a /v1/check body that never ends at the read timeout; an
// idle connection at the idle timeout; a header over 32 KiB is 431.
func TestAdminListenerBounds(t *testing.T) {
	oldHeader := gateway.SetHeaderTimeout(300 * time.Millisecond)
	defer gateway.SetHeaderTimeout(oldHeader)
	defer gateway.SetAdminTimeouts(700*time.Millisecond, 5*time.Second, 300*time.Millisecond)()
	up := newUpstream(t)
	cfg, err := config.Parse([]byte(strings.ReplaceAll(forwardYAML, "UPSTREAM", up.URL)), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := gateway.NewTestServer(cfg, "", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := srv.AdminServer()
	go hs.Serve(ln)
	defer hs.Close()
	addr := ln.Addr().String()

	// closedWithin sends first, then (if trickle) a byte every 50ms of rest, and reports how long
	// the server took to close the connection; it fails the test if it is still open after limit.
	closedWithin := func(name, first, rest string, limit time.Duration) time.Duration {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		start := time.Now()
		if _, err := io.WriteString(c, first); err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		defer close(stop)
		if rest != "" {
			go func() {
				tick := time.NewTicker(50 * time.Millisecond) // the slow client's pace, not synchronisation
				defer tick.Stop()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					case <-tick.C:
						if _, err := c.Write([]byte{rest[i%len(rest)]}); err != nil {
							return
						}
					}
				}
			}()
		}
		c.SetReadDeadline(start.Add(limit))
		_, err = io.Copy(io.Discard, c) // whatever it answers, until it closes
		took := time.Since(start)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("%s: the admin listener kept the connection open for %v", name, limit)
		}
		return took
	}
	const slack = 3 * time.Second // a loaded machine under -race
	closedWithin("a header that never ends", "GET /metrics HTTP/1.1\r\nHost: a\r\n", "", 300*time.Millisecond+slack)
	closedWithin("a header a byte at a time", "GET /metrics HTTP/1.1\r\n", "X-Slow: aaaa\r\n", 300*time.Millisecond+slack)
	if took := closedWithin("a /v1/check body that never ends", "POST /v1/check HTTP/1.1\r\nHost: a\r\nContent-Length: 1000\r\n\r\n{\"client\":", "", 700*time.Millisecond+slack); took < 600*time.Millisecond {
		t.Errorf("a /v1/check body that never ends was cut after %v, before the read timeout (700ms)", took)
	}
	closedWithin("an idle connection", "GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n", "", 300*time.Millisecond+slack)

	resp, _, _, err := rawExchange(t, &frontend{"http://" + addr}, "GET /metrics HTTP/1.1\r\nHost: a\r\nX-Big: "+strings.Repeat("b", 40<<10)+"\r\n\r\n")
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("a 40 KiB header: %d, want 431", resp.StatusCode)
	}
}

// POST /v1/check reads one JSON object of at most 64 KiB and nothing after it; a negative cost,
// a body too large, trailing data and another method are problems of their own.
func TestCheckRequestValidation(t *testing.T) {
	up := newUpstream(t)
	_, srv := start(t, "nethttp", yamlFor("127.0.0.2/32"), up)
	admin := httptestServer(t, srv)
	type problemBody struct {
		Type, Title, Detail string
		Status              int
	}
	do := func(method, body string) (*http.Response, problemBody) {
		t.Helper()
		req, _ := http.NewRequest(method, admin+"/v1/check", strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var p problemBody
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
			if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
				t.Fatalf("%s %q: %d with Content-Type %q, want a problem body: %s", method, body, resp.StatusCode, ct, raw)
			}
			if err := json.Unmarshal(raw, &p); err != nil || p.Status != resp.StatusCode || p.Detail == "" {
				t.Fatalf("%s %q: body %s is not a problem of status %d (%v)", method, body, raw, resp.StatusCode, err)
			}
		}
		return resp, p
	}
	if resp, _ := do(http.MethodPost, `{"client":"partner-a","cost":0}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("a good request: %d", resp.StatusCode)
	}
	if resp, p := do(http.MethodPost, `{"client":"partner-a","cost":-1}`); resp.StatusCode != http.StatusBadRequest ||
		p.Type != "about:blank" || !strings.Contains(p.Detail, "cost -1 is negative") {
		t.Errorf("a negative cost: %d %+v; want 400, the invalid-cost problem", resp.StatusCode, p)
	}
	big := `{"client":"partner-a","key":"` + strings.Repeat("k", 70<<10) + `"}`
	if resp, _ := do(http.MethodPost, big); resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("a 70 KiB body: %d, want 413", resp.StatusCode)
	}
	for _, trailing := range []string{`{"client":"partner-a"} garbage`, `{"client":"partner-a"}{"client":"partner-b"}`} {
		if resp, p := do(http.MethodPost, trailing); resp.StatusCode != http.StatusBadRequest || !strings.Contains(p.Detail, "nothing after it") {
			t.Errorf("%q: %d %+v; want 400", trailing, resp.StatusCode, p)
		}
	}
	if resp, _ := do(http.MethodPost, "{\"client\":\"partner-a\"}\n\n"); resp.StatusCode != http.StatusOK {
		t.Errorf("a body with trailing white space: %d, want 200", resp.StatusCode)
	}
	for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodDelete, "PATCH"} {
		if resp, _ := do(m, ""); resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "POST" {
			t.Errorf("%s /v1/check: %d, Allow %q; want 405, Allow: POST", m, resp.StatusCode, resp.Header.Get("Allow"))
		}
	}
}

// A held request's body still arrives whole: the hold watches the socket (and moves its read
// deadline), and the body gets its allowance back after it.
func TestHeldRequestBody(t *testing.T) {
	up := newEcho(t)
	gw, _ := start(t, "fasthttp", `
upstream: UPSTREAM
identity:
  - ip: {}
policies:
  - {name: queue, algorithm: leaky-bucket, limit: 10, period: 1s, burst: 5}
default_policy: queue
server: {body_timeout: 2s}
`, up)
	body := bytes.Repeat([]byte("held"), 256<<10) // 1 MiB
	for i := range 3 {
		resp, err := http.DefaultClient.Post(gw.URL+"/q", "application/octet-stream", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var got echoed
		err = json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || got.BodyLen != len(body) {
			t.Fatalf("request %d (held %dms): %d %v, the upstream got %d bytes of %d", i, i*100, resp.StatusCode, err, got.BodyLen, len(body))
		}
	}
}

package gateway_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/gateway"
)

// sseUpstream is a real upstream that streams server-sent events: GET /stream sends its header
// (with X-Usage: 7) and a first event at once, then a second one when the test closes more, then
// ends. Every other path answers "ok".
type sseUpstream struct {
	*upstream
	more    chan struct{}
	once    sync.Once
	arrived chan struct{}
}

func newSSEUpstream(t *testing.T) *sseUpstream {
	s := &sseUpstream{upstream: &upstream{count: map[string]int{}}, more: make(chan struct{}), arrived: make(chan struct{}, 16)}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/stream" {
			io.WriteString(w, "ok")
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Usage", "7")
		io.WriteString(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		s.arrived <- struct{}{}
		select {
		case <-s.more:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "data: second\n\n")
	}))
	t.Cleanup(func() { s.release(); s.Close() })
	return s
}

func (s *sseUpstream) release() { s.once.Do(func() { close(s.more) }) }

// openStream GETs /stream and reads its first event; the test reads the rest.
func openStream(t *testing.T, url string, headers ...string) (*http.Response, *bufio.Reader) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url+"/stream", nil)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the stream: %d", resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != "data: first\n" {
		t.Fatalf("the first event: %q, %v", line, err)
	}
	return resp, br
}

// readRest reads the stream to its end and checks the second event came.
func readRest(t *testing.T, br *bufio.Reader) {
	t.Helper()
	rest, err := io.ReadAll(br)
	if err != nil || !strings.Contains(string(rest), "data: second") {
		t.Fatalf("the rest of the stream: %q, %v", rest, err)
	}
}

// TestConcurrencyWhileStreaming: with a concurrency limit of 1, a second request of the same
// client is refused 429 while the first one's SSE body is still streaming, on both engines (the
// slot is the stream's until its last byte, not until the upstream's header); the first event
// reaches the client before the upstream sends the second (the stream is not buffered); once the
// stream has ended, the slot is free again.
func TestConcurrencyWhileStreaming(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		up := newSSEUpstream(t)
		gw, _ := start(t, engine, `upstream: UPSTREAM
policies:
  - {name: in-flight, algorithm: concurrency, limit: 1, lease: 1m}
default_policy: in-flight
`, up.upstream)
		_, br := openStream(t, gw.URL) // the first event, before the upstream sends the second
		for range 3 {
			if code := get(t, gw.URL+"/other").StatusCode; code != http.StatusTooManyRequests {
				t.Fatalf("a second request while the stream is open: %d, want 429", code)
			}
		}
		up.release()
		readRest(t, br)
		waitFor(t, "the slot given back after the stream ended", func() bool {
			return get(t, gw.URL+"/other").StatusCode == http.StatusOK
		})
	})
}

// TestShedAndSettleAtStreamEnd: load shedding's in-flight slot is the stream's until it ends
// (another request is shed meanwhile), and a cost_from route settles at the stream's end, not at
// its first byte: while the stream is open the estimate is charged, after it the header's cost.
func TestShedAndSettleAtStreamEnd(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		up := newSSEUpstream(t)
		gw, srv := start(t, engine, `upstream: UPSTREAM
identity:
  - api_key: {header: X-API-Key}
policies:
  - {name: tokens, algorithm: fixed-window, limit: 1000, period: 1000h}
clients:
  - {name: partner, api_key_sha256: `+sum("k")+`, policy: tokens}
routes:
  - path_prefix: /stream
    cost: 100
    cost_from: {header: x-usage}
load_shedding: {min_limit: 1, max_limit: 1, retry_after: 2s}
`, up.upstream)
		admin := httptest.NewServer(srv.Admin())
		t.Cleanup(admin.Close)
		left := func() int64 { return tokensLeft(t, srv) }
		_, br := openStream(t, gw.URL, "X-API-Key", "k")
		if st := stats(t, admin.URL).LoadShedding; st == nil || st.InFlight != 1 {
			t.Fatalf("load shedding while the stream is open: %+v, want 1 in flight", st)
		}
		if code := get(t, gw.URL+"/other", "X-API-Key", "k").StatusCode; code != http.StatusServiceUnavailable {
			t.Fatalf("another request while the stream holds the only slot: %d, want 503", code)
		}
		if got := left(); got != 900 {
			t.Fatalf("while the stream is open: %d left, want 900 (the estimate, not yet settled)", got)
		}
		up.release()
		readRest(t, br)
		waitFor(t, "the settlement at the stream's end", func() bool { return left() == 993 })
		waitFor(t, "the shedding slot given back", func() bool { return stats(t, admin.URL).LoadShedding.InFlight == 0 })
	})
}

// tokensLeft is what the client "partner" has left of the policy "tokens" (1000 per 1000 h).
func tokensLeft(t *testing.T, srv *gateway.Server) int64 {
	t.Helper()
	p := sluice.Policy{Name: "tokens", Algorithm: sluice.FixedWindow, Limit: 1000, Period: 1000 * time.Hour}
	d, err := srv.Store().Decide(context.Background(), "partner", p, 0)
	if err != nil {
		t.Fatal(err)
	}
	return d.Remaining
}

// wsUpstream answers an upgrade with 101 and echoes what it is sent until the client closes.
func wsUpstream(t *testing.T) *upstream {
	u := &upstream{count: map[string]int{}}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "" {
			io.WriteString(w, "ok")
			return
		}
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		brw.Flush()
		io.Copy(c, brw)
	}))
	t.Cleanup(u.Close)
	return u
}

// openTunnel sends an upgrade through the gateway at addr and reads its 101.
func openTunnel(t *testing.T, url string, headers ...string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	req := "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
	for i := 0; i+1 < len(headers); i += 2 {
		req += headers[i] + ": " + headers[i+1] + "\r\n"
	}
	if _, err := io.WriteString(c, req+"\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("the upgrade: %d", resp.StatusCode)
	}
	io.WriteString(c, "ping")
	echo := make([]byte, 4)
	if _, err := io.ReadFull(br, echo); err != nil || string(echo) != "ping" {
		t.Fatalf("through the tunnel: %q, %v", echo, err)
	}
	return c, br
}

// TestUpgradeIsAnswered: an accepted upgrade (101) is an answer: on a refund_on route it is
// charged (not refunded as "the upstream did not answer"), and it holds its concurrency slot
// until the tunnel closes, on both engines.
func TestUpgradeIsAnswered(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		up := wsUpstream(t)
		gw, srv := start(t, engine, `upstream: UPSTREAM
identity:
  - api_key: {header: X-API-Key}
policies:
  - {name: tokens, algorithm: fixed-window, limit: 1000, period: 1000h}
  - {name: in-flight, algorithm: concurrency, limit: 1, lease: 1m}
clients:
  - {name: partner, api_key_sha256: `+sum("k")+`, policy: [tokens, in-flight]}
routes:
  - path_prefix: /ws
    refund_on: [500, 502, 503]
`, up)
		c, _ := openTunnel(t, gw.URL, "X-API-Key", "k")
		if code := get(t, gw.URL+"/other", "X-API-Key", "k").StatusCode; code != http.StatusTooManyRequests {
			t.Fatalf("a request while the tunnel is open: %d, want 429 (the tunnel holds the slot)", code)
		}
		c.Close()
		waitFor(t, "the slot given back when the tunnel closed", func() bool {
			return get(t, gw.URL+"/other", "X-API-Key", "k").StatusCode == http.StatusOK
		})
		if got := tokensLeft(t, srv); got != 1000-2 { // the tunnel's 1, and the /other that passed
			t.Fatalf("%d left, want %d: the 101 was not charged", got, 1000-2)
		}
	})
}

// TestUpstreamCutShort: an upstream that sends 200 with X-Usage: 7 and part of its body, then
// closes, is not a response: the client sees the failure (not a clean end), the estimate stands
// (not settled at 7), and sluice_upstream_errors_total counts it; with a fixed length and
// chunked.
func TestUpstreamCutShort(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		up := &upstream{count: map[string]int{}}
		up.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			if r.URL.Query().Has("chunked") {
				brw.WriteString("HTTP/1.1 200 OK\r\nX-Usage: 7\r\nTransfer-Encoding: chunked\r\n\r\n7\r\npartial\r\n")
			} else {
				brw.WriteString("HTTP/1.1 200 OK\r\nX-Usage: 7\r\nContent-Length: 100\r\n\r\npartial")
			}
			brw.Flush()
		}))
		t.Cleanup(up.Close)
		gw, srv := start(t, engine, `upstream: UPSTREAM
identity:
  - api_key: {header: X-API-Key}
policies:
  - {name: tokens, algorithm: fixed-window, limit: 1000, period: 1000h}
clients:
  - {name: partner, api_key_sha256: `+sum("k")+`, policy: tokens}
routes:
  - path_prefix: /
    cost: 100
    cost_from: {header: x-usage}
`, up)
		admin := httptest.NewServer(srv.Admin())
		t.Cleanup(admin.Close)
		for _, q := range []string{"", "?chunked"} {
			req, _ := http.NewRequest(http.MethodGet, gw.URL+"/v1/chat"+q, nil)
			req.Header.Set("X-API-Key", "k")
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				_, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			if err == nil {
				t.Fatalf("%s: the client saw a clean end of a response cut short", q)
			}
		}
		waitFor(t, "both requests ended", func() bool {
			return strings.Contains(metricsText(t, admin.URL), "sluice_upstream_errors_total 2\n")
		})
		if got := tokensLeft(t, srv); got != 800 {
			t.Fatalf("%d left, want 800: a response cut short settled at its header's cost", got)
		}
		if m := metricsText(t, admin.URL); strings.Contains(m, `outcome="settled"`) {
			t.Fatalf("a response cut short counted as settled:\n%s", grep(m, "settlements"))
		}
	})
}

// TestClientLeaves: a client that closes its connection while its request waits for the
// upstream's header, or while the upstream's stream is open, is let go at once: its concurrency
// slot is free again (no wait for the upstream), and the upstream's request is cancelled (the
// upstream sees its request's context end), on both engines.
func TestClientLeaves(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		arrived, cancelled := make(chan string, 4), make(chan string, 4)
		gate := make(chan struct{})
		up := &upstream{count: map[string]int{}}
		up.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/wait", "/stream":
				if r.URL.Path == "/stream" {
					io.WriteString(w, "data: first\n\n")
					w.(http.Flusher).Flush()
				}
				arrived <- r.URL.Path
				select {
				case <-r.Context().Done():
					cancelled <- r.URL.Path
				case <-gate:
				}
			default:
				io.WriteString(w, "ok")
			}
		}))
		t.Cleanup(func() { close(gate); up.Close() })
		gw, _ := start(t, engine, `upstream: UPSTREAM
policies:
  - {name: in-flight, algorithm: concurrency, limit: 1, lease: 1m}
default_policy: in-flight
`, up)
		for _, path := range []string{"/stream", "/wait"} {
			c, err := net.Dial("tcp", strings.TrimPrefix(gw.URL, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path)
			select {
			case <-arrived:
			case <-time.After(30 * time.Second):
				t.Fatalf("%s did not reach the upstream", path)
			}
			if code := get(t, gw.URL+"/other").StatusCode; code != http.StatusTooManyRequests {
				t.Fatalf("%s: another request while it is in flight: %d, want 429", path, code)
			}
			c.Close()
			waitFor(t, path+": the slot given back when the client left", func() bool {
				return get(t, gw.URL+"/other").StatusCode == http.StatusOK
			})
			select {
			case got := <-cancelled:
				if got != path {
					t.Fatalf("cancelled %s, want %s", got, path)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("%s: the upstream's request was not cancelled when the client left", path)
			}
		}
	})
}

// TestStreamBoundedMemory: a 50 MB body passes through without being held: what the test
// process allocates while it streams (the gateway, the upstream and the client are all in it)
// stays a small part of it.
func TestStreamBoundedMemory(t *testing.T) {
	const size = 50 << 20
	forEachEngine(t, func(t *testing.T, engine string) {
		up := &upstream{count: map[string]int{}}
		chunk := make([]byte, 32<<10)
		up.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			for sent := 0; sent < size; sent += len(chunk) {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		}))
		t.Cleanup(up.Close)
		gw, _ := start(t, engine, `upstream: UPSTREAM
policies:
  - {name: open, algorithm: token-bucket, limit: 1000, period: 1s}
default_policy: open
`, up)
		get(t, gw.URL+"/warm")
		var before, after runtimeStats
		before.read()
		resp, err := http.Get(gw.URL + "/big")
		if err != nil {
			t.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || n != size {
			t.Fatalf("streamed %d bytes, %v", n, err)
		}
		after.read()
		if grew := after.alloc - before.alloc; grew > 16<<20 {
			t.Fatalf("streaming %d MB allocated %d MB: the body is being held", size>>20, grew>>20)
		}
	})
}

// runtimeStats is what the test process has allocated so far.
type runtimeStats struct{ alloc uint64 }

func (s *runtimeStats) read() {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	s.alloc = m.TotalAlloc
}

// TestUpstreamRestart: the upstream restarts on the same port (the connections sluice kept
// alive to it are dead): the next requests through sluice succeed on a fresh connection, GETs on
// both engines, and a POST too on the fasthttp engine (which finds a dead pooled connection
// before it writes on it); while it is down, the failure is logged (rate limited).
func TestUpstreamRestart(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		serve := func(ln net.Listener) *http.Server {
			s := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				io.WriteString(w, "ok")
			})}
			go s.Serve(ln)
			return s
		}
		first := serve(ln)
		up := &upstream{Server: &httptest.Server{URL: "http://" + addr}, count: map[string]int{}}
		var log lockedBuffer
		gw, _ := startLoggingTo(t, engine, `upstream: UPSTREAM
policies:
  - {name: open, algorithm: token-bucket, limit: 1000, period: 1s}
default_policy: open
`, up, &log)
		// Several connections kept alive in the pool.
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for range 3 {
					get(t, gw.URL+"/warm")
				}
			})
		}
		wg.Wait()
		first.Close() // closes the kept-alive connections: the upstream is down
		if code := get(t, gw.URL+"/down").StatusCode; code != http.StatusBadGateway {
			t.Fatalf("with the upstream down: %d, want 502", code)
		}
		waitFor(t, "the upstream's failure logged", func() bool { return strings.Contains(log.String(), "upstream failed") })
		var ln2 net.Listener
		waitFor(t, "the port free again", func() bool { ln2, err = net.Listen("tcp", addr); return err == nil })
		second := serve(ln2)
		t.Cleanup(func() { second.Close() })
		for i := range 6 {
			if code := get(t, gw.URL+"/after").StatusCode; code != http.StatusOK {
				t.Fatalf("GET %d after the restart: %d", i, code)
			}
		}
		// Once more, with connections the upstream closes under the pool while it is up.
		for range 4 {
			wg.Go(func() { get(t, gw.URL+"/warm") })
		}
		wg.Wait()
		second.Close()
		ln3, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		third := serve(ln3)
		t.Cleanup(func() { third.Close() })
		// (net/http's Transport sends a POST again only if it saw the connection closed before writing.)
		for i := range 3 * boolInt(engine == "fasthttp") {
			resp, err := http.Post(gw.URL+"/after", "text/plain", strings.NewReader("body"))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if code := get(t, gw.URL+"/after").StatusCode; resp.StatusCode != http.StatusOK || code != http.StatusOK {
				t.Fatalf("round %d after the restart: POST %d, GET %d\n%s", i, resp.StatusCode, code, grep(log.String(), "upstream failed"))
			}
		}
		// Once more, with more kept-alive connections than a request has attempts: a GET written on
		// a connection the upstream had closed is sent again on the next, and such a connection
		// is not counted as an attempt.
		const pooled = 6
		third.Close()
		var ln4 net.Listener
		waitFor(t, "the port free again", func() bool { ln4, err = net.Listen("tcp", addr); return err == nil })
		var gather sync.WaitGroup
		gather.Add(pooled)
		fourth := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			gather.Done()
			gather.Wait() // all pooled requests in flight at once: each on a connection of its own
			io.WriteString(w, "ok")
		})}
		go fourth.Serve(ln4)
		for range pooled {
			wg.Go(func() { get(t, gw.URL+"/gather") })
		}
		wg.Wait()
		fourth.Close()
		var ln5 net.Listener
		waitFor(t, "the port free again", func() bool { ln5, err = net.Listen("tcp", addr); return err == nil })
		fifth := serve(ln5)
		t.Cleanup(func() { fifth.Close() })
		if code := get(t, gw.URL+"/after").StatusCode; code != http.StatusOK {
			t.Fatalf("GET after a restart, with %d dead kept-alive connections: %d\n%s", pooled, code, grep(log.String(), "upstream failed"))
		}
	})
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestEndsReusedUnderChurn: the fasthttp engine reuses each request's end (its upstream call, its
// client watch and its timer, its response stream) once the request is over. Many requests at
// once, of every kind of end (answered at once; answered after the client watch started; the
// client leaving while the upstream waits, before or after the watch started; the client leaving
// a stream), repeated: every request the client left is cancelled at the upstream, and afterwards
// the concurrency policy holds exactly its limit, no slot lost nor given back twice. It runs with
// the client watch's usual delay, and with one of 100 µs, where most watches start as their
// requests end (the watch's stop then races its timer).
func TestEndsReusedUnderChurn(t *testing.T) {
	for _, delay := range []time.Duration{0, 100 * time.Microsecond} {
		t.Run(fmt.Sprintf("watch-delay-%v", delay), func(t *testing.T) {
			if delay > 0 {
				gateway.SetWatchDelay(t, delay)
			}
			testEndsReusedUnderChurn(t)
		})
	}
}

func testEndsReusedUnderChurn(t *testing.T) {
	const limit, workers, rounds = 24, 8, 40
	forEachEngine(t, func(t *testing.T, engine string) {
		var arrived sync.Map // id -> chan struct{}
		var cancelled sync.WaitGroup
		up := &upstream{count: map[string]int{}}
		up.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch {
			case r.URL.Path == "/slow":
				time.Sleep(25 * time.Millisecond) // the upstream's own work: longer than the watch's delay
				io.WriteString(w, "ok")
			case strings.HasPrefix(r.URL.Path, "/wait/"), strings.HasPrefix(r.URL.Path, "/stream/"):
				if strings.HasPrefix(r.URL.Path, "/stream/") {
					io.WriteString(w, "data: first\n\n")
					w.(http.Flusher).Flush()
				}
				if ch, ok := arrived.Load(r.URL.Path); ok {
					close(ch.(chan struct{}))
				}
				<-r.Context().Done() // answered only by the client leaving
				cancelled.Done()
			default:
				io.WriteString(w, "ok")
			}
		}))
		t.Cleanup(up.Close)
		gw, _ := start(t, engine, fmt.Sprintf(`upstream: UPSTREAM
policies:
  - {name: in-flight, algorithm: concurrency, limit: %d, lease: 1m}
default_policy: in-flight
`, limit), up)
		addr := strings.TrimPrefix(gw.URL, "http://")
		// leave sends GET path on a connection of its own and closes it once the upstream has the
		// request (and, for a stream, once the client has its first event).
		leave := func(path string) error {
			ch := make(chan struct{})
			arrived.Store(path, ch)
			cancelled.Add(1)
			c, err := net.Dial("tcp", addr)
			if err != nil {
				return err
			}
			defer c.Close()
			fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path)
			select {
			case <-ch:
			case <-time.After(30 * time.Second):
				return fmt.Errorf("%s did not reach the upstream", path)
			}
			if strings.HasPrefix(path, "/stream/") {
				br := bufio.NewReader(c)
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						return fmt.Errorf("%s: %v before the first event", path, err)
					}
					if strings.HasPrefix(line, "data: first") {
						break
					}
				}
			}
			return nil
		}
		errs := make(chan error, workers*rounds)
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := range rounds {
					id := fmt.Sprintf("%d-%d", w, i)
					switch i % 4 {
					case 0, 1:
						path := "/ok"
						if i%4 == 1 {
							path = "/slow"
						}
						resp, err := http.Get(gw.URL + path)
						if err != nil {
							errs <- err
							continue
						}
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if resp.StatusCode != http.StatusOK {
							errs <- fmt.Errorf("%s: %d, want 200", path, resp.StatusCode)
						}
					case 2:
						if err := leave("/wait/" + id); err != nil {
							errs <- err
						}
					case 3:
						if err := leave("/stream/" + id); err != nil {
							errs <- err
						}
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if t.Failed() {
			return
		}
		done := make(chan struct{})
		go func() { cancelled.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			t.Fatal("not every request whose client left was cancelled at the upstream")
		}
		// The policy holds exactly limit requests: limit in flight, then the next is refused.
		waitFor(t, "the slots of the requests whose clients left given back", func() bool {
			return get(t, gw.URL+"/ok").StatusCode == http.StatusOK
		})
		holders := make([]net.Conn, 0, limit)
		t.Cleanup(func() {
			for _, c := range holders {
				c.Close()
			}
		})
		for i := range limit {
			path := fmt.Sprintf("/wait/hold-%d", i)
			ch := make(chan struct{})
			arrived.Store(path, ch)
			cancelled.Add(1)
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			holders = append(holders, c)
			fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path)
			select {
			case <-ch:
			case <-time.After(30 * time.Second):
				t.Fatalf("request %d of %d in flight did not reach the upstream", i+1, limit)
			}
		}
		if code := get(t, gw.URL+"/ok").StatusCode; code != http.StatusTooManyRequests {
			t.Fatalf("with %d requests in flight: %d, want 429", limit, code)
		}
	})
}

package main

// End-to-end tests of how `sluice serve` bounds what clients and its store can make it wait for:
// slow request bodies, the drain at SIGTERM, and what it says (/readyz, /v1/stats, its log) while
// Redis goes away and comes back. Real binary, real upstream, real redis-server, as in
// serve_e2e_test.go.

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gateway"
	"github.com/sluicehq/sluice/internal/redistest"
)

// byteCounter is an upstream that reads every request's body whole and answers with the number
// of bytes it got.
type byteCounter struct {
	*httptest.Server
	bodies atomic.Int64 // bodies read whole
}

func newByteCounter(t *testing.T) *byteCounter {
	t.Helper()
	u := &byteCounter{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			return // the gateway cut the body: there is no one to answer
		}
		u.bodies.Add(1)
		fmt.Fprintf(w, "%d", n)
	}))
	t.Cleanup(u.Close)
	return u
}

// openConfig is a configuration whose one policy never refuses, with extra lines (a server
// section) after it.
func openConfig(upstreamURL, extra string) configFunc {
	return func(listen, admin string) string {
		return fmt.Sprintf(`listen: %s
admin_listen: %s
upstream: %s
identity:
  - ip: {}
policies:
  - {name: anonymous, algorithm: token-bucket, limit: 1000000, period: 1s}
default_policy: anonymous
%s`, listen, admin, upstreamURL, extra)
	}
}

// TestServeE2ESlowBodiesCut: 200 connections that send a request body at 1 byte a second do not
// hold the gateway: with body_timeout 1s (and the default 1024 bytes/s), every one is answered
// 408 or closed about a second after its body started (before it has been forwarded, once part
// of it has, and chunked), none counts as an upstream error, and the gateway serves on.
func TestServeE2ESlowBodiesCut(t *testing.T) {
	t.Parallel()
	up := newByteCounter(t)
	p := startSluice(t, t.TempDir(), "sluice.yaml", openConfig(up.URL, "server: {body_timeout: 1s}\n"))
	addr := strings.TrimPrefix(p.proxy, "http://")

	const n = 200
	const allowance = time.Second           // body_timeout; 1 byte/s adds 1/1024 s a byte
	const limit = allowance + 5*time.Second // what a loaded machine (2 cores, -race) may add
	fast := strings.Repeat("x", 16<<10)     // a body's first part, sent at once
	heads := []string{
		"PUT /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\n",                          // cut before the handler runs
		"PUT /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\n" + fast,                   // cut while forwarded
		"PUT /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n" + "186a0\r\n" + fast, // chunked, 100000
	}
	type result struct {
		status int           // 0: closed without an answer
		took   time.Duration // from the end of the fast part to the close
		err    error
	}
	results := make([]result, n)
	stop := make(chan struct{})
	defer close(stop)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &results[i]
			c, err := net.Dial("tcp", addr)
			if err != nil {
				r.err = err
				return
			}
			defer c.Close()
			if _, err := io.WriteString(c, heads[i%len(heads)]); err != nil {
				r.err = err
				return
			}
			start := time.Now()
			go func() { // the slow client: a byte a second
				tick := time.NewTicker(time.Second)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
						if _, err := c.Write([]byte{'y'}); err != nil {
							return
						}
					}
				}
			}()
			c.SetReadDeadline(start.Add(limit))
			br := bufio.NewReader(c)
			if resp, err := http.ReadResponse(br, nil); err == nil {
				r.status = resp.StatusCode
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			_, err = io.Copy(io.Discard, br) // then the connection must close
			r.took = time.Since(start)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				r.err = fmt.Errorf("still open after %v (status %d)", limit, r.status)
			}
		}()
	}
	wg.Wait()
	statuses := map[int]int{}
	var slowest time.Duration
	bad := 0
	for i, r := range results {
		statuses[r.status]++
		slowest = max(slowest, r.took)
		err := r.err
		switch {
		case err != nil:
		case r.status != 0 && r.status != http.StatusRequestTimeout:
			err = fmt.Errorf("answered %d; want 408 or a closed connection", r.status)
		case r.took < allowance*9/10:
			err = fmt.Errorf("cut after %v, before its allowance (%v)", r.took, allowance)
		}
		if err != nil {
			if bad++; bad <= 5 {
				t.Errorf("connection %d (kind %d): %v", i, i%len(heads), err)
			}
		}
	}
	t.Logf("%d slow connections: statuses %v (0: closed), the slowest closed after %v", n, statuses, slowest)
	if up.bodies.Load() != 0 {
		t.Errorf("the upstream read %d bodies whole; want none", up.bodies.Load())
	}
	if v := p.metric(t, "sluice_upstream_errors_total", nil); v != 0 {
		t.Errorf("sluice_upstream_errors_total = %v; the clients' slow bodies are not the upstream's errors", v)
	}
	req, _ := http.NewRequest(http.MethodPut, p.proxy+"/after", strings.NewReader("fine"))
	resp, err := e2eClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "4" {
		t.Errorf("a normal request after the slow ones: %d %q", resp.StatusCode, body)
	}
}

// zeros is an endless reader of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// TestServeE2ELargeUploadPasses: with the same short body_timeout, a 100 MB upload that comes
// at the speed of a loopback (with a length, and chunked) reaches the upstream whole.
func TestServeE2ELargeUploadPasses(t *testing.T) {
	t.Parallel()
	up := newByteCounter(t)
	p := startSluice(t, t.TempDir(), "sluice.yaml", openConfig(up.URL, "server: {body_timeout: 1s}\n"))
	const size = 100 << 20
	for _, chunked := range []bool{false, true} {
		req, _ := http.NewRequest(http.MethodPut, p.proxy+"/upload", io.LimitReader(zeros{}, size))
		if chunked {
			req.ContentLength = -1
		} else {
			req.ContentLength = size
		}
		start := time.Now()
		resp, err := (&http.Client{Timeout: 2 * time.Minute}).Do(req)
		if err != nil {
			t.Fatalf("chunked %v: %v\nstderr:\n%s", chunked, err, p.stderr.String())
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(body) != strconv.Itoa(size) {
			t.Fatalf("chunked %v: %d %q; want 200 and the upstream's count, %d", chunked, resp.StatusCode, body, size)
		}
		t.Logf("100 MB (chunked %v) in %v", chunked, time.Since(start).Round(time.Millisecond))
	}
}

// TestServeE2EDrainTimeout: at SIGTERM, a request in flight that takes 300ms finishes whole; one
// that would take longer than server.drain_timeout (1s) is cut when the drain ends, and the
// process exits 0 then.
func TestServeE2EDrainTimeout(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	started := make(chan string, 2)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started <- r.URL.Path
		if r.URL.Path == "/slow/cut" {
			<-release // longer than any drain
			return
		}
		time.Sleep(300 * time.Millisecond) // the request's own work
		fmt.Fprint(w, "done")
	}))
	defer upstream.Close()
	defer close(release) // first: Close waits for the handlers
	p := startSluice(t, t.TempDir(), "sluice.yaml", openConfig(upstream.URL, "server: {drain_timeout: 1s}\n"))
	type outcome struct {
		r   reply
		err error
		at  time.Time
	}
	results := map[string]chan outcome{"/slow/ok": make(chan outcome, 1), "/slow/cut": make(chan outcome, 1)}
	for path, ch := range results {
		go func() {
			r, err := tryGet(p.proxy, path)
			ch <- outcome{r, err, time.Now()}
		}()
	}
	for range 2 {
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			t.Fatal("the requests did not reach the upstream")
		}
	}
	sent := time.Now()
	p.signal(syscall.SIGTERM)
	ok := <-results["/slow/ok"]
	if ok.err != nil || ok.r.status != 200 || string(ok.r.body) != "done" {
		t.Errorf("the 300ms request in flight at SIGTERM: %v %d %q; want 200 done", ok.err, ok.r.status, ok.r.body)
	}
	cut := <-results["/slow/cut"]
	if cut.err == nil {
		t.Errorf("the request longer than the drain was answered %d %q; want it cut", cut.r.status, cut.r.body)
	}
	if after := cut.at.Sub(sent); after < 900*time.Millisecond || after > 6*time.Second {
		t.Errorf("the long request was cut %v after SIGTERM; want when the 1s drain ends", after)
	}
	if code := p.wait(10 * time.Second); code != 0 {
		t.Errorf("exit code %d; want 0\nstderr:\n%s", code, p.stderr.String())
	}
	if log := p.stderr.String(); !strings.Contains(log, "drain_timeout=1s") || !strings.Contains(log, "they are cut") {
		t.Errorf("the log does not say the drain and its end:\n%s", log)
	}
}

// TestServeE2EStatsListenAfterReload: a reload whose file names other listen addresses does not
// move the listeners (that takes a restart, and the log says so), and /v1/stats shows the
// addresses actually listened on, in its fields and in its configuration line.
func TestServeE2EStatsListenAfterReload(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	cfg := openConfig(up.URL, "")
	p := startSluice(t, t.TempDir(), "sluice.yaml", cfg)
	listen, admin := strings.TrimPrefix(p.proxy, "http://"), strings.TrimPrefix(p.admin, "http://")
	newListen, err1 := freeAddr()
	newAdmin, err2 := freeAddr()
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	writeFile(t, p.config, cfg(newListen, newAdmin))
	p.signal(syscall.SIGHUP)
	p.waitMetric(t, "sluice_config_reloads_total", map[string]string{"result": "ok"}, 1, 10*time.Second)

	r := get(t, p.admin, "/v1/stats")
	var st gateway.Stats
	if err := json.Unmarshal(r.body, &st); err != nil {
		t.Fatalf("/v1/stats: %v %s", err, r.body)
	}
	if st.Listen != listen || st.AdminListen != admin {
		t.Errorf("/v1/stats listen %q admin_listen %q; want the addresses listened on, %s and %s", st.Listen, st.AdminListen, listen, admin)
	}
	if !strings.Contains(st.Config, "listen "+listen) || !strings.Contains(st.Config, "admin "+admin) ||
		strings.Contains(st.Config, newListen) || strings.Contains(st.Config, newAdmin) {
		t.Errorf("/v1/stats config %q; want the running listeners (%s, %s), not the file's new ones", st.Config, listen, admin)
	}
	if r := get(t, p.proxy, "/still-here"); r.status != 200 {
		t.Errorf("the proxy at its address after the reload: %d", r.status)
	}
	if c, err := net.DialTimeout("tcp", newListen, time.Second); err == nil {
		c.Close()
		t.Errorf("something listens on the file's new address %s", newListen)
	}
	if !strings.Contains(p.stderr.String(), "take effect at the next restart") {
		t.Errorf("the log does not say the listeners change at a restart:\n%s", p.stderr.String())
	}
}

// redisOpenConfig is one instance on Redis, failing open, whose one policy never refuses: every
// request is decided (by Redis, or by the failure mode) and answered 200. The store's timeout is
// 1 s, as in redisConfig: a slow call on a loaded machine must not open the breaker.
func redisOpenConfig(upstreamURL, redisAddr string) configFunc {
	return func(listen, admin string) string {
		return fmt.Sprintf(`listen: %s
admin_listen: %s
upstream: %s
store:
  type: redis
  addrs: [%s]
  on_error: fail-open
  timeout: 1s
identity:
  - ip: {}
policies:
  - {name: anonymous, algorithm: token-bucket, limit: 1000000, period: 1s}
default_policy: anonymous
`, listen, admin, upstreamURL, redisAddr)
	}
}

// stats reads the admin listener's /v1/stats.
func (p *sluiceProc) stats(t *testing.T) gateway.Stats {
	t.Helper()
	r := get(t, p.admin, "/v1/stats")
	var st gateway.Stats
	if err := json.Unmarshal(r.body, &st); err != nil {
		t.Fatalf("/v1/stats: %v %s", err, r.body)
	}
	return st
}

// TestServeE2EReadyzFollowsDecisions: /readyz is 200 when decisions go to Redis, not when Redis
// merely answers a PING. Redis is killed under fail-open, so requests still pass, decided by the
// failure mode, with the breaker open; once Redis is back, with no request in between, /readyz
// probes the breaker itself, and the moment it says ready the breaker is closed and a request is
// decided by Redis (not counted as a fallback).
func TestServeE2EReadyzFollowsDecisions(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	up := newUpstream(t)
	up.slow = 0
	p := startSluice(t, t.TempDir(), "sluice.yaml", redisOpenConfig(up.URL, rs.Addr))
	const path = "/ready"
	if st := p.stats(t); st.Store.BreakerOpen || !st.Store.Reachable {
		t.Fatalf("Redis up: %+v", st.Store)
	}
	rs.Kill()
	deadline := time.Now().Add(10 * time.Second)
	for !p.stats(t).Store.BreakerOpen {
		if time.Now().After(deadline) {
			t.Fatal("the breaker did not open with Redis dead")
		}
		if r := get(t, p.proxy, path); r.status != 200 {
			t.Fatalf("fail-open with Redis dead: %d %s", r.status, r.body)
		}
	}
	if r := get(t, p.admin, "/readyz"); r.status != http.StatusServiceUnavailable {
		t.Fatalf("/readyz with Redis dead: %d", r.status)
	}
	rs.Restart()
	if _, err := rs.Do("PING"); err != nil {
		t.Fatal(err)
	}
	// No request now: only /readyz itself can find out that decisions would go to Redis.
	deadline = time.Now().Add(15 * time.Second)
	for {
		r := get(t, p.admin, "/readyz")
		if r.status == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz still %d 15 s after Redis came back, with no traffic\nstderr:\n%s", r.status, p.stderr.String())
		}
		time.Sleep(20 * time.Millisecond) // a load balancer's polling, faster
	}
	st := p.stats(t)
	if st.Store.BreakerOpen {
		t.Fatalf("/readyz said ready while the breaker is open: decisions still go to the failure mode (%+v)", st.Store)
	}
	// Decisions go to Redis now. One of the client's pipelined connections may still hold the
	// socket Redis closed when it died, and fail the first call made on it (seen once in four CI
	// runs): the failure mode answers that one, and the breaker stays closed. So: of three
	// requests, at least one is decided by Redis, and the breaker never reopens.
	before := st.Store.Fallbacks
	for i := 0; i < 3; i++ {
		if r := get(t, p.proxy, path); r.status != 200 {
			t.Fatalf("after ready: %d %s", r.status, r.body)
		}
	}
	after := p.stats(t)
	if after.Store.Fallbacks-before > 1 || after.Store.BreakerOpen {
		t.Errorf("after /readyz said ready, %d of 3 requests were decided by the failure mode (breaker open: %v); want at most 1",
			after.Store.Fallbacks-before, after.Store.BreakerOpen)
	}
}

// TestServeE2EStoreHealthLogged: Redis killed under traffic and restarted is logged exactly
// once each way: one line when the breaker opens (the store is unavailable), one when it closes
// (available again), however many requests saw it and however many probes failed in between.
func TestServeE2EStoreHealthLogged(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	up := newUpstream(t)
	up.slow = 0
	p := startSluice(t, t.TempDir(), "sluice.yaml", redisOpenConfig(up.URL, rs.Addr))
	var decided atomic.Int64 // requests answered 200 (fail-open: all of them)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if r, err := tryGet(p.proxy, "/traffic"); err == nil && r.status == 200 {
					decided.Add(1)
				}
			}
		}()
	}
	waitLog := func(what string) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for !strings.Contains(p.stderr.String(), what) {
			if time.Now().After(deadline) {
				t.Fatalf("no %q in the log\n%s", what, p.stderr.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// more waits until n more requests have been answered: traffic goes on through each phase.
	more := func(n int64) {
		t.Helper()
		target := decided.Load() + n
		deadline := time.Now().Add(15 * time.Second)
		for decided.Load() < target {
			if time.Now().After(deadline) {
				t.Fatalf("traffic stopped: %d requests answered", decided.Load())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	more(50)
	rs.Kill()
	killed := time.Now()
	// The breaker's own lines, by their message: the instance registry's failed heartbeat (every
	// Redis store runs one) is logged too, with the store's error, which says "store unavailable".
	const downMsg, backMsg = `msg="store unavailable`, `msg="store available again`
	waitLog(downMsg)
	// Traffic while Redis is dead, for several of the breaker's probes (one per 250ms), all
	// failing: the window is what is observed, not a synchronisation.
	for more(20); time.Since(killed) < 1500*time.Millisecond; {
		more(20)
	}
	rs.Restart()
	waitLog(backMsg)
	more(200)
	close(stop)
	wg.Wait()
	log := p.stderr.String()
	down, back := strings.Count(log, downMsg), strings.Count(log, backMsg)
	if down != 1 || back != 1 {
		t.Errorf("%d \"store unavailable\" and %d \"store available again\" lines; want one each\n%s", down, back, log)
	}
	if !strings.Contains(log, "on_error=fail-open") {
		t.Errorf("the unavailable line does not say the failure mode:\n%s", log)
	}
}

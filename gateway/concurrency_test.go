package gateway_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestConcurrencyBothEngines: on each engine, a concurrency policy of 2 admits two requests that
// the upstream holds (until the test lets them go), refuses a third with qu="concurrent-requests"
// in the fields (not counted as an early retry however soon the client comes back: the wait is a
// hint), and admits again as soon as the held ones have answered: the slots are given back when
// the response is written.
func TestConcurrencyBothEngines(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		arrived, gate := make(chan struct{}, 8), make(chan struct{})
		var once sync.Once
		open := func() { once.Do(func() { close(gate) }) }
		up := &upstream{count: map[string]int{}}
		up.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasPrefix(r.URL.Path, "/held") {
				arrived <- struct{}{}
				select {
				case <-gate:
				case <-r.Context().Done():
				}
			}
			io.WriteString(w, "ok")
		}))
		t.Cleanup(func() { open(); up.Close() })
		gw, srv := start(t, engine, `upstream: UPSTREAM
policies:
  - {name: in-flight, algorithm: concurrency, limit: 2, lease: 1m}
default_policy: in-flight
`, up)
		t.Cleanup(open)
		done := make(chan int, 2)
		for range 2 {
			go func() {
				resp, err := http.Get(gw.URL + "/held")
				if err != nil {
					done <- -1
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				done <- resp.StatusCode
			}()
		}
		for range 2 {
			select {
			case <-arrived:
			case <-time.After(10 * time.Second):
				t.Fatal("the held requests did not reach the upstream")
			}
		}
		for range 3 {
			resp := get(t, gw.URL+"/now")
			if resp.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("a third request in flight: %d", resp.StatusCode)
			}
			if p := resp.Header.Get("RateLimit-Policy"); p != `"in-flight";q=2;qu="concurrent-requests"` {
				t.Fatalf("RateLimit-Policy %q", p)
			}
		}
		open()
		for range 2 {
			if code := <-done; code != http.StatusOK {
				t.Fatalf("a held request: %d", code)
			}
		}
		for range 4 { // one at a time: each gives its slot back when answered
			if code := get(t, gw.URL+"/now").StatusCode; code != http.StatusOK {
				t.Fatalf("after the held ones answered: %d", code)
			}
		}
		admin := httptest.NewServer(srv.Admin())
		defer admin.Close()
		resp, err := http.Get(admin.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), "sluice_early_retries_total{") {
			t.Fatalf("concurrency refusals counted as early retries:\n%s", grep(string(body), "early_retries"))
		}
	})
}

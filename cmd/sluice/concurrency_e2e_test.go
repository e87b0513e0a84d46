package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"

	"github.com/sluicehq/sluice/internal/redistest"
)

// heldUpstream is an upstream whose requests to /held/... wait until the test lets them go (a
// channel, not a timer) or their connection closes; every other path answers at once.
type heldUpstream struct {
	*httptest.Server
	arrived chan string   // a /held request arrived
	gate    chan struct{} // closed: the held requests answer
	once    sync.Once
}

func newHeldUpstream(t *testing.T) *heldUpstream {
	t.Helper()
	u := &heldUpstream{arrived: make(chan string, 64), gate: make(chan struct{})}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/held/") {
			u.arrived <- r.URL.Path
			select {
			case <-u.gate:
			case <-r.Context().Done(): // the gateway that sent it died
				return
			}
		}
		fmt.Fprintf(w, "done %s", r.URL.Path)
	}))
	t.Cleanup(func() { u.open(); u.Close() })
	return u
}

// open lets every held request answer, and every later one go through at once.
func (u *heldUpstream) open() { u.once.Do(func() { close(u.gate) }) }

// waitArrived waits for n held requests to reach the upstream.
func (u *heldUpstream) waitArrived(t *testing.T, n int) {
	t.Helper()
	for i := range n {
		select {
		case <-u.arrived:
		case <-time.After(15 * time.Second):
			t.Fatalf("%d of %d held requests reached the upstream", i, n)
		}
	}
}

// concurrencyConfig: one client (every request comes from 127.0.0.1), at most 5 requests in
// flight, on Redis, with a short lease.
func concurrencyConfig(upstreamURL, redisAddr string, lease time.Duration) configFunc {
	return func(listen, admin string) string {
		return fmt.Sprintf(`listen: %s
admin_listen: %s
upstream: %s
store:
  type: redis
  addrs: [%s]
  timeout: 2s
identity:
  - ip: {}
policies:
  - {name: in-flight, algorithm: concurrency, limit: 5, lease: %v}
  - {name: rate, algorithm: token-bucket, limit: 1000, period: 1s}
default_policy: [in-flight, rate]
`, listen, admin, upstreamURL, redisAddr, lease)
	}
}

// checkConcurrencyRefusal checks a 429 of the concurrency policy: RateLimit-Policy says
// q=5;qu="concurrent-requests" for it (no window), RateLimit r=0, and a Retry-After.
func checkConcurrencyRefusal(r reply) error {
	if r.status != http.StatusTooManyRequests {
		return fmt.Errorf("status %d (%s), want 429", r.status, r.body)
	}
	if _, err := retryAfter(r.header); err != nil {
		return err
	}
	list, err := httpsfv.UnmarshalList(r.header.Values("RateLimit-Policy"))
	if err != nil {
		return fmt.Errorf("RateLimit-Policy %q: %v", r.header.Values("RateLimit-Policy"), err)
	}
	found := false
	for _, m := range list {
		item, ok := m.(httpsfv.Item)
		if !ok || item.Value != "in-flight" {
			continue
		}
		found = true
		q, _ := item.Params.Get("q")
		qu, _ := item.Params.Get("qu")
		_, hasW := item.Params.Get("w")
		if q != int64(5) || qu != "concurrent-requests" || hasW {
			return fmt.Errorf("RateLimit-Policy %q: want \"in-flight\";q=5;qu=\"concurrent-requests\"", r.header.Values("RateLimit-Policy"))
		}
	}
	if !found {
		return fmt.Errorf("RateLimit-Policy %q has no in-flight member", r.header.Values("RateLimit-Policy"))
	}
	if rl := r.header.Get("RateLimit"); !strings.HasPrefix(rl, `"in-flight";r=0;t=`) {
		return fmt.Errorf("RateLimit %q, want the refusing in-flight policy with r=0", rl)
	}
	return nil
}

// TestServeE2EConcurrencyThreeInstances: ten requests of one client in parallel, across three
// gateway processes on one real Redis, to an upstream that holds them: exactly five reach it and
// five are refused with a 429 of the concurrency policy; while the five are held past their
// first lease (the gateways renew it) a new one is still refused; once they finish, five more pass.
func TestServeE2EConcurrencyThreeInstances(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	up := newHeldUpstream(t)
	const lease = 2 * time.Second
	procs := startThree(t, concurrencyConfig(up.URL, rs.Addr, lease))
	t.Cleanup(up.open) // (before the processes stop: a failed test leaves nothing held)

	results := make(chan reply, 10)
	for i := range 10 {
		go func() {
			r, err := tryGet(procs[i%3].proxy, fmt.Sprintf("/held/%d", i))
			if err != nil {
				r = reply{status: -1, body: []byte(err.Error())}
			}
			results <- r
		}()
	}
	up.waitArrived(t, 5)
	for range 5 {
		if err := checkConcurrencyRefusal(<-results); err != nil {
			t.Fatal(err)
		}
	}
	// The five are in flight. Past their first lease a new request, at any instance, is refused:
	// the leases are renewed.
	start := time.Now()
	for i := 0; time.Since(start) < lease+lease/2; i++ {
		if err := checkConcurrencyRefusal(get(t, procs[i%3].proxy, "/now")); err != nil {
			t.Fatalf("%v after %v in flight: %v", "a sixth request", time.Since(start), err)
		}
	}
	select {
	case r := <-results:
		t.Fatalf("a held request answered early: %d %s", r.status, r.body)
	default:
	}
	up.open()
	for range 5 {
		if r := <-results; r.status != http.StatusOK {
			t.Fatalf("a held request: %d %s", r.status, r.body)
		}
	}
	// All five finished: their slots are back, and five more pass, at once, at every instance.
	var wg sync.WaitGroup
	for i := range 5 {
		wg.Go(func() {
			if r, err := tryGet(procs[i%3].proxy, fmt.Sprintf("/after/%d", i)); err != nil || r.status != http.StatusOK {
				t.Errorf("after the five finished: %v %d %s", err, r.status, r.body)
			}
		})
	}
	wg.Wait()
}

// TestServeE2EConcurrencyKilledInstance: a gateway process SIGKILLed with five requests in flight
// leaves their slots taken — the other instances refuse — until the lease expires, and then
// they are free.
func TestServeE2EConcurrencyKilledInstance(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	up := newHeldUpstream(t)
	const lease = 3 * time.Second
	procs := startThree(t, concurrencyConfig(up.URL, rs.Addr, lease))
	t.Cleanup(up.open) // (before the processes stop: a failed test leaves nothing held)
	for i := range 5 {
		go func() { _, _ = tryGet(procs[0].proxy, fmt.Sprintf("/held/%d", i)) }()
	}
	up.waitArrived(t, 5)
	if err := procs[0].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-procs[0].done
	killed := time.Now()
	// Its last renewal was at most a third of the lease before it died: for two thirds of the
	// lease the slots are surely still taken.
	r := get(t, procs[1].proxy, "/now")
	if since := time.Since(killed); since >= lease*2/3 {
		t.Fatalf("the check came %v after the kill, too late to tell", since)
	}
	if err := checkConcurrencyRefusal(r); err != nil {
		t.Fatalf("just after the kill: %v", err)
	}
	// Then they expire: within the lease (and Redis's pruning at the next call).
	for {
		r := get(t, procs[2].proxy, "/now")
		if r.status == http.StatusOK {
			break
		}
		if err := checkConcurrencyRefusal(r); err != nil {
			t.Fatal(err)
		}
		if time.Since(killed) > lease+2*time.Second {
			t.Fatalf("the dead instance's slots are still taken %v after it died (lease %v)", time.Since(killed), lease)
		}
		time.Sleep(50 * time.Millisecond) // polling the expiry under test
	}
	t.Logf("the slots came back %v after the kill (lease %v)", time.Since(killed), lease)
	// All five are back.
	up.open()
	var wg sync.WaitGroup
	for i := range 5 {
		wg.Go(func() {
			if r, err := tryGet(procs[1+i%2].proxy, fmt.Sprintf("/after/%d", i)); err != nil || r.status != http.StatusOK {
				t.Errorf("after the lease: %v %d %s", err, r.status, r.body)
			}
		})
	}
	wg.Wait()
}

// TestSimulateConcurrencyRefused: the simulator's requests take no time, so it refuses the
// concurrency algorithm, saying why, rather than simulating nothing.
func TestSimulateConcurrencyRefused(t *testing.T) {
	code, _, stderr := runCLI(t, "", "simulate", "--algorithm", "concurrency", "--limit", "5", "--period", "1s", "--traffic", "10 at once")
	if code == 0 || !strings.Contains(stderr, "--algorithm concurrency") || !strings.Contains(stderr, "in flight") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
}

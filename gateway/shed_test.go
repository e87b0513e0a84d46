package gateway_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// switchUpstream is a real HTTP server whose work takes fast or, once slow is set, slowDelay; it
// notes how many requests it holds at once (the most since reset) and counts arrivals.
type switchUpstream struct {
	*httptest.Server
	slow            atomic.Bool
	fast, slowDelay time.Duration
	cur, most       atomic.Int64
	arrived         atomic.Int64
}

func newSwitchUpstream(t *testing.T, fast, slow time.Duration) *switchUpstream {
	u := &switchUpstream{fast: fast, slowDelay: slow}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := u.cur.Add(1)
		for m := u.most.Load(); n > m && !u.most.CompareAndSwap(m, n); m = u.most.Load() {
		}
		u.arrived.Add(1)
		d := u.fast
		if u.slow.Load() {
			d = u.slowDelay
		}
		time.Sleep(d) // the upstream's own work, not synchronisation
		u.cur.Add(-1)
		io.WriteString(w, "ok")
	}))
	t.Cleanup(u.Close)
	return u
}

// waitFor polls cond (a state of the gateway that real latencies drive) until it holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling an outcome, not ordering events
	}
}

const shedYAML = `upstream: UPSTREAM
identity: [api_key: {header: X-API-Key}]
clients:
  - {name: partner-a, api_key_sha256: KEY_A}
load_shedding:
  min_limit: 4
  max_limit: 64
  window: 50ms
  baseline_window: 1h
  tolerance: 2
  slack: 150ms
  priorities: {partner-a: high}
`

// TestShedSlowUpstream: on each engine, against a real upstream that slows down on command, with
// 2 high-priority (partner-a) and 8 low-priority (anonymous) clients sending all the time:
// healthy (5ms), nothing is shed and the limit stays near max_limit; slowed (500ms), the limit
// falls to min_limit, the upstream never holds more than it, the anonymous requests are shed
// (503 temporary-reduced-capacity) while partner-a's are all served; recovered, the limit climbs
// back.
func TestShedSlowUpstream(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		up := newSwitchUpstream(t, 5*time.Millisecond, 500*time.Millisecond)
		gw, srv := start(t, engine, strings.ReplaceAll(shedYAML, "KEY_A", sum("key-a")), &upstream{Server: up.Server})
		admin := httptest.NewServer(srv.Admin())
		t.Cleanup(admin.Close)
		shedState := func() *struct {
			Limit, InFlight int
			Shed            map[string]uint64
		} {
			st := stats(t, admin.URL).LoadShedding
			if st == nil {
				t.Fatal("no load_shedding in /v1/stats")
			}
			return &struct {
				Limit, InFlight int
				Shed            map[string]uint64
			}{st.Limit, st.InFlight, st.Shed}
		}
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
		var codes [2]sync.Map // high, low: status → *atomic.Int64
		count := func(prio, code int) *atomic.Int64 {
			v, _ := codes[prio].LoadOrStore(code, new(atomic.Int64))
			return v.(*atomic.Int64)
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for i := range 10 {
			prio := 1 // low: anonymous
			if i < 2 {
				prio = 0 // high: partner-a
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					req, _ := http.NewRequest(http.MethodGet, gw.URL+"/x", nil)
					if prio == 0 {
						req.Header.Set("X-API-Key", "key-a")
					}
					resp, err := client.Do(req)
					if err != nil {
						count(prio, -1).Add(1)
						continue
					}
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode == http.StatusServiceUnavailable {
						var p struct{ Type string }
						if json.Unmarshal(body, &p) != nil || p.Type != "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity" ||
							resp.Header.Get("Retry-After") != "1" {
							count(prio, -2).Add(1)
						}
					}
					count(prio, resp.StatusCode).Add(1)
				}
			}()
		}
		defer func() { close(stop); wg.Wait() }()
		total := func(prio, code int) int64 { return count(prio, code).Load() }

		// Healthy.
		waitFor(t, "400 healthy requests", func() bool { return up.arrived.Load() >= 400 })
		// (A machine stalled for more than the slack may halve the limit once: 32 still admits
		// every one of the 10 clients.)
		if s := shedState(); s.Limit < 32 || s.Shed["low"]+s.Shed["normal"]+s.Shed["high"] != 0 || total(1, 503) != 0 || total(0, 503) != 0 {
			t.Fatalf("healthy upstream: %+v, %d and %d shed", s, total(0, 503), total(1, 503))
		}

		// Slowed.
		up.slow.Store(true)
		waitFor(t, "the limit to fall to min_limit", func() bool { return shedState().Limit == 4 })
		// The requests admitted above the limit as it fell are gone after 20 more arrivals (four
		// at a time, each 500ms); from then on the upstream never holds more than the limit.
		a := up.arrived.Load()
		waitFor(t, "20 slow arrivals", func() bool { return up.arrived.Load() >= a+20 })
		up.most.Store(up.cur.Load())
		before := shedState()
		high200, low200, low503 := total(0, 200), total(1, 200), total(1, 503)
		a = up.arrived.Load()
		waitFor(t, "20 more slow arrivals", func() bool { return up.arrived.Load() >= a+20 })
		after := shedState()
		if most := up.most.Load(); most > 4 {
			t.Errorf("the slow upstream held %d requests at once; the limit is 4", most)
		}
		if after.Limit != 4 || after.InFlight > 4 {
			t.Errorf("slowed: %+v", after)
		}
		if after.Shed["high"] != before.Shed["high"] {
			t.Errorf("partner-a (high) shed while slowed: %d → %d", before.Shed["high"], after.Shed["high"])
		}
		if total(0, 200) <= high200 || total(1, 503) <= low503 || after.Shed["low"] <= before.Shed["low"] {
			t.Errorf("slowed: high served %d → %d, low shed %d → %d (low served %d → %d)", high200, total(0, 200), low503, total(1, 503), low200, total(1, 200))
		}

		// Recovered.
		up.slow.Store(false)
		waitFor(t, "the limit to climb back to 16", func() bool { return shedState().Limit >= 16 })
		for prio, name := range []string{"high", "low"} {
			if bad := total(prio, -1) + total(prio, -2); bad != 0 {
				t.Errorf("%s: %d failed requests or malformed 503s", name, bad)
			}
		}
	})
}

// TestShedAfterQuota: on each engine, load shedding decides after the quotas: with the one slot
// held (the upstream holds a request until the test lets it go), a request over its quota is still
// 429 (it never takes a slot), one within it is 503 temporary-reduced-capacity with Retry-After
// and counted shed in the metrics; once the held one has answered, the slot is back.
func TestShedAfterQuota(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		arrived, gate := make(chan struct{}, 4), make(chan struct{})
		var once sync.Once
		open := func() { once.Do(func() { close(gate) }) }
		up := &upstream{count: map[string]int{}}
		up.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/held" {
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
  - {name: few, algorithm: fixed-window, limit: 3, period: 1h}
routes:
  - {path_prefix: /quota, policy: few}
load_shedding: {min_limit: 1, max_limit: 1, retry_after: 2s}
`, up)
		admin := httptest.NewServer(srv.Admin())
		t.Cleanup(admin.Close)
		done := make(chan int, 1)
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
		select {
		case <-arrived:
		case <-time.After(10 * time.Second):
			t.Fatal("the held request did not reach the upstream")
		}
		// Five requests within the quota of 3, over the load limit: each is shed, and each gets the
		// quota it took back (the client did nothing wrong), so none is refused for its quota.
		for i := range 5 {
			resp, err := http.Get(gw.URL + "/quota")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var p struct {
				Type, Detail string
				Status       int
			}
			if err := json.Unmarshal(body, &p); err != nil {
				t.Fatalf("request %d: %s", i, body)
			}
			if resp.StatusCode != 503 || p.Status != 503 || p.Type != "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity" ||
				resp.Header.Get("Retry-After") != "2" || !strings.Contains(p.Detail, "not a quota refusal") ||
				resp.Header.Get("Content-Type") != "application/problem+json" || resp.Header.Get("RateLimit-Policy") == "" {
				t.Fatalf("request %d with the slot taken: %d %v %s", i, resp.StatusCode, resp.Header, body)
			}
		}
		st := stats(t, admin.URL).LoadShedding
		if st == nil || st.Limit != 1 || st.InFlight != 1 || st.Shed["low"] != 5 || st.Admitted["low"] != 1 || st.Shares["low"] != 50 {
			t.Fatalf("/v1/stats load_shedding with the slot held: %+v", st)
		}
		m := metricsText(t, admin.URL)
		for _, line := range []string{`sluice_load_shed_total{priority="low"} 5`, `sluice_load_shed_total{priority="high"} 0`,
			"sluice_load_shedding_limit 1", "sluice_load_shedding_in_flight 1"} {
			if !strings.Contains(m, line+"\n") {
				t.Errorf("metrics lack %q", line)
			}
		}
		open()
		if code := <-done; code != 200 {
			t.Fatalf("the held request: %d", code)
		}
		if code := get(t, gw.URL+"/free").StatusCode; code != 200 {
			t.Fatalf("after the held one answered: %d", code)
		}
		// The whole quota is still there: 3 pass, and only then is one refused for its quota,
		// before load shedding is asked.
		for i := range 4 {
			resp := get(t, gw.URL+"/quota")
			if want := map[bool]int{true: 200, false: 429}[i < 3]; resp.StatusCode != want {
				t.Fatalf("after the shed ones, request %d to the quota of 3: %d, want %d", i, resp.StatusCode, want)
			}
		}
		if st := stats(t, admin.URL).LoadShedding; st.InFlight != 0 || st.Admitted["low"] != 5 {
			t.Fatalf("after: %+v", st)
		}
	})
}

// TestShedReload: a reload that keeps load_shedding's settings keeps the limiter (its requests in
// flight and counts); one that changes them starts a new one; one without it has none, and
// /v1/stats leaves load_shedding out.
func TestShedReload(t *testing.T) {
	srv, reloadFile := reloadable(t, newUpstream(t), "upstream: UPSTREAM\nload_shedding: {max_limit: 50}\n")
	gw := httptest.NewServer(srv)
	defer gw.Close()
	admin := httptest.NewServer(srv.Admin())
	defer admin.Close()
	get(t, gw.URL+"/a")
	reload := func(s string) {
		t.Helper()
		if err := reloadFile("upstream: UPSTREAM\n" + s); err != nil {
			t.Fatal(err)
		}
	}
	reload("load_shedding: {max_limit: 50}\npolicies: [{name: p, algorithm: fixed-window, limit: 9, period: 1h}]\n")
	if st := stats(t, admin.URL).LoadShedding; st == nil || st.Admitted["low"] != 1 || st.MaxLimit != 50 {
		t.Fatalf("the same settings reloaded: %+v", st)
	}
	reload("load_shedding: {max_limit: 60}\n")
	if st := stats(t, admin.URL).LoadShedding; st == nil || st.Admitted["low"] != 0 || st.MaxLimit != 60 || st.Limit != 60 {
		t.Fatalf("max_limit changed: %+v", st)
	}
	reload("")
	if st := stats(t, admin.URL); st.LoadShedding != nil {
		t.Fatalf("without load_shedding: %+v", st.LoadShedding)
	}
	if code := get(t, gw.URL+"/b").StatusCode; code != 200 {
		t.Fatalf("without load_shedding: %d", code)
	}
}

// TestShedRoutePriority: on each engine, a route's priority is what load shedding orders by,
// over the client's. With the limit fixed at 4 (low may fill 2, high 4) and two anonymous
// requests held on a high route, an anonymous request elsewhere (low) and partner-a's (a high
// client) on a low route are shed, while partner-a's elsewhere is admitted.
func TestShedRoutePriority(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		arrived, gate := make(chan struct{}, 8), make(chan struct{})
		var once sync.Once
		open := func() { once.Do(func() { close(gate) }) }
		up := &upstream{count: map[string]int{}}
		up.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Query().Get("hold") != "" {
				arrived <- struct{}{}
				select {
				case <-gate:
				case <-r.Context().Done():
				}
			}
			io.WriteString(w, "ok")
		}))
		t.Cleanup(func() { open(); up.Close() })
		gw, srv := start(t, engine, strings.ReplaceAll(`upstream: UPSTREAM
identity: [api_key: {header: X-API-Key}]
clients:
  - {name: partner-a, api_key_sha256: KEY_A}
routes:
  - {path_prefix: /checkout, priority: high}
  - {path_prefix: /reports, priority: low}
load_shedding: {min_limit: 4, max_limit: 4, priorities: {partner-a: high}}
`, "KEY_A", sum("key-a")), up)
		t.Cleanup(open) // (before the server's Close, which waits for the held requests)
		admin := httptest.NewServer(srv.Admin())
		t.Cleanup(admin.Close)
		done := make(chan int, 3)
		hold := func(path string) {
			go func() {
				resp, err := http.Get(gw.URL + path)
				if err != nil {
					done <- -1
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				done <- resp.StatusCode
			}()
			select {
			case <-arrived:
			case <-time.After(10 * time.Second):
				t.Fatalf("%s did not reach the upstream", path)
			}
		}
		hold("/checkout?hold=1")
		hold("/checkout?hold=2") // anonymous, but on a high route: admitted with 1 in flight of low's 2
		for _, c := range []struct {
			path, key string
			want      int
		}{
			{"/other", "", 503},           // anonymous (low) with 2 in flight: shed
			{"/reports/q3", "key-a", 503}, // partner-a is high, but the route is low: shed
			{"/other", "key-a", 200},      // partner-a elsewhere: high, admitted (3 of 4)
			{"/checkout", "", 200},        // anonymous on the high route: admitted
			{"/reports/q3?x=1", "", 503},  // and on the low route: shed
			{"/reports/q4", "key-a", 503}, // (a second, to count)
		} {
			var headers []string
			if c.key != "" {
				headers = []string{"X-API-Key", c.key}
			}
			if resp := get(t, gw.URL+c.path, headers...); resp.StatusCode != c.want {
				t.Fatalf("%s as %q: %d, want %d", c.path, c.key, resp.StatusCode, c.want)
			}
		}
		st := stats(t, admin.URL).LoadShedding
		if st == nil || st.InFlight != 2 || st.Shed["low"] != 4 || st.Shed["high"] != 0 || st.Admitted["high"] != 4 || st.Admitted["low"] != 0 {
			t.Fatalf("/v1/stats load_shedding: %+v", st)
		}
		open()
		for range 2 {
			if code := <-done; code != 200 {
				t.Fatalf("a held request: %d", code)
			}
		}
	})
}

package region_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/allot"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/gateway"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/region"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

// aRegion is one region of a test: its own redis-server, a gateway on it (the global policy's
// limit its allotment, from the refresher on the global Redis), and the upstream behind it.
type aRegion struct {
	name   string
	redis  *redistest.Server
	ref    *region.Refresher
	gw     *httptest.Server
	admin  *httptest.Server
	client *http.Client
	srv    *gateway.Server
	path   string // its configuration file
}

// startRegion starts region name: a regional redis-server and a gateway whose configuration is
// conf with REGIONAL and GLOBAL replaced by the two Redis addresses and NAME by name. start: run
// the refresher's loop (else the test refreshes with RefreshAll).
func startRegion(t *testing.T, name, conf string, global *redistest.Server, start bool) *aRegion {
	t.Helper()
	return startInstance(t, name, conf, global, redistest.Start(t), "", start)
}

// startInstance is startRegion on the regional redis-server rs, which other instances of the
// region may share; with an id, the instance pools with them there (Refresher.UsePool).
func startInstance(t *testing.T, name, conf string, global, rs *redistest.Server, id string, start bool) *aRegion {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(up.Close)
	y := regexp.MustCompile(`REGIONAL|GLOBAL|NAME|UPSTREAM`).ReplaceAllStringFunc(conf, func(s string) string {
		return map[string]string{"REGIONAL": rs.Addr, "GLOBAL": global.Addr, "NAME": name, "UPSTREAM": up.URL}[s]
	})
	path := filepath.Join(t.TempDir(), name+".yaml")
	if err := os.WriteFile(path, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	regional, err := redisstore.New(redisstore.Options{Addrs: cfg.Store.Addrs, Timeout: 2 * time.Second, SlowTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	guarded, err := sluice.Guard(regional)
	if err != nil {
		t.Fatal(err)
	}
	gs, err := redisstore.New(redisstore.Options{Addrs: cfg.Region.Global.Addrs, Timeout: 2 * time.Second, SlowTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := region.New(gs, cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	if id != "" {
		if err := ref.UsePool(regional, id); err != nil {
			t.Fatal(err)
		}
	}
	srv, err := gateway.NewServer(cfg, path, gateway.Store{Store: guarded, Ping: regional.Ping, Global: ref,
		Regions: func() gateway.RegionStats { return gateway.RegionStats{Region: ref.Name(), Policies: ref.Stats()} },
		Close:   func() { ref.Close(); gs.Close(); regional.Close() }}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	if start {
		ref.Start()
	}
	gw := httptest.NewServer(srv)
	t.Cleanup(gw.Close)
	admin := httptest.NewServer(srv.Admin())
	t.Cleanup(admin.Close)
	return &aRegion{name: name, redis: rs, ref: ref, gw: gw, admin: admin, client: gw.Client(), srv: srv, path: path}
}

// get sends one request; it returns the status and the RateLimit-Policy's q=.
func (r *aRegion) get(t *testing.T) (int, int64) {
	t.Helper()
	resp, err := r.client.Get(r.gw.URL + "/a")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	q := int64(-1)
	if m := regexp.MustCompile(`;q=(\d+)`).FindStringSubmatch(resp.Header.Get("RateLimit-Policy")); m != nil {
		q, _ = strconv.ParseInt(m[1], 10, 64)
	}
	return resp.StatusCode, q
}

// patience is how long a test waits for a condition before it fails: long, as a busy machine
// (two cores, another suite beside) may take many times an idle one's.
const patience = 30 * time.Second

// waitFor polls cond until it holds, failing the test after within.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func allotment(r *aRegion) int64 {
	a, _ := r.ref.Allotment("partner")
	return a
}

const oneRegion = `upstream: UPSTREAM
store: {type: redis, addrs: [REGIONAL], timeout: 2s, slow_timeout: 2s}
region: {name: NAME, regions: 2, floor: 0.1, refresh: 100ms, lease: 1s, hold: 1ms, global: {addrs: [GLOBAL], timeout: 2s, slow_timeout: 2s}}
policies:
  - {name: partner, algorithm: fixed-window, limit: 100, period: 1h, global: true, key_by: []}
  - {name: local, algorithm: fixed-window, limit: 1000, period: 1h}
default_policy: [partner, local]
`

// TestRegionEnforcesAllotment: before any grant the gateway enforces the floor (10 of 100: the
// first request never waits); the ledger's state is new, so for a lease and the hold it grants
// no more than the floor (learning); then, while demand goes on, the ledger's allotment (all but
// the floor reserved for the other region: 90) is the limit the gateway enforces,
// RateLimit-Policy's q= shows it, and the counts are kept across the change. The ledger has the
// region's report.
func TestRegionEnforcesAllotment(t *testing.T) {
	global := redistest.Start(t)
	eu := startRegion(t, "eu", oneRegion, global, false)
	for i := range 10 {
		if code, q := eu.get(t); code != 200 || q != 10 {
			t.Fatalf("request %d on the floor: %d, q=%d; want 200, q=10", i, code, q)
		}
	}
	if code, q := eu.get(t); code != 429 || q != 10 {
		t.Fatalf("the 11th on the floor: %d, q=%d; want 429, q=10", code, q)
	}
	eu.ref.Start()
	// Refused requests are demand too: they keep it up while the ledger learns; then the
	// allotment, 90, is enforced, until the window has admitted 90.
	admitted := int64(10)
	waitFor(t, patience, "the allotment of 90 used", func() bool {
		code, q := eu.get(t)
		switch {
		case code == 200 && q == 90:
			admitted++
		case code == 429 && q == 90:
			return true
		case code != 429 || q != 10:
			t.Fatalf("after %d admitted: %d, q=%d; want 429 on the floor of 10 or the allotment of 90", admitted, code, q)
		}
		return false
	})
	if admitted != 90 {
		t.Fatalf("%d admitted in the window; want the allotment, 90 (the 10 on the floor still count)", admitted)
	}
	// GET /v1/stats "regions" and the metrics show it.
	stats := statsOf(t, eu)
	if r := stats.Regions; r == nil || r.Region != "eu" || len(r.Policies) != 1 || r.Policies[0].Policy != "partner" || r.Policies[0].Limit != 100 ||
		r.Policies[0].Allotment != 90 || r.Policies[0].Floor || r.Policies[0].Safe || r.Policies[0].Lease.IsZero() {
		t.Fatalf("/v1/stats regions: %+v", stats.Regions)
	}
	resp, err := http.Get(eu.admin.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, m := range []string{`sluice_region_allotment{policy="partner",region="eu"} 90`, `sluice_region_limit{policy="partner",region="eu"} 100`,
		`sluice_region_safe_share{policy="partner",region="eu"} 0`} {
		if !strings.Contains(string(metrics), m) {
			t.Errorf("/metrics has no %s", m)
		}
	}
	l, err := mustStore(t, global).Ledger("partner", redisstore.LedgerOptions{Limit: 100, Regions: 2, Floor: 10, Lease: time.Second, Hold: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, patience, "the ledger counting eu's use of 90", func() bool {
		v, err := l.Read(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return len(v.Regions) == 1 && v.Regions[0].Region == "eu" && v.Regions[0].Used == 90
	})
}

func mustStore(t *testing.T, s *redistest.Server) *redisstore.Store {
	t.Helper()
	st, err := redisstore.New(redisstore.Options{Addrs: []string{s.Addr}, Timeout: 2 * time.Second, SlowTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st
}

const twoRegions = `upstream: UPSTREAM
store: {type: redis, addrs: [REGIONAL], timeout: 2s, slow_timeout: 2s}
region: {name: NAME, regions: 2, floor: 0.1, safe_share: 0.3, refresh: 200ms, lease: 2s, global: {addrs: [GLOBAL], timeout: 2s, slow_timeout: 2s}}
policies:
  - {name: partner, algorithm: fixed-window, limit: 100, period: 1s, global: true, key_by: []}
default_policy: partner
`

// tally counts each region's requests by the window (1 s) they were certainly decided in (sent
// and answered within it); ambiguous ones, at a window's boundary, are counted apart.
type tally struct {
	mu        sync.Mutex
	admitted  map[string]map[int64]int64
	refused   map[string]map[int64]int64
	ambiguous atomic.Int64
}

func newTally() *tally {
	return &tally{admitted: map[string]map[int64]int64{}, refused: map[string]map[int64]int64{}}
}

// traffic sends rate requests a second to r until stop, counting them in tl under r's name. On a
// busy machine it may send fewer: check asks for the limit to be used in the windows where the
// regions were asked for more.
func (tl *tally) traffic(t *testing.T, r *aRegion, rate int, stop <-chan struct{}) {
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	// Up to 16 at once, so that a slow answer does not slow the rate asked.
	slots := make(chan struct{}, 16)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		select {
		case slots <- struct{}{}:
		case <-stop:
			return
		}
		wg.Go(func() {
			defer func() { <-slots }()
			tl.send(t, r)
		})
	}
}

// send sends one request to r and counts it.
func (tl *tally) send(t *testing.T, r *aRegion) {
	t0 := time.Now().UnixMicro()
	resp, err := r.client.Get(r.gw.URL + "/a")
	t1 := time.Now().UnixMicro()
	if err != nil {
		t.Error(err)
		return
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if t0/1e6 != t1/1e6 {
		tl.ambiguous.Add(1)
		return
	}
	by := tl.refused
	if resp.StatusCode == 200 {
		by = tl.admitted
	}
	tl.mu.Lock()
	if by[r.name] == nil {
		by[r.name] = map[int64]int64{}
	}
	by[r.name][t0/1e6]++
	tl.mu.Unlock()
}

// check checks the windows [from, to): the regions' admissions together at most most, each
// region's at most each (0: no such bound); and, unless least is 0, that the allotments are
// used: at least least admitted together in most of the windows where the regions were asked
// for more than least together (the rest may lag a change of the traffic, which on a busy
// machine is less steady than asked).
func (tl *tally) check(t *testing.T, what string, from, to, most, each, least int64) {
	t.Helper()
	tl.mu.Lock()
	defer tl.mu.Unlock()
	asked, used := 0, 0
	var short []string
	for w := from; w < to; w++ {
		var sum, offered int64
		var parts []string
		for _, name := range slices.Sorted(maps.Keys(tl.admitted)) {
			n := tl.admitted[name][w]
			sum, offered = sum+n, offered+n+tl.refused[name][w]
			parts = append(parts, fmt.Sprintf("%s %d (%d refused)", name, n, tl.refused[name][w]))
			if each > 0 && n > each {
				t.Errorf("%s, window %d: %s admitted %d; at most %d", what, w, name, n, each)
			}
		}
		if sum > most {
			t.Errorf("%s, window %d: %s: %d admitted worldwide; at most %d", what, w, strings.Join(parts, ", "), sum, most)
		}
		if least > 0 && offered > least {
			asked++
			if sum >= least {
				used++
			} else {
				short = append(short, fmt.Sprintf("window %d: %s", w, strings.Join(parts, ", ")))
			}
		}
	}
	if least > 0 && (asked == 0 || 2*used <= asked) {
		t.Errorf("%s: at least %d used in %d of the %d windows asked for more; want most (short: %s)", what, least, used, asked, strings.Join(short, "; "))
	}
}

// fairShare is what the ledger's split gives the regions' reported wants, each raised to the floor.
func fairShare(floor int64, regions ...*aRegion) []int64 {
	want := make([]int64, len(regions))
	for i, r := range regions {
		for _, s := range r.ref.Stats() {
			if s.Refresher || s.Version == 0 {
				want[i] = max(s.Want, floor)
			}
		}
	}
	return allot.FairShare(100, want)
}

// near: got is within 5 of want (the demand is measured over short intervals and moves a few
// units between refreshes).
func near(got, want int64) bool { return got >= want-5 && got <= want+5 }

// TestRegionsFollowDemand: two regions, each its gateway on its own Redis, one global Redis;
// demand 3:1 over the limit (120 and 40 a second for 100 a second): the fair share gives the
// smaller region all it wants (40) and the other the rest (60), and no window admits more than
// the limit worldwide, while most of it is used. Then the global Redis is killed: each region
// keeps its allotment until its lease ends, then enforces its safe share (30), so that a window
// admits at most L + k·(S − F) = 100 + 2·(30 − 10) worldwide (docs/design.md), here 2·30.
func TestRegionsFollowDemand(t *testing.T) {
	global := redistest.Start(t)
	eu := startRegion(t, "eu", twoRegions, global, true)
	us := startRegion(t, "us", twoRegions, global, true)
	tl := newTally()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, c := range []struct {
		r    *aRegion
		rate int
	}{{eu, 120}, {us, 40}} {
		wg.Add(1)
		go func() { defer wg.Done(); tl.traffic(t, c.r, c.rate, stop) }()
	}
	stopped := false
	defer func() {
		if !stopped {
			close(stop)
			wg.Wait()
		}
	}()
	// The allotments follow demand: eu near 60, us near 40, the fair share of what each wants
	// (on a busy machine the traffic may be less than asked: then the fair share of what the
	// regions reported, eu still the larger).
	waitFor(t, patience, "allotments: the fair share of the demand, eu's the larger", func() bool {
		e, u, share := allotment(eu), allotment(us), fairShare(10, eu, us)
		return near(e, share[0]) && near(u, share[1]) && e > u && e+u <= 100
	})
	waitFor(t, patience, "the diagnosis: the limit short of the regions' demand", func() bool {
		return hasFinding(t, eu, "global_limit_short") && hasFinding(t, us, "global_limit_short") && !hasFinding(t, eu, "region_safe_share")
	})
	start := time.Now().Unix() + 1
	waitFor(t, patience, "four whole windows", func() bool { return time.Now().Unix() >= start+4 })
	// The ledger is killed: each region keeps its lease, then the safe share.
	held := map[string]int64{"eu": allotment(eu), "us": allotment(us)}
	leases := map[string]time.Time{}
	for _, r := range []*aRegion{eu, us} {
		leases[r.name] = r.ref.Stats()[0].Lease
	}
	global.Kill()
	killedAt := time.Now()
	for _, r := range []*aRegion{eu, us} {
		waitFor(t, patience, r.name+" on its safe share", func() bool {
			a, _ := r.ref.Allotment("partner")
			now := time.Now()
			if now.Before(leases[r.name]) && a != held[r.name] {
				t.Fatalf("%s: allotment %d before its lease ended (%v); want the %d it held", r.name, a, leases[r.name].Sub(now), held[r.name])
			}
			return a == 30
		})
		if time.Now().Before(leases[r.name]) {
			t.Fatalf("%s on its safe share before its lease ended", r.name)
		}
		waitFor(t, patience, r.name+"'s stats: on its safe share, the refresh failing, the diagnosis says so", func() bool {
			st := r.ref.Stats()[0]
			return st.Safe && st.Allotment == 30 && st.Error != "" && hasFinding(t, r, "region_safe_share")
		})
	}
	safeFrom := time.Now().Unix() + 1
	waitFor(t, patience, "three whole windows on the safe share", func() bool { return time.Now().Unix() >= safeFrom+3 })
	close(stop)
	wg.Wait()
	stopped = true

	tl.check(t, "the ledger reachable", start, start+4, 100, 0, 90)
	tl.check(t, "on the safe share (L + k·(S − F) = 140 worldwide, 30 each)", safeFrom, safeFrom+3, 100+2*(30-10), 30, 55)
	t.Logf("killed at %v; admitted: %v; ambiguous (at a boundary): %d", killedAt.Format("15:04:05.000"), fmt.Sprint(tl.admitted), tl.ambiguous.Load())
}

// TestRegionHotPath: what the decision layer asks per request of a global policy allocates
// nothing.
func TestRegionHotPath(t *testing.T) {
	global := redistest.Start(t)
	eu := startRegion(t, "eu", oneRegion, global, false)
	d := sluice.Decision{Allowed: true, Limit: 10, Remaining: 3, ResetAfter: time.Minute}
	if n := testing.AllocsPerRun(1000, func() {
		if a, ok := eu.ref.Allotment("partner"); !ok || a != 10 {
			t.Fatalf("allotment %d, %v", a, ok)
		}
		eu.ref.Decided("partner", true, &d)
	}); n != 0 {
		t.Fatalf("%v allocations per decision", n)
	}
	if _, ok := eu.ref.Allotment("local"); ok {
		t.Fatal("a region-only policy has no allotment")
	}
}

// TestRegionReload: a reload that changes a global policy's limit gives the refresher the new
// ledger (on the floor of the new limit until its grant); one that changes the region section is
// refused, the running one staying.
func TestRegionReload(t *testing.T) {
	global := redistest.Start(t)
	eu := startRegion(t, "eu", oneRegion, global, false)
	conf, err := os.ReadFile(eu.path)
	if err != nil {
		t.Fatal(err)
	}
	write := func(old, new string) {
		t.Helper()
		if err := os.WriteFile(eu.path, []byte(strings.Replace(string(conf), old, new, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("limit: 100, period: 1h, global: true", "limit: 200, period: 1h, global: true")
	if err := eu.srv.Reload(); err != nil {
		t.Fatal(err)
	}
	if code, q := eu.get(t); code != 200 || q != 20 || allotment(eu) != 20 {
		t.Fatalf("after the limit went to 200: %d, q=%d, allotment %d; want the new floor, 20", code, q, allotment(eu))
	}
	eu.ref.RefreshAll(context.Background())
	if st := eu.ref.Stats(); len(st) != 1 || st[0].Limit != 200 {
		t.Fatalf("stats after the reload: %+v", st)
	}
	write("floor: 0.1", "floor: 0.2")
	if err := eu.srv.Reload(); !errors.Is(err, gateway.ErrRegionChanged) {
		t.Fatalf("a reload changing the region section: %v; want ErrRegionChanged", err)
	}
	if allotment(eu) != 20 {
		t.Fatalf("allotment %d after a refused reload; want the running 20", allotment(eu))
	}
}

// statsOf is r's GET /v1/stats.
func statsOf(t *testing.T, r *aRegion) gateway.Stats {
	t.Helper()
	resp, err := http.Get(r.admin.URL + "/v1/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st gateway.Stats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

// hasFinding: r's /v1/stats diagnosis has a finding of kind.
func hasFinding(t *testing.T, r *aRegion, kind string) bool {
	t.Helper()
	for _, f := range statsOf(t, r).Diagnosis.Findings {
		if f.Kind == kind {
			return true
		}
	}
	return false
}

// TestRegionZeroAllotment: with a floor of 0, a region that has no grant yet admits nothing of
// the global policy: refused without a store call (nothing counted on its Redis: the local
// policy beside it consumed nothing either), the refusal counted as demand.
func TestRegionZeroAllotment(t *testing.T) {
	global := redistest.Start(t)
	eu := startRegion(t, "eu", regexp.MustCompile(`floor: 0\.1`).ReplaceAllString(oneRegion, "floor: 0"), global, false)
	for range 3 {
		if code, q := eu.get(t); code != 429 || q != 0 {
			t.Fatalf("on a floor of 0: %d, q=%d; want 429, q=0", code, q)
		}
	}
	if keys, err := eu.redis.Do("DBSIZE"); err != nil || keys != "0" {
		t.Fatalf("the regional Redis holds %s keys (%v); want none: nothing was decided there", keys, err)
	}
	eu.ref.RefreshAll(context.Background())
	l, err := mustStore(t, global).Ledger("partner", redisstore.LedgerOptions{Limit: 100, Regions: 2, Lease: time.Second, Hold: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	v, err := l.Read(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Regions) != 1 || v.Regions[0].Refused != 3 || v.Regions[0].Want == 0 {
		t.Fatalf("the ledger: %+v; want eu's 3 refusals as its demand", v.Regions)
	}
}

// TestRegionAlgorithms: on the floor (10 of 100, no grant yet), a sliding window admits 10 in
// its window and a token bucket of burst 200 a capacity scaled alike, 20 (C·a/L: docs/design.md).
func TestRegionAlgorithms(t *testing.T) {
	global := redistest.Start(t)
	for _, c := range []struct {
		policy string
		want   int
	}{
		{"algorithm: sliding-window, limit: 100, period: 1h", 10},
		{"algorithm: token-bucket, limit: 100, period: 1h, burst: 200", 20},
	} {
		conf := strings.Replace(oneRegion, "algorithm: fixed-window, limit: 100, period: 1h", c.policy, 1)
		r := startRegion(t, "eu", conf, global, false)
		admitted, last := 0, 0
		for {
			code, _ := r.get(t)
			if last = code; code != 200 {
				break
			}
			admitted++
			if admitted > c.want {
				break
			}
		}
		if admitted != c.want {
			t.Errorf("%s on the floor: %d admitted (then %d); want %d", c.policy, admitted, last, c.want)
		}
	}
}

// TestRegionUseOfLaterWindow: a fixed window's decision in a later window replaces the use the
// region reports, even when it comes back before the earlier window's end by this clock (the
// earlier window has ended on the store's, for every key): before, the two were kept with max,
// and a window's use counted a whole window more (TestServeE2ERegionsWorld: a region's ramp-up
// use of 183 held in the ledger for two more windows, another region granted 0).
func TestRegionUseOfLaterWindow(t *testing.T) {
	global := redistest.Start(t)
	eu := startRegion(t, "eu", oneRegion, global, false)
	eu.ref.Decided("partner", true, &sluice.Decision{Allowed: true, Limit: 100, Remaining: 10, ResetAfter: time.Minute, Source: sluice.FromStore})
	eu.ref.Decided("partner", true, &sluice.Decision{Allowed: true, Limit: 100, Remaining: 95, ResetAfter: time.Hour - time.Millisecond, Source: sluice.FromStore})
	eu.ref.RefreshAll(context.Background())
	if st := eu.ref.Stats()[0]; st.Used != 5 {
		t.Fatalf("the use reported after a decision of the next window: %d; want its 5, not the earlier window's 90 (stats %+v)", st.Used, st)
	}
	// Within one window the largest use of any key is kept.
	eu.ref.Decided("partner", true, &sluice.Decision{Allowed: true, Limit: 100, Remaining: 98, ResetAfter: time.Hour - 2*time.Millisecond, Source: sluice.FromStore})
	eu.ref.RefreshAll(context.Background())
	if st := eu.ref.Stats()[0]; st.Used != 5 {
		t.Fatalf("the use reported after a smaller one in the same window: %d; want the larger, 5", st.Used)
	}
}

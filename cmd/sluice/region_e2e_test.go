package main

import (
	"fmt"
	"io"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
)

// regionConfig is region name's instance: its own Redis, the ledger on global, one global
// policy of 100 an hour counted for every request together.
func regionConfig(upstreamURL, name, regional, global string) configFunc {
	return func(listen, admin string) string {
		return fmt.Sprintf(`listen: %s
admin_listen: %s
upstream: %s
store: {type: redis, addrs: [%s], timeout: 2s, slow_timeout: 2s}
region:
  name: %s
  regions: 2
  global: {addrs: [%s]}
  refresh: 100ms
  lease: 1s
  hold: 1ms
  floor: 0.1
policies:
  - {name: partner, algorithm: fixed-window, limit: 100, period: 1h, global: true, key_by: []}
default_policy: partner
`, listen, admin, upstreamURL, regional, name, global)
	}
}

var qRE = regexp.MustCompile(`;q=(\d+)`)

// regionGet sends one request to p; it returns the status and the RateLimit-Policy's q=.
func regionGet(t *testing.T, p *sluiceProc) (int, int64) {
	t.Helper()
	resp, err := e2eClient.Get(p.proxy + "/a")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	q := int64(-1)
	if m := qRE.FindStringSubmatch(resp.Header.Get("RateLimit-Policy")); m != nil {
		q, _ = strconv.ParseInt(m[1], 10, 64)
	}
	return resp.StatusCode, q
}

// TestServeE2ERegions: two sluice serve processes, each a region on its own redis-server, one
// global redis-server for the ledger. eu's demand takes all but the floor reserved for us (90 of
// 100: RateLimit-Policy's q= shows it, and /v1/stats and the metrics); us then gets its floor,
// 10, as eu's use counts to the hour's end: worldwide exactly the limit reaches the upstream.
func TestServeE2ERegions(t *testing.T) {
	t.Parallel()
	global := redistest.Start(t)
	up := newUpstream(t)
	dir := t.TempDir()
	eu := startSluice(t, dir, "eu.yaml", regionConfig(up.URL, "eu", redistest.Start(t).Addr, global.Addr))
	us := startSluice(t, dir, "us.yaml", regionConfig(up.URL, "us", redistest.Start(t).Addr, global.Addr))
	// eu asks until its window is full under an allotment above the floor: refused requests are
	// demand too, and keep it up while the ledger's new state learns (a lease and the hold).
	admitted := map[string]int{}
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, q := regionGet(t, eu)
		if code == 200 {
			admitted["eu"]++
		} else if q == 90 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("eu's allotment did not reach 90 (last q=%d, %d admitted)\n%s", q, admitted["eu"], eu.stderr.String())
		}
	}
	if admitted["eu"] != 90 {
		t.Fatalf("eu admitted %d; want 90, its allotment (100 less the floor reserved for us)", admitted["eu"])
	}
	st := eu.stats(t)
	if st.Regions == nil || st.Regions.Region != "eu" || len(st.Regions.Policies) != 1 || st.Regions.Policies[0].Allotment != 90 {
		t.Fatalf("eu's /v1/stats regions: %+v", st.Regions)
	}
	if v := eu.metric(t, "sluice_region_allotment", map[string]string{"region": "eu", "policy": "partner"}); v != 90 {
		t.Fatalf("sluice_region_allotment %v; want 90", v)
	}
	// us: its floor, and no more while eu's 90 count.
	for range 30 {
		if code, q := regionGet(t, us); code == 200 {
			admitted["us"]++
		} else if q > 10 {
			t.Fatalf("us refused under q=%d; eu's use leaves it 10", q)
		}
	}
	if admitted["us"] != 10 {
		t.Fatalf("us admitted %d; want its floor, 10", admitted["us"])
	}
	for range 5 {
		if code, _ := regionGet(t, eu); code != 429 {
			t.Fatalf("eu admitted past the limit: %d", code)
		}
	}
	if n := up.count("/a"); n != 100 {
		t.Fatalf("%d requests reached the upstream; want the limit, 100", n)
	}
}

// TestServeE2ERegionPool: two sluice serve instances of eu on eu's redis-server, one of us on
// its own, one global redis-server. eu's instances pool there: exactly one refreshes the ledger
// for the region (its lock), both enforce the grant it publishes on the region's counter, so
// eu's demand, sent to both in turn, takes all but us's floor (90) and the two admit 90 together;
// us then admits its floor: exactly the limit reaches the upstream. The diagnosis has no finding
// of several instances in the region.
func TestServeE2ERegionPool(t *testing.T) {
	t.Parallel()
	global, euRedis := redistest.Start(t), redistest.Start(t)
	up := newUpstream(t)
	dir := t.TempDir()
	eu := []*sluiceProc{
		startSluice(t, dir, "eu-a.yaml", regionConfig(up.URL, "eu", euRedis.Addr, global.Addr)),
		startSluice(t, dir, "eu-b.yaml", regionConfig(up.URL, "eu", euRedis.Addr, global.Addr)),
	}
	us := startSluice(t, dir, "us.yaml", regionConfig(up.URL, "us", redistest.Start(t).Addr, global.Addr))
	admitted, full := 0, map[int]bool{}
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; len(full) < 2; i++ {
		code, q := regionGet(t, eu[i%2])
		if code == 200 {
			admitted++
		} else if q == 90 {
			full[i%2] = true
		}
		if time.Now().After(deadline) {
			t.Fatalf("eu's instances did not both refuse under 90 (last q=%d, %d admitted)\n%s\n%s", q, admitted, eu[0].stderr.String(), eu[1].stderr.String())
		}
	}
	if admitted != 90 {
		t.Fatalf("eu's two instances admitted %d together; want 90, the region's allotment", admitted)
	}
	refreshers, survivor := 0, -1
	for i, p := range eu {
		st := p.stats(t)
		if st.Regions == nil || len(st.Regions.Policies) != 1 || st.Regions.Policies[0].Allotment != 90 {
			t.Fatalf("eu's /v1/stats regions: %+v", st.Regions)
		}
		if st.Regions.Policies[0].Refresher {
			refreshers++
		} else {
			survivor = i
		}
		for _, f := range st.Diagnosis.Findings {
			if f.Kind == "region_instances" {
				t.Fatalf("the diagnosis flags the pooled instances: %+v", f)
			}
		}
	}
	if refreshers != 1 {
		t.Fatalf("%d of eu's instances refresh the ledger; want one", refreshers)
	}
	usAdmitted := 0
	for range 30 {
		if code, _ := regionGet(t, us); code == 200 {
			usAdmitted++
		}
	}
	if usAdmitted != 10 {
		t.Fatalf("us admitted %d; want its floor, 10", usAdmitted)
	}
	// eu's refresher is killed (its lock not given back): the survivor takes over within the
	// lock's TTL (3 refreshes, 300 ms) and a refresh, and admits nothing more (the region's 90 are
	// used in this hour's window): the upstream has the limit.
	eu[1-survivor].signal(syscall.SIGKILL)
	killed := time.Now()
	for !eu[survivor].stats(t).Regions.Policies[0].Refresher {
		if time.Since(killed) > 30*time.Second {
			t.Fatalf("no takeover within 30s\n%s", eu[survivor].stderr.String())
		}
		time.Sleep(10 * time.Millisecond) // polling /v1/stats, as an operator would
	}
	// (Within the lock's TTL, 300 ms, and a refresh on an idle machine: logged, not checked.)
	t.Logf("the survivor took over %v after the kill", time.Since(killed))
	for range 10 {
		if code, q := regionGet(t, eu[survivor]); code != 429 || q > 90 || q < 0 {
			t.Fatalf("eu's survivor after the takeover: %d, q=%d; want 429, the region's 90 used (its allotment at most 90, less as us wants too)", code, q)
		}
	}
	if n := up.count("/a"); n != 100 {
		t.Fatalf("%d requests reached the upstream; want the limit, 100", n)
	}
}

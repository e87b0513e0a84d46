package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sluicehq/sluice/gateway"
	"github.com/sluicehq/sluice/internal/browsertest"
	"github.com/sluicehq/sluice/internal/redistest"
)

const sharesKey = "e2e-shares-partner-key-8d1f"

// sharesConfig: a Redis store with the default failure mode (fail-closed: no local fallback,
// and still the instance registry), one partner with a fixed window of limit per 1000 hours (a
// window that does not roll over during the test).
func sharesConfig(upstreamURL, redisAddr string, limit int) configFunc {
	return sharesConfigAlg(upstreamURL, redisAddr, "fixed-window", limit)
}

// sharesConfigAlg is sharesConfig with the policy's algorithm.
func sharesConfigAlg(upstreamURL, redisAddr, algorithm string, limit int) configFunc {
	return func(listen, admin string) string {
		return fmt.Sprintf(`listen: %s
admin_listen: %s
upstream: %s
store:
  type: redis
  addrs: [%s]
  timeout: 1s
identity:
  - api_key: {header: X-API-Key}
  - ip: {}
policies:
  - {name: partner-window, algorithm: %s, limit: %d, period: 1000h}
clients:
  - {name: partner, api_key_sha256: %q, policy: partner-window}
`, listen, admin, upstreamURL, redisAddr, algorithm, limit, sha256Hex(sharesKey))
	}
}

func statsOf(t *testing.T, p *sluiceProc) gateway.Stats {
	t.Helper()
	r := get(t, p.admin, "/v1/stats")
	var st gateway.Stats
	if err := json.Unmarshal(r.body, &st); err != nil || r.status != http.StatusOK {
		t.Fatalf("GET /v1/stats of %s: %d %v %s", p.admin, r.status, err, r.body)
	}
	return st
}

// partnerShares returns p's diagnosis.shares row of the partner, nil if it has none yet.
func partnerShares(st gateway.Stats) *gateway.ClientShare {
	if st.Diagnosis.Shares == nil {
		return nil
	}
	for _, c := range st.Diagnosis.Shares.Clients {
		if c.Client == "partner" && c.Policy == "partner-window" {
			return &c
		}
	}
	return nil
}

// byInstance is a share row's approvals as "id=n" in the row's order (by id).
func byInstance(c *gateway.ClientShare) string {
	var s []string
	for _, in := range c.Instances {
		s = append(s, fmt.Sprintf("%s=%d", in.ID, in.Approved))
	}
	return strings.Join(s, " ")
}

// waitShares waits until every one of procs shows, after their heartbeats, the partner's row
// with want (byInstance's form) and returns what each shows.
func waitShares(t *testing.T, procs []*sluiceProc, want string) []gateway.Stats {
	t.Helper()
	out := make([]gateway.Stats, len(procs))
	deadline := time.Now().Add(20 * time.Second)
	for i, p := range procs {
		for {
			out[i] = statsOf(t, p)
			c := partnerShares(out[i])
			if c != nil && byInstance(c) == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("instance %d never showed the partner's approvals %s within 20 s: %+v", i, want, c)
			}
			time.Sleep(50 * time.Millisecond) // (polling the heartbeats, every 2 s, with a deadline)
		}
	}
	return out
}

// send sends n of the partner's requests to p and returns how many passed (200; else 429).
func send(t *testing.T, p *sluiceProc, path string, n int) int {
	t.Helper()
	return admitted(t, p, path, sharesKey, n)
}

// TestServeE2EShares: three `sluice serve` processes on one real Redis with the default failure
// mode (no local fallback: the instance registry runs on every Redis store now) get one
// partner's requests unevenly, 30, 20 and 10, of a limit of 100. After their heartbeats the
// /v1/stats of ANY instance shows each instance's exact approvals for the partner, its share,
// the total of 60 and the 3 instances; nothing is flagged (they count together: 60 of 100); and
// the operator page (Chromium) shows the table, client by instance, under its fleet's name.
func TestServeE2EShares(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	up := newUpstream(t)
	procs := startThree(t, sharesConfig(up.URL, rs.Addr, 100))
	waitFleet(t, procs, 3, time.Time{}, 20*time.Second)
	ids := make([]string, 3)
	for i, p := range procs {
		ids[i] = statsFleet(t, p).Self
	}
	for i, n := range []int{30, 20, 10} {
		if got := send(t, procs[i], "/orders", n); got != n {
			t.Fatalf("instance %d: %d of %d passed; want all (60 of 100)", i, got, n)
		}
	}
	type idn struct {
		id string
		n  int64
	}
	order := []idn{{ids[0], 30}, {ids[1], 20}, {ids[2], 10}}
	slices.SortFunc(order, func(a, b idn) int { return strings.Compare(a.id, b.id) })
	var want []string
	for _, o := range order {
		want = append(want, fmt.Sprintf("%s=%d", o.id, o.n))
	}
	sts := waitShares(t, procs, strings.Join(want, " "))
	for i, st := range sts {
		c := partnerShares(st)
		sh := st.Diagnosis.Shares
		if c.Total != 60 || c.Allowed != 100 || c.Period != "1000h0m0s" || sh.Instances != 3 || sh.Listed != 3 || st.Diagnosis.Counting.Instances != 3 {
			t.Errorf("instance %d's shares: %+v, row %+v; want a total of 60 of 100 on 3 instances", i, sh, c)
		}
		for _, in := range c.Instances {
			if want := float64(in.Approved) * 100 / 60; in.Share != want {
				t.Errorf("instance %d: %s's share %v%%; want %v%%", i, in.ID, in.Share, want)
			}
		}
		for _, f := range st.Diagnosis.Findings {
			if f.Kind == "separate_counters" {
				t.Errorf("instance %d: a separate_counters finding though 60 of 100 passed: %+v", i, f)
			}
		}
		if st.Fleet == nil || st.Fleet.FallbackShare != 0 {
			t.Errorf("instance %d's fleet: %+v; want the registry, no local fallback (share 0)", i, st.Fleet)
		}
	}
	if got := up.count("/orders"); got != 60 {
		t.Errorf("the upstream got %d; want 60", got)
	}

	tab := browsertest.NewTab(t, 1280, 1600)
	tab.Do("open the operator page of instance 2", chromedp.Navigate(procs[2].admin+"/operator/"))
	tab.Wait("the shares table with the partner's row", `document.querySelector('#diag-shares tr[data-key="partner"]') !== null`)
	head := browsertest.Eval[[]string](tab, `[...document.querySelectorAll('#diag-shares thead th')].map(th => th.textContent)`)
	wantHead := []string{"client", "policy"}
	wantRow := []string{"partner", "partner-window"}
	for _, o := range order {
		wantHead = append(wantHead, o.id)
		wantRow = append(wantRow, fmt.Sprintf("%d (%.1f%%)", o.n, float64(o.n)*100/60))
	}
	wantHead = append(wantHead, "total", "allowed per window")
	wantRow = append(wantRow, "60", "100")
	if !slices.Equal(head, wantHead) {
		t.Errorf("the shares table's head on the page: %q; want %q", head, wantHead)
	}
	row := browsertest.Eval[[]string](tab, `[...document.querySelector('#diag-shares tr[data-key="partner"]').cells].map(c => c.textContent)`)
	if !slices.Equal(row, wantRow) {
		t.Errorf("the partner's row on the page: %q; want %q", row, wantRow)
	}
	if browsertest.Eval[bool](tab, `document.querySelector('#diag-shares td.over') !== null`) {
		t.Error("the page flags a total over the limit; 60 of 100 is not")
	}
	if h := browsertest.Eval[string](tab, `document.getElementById("fleet-h").textContent`); h != "Instances of fleet default" {
		t.Errorf("the page's instances heading: %q; want it to name the fleet, default", h)
	}
	tab.Screenshot("shares-desktop")

	// The fleet's history (GET /v1/history, the processes' own wiring to Redis): once the slot of
	// the requests has ended and every instance has added it, instance 2 reads the 60 allowed of
	// the 3 instances, and its own 10; its page's fleet chart holds that slot.
	var h gateway.HistoryReport
	sum := func(ss []gateway.HistorySlot) (allowed uint64, instances int) {
		for _, s := range ss {
			allowed += s.Allowed
			instances = max(instances, s.Instances)
		}
		return allowed, instances
	}
	for deadline := time.Now().Add(40 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		resp, err := http.Get(procs[2].admin + "/v1/history")
		if err != nil {
			t.Fatal(err)
		}
		h = gateway.HistoryReport{}
		err = json.NewDecoder(resp.Body).Decode(&h)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("GET /v1/history: %d %v", resp.StatusCode, err)
		}
		fa, fi := sum(h.Fleet)
		if fa == 60 && fi == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the fleet's history after 40 s: %d allowed by up to %d instances (%s); want 60 by 3: %+v", fa, fi, h.FleetError, h.Fleet)
		}
	}
	if mine, _ := sum(h.Instance); mine != 10 {
		t.Errorf("instance 2's own history: %d allowed; want its 10", mine)
	}
	tab.Do("open the operator page again", chromedp.Navigate(procs[2].admin+"/operator/"))
	tab.Wait("the fleet's chart with the 3 instances' slot", `!document.getElementById("fleet-rates").hidden && document.getElementById("fleet-chart").dataset.instances === "3"`)
}

// TestServeE2ESharesDrift: the instances do not count together although they share the Redis,
// its prefix and the registry — a configuration change that reached one instance only: two run
// the partner's policy as a fixed window with a limit of 10, the third as a sliding window of 12.
// A policy's state is stamped with its algorithm (and period), and a state of another algorithm
// reads as never seen (a changed limit alone keeps the count), so the third and the others reset
// each other's count: sent round robin, all 30 requests pass (10 on each), where one counter would
// have let 12 at most. Every instance's /v1/stats shows the 10 each and flags separate_counters with the
// figures and the differing configurations; the operator page flags the total.
func TestServeE2ESharesDrift(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	up := newUpstream(t)
	dir := t.TempDir()
	procs := make([]*sluiceProc, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i, limit := range []int{10, 10, 12} {
		alg := map[bool]string{true: "sliding-window", false: "fixed-window"}[limit == 12]
		wg.Add(1)
		go func() {
			defer wg.Done()
			procs[i], errs[i] = launch(t, dir, fmt.Sprintf("sluice-%d.yaml", i), sharesConfigAlg(up.URL, rs.Addr, alg, limit), "/readyz")
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	waitFleet(t, procs, 3, time.Time{}, 20*time.Second)
	ids := make([]string, 3)
	for i, p := range procs {
		ids[i] = statsFleet(t, p).Self
	}
	passed := 0
	for range 10 {
		for _, p := range procs {
			passed += send(t, p, "/orders", 1)
		}
	}
	if passed != 30 {
		t.Fatalf("%d of 30 passed; want all 30 (each instance resets the others' count)", passed)
	}
	sorted := slices.Sorted(slices.Values(ids))
	want := fmt.Sprintf("%s=10 %s=10 %s=10", sorted[0], sorted[1], sorted[2])
	sts := waitShares(t, procs, want)
	for i, st := range sts {
		c := partnerShares(st)
		if c.Total != 30 || c.Allowed != 12 {
			t.Errorf("instance %d: the partner's row %+v; want 30, of 12 allowed at most", i, c)
		}
		var f *gateway.Finding
		for _, x := range st.Diagnosis.Findings {
			if x.Kind == "separate_counters" && x.Subject == "partner" {
				f = &x
			}
		}
		if f == nil {
			t.Fatalf("instance %d: no separate_counters finding for the partner: %+v", i, st.Diagnosis.Findings)
		}
		ten := slices.Sorted(slices.Values([]string{ids[0], ids[1]}))
		for _, s := range []string{"partner was approved 30 under partner-window (per 1000h0m0s)", "by 3 instances",
			"more than one shared counter allows in a window (12)", "allowed per window: 10 on " + ten[0] + ", " + ten[1] + "; 12 on " + ids[2]} {
			if !strings.Contains(f.Summary, s) {
				t.Errorf("instance %d: the finding %q does not say %q", i, f.Summary, s)
			}
		}
		if !strings.Contains(f.Do, "same configuration") {
			t.Errorf("instance %d: the finding's what to do: %q", i, f.Do)
		}
	}
	tab := browsertest.NewTab(t, 390, 2400)
	tab.Do("open the operator page of instance 0", chromedp.Navigate(procs[0].admin+"/operator/"))
	tab.Wait("the partner's total flagged over what one counter allows", `document.querySelector('#diag-shares tr[data-key="partner"] td.over')?.textContent === "30"`)
	tab.Wait("the finding", `[...document.querySelectorAll('#findings li')].some(li => li.dataset.kind === "separate_counters" && li.dataset.subject === "partner")`)
	tab.Screenshot("shares-drift-phone")
}

package gateway

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/answer"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/decision"
)

func sharesRequest(client string, p sluice.Policy, cost int64, allowed bool) (*decision.Request, *decision.Verdict) {
	req := &decision.Request{Client: client, Cost: cost, Limits: []decision.Limit{{Policy: p, PolicyName: p.Name}}}
	v := &decision.Verdict{Outcome: decision.Allowed, Decisions: []answer.Applied{{Policy: p, Decision: sluice.Decision{Allowed: allowed}}}}
	if !allowed {
		v.Outcome = decision.Refused
	}
	return req, v
}

// TestSharesCounts: an instance counts the cost it approved per client and policy in the policy's
// epoch-aligned windows, the current and the one before (a window later than that forgets both),
// and nothing refused, dry-run, keyed by a tuple, or of a concurrency or calendar policy; a
// reloaded policy of the same name starts again. Goroutines count concurrently (-race).
func TestSharesCounts(t *testing.T) {
	hour := sluice.Policy{Name: "per-hour", Algorithm: sluice.FixedWindow, Limit: 100, Period: time.Hour}
	t0 := time.Unix(1_800_000_000, 0) // 500000 hours exactly
	s := NewShares()
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 25 {
				req, v := sharesRequest("partner", hour, 2, true)
				s.record(req, v, t0)
			}
		}()
	}
	wg.Wait()
	req, v := sharesRequest("partner", hour, 5, false)
	s.record(req, v, t0)
	dry, dv := sharesRequest("partner", hour, 7, true)
	dry.Limits[0].DryRun = true
	s.record(dry, dv, t0)
	keyed, kv := sharesRequest("partner", hour, 7, true)
	keyed.Limits[0].Key = "partner|/x"
	s.record(keyed, kv, t0)
	conc, cv := sharesRequest("partner", sluice.Policy{Name: "conc", Algorithm: sluice.Concurrency, Limit: 3, Period: time.Minute}, 1, true)
	s.record(conc, cv, t0)

	want := func(at time.Time, w string) {
		t.Helper()
		if got := fmt.Sprint(s.Counts(at)); got != w {
			t.Errorf("Counts at %v: %s; want %s", at, got, w)
		}
	}
	// 100 requests of cost 2 approved by the goroutines: 200 in window 500000.
	want(t0, "[{partner per-hour 1h0m0s 500000 200 0 100}]")
	want(t0.Add(time.Hour), "[{partner per-hour 1h0m0s 500001 0 200 100}]")
	want(t0.Add(2*time.Hour), "[]")

	// Window n, then n+1, then n+1 (the previous is n's), then n+3 (both forgotten).
	s = NewShares()
	at := func(d time.Duration, cost int64) {
		req, v := sharesRequest("partner", hour, cost, true)
		s.record(req, v, t0.Add(d))
	}
	at(0, 30)
	at(time.Hour-time.Microsecond, 1)
	at(time.Hour, 20)
	want(t0.Add(time.Hour), "[{partner per-hour 1h0m0s 500001 20 31 100}]")
	at(3*time.Hour, 4)
	want(t0.Add(3*time.Hour), "[{partner per-hour 1h0m0s 500003 4 0 100}]")
	reloaded := hour
	reloaded.Limit = 50
	req, v = sharesRequest("partner", reloaded, 1, true)
	s.record(req, v, t0.Add(3*time.Hour))
	want(t0.Add(3*time.Hour), "[{partner per-hour 1h0m0s 500003 1 0 50}]")
}

// TestSharesBound: the entries are bounded (maxShareEntries) whatever the names decided.
func TestSharesBound(t *testing.T) {
	s := NewShares()
	now := time.Unix(1_800_000_000, 0)
	for i := range maxShareEntries + 100 {
		p := sluice.Policy{Name: fmt.Sprintf("p%d", i), Algorithm: sluice.FixedWindow, Limit: 10, Period: time.Minute}
		req, v := sharesRequest("partner", p, 1, true)
		s.record(req, v, now)
	}
	if n := len(s.Counts(now)); n != maxShareEntries {
		t.Errorf("%d entries; want at most %d", n, maxShareEntries)
	}
}

// TestAllowedPerWindow: the most one shared counter approves in one window of the period.
func TestAllowedPerWindow(t *testing.T) {
	for _, c := range []struct {
		p    sluice.Policy
		want int64
	}{
		{sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 100, Period: time.Minute}, 100},
		{sluice.Policy{Algorithm: sluice.SlidingWindow, Limit: 100, Period: time.Minute}, 100},
		{sluice.Policy{Algorithm: sluice.SlidingLog, Limit: 100, Period: time.Minute}, 100},
		{sluice.Policy{Algorithm: sluice.TokenBucket, Limit: 100, Period: time.Minute}, 200},
		{sluice.Policy{Algorithm: sluice.TokenBucket, Limit: 100, Period: time.Minute, Burst: 10}, 110},
		{sluice.Policy{Algorithm: sluice.LeakyBucket, Limit: 100, Period: time.Minute, Burst: 4}, 105},
		{sluice.Policy{Algorithm: sluice.Concurrency, Limit: 100, Period: time.Minute}, 0},
	} {
		if got := allowedPerWindow(c.p); got != c.want {
			t.Errorf("%v %d/%v burst %d: %d; want %d", c.p.Algorithm, c.p.Limit, c.p.Period, c.p.Burst, got, c.want)
		}
	}
}

func member(id string, counts ...ShareCount) FleetInstance {
	return FleetInstance{ID: id, Counts: counts}
}

func hourCount(client string, window, cur, prev, allowed int64) ShareCount {
	return ShareCount{Client: client, Policy: "per-hour", Period: time.Hour, Window: window, Current: cur, Previous: prev, Allowed: allowed}
}

// TestFleetSharesRule, with exact figures: 30, 20 and 10 approved of a limit of 100 in one
// window by three instances is each one's share (50%, 33.3%, 16.7%) and no finding; 40, 40 and
// 41, 121 in one window, is more than one shared counter allows by the most generous of their
// configurations (100, 100, 120), and is the finding, with the figures; so is 121 of 100, not 100. An instance that reported the window before the latest counts there. Anonymous
// clients (counted per address) never make one.
func TestFleetSharesRule(t *testing.T) {
	const w = 500_000
	f := &FleetStats{Instances: 3, Members: []FleetInstance{
		member("gw-c", hourCount("partner", w, 10, 0, 100)),
		member("gw-a", hourCount("partner", w, 30, 0, 100), hourCount("anonymous", w, 500, 0, 5)),
		member("gw-b", hourCount("partner", w, 20, 0, 100)),
	}}
	sh, found := fleetShares(f, fleetMaxCounts)
	if len(found) != 0 {
		t.Fatalf("30+20+10 of 100: findings %+v; want none", found)
	}
	if sh.Instances != 3 || sh.Listed != 3 || len(sh.Clients) != 2 {
		t.Fatalf("shares %+v", sh)
	}
	p := sh.Clients[1] // (anonymous first: 500 approved)
	if p.Client != "partner" || p.Total != 60 || p.Allowed != 100 || p.Period != "1h0m0s" || !p.WindowStart.Equal(time.Unix(1_800_000_000, 0)) {
		t.Fatalf("partner's shares %+v", p)
	}
	got := ""
	for _, in := range p.Instances {
		got += fmt.Sprintf("%s=%d(%.1f%%) ", in.ID, in.Approved, in.Share)
	}
	if got != "gw-a=30(50.0%) gw-b=20(33.3%) gw-c=10(16.7%) " {
		t.Errorf("partner by instance: %s", got)
	}

	f.Members = []FleetInstance{
		member("gw-a", hourCount("partner", w, 40, 0, 100)),
		member("gw-b", hourCount("partner", w, 40, 0, 100)),
		member("gw-c", hourCount("partner", w-1, 40, 0, 120)), // (its last heartbeat was in the window before)
	}
	_, found = fleetShares(f, fleetMaxCounts)
	if len(found) != 0 {
		t.Fatalf("80 in the latest window, 40 in the one before: %+v; want no finding", found)
	}
	f.Members[2] = member("gw-c", hourCount("partner", w, 41, 0, 120))
	_, found = fleetShares(f, fleetMaxCounts)
	if len(found) != 1 {
		t.Fatalf("121 in one window, of 100 by two configurations and 120 by one: findings %+v; want one", found)
	}
	fd := found[0]
	for _, s := range []string{"partner was approved 121 under per-hour (per 1h0m0s)", "by 3 instances (gw-a 40, gw-b 40, gw-c 41)",
		"one shared counter allows in a window (120)", "allowed per window: 100 on gw-a, gw-b; 120 on gw-c"} {
		if !strings.Contains(fd.Summary, s) {
			t.Errorf("the finding's summary %q does not say %q", fd.Summary, s)
		}
	}
	if fd.Kind != "separate_counters" || fd.Subject != "partner" || !strings.Contains(fd.Do, "store.prefix") {
		t.Errorf("finding %+v", fd)
	}
	// 121 with one configuration: over its 100 by 21.
	f.Members[2] = member("gw-c", hourCount("partner", w, 41, 0, 100))
	if _, found = fleetShares(f, fleetMaxCounts); len(found) != 1 || !strings.Contains(found[0].Summary, "approved 121") || strings.Contains(found[0].Summary, "differ") {
		t.Errorf("121 of 100: %+v", found)
	}
	// 100 of 100: exactly what one counter allows, no finding.
	f.Members[2] = member("gw-c", hourCount("partner", w, 20, 0, 100))
	if _, found = fleetShares(f, fleetMaxCounts); len(found) != 0 {
		t.Errorf("100 of 100: %+v; want no finding", found)
	}
	// The window before: 60+50 there, reported by instances now in the next one.
	f.Members = []FleetInstance{member("gw-a", hourCount("partner", w+1, 1, 60, 100)), member("gw-b", hourCount("partner", w+1, 0, 50, 100))}
	if _, found = fleetShares(f, fleetMaxCounts); len(found) != 1 || !strings.Contains(found[0].Summary, "approved 110") || !strings.Contains(found[0].Summary, "the window before") {
		t.Errorf("110 of 100 in the window before: %+v", found)
	}
}

// TestDiagnosisShares: the snapshot shows the shares and puts the finding first with the memory
// store's warning absent on Redis; the memory store has no shares and keeps its warning.
func TestDiagnosisShares(t *testing.T) {
	d := newDiagnosis()
	now := time.Unix(1_800_000_000, 0)
	redisCfg := &config.Config{Store: config.Store{Type: config.StoreRedis}}
	f := &FleetStats{Instances: 2, Members: []FleetInstance{member("gw-a", hourCount("partner", 500_000, 80, 0, 100)), member("gw-b", hourCount("partner", 500_000, 80, 0, 100))}}
	snap := d.snapshot(now, redisCfg, f)
	if snap.Shares == nil || len(snap.Shares.Clients) != 1 || snap.Shares.Clients[0].Total != 160 {
		t.Fatalf("shares: %+v", snap.Shares)
	}
	if len(snap.Findings) != 1 || snap.Findings[0].Kind != "separate_counters" || snap.Findings[0].Subject != "partner" || !snap.Counting.Shared || snap.Counting.Instances != 2 {
		t.Fatalf("findings %+v, counting %+v", snap.Findings, snap.Counting)
	}
	mem := d.snapshot(now, &config.Config{Store: config.Store{Type: config.StoreMemory}}, nil)
	if mem.Shares != nil || len(mem.Findings) != 1 || mem.Findings[0].Subject != "store: memory" {
		t.Fatalf("memory: shares %+v, findings %+v", mem.Shares, mem.Findings)
	}
}

// TestSharesCountsWhileRecording: the heartbeat's Counts runs while requests record new entries
// (real goroutines, -race): an entry made but not yet counted in is skipped, never divided by its
// zero period.
func TestSharesCountsWhileRecording(t *testing.T) {
	s := NewShares()
	now := time.Unix(1_800_000_000, 0)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 3000 {
			p := sluice.Policy{Name: fmt.Sprintf("p%d", i), Algorithm: sluice.FixedWindow, Limit: 10, Period: time.Minute}
			req, v := sharesRequest("partner", p, 1, true)
			s.record(req, v, now)
		}
	}()
	for {
		select {
		case <-done:
			if n := len(s.Counts(now)); n != 3000 {
				t.Fatalf("%d entries counted; want 3000", n)
			}
			return
		default:
			s.Counts(now)
		}
	}
}

// TestSharesNetOfSettlements: approvals are counted net of what settlements changed (a refund, a
// request shed for load: 0; cost_from: the real cost), in the window of the decision's instant
// (its previous window too), never below 0, and not after a reload of the policy. One instance on
// one store whose 15 approvals of a limit of 10 were 10 refunded is not "separate counters".
func TestSharesNetOfSettlements(t *testing.T) {
	hour := sluice.Policy{Name: "per-hour", Algorithm: sluice.FixedWindow, Limit: 10, Period: time.Hour}
	t0 := time.Unix(1_800_000_000, 0) // 500000 hours exactly
	s := NewShares()
	type decided struct {
		req *decision.Request
		dec sluice.Decision
	}
	var refunded []decided
	for i := range 15 {
		req, v := sharesRequest("partner", hour, 1, true)
		v.Decisions[0].Decision.At = t0.Add(time.Duration(i) * time.Second).UnixMicro()
		s.record(req, v, time.Time{}) // (the decision's instant, not this)
		if i < 10 {
			refunded = append(refunded, decided{req, v.Decisions[0].Decision})
		}
	}
	var wg sync.WaitGroup // settlements come from the requests' goroutines (-race)
	for _, d := range refunded {
		wg.Add(1)
		go func() { defer wg.Done(); s.settled(d.req, 0, d.dec, 1, 0, time.Time{}) }()
	}
	wg.Wait()
	if got := fmt.Sprint(s.Counts(t0)); got != "[{partner per-hour 1h0m0s 500000 5 0 10}]" {
		t.Fatalf("15 approved, 10 refunded: %s; want 5", got)
	}
	f := &FleetStats{Instances: 1, Members: []FleetInstance{member("gw-a", s.Counts(t0)...)}}
	if _, found := fleetShares(f, fleetMaxCounts); len(found) != 0 {
		t.Fatalf("one instance, net 5 of 10: findings %+v", found)
	}

	// cost_from charged more than the estimate: the difference is added. In the next window, a
	// settlement of a decision of the window before lands there.
	req, v := sharesRequest("partner", hour, 2, true)
	v.Decisions[0].Decision.At = t0.UnixMicro()
	s.record(req, v, time.Time{})
	s.settled(req, 0, v.Decisions[0].Decision, 2, 6, time.Time{})
	later, lv := sharesRequest("partner", hour, 3, true)
	lv.Decisions[0].Decision.At = t0.Add(time.Hour).UnixMicro()
	s.record(later, lv, time.Time{})
	s.settled(req, 0, v.Decisions[0].Decision, 6, 0, time.Time{}) // (a second settlement, for the test)
	if got := fmt.Sprint(s.Counts(t0.Add(time.Hour))); got != "[{partner per-hour 1h0m0s 500001 3 5 10}]" {
		t.Fatalf("after cost_from 2→6, then 6→0 in the window before: %s; want 3 now, 5 before", got)
	}
	// Never below 0; nothing for a dry run or a limit of a key_by tuple, or after a reload.
	s.settled(later, 0, lv.Decisions[0].Decision, 100, 0, time.Time{})
	dry, dv := sharesRequest("partner", hour, 3, true)
	dry.Limits[0].DryRun = true
	dv.Decisions[0].Decision.At = t0.Add(time.Hour).UnixMicro()
	s.settled(dry, 0, dv.Decisions[0].Decision, 0, 50, time.Time{})
	if got := fmt.Sprint(s.Counts(t0.Add(time.Hour))); got != "[{partner per-hour 1h0m0s 500001 0 5 10}]" {
		t.Fatalf("a refund of more than was counted, and a dry run's: %s", got)
	}
	reloaded := hour
	reloaded.Limit = 20
	rreq, rv := sharesRequest("partner", reloaded, 1, true)
	rv.Decisions[0].Decision.At = t0.Add(time.Hour).UnixMicro()
	s.settled(rreq, 0, rv.Decisions[0].Decision, 0, 7, time.Time{})
	if got := fmt.Sprint(s.Counts(t0.Add(time.Hour))); got != "[{partner per-hour 1h0m0s 500001 0 5 10}]" {
		t.Fatalf("a settlement under another configuration of the policy: %s", got)
	}
}

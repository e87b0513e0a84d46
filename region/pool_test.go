package region_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/region"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

// TestRegionPoolBound: two regions, two gateway instances each on the region's own Redis, one
// global Redis; demand 3:1 over the limit (eu's two instances 60 a second each, us's 20 each,
// for 100 a second). The instances of a region pool: one refreshes the ledger for the region with
// both instances' demand, both enforce the grant it publishes on the region's counter; so the
// allotments follow the regions' demand (eu ≈ 60, us ≈ 40) and no window admits more than the
// limit worldwide. Then eu's refresher is killed (its lock is not given back): the other eu
// instance takes over within the lock's TTL and a refresh, and the bound still holds.
func TestRegionPoolBound(t *testing.T) {
	global, euRedis, usRedis := redistest.Start(t), redistest.Start(t), redistest.Start(t)
	inst := map[string]*aRegion{
		"eu-1": startInstance(t, "eu", twoRegions, global, euRedis, "eu-1", true),
		"eu-2": startInstance(t, "eu", twoRegions, global, euRedis, "eu-2", true),
		"us-1": startInstance(t, "us", twoRegions, global, usRedis, "us-1", true),
		"us-2": startInstance(t, "us", twoRegions, global, usRedis, "us-2", true),
	}
	var mu sync.Mutex
	admitted := map[string]map[int64]int64{"eu": {}, "us": {}}
	var ambiguous atomic.Int64
	stops := map[string]chan struct{}{}
	var wg sync.WaitGroup
	for id, rate := range map[string]int{"eu-1": 60, "eu-2": 60, "us-1": 20, "us-2": 20} {
		r, stop := inst[id], make(chan struct{})
		stops[id] = stop
		wg.Add(1)
		go func() { defer wg.Done(); traffic(t, r, rate, stop, admitted[r.name], &ambiguous, &mu) }()
	}
	stopAll := sync.OnceFunc(func() {
		for _, s := range stops {
			select {
			case <-s:
			default:
				close(s)
			}
		}
		wg.Wait()
	})
	defer stopAll()
	waitFor(t, 15*time.Second, "allotments eu ≈ 60, us ≈ 40 on every instance", func() bool {
		e1, e2, u1, u2 := allotment(inst["eu-1"]), allotment(inst["eu-2"]), allotment(inst["us-1"]), allotment(inst["us-2"])
		return e1 == e2 && u1 == u2 && e1 >= 55 && e1 <= 65 && u1 >= 35 && u1 <= 45 && e1+u1 <= 100
	})
	refresher := func(region string) (string, int) {
		var who string
		n := 0
		for id, r := range inst {
			if r.name == region && r.ref.Stats()[0].Refresher {
				who, n = id, n+1
			}
		}
		return who, n
	}
	var euRef string
	for _, reg := range []string{"eu", "us"} {
		waitFor(t, 2*time.Second, "one refresher in "+reg, func() bool {
			who, n := refresher(reg)
			if reg == "eu" {
				euRef = who
			}
			return n == 1
		})
	}
	start := time.Now().Unix() + 1
	waitFor(t, 10*time.Second, "four whole windows", func() bool { return time.Now().Unix() >= start+4 })

	// eu's refresher dies: the other takes over within the lock's TTL (3 refreshes, 150 ms) and
	// a refresh; the region's demand is now the survivor's (60 a second).
	close(stops[euRef])
	inst[euRef].ref.Close()
	killed := time.Now()
	other := map[string]string{"eu-1": "eu-2", "eu-2": "eu-1"}[euRef]
	waitFor(t, 2*time.Second, other+" refreshing for eu", func() bool { return inst[other].ref.Stats()[0].Refresher })
	if d := time.Since(killed); d > 3*50*time.Millisecond+2*50*time.Millisecond+150*time.Millisecond {
		t.Errorf("%s took over %v after the refresher died; want within the lock's TTL (150ms) and a refresh", other, d)
	}
	if a := allotment(inst[other]); a < 50 || a > 65 || inst[other].ref.Stats()[0].Safe {
		t.Errorf("%s enforces %d after the takeover (stats %+v); want eu's grant kept", other, a, inst[other].ref.Stats()[0])
	}
	after := time.Now().Unix() + 1
	waitFor(t, 10*time.Second, "three whole windows after the takeover", func() bool { return time.Now().Unix() >= after+3 })
	stopAll()

	mu.Lock()
	defer mu.Unlock()
	for w := start; w < after+3; w++ {
		e, u := admitted["eu"][w], admitted["us"][w]
		if e+u > 100 {
			t.Errorf("window %d: %d + %d admitted worldwide; the limit is 100", w, e, u)
		}
		if w < start+4 && e+u < 85 {
			t.Errorf("window %d: %d + %d admitted worldwide; want most of the 100 used (demand is 160)", w, e, u)
		}
	}
	for id, r := range inst {
		t.Logf("%s: %+v", id, r.ref.Stats()[0])
	}
	t.Logf("refresher %s killed at %v; admitted: %v; ambiguous: %d", euRef, killed.Format("15:04:05.000"), fmt.Sprint(admitted), ambiguous.Load())
}

const confirmConf = `upstream: http://127.0.0.1:1
store: {type: redis, addrs: [REGIONAL]}
region: {name: NAME, regions: 2, floor: 0.1, refresh: 200ms, lease: 2s, hold: 1ms, global: {addrs: [GLOBAL]}}
policies:
  - {name: partner, algorithm: fixed-window, limit: 100, period: 1h, global: true, key_by: []}
default_policy: partner
`

// refresher is a region's refresher alone (no gateway), pooled on rs with id if rs is set; the
// test drives its demand with Decided and its refreshes with RefreshAll.
func refresher(t *testing.T, name string, global, rs *redistest.Server, id string) *region.Refresher {
	t.Helper()
	y := regexp.MustCompile(`REGIONAL|GLOBAL|NAME`).ReplaceAllStringFunc(confirmConf, func(s string) string {
		return map[string]string{"REGIONAL": rs.Addr, "GLOBAL": global.Addr, "NAME": name}[s]
	})
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := region.New(mustStore(t, global), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := ref.UsePool(mustStore(t, rs), id); err != nil {
		t.Fatal(err)
	}
	return ref
}

// TestRegionPoolConfirm: a smaller grant is confirmed to the ledger only a follow window (two
// refreshes) and 1.5 refreshes more (every instance pushes the use it admitted under the larger
// one) after the region's refresher published it. Until then another instance may still
// enforce the larger one it read before (it trusts a read that long), so the ledger must go on
// counting the larger one: were it freed at once, the other region could be granted it while
// that instance still admits under it, and a window pass the limit.
func TestRegionPoolConfirm(t *testing.T) {
	global, euRedis, usRedis := redistest.Start(t), redistest.Start(t), redistest.Start(t)
	a := refresher(t, "eu", global, euRedis, "eu-a")
	b := refresher(t, "eu", global, euRedis, "eu-b")
	us := refresher(t, "us", global, usRedis, "us-a")
	ctx := context.Background()
	refused := sluice.Decision{}
	demand := func(r *region.Refresher) {
		for range 10 {
			r.Decided("partner", false, &refused)
		}
	}
	ledger, err := mustStore(t, global).Ledger("partner", redisstore.LedgerOptions{Limit: 100, Regions: 2, Floor: 10, Lease: 2 * time.Second, Hold: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	eu := func() redisstore.LedgerRegion {
		t.Helper()
		v, err := ledger.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range v.Regions {
			if r.Region == "eu" {
				return r
			}
		}
		return redisstore.LedgerRegion{}
	}
	// eu alone wants: once the ledger has learnt, eu holds all but us's floor, and both its
	// instances enforce it; a refreshes for eu (the first to take the lock), b follows.
	waitFor(t, 10*time.Second, "eu's instances on 90", func() bool {
		demand(a)
		demand(b)
		a.RefreshAll(ctx)
		b.RefreshAll(ctx)
		x, _ := a.Allotment("partner")
		y, _ := b.Allotment("partner")
		return x == 90 && y == 90
	})
	if !a.Stats()[0].Refresher || b.Stats()[0].Refresher {
		t.Fatalf("refreshers: a %v, b %v; want a alone", a.Stats()[0].Refresher, b.Stats()[0].Refresher)
	}
	// us wants as much: eu's share falls to 50, published at once; b has read 90 before.
	demand(us)
	us.RefreshAll(ctx)
	demand(a)
	a.RefreshAll(ctx)
	published := time.Now()
	if x, _ := a.Allotment("partner"); x != 50 {
		t.Fatalf("eu's refresher enforces %d after us's demand; want its fair share, 50", x)
	}
	// Within the follow window the ledger still counts 90 for eu, refresh after refresh, and us
	// gets nothing beyond its floor.
	for range 3 {
		a.RefreshAll(ctx)
		us.RefreshAll(ctx)
		if time.Since(published) >= 400*time.Millisecond {
			t.Skip("the machine is too slow to refresh within the follow window")
		}
		if r := eu(); r.Holding != 90 || r.Pending != 90 {
			t.Fatalf("%v after the shrink was published: the ledger counts %d for eu (pending %d); want 90, the shrink not confirmed", time.Since(published), r.Holding, r.Pending)
		}
		if x, _ := us.Allotment("partner"); x > 10 {
			t.Fatalf("us granted %d within the follow window; eu's instances may still enforce 90", x)
		}
	}
	// Then it is confirmed: eu's 50 is what the ledger counts, and us gets the rest.
	waitFor(t, 5*time.Second, "the shrink confirmed", func() bool {
		demand(a)
		a.RefreshAll(ctx)
		r := eu()
		return r.Holding == 50 && r.Pending == 50
	})
	if d := time.Since(published); d < 650*time.Millisecond {
		t.Fatalf("the shrink confirmed %v after it was published; not before the follow window and 1.5 refreshes for the instances' uses, 700ms", d)
	}
	b.RefreshAll(ctx)
	if y, _ := b.Allotment("partner"); y != 50 {
		t.Fatalf("eu's other instance enforces %d; want the published 50", y)
	}
	waitFor(t, 5*time.Second, "us granted the rest", func() bool {
		demand(us)
		us.RefreshAll(ctx)
		x, _ := us.Allotment("partner")
		return x == 50
	})
}

// TestRegionPoolDown: eu's own Redis is killed under its two instances. They cannot pool (nor
// count: their decisions meet the failure mode), so neither trusts the grant it read beyond the
// follow window: both run on the safe share (30), the allotment their failure mode's local
// fallback divides among them (local_share: fleet); and the refresher, unable to keep its lock,
// stops refreshing for the region, whose lease in the ledger ends, so that the ledger counts it
// for its hold and then reserves its floor (docs/design.md). us goes on.
func TestRegionPoolDown(t *testing.T) {
	global, euRedis, usRedis := redistest.Start(t), redistest.Start(t), redistest.Start(t)
	eu := []*aRegion{
		startInstance(t, "eu", twoRegions, global, euRedis, "eu-1", true),
		startInstance(t, "eu", twoRegions, global, euRedis, "eu-2", true),
	}
	us := startInstance(t, "us", twoRegions, global, usRedis, "us-1", true)
	waitFor(t, 10*time.Second, "every instance on a grant", func() bool {
		for _, r := range append(eu, us) {
			if st := r.ref.Stats()[0]; st.Floor || st.Version == 0 || st.Learning {
				return false
			}
		}
		return true
	})
	ledger, err := mustStore(t, global).Ledger("partner", redisstore.LedgerOptions{Limit: 100, Regions: 2, Floor: 10, Lease: 600 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	euRedis.Kill()
	killed := time.Now()
	for i, r := range eu {
		waitFor(t, 2*time.Second, fmt.Sprintf("eu instance %d on the safe share", i), func() bool {
			st := r.ref.Stats()[0]
			return st.Safe && st.Allotment == 30 && st.Error != "" && !st.Refresher
		})
	}
	// The follow window (100 ms) after the last read, which came at most a refresh and the pool's
	// timeout (1 s) before the kill.
	if d := time.Since(killed); d > 100*time.Millisecond+50*time.Millisecond+time.Second+200*time.Millisecond {
		t.Errorf("eu on its safe share %v after its Redis died", d)
	}
	waitFor(t, 3*time.Second, "eu's lease ended in the ledger, us's live", func() bool {
		v, err := ledger.Read(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		live := map[string]bool{}
		for _, r := range v.Regions {
			live[r.Region] = r.Live
		}
		return !live["eu"] && live["us"]
	})
	if st := us.ref.Stats()[0]; st.Safe || st.Error != "" {
		t.Fatalf("us after eu's Redis died: %+v", st)
	}
}

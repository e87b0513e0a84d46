// Command regionsload is issue 34's side-by-side benchmark of a limit across regions
// (scripts/bench-regions.sh runs it in interleaved rounds): the harness of internal/regiontest
// (three regions on loopback, each its own redis-server and two sluice serve pooled on it, the
// ledger's redis-server behind one netfault link per region adding 50–150 ms each way), its load
// (twice the limit, 70/20/10 then 10/20/70, each region's requests to its instances in turn), and
// one of three targets:
//
//	-target global       sluice, the policy global: true (one limit L for the world)
//	-target region       sluice, the same policy without global: each region enforces L on its
//	                     own (the latency baseline: the same processes and path, no ledger; the
//	                     world then admits what the regions' demands allow, up to 3·L)
//	-target gubernator   Gubernator v2.13.0 (internal/peertest), three instances, one per
//	                     region, each region's requests to its own instance with behavior
//	                     GLOBAL, limit L per period; each instance advertises a netfault link
//	                     with the same 50–150 ms each way to its peers, so the instances' calls
//	                     to each other (hits to the owner, its updates back) cross the same
//	                     latency as sluice's regions to the ledger; an admitted request is then
//	                     sent to the upstream
//
//	go run ./bench/regionsload -target global -bin ./sluice [-limit 300] [-period 3s] \
//		[-warmup 3] [-windows 4] [-refresh 500ms] [-lease 2s]
//
// The load runs -warmup windows of 70/20/10, then -windows measured windows of it, then moves
// to 10/20/70 and runs -windows more, all measured (the move's included). Every admission is
// attributed to its window exactly: sluice's by the answer's RateLimit reset
// (regiontest.WindowOf), Gubernator's by its answer's reset time (its token bucket's window
// starts at the first hit and ends at ResetTime; the instances' copies of the one counter carry
// the owner's reset time, or their own until its first update reaches them, so reset times
// less than half a period apart are one window).
//
// It prints one line of JSON on stdout: the measured windows' worldwide admissions (the most in
// a window and its ratio to L, the mean share of L used), and the time the target adds to a
// request (p50 and p99 of every request through it, less the median of direct calls to the upstream
// made at the same time), and one line for people on stderr.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/netfault"
	"github.com/sluicehq/sluice/internal/peertest"
	"github.com/sluicehq/sluice/internal/regiontest"
)

func main() {
	target := flag.String("target", "global", "global, region or gubernator")
	bin := flag.String("bin", "", "the sluice binary (global, region)")
	limit := flag.Int64("limit", 300, "the limit L per period")
	period := flag.Duration("period", 3*time.Second, "the fixed window")
	warmup := flag.Int("warmup", 3, "windows of load before the measurement")
	windows := flag.Int("windows", 4, "measured windows before the move, and after it")
	refresh := flag.Duration("refresh", 500*time.Millisecond, "sluice's region refresh")
	lease := flag.Duration("lease", 2*time.Second, "sluice's region lease")
	label := flag.String("label", "", "the JSON's label (default: the target)")
	flag.Parse()
	if *label == "" {
		*label = *target
	}
	tb := &runTB{name: "regionsload"}
	defer tb.cleanup()
	log.SetFlags(0)

	var t regiontest.Target
	var up *regiontest.Upstream
	switch *target {
	case "global", "region":
		if *bin == "" {
			tb.Fatalf("-bin is required for %s", *target)
		}
		h := regiontest.Start(tb, regiontest.Options{Bin: *bin, Limit: *limit, Period: *period, Global: *target == "global",
			Refresh: *refresh, Lease: *lease, Floor: 0.1})
		t, up = h.Sluice(), h.Upstream
	case "gubernator":
		up = regiontest.NewUpstream(tb)
		g := peertest.StartGubernatorsVia(tb, 3, func(i int, addr string) string {
			link := netfault.Start(tb, addr)
			l := netfault.Uniform(50*time.Millisecond, 150*time.Millisecond)
			link.SetLatency(l, l)
			return link.Addr()
		})
		gt := &gubernator{upstream: up.URL, limit: *limit, period: *period}
		for _, addr := range g.GRPCAddrs {
			gt.clients = append(gt.clients, peertest.DialGubernator(tb, addr))
		}
		t = gt
	default:
		tb.Fatalf("-target %q: global, region or gubernator", *target)
	}
	if tb.Failed() {
		tb.Fatalf("the harness did not start")
	}

	// Aligned on a window's start: warm-up, the windows before the move, those after.
	load := regiontest.StartLoad(t, 2*float64(*limit)/period.Seconds(), []float64{70, 20, 10}, up.URL)
	wait := func(w int64) {
		for regiontest.Window(time.Now(), *period) < w {
			time.Sleep(10 * time.Millisecond) // until the window starts
		}
	}
	first := regiontest.Window(time.Now(), *period) + int64(*warmup)
	start := time.Now()
	wait(first)
	measuredFrom := time.Now()
	wait(first + int64(*windows))
	load.SetShares([]float64{10, 20, 70})
	wait(first + 2*int64(*windows))
	load.Stop()
	res := load.Result()
	for _, err := range res.Errors {
		log.Printf("regionsload: %v", err)
	}
	if n := up.Admitted(); n != res.Total {
		log.Printf("regionsload: %d requests reached the upstream; %d admissions counted", n, res.Total)
	}

	var world []int64
	if *target == "gubernator" {
		world = resetWindows(res, measuredFrom, *period)
	} else {
		for w := first; w < first+2*int64(*windows); w++ {
			world = append(world, res.World(w))
		}
	}
	var most, sum int64
	for _, n := range world {
		most = max(most, n)
		sum += n
	}
	out := map[string]any{
		"label": *label, "target": *target, "limit": *limit, "period": period.String(), "windows": len(world),
		"world": world, "max": most, "max_ratio": float64(most) / float64(*limit),
		"used":     float64(sum) / float64(int64(len(world))**limit),
		"requests": res.Requests, "admitted": res.Total, "errors": len(res.Errors), "late": res.Late,
		"added_p50_us": res.Added(0.5).Microseconds(), "added_p99_us": res.Added(0.99).Microseconds(),
		"p50_us": regiontest.Quantile(res.Latencies, 0.5).Microseconds(), "p99_us": regiontest.Quantile(res.Latencies, 0.99).Microseconds(),
		"direct_p50_us": regiontest.Quantile(res.Direct, 0.5).Microseconds(), "direct_p99_us": regiontest.Quantile(res.Direct, 0.99).Microseconds(),
		"seconds": time.Since(start).Seconds(),
	}
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
	log.Printf("%s: most in a window %d of %d (%.2f×), %.1f%% used; adds p50 %v, p99 %v; %d requests, %d errors",
		*label, most, *limit, float64(most)/float64(*limit), 100*out["used"].(float64), res.Added(0.5), res.Added(0.99), res.Requests, len(res.Errors))
}

// resetWindows groups Gubernator's admissions by their reset times (ms), a reset time less
// than half a period after the first of a group in that group, and returns the groups' counts,
// those that end after from (the measurement's start) and before the last group (cut short).
func resetWindows(res regiontest.Result, from time.Time, period time.Duration) []int64 {
	resets := res.Windows()
	var groups []int64
	var counts []int64
	for _, r := range resets {
		if len(groups) == 0 || r-groups[len(groups)-1] >= period.Milliseconds()/2 {
			groups = append(groups, r)
			counts = append(counts, 0)
		}
		counts[len(counts)-1] += res.World(r)
	}
	var out []int64
	for i, g := range groups {
		if g-period.Milliseconds() >= from.UnixMilli() && i < len(groups)-1 {
			out = append(out, counts[i])
		}
	}
	return out
}

// gubernator is the Target of three Gubernator instances: region r's requests go to instance r.
type gubernator struct {
	clients  []*peertest.GubernatorClient
	upstream string
	limit    int64
	period   time.Duration
}

func (g *gubernator) Do(ctx context.Context, region, _ int) (regiontest.Outcome, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	a, err := g.clients[region].Global(ctx, "regions_bench", "world", g.limit, g.period)
	if err != nil || a.Over {
		return regiontest.Outcome{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.upstream+"/"+regiontest.RegionName(region), nil)
	if err != nil {
		return regiontest.Outcome{}, err
	}
	resp, err := regiontest.Client.Do(req)
	if err != nil {
		return regiontest.Outcome{}, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return regiontest.Outcome{Admitted: true, Window: a.ResetTime.UnixMilli()}, nil
}

// runTB is the testing.TB the harness's helpers need, for a program: cleanups run at the end
// (or on a fatal error, before exiting 1).
type runTB struct {
	testing.TB // not set: a method not defined below panics
	name       string
	mu         sync.Mutex
	cleanups   []func()
	failed     bool
	done       bool
}

func (t *runTB) Helper()      {}
func (t *runTB) Name() string { return t.name }
func (t *runTB) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}
func (t *runTB) TempDir() string {
	d, err := os.MkdirTemp("", "regionsload-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}
func (t *runTB) Logf(f string, a ...any) { log.Printf(f, a...) }
func (t *runTB) Log(a ...any)            { log.Print(a...) }
func (t *runTB) Errorf(f string, a ...any) {
	log.Printf(f, a...)
	t.mu.Lock()
	t.failed = true
	t.mu.Unlock()
}
func (t *runTB) Error(a ...any) { t.Errorf("%s", fmt.Sprint(a...)) }
func (t *runTB) Failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed
}
func (t *runTB) Fatalf(f string, a ...any) {
	t.Errorf(f, a...)
	t.cleanup()
	os.Exit(1)
}
func (t *runTB) Fatal(a ...any) { t.Fatalf("%s", fmt.Sprint(a...)) }

// cleanup runs the cleanups, the last registered first, once.
func (t *runTB) cleanup() {
	t.mu.Lock()
	if t.done {
		t.mu.Unlock()
		return
	}
	t.done = true
	fs := slices.Clone(t.cleanups)
	t.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}

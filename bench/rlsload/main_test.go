package main

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/peertest"
	"github.com/sluicehq/sluice/internal/redistest"
)

func TestPercentile(t *testing.T) {
	s := []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for q, want := range map[float64]int64{0.5: 5, 0.9: 9, 0.99: 10, 1: 10, 0.01: 1} {
		if got := percentile(s, q); got != want {
			t.Errorf("percentile(1..10, %v) = %d, want %d", q, got, want)
		}
	}
	if percentile(nil, 0.5) != 0 {
		t.Error("percentile of nothing")
	}
}

// TestRecordKeepsAUniformSample: past its room a caller keeps a sample whose values are spread
// like all of them (here 0..99999 with room for 1000: the sample's mean near 50000), and its
// count and maximum stay exact.
func TestRecordKeepsAUniformSample(t *testing.T) {
	var c caller
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range int64(100000) {
		c.record(i, 1000, rng)
	}
	if len(c.samples) != 1000 || c.n != 100000 || c.max != 99999 {
		t.Fatalf("samples %d, n %d, max %d", len(c.samples), c.n, c.max)
	}
	var sum int64
	for _, v := range c.samples {
		sum += v
	}
	if mean := sum / 1000; mean < 45000 || mean > 55000 {
		t.Errorf("the sample's mean is %d, want about 50000", mean)
	}
}

// TestRunAgainstThePeer drives the real peer on a real Redis for a moment, with two rules and a
// configuration written by -write-config: every decision is counted, all OK, none an error.
func TestRunAgainstThePeer(t *testing.T) {
	o := options{domain: "rls_bench", key: "client", values: 100, concurrency: 4, conns: 2, rules: 2,
		duration: 300 * time.Millisecond, warmup: 50 * time.Millisecond, ready: 10 * time.Second,
		maxSamples: 1000, limit: 1000000, unit: "second", cpu: []process{{Name: "rlsload", PID: os.Getpid()}}}
	file := filepath.Join(t.TempDir(), "bench.yaml")
	if err := os.WriteFile(file, []byte(o.config()), 0o644); err != nil {
		t.Fatal(err)
	}
	redis := redistest.Start(t)
	o.addr = peertest.Start(t, redis.Addr, file)
	var conns []*grpc.ClientConn
	for range o.conns {
		c, err := grpc.NewClient(o.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		conns = append(conns, c)
	}
	if err := waitReady(conns[0], o); err != nil {
		t.Fatal(err)
	}
	r := run(conns, o)
	t.Logf("%+v", r)
	if r.Decisions == 0 || r.OK != r.Decisions || r.Errors != 0 || r.OverLimit != 0 {
		t.Errorf("decisions %d: OK %d, OVER_LIMIT %d, errors %d (%s)", r.Decisions, r.OK, r.OverLimit, r.Errors, r.FirstError)
	}
	if r.P50 <= 0 || r.P50 > r.P90 || r.P90 > r.P99 || r.P99 > r.Max {
		t.Errorf("latencies out of order: p50 %v p90 %v p99 %v max %v", r.P50, r.P90, r.P99, r.Max)
	}
	// -cpu: the load generator's own time per decision is reported (in 10 ms ticks, so it may be 0
	// over this short run, never negative).
	if c, ok := r.CPUPerDecision["rlsload"]; !ok || c < 0 || len(r.CPUPerDecision) != 1 {
		t.Errorf("cpu_us_per_decision %v: want rlsload's, 0 or more", r.CPUPerDecision)
	}
	// Both rules were used: each key's counter exists in Redis.
	for _, k := range o.keys() {
		keys, err := redis.Do("KEYS", "rls_bench_"+k+"_*")
		if err != nil || keys == "" {
			t.Errorf("no counter of %s in Redis: %v", k, err)
		}
	}
}

// TestRunCountsRefusals: with a limit of 1 per minute, nearly every decision is OVER_LIMIT. How
// many decisions a run of 200 ms makes depends on the machine's load, so runs are repeated until
// there have been more than the limit can approve: at most one OK per value and minute touched.
func TestRunCountsRefusals(t *testing.T) {
	o := options{domain: "rls_bench", key: "capped", values: 3, concurrency: 2, conns: 1, rules: 1,
		duration: 200 * time.Millisecond, ready: 10 * time.Second, maxSamples: 1000, limit: 1, unit: "minute"}
	file := filepath.Join(t.TempDir(), "bench.yaml")
	if err := os.WriteFile(file, []byte(o.config()), 0o644); err != nil {
		t.Fatal(err)
	}
	o.addr = peertest.Start(t, redistest.Start(t).Addr, file)
	c, err := grpc.NewClient(o.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := waitReady(c, o); err != nil {
		t.Fatal(err)
	}
	from := time.Now()
	// approvable is the most OKs the runs so far can have had: one per value in each minute
	// (the peer's windows start on the minute) from the first run's start to now.
	approvable := func() int64 {
		return int64(o.values) * int64(time.Now().Truncate(time.Minute).Sub(from.Truncate(time.Minute))/time.Minute+1)
	}
	var sum result
	for runs := 1; ; runs++ {
		r := run([]*grpc.ClientConn{c}, o)
		sum.Decisions += r.Decisions
		sum.OK += r.OK
		sum.OverLimit += r.OverLimit
		sum.Errors += r.Errors
		if sum.FirstError == "" {
			sum.FirstError = r.FirstError
		}
		if sum.Errors != 0 || sum.Decisions > approvable()+3 {
			break
		}
		if time.Since(from) > 2*time.Minute {
			t.Fatalf("%d runs made only %d decisions in 2 minutes", runs, sum.Decisions)
		}
	}
	if most := approvable(); sum.OK > most || sum.OverLimit != sum.Decisions-sum.OK || sum.Errors != 0 {
		t.Errorf("decisions %d: OK %d (at most %d), OVER_LIMIT %d, errors %d %s", sum.Decisions, sum.OK, most, sum.OverLimit, sum.Errors, sum.FirstError)
	}
}

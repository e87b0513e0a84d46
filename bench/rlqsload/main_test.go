package main

import (
	"net"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/rlqs"
)

// startService serves sluice's quota service (package rlqs, its ledgers in memory) on a free
// loopback port, with one rule: match {name: api, user: "*"}, limit per second.
func startService(t *testing.T, limit int64, interval time.Duration) string {
	t.Helper()
	q := &config.Quota{Domain: "rlqs_bench", ReportInterval: interval, TTL: 3 * interval, Idle: time.Minute, Algorithm: "fair",
		Buckets: []config.QuotaBucket{{Name: "api", Match: map[string]string{"name": "api", "user": "*"}, Limit: limit, Burst: limit, Period: time.Second}}}
	svc := rlqs.New(q, rlqs.Options{Ledgers: func(name string, opts ledger.Options) (ledger.Ledger, error) {
		return ledger.NewMemory(name, opts, ledger.MemoryOptions{})
	}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	svc.Register(gs)
	go gs.Serve(ln)
	t.Cleanup(func() { svc.Close(); gs.Stop() })
	return ln.Addr().String()
}

// TestRunAgainstTheService drives sluice's quota service for a moment with two Envoys, as fast as
// they go, on a limit of 5 a second per bucket: the warm-up lasts until both hold assignments
// (the ledger's learning mode first), the measured decisions are counted, some refused (the
// Envoys' token buckets hold 5 a second between them), the Envoys reported and were answered
// in the window, and -cpu read this process's time. Nothing here depends on how fast the
// machine is beyond the generous bound on reaching the assignments.
func TestRunAgainstTheService(t *testing.T) {
	interval := 100 * time.Millisecond
	o := options{domain: "rlqs_bench", name: "api", key: "user", envoys: 2, values: 3, concurrency: 4,
		reportInterval: interval, warmup: 50 * time.Millisecond, steady: 30 * time.Second, settle: 100 * time.Millisecond, duration: time.Second,
		ready: 10 * time.Second, cpu: []process{{Name: "load", PID: os.Getpid()}}}
	o.addr = startService(t, 5, interval)
	if err := o.check(); err != nil {
		t.Fatal(err)
	}
	if err := waitReady(o); err != nil {
		t.Fatal(err)
	}
	r, err := run(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", r)
	if !r.Steady {
		t.Errorf("the Envoys held no assignment for every bucket within -steady %v", o.steady)
	}
	if r.Decisions == 0 || r.Admitted+r.Refused != r.Decisions || r.Refused == 0 {
		t.Errorf("decisions %d: admitted %d, refused %d; want some refused under 5 a second", r.Decisions, r.Admitted, r.Refused)
	}
	if r.Reports == 0 || r.Responses == 0 || r.Streams < o.envoys || r.CallsPer1000 <= 0 {
		t.Errorf("reports %d, responses %d, streams %d, calls per 1000 %v: want the Envoys' streams busy in the window",
			r.Reports, r.Responses, r.Streams, r.CallsPer1000)
	}
	if c, ok := r.CPUPerDecision["load"]; !ok || c < 0 || r.CPUMillis["load"] < 0 {
		t.Errorf("cpu_us_per_decision %v, cpu_ms %v: want the load generator's, 0 or more", r.CPUPerDecision, r.CPUMillis)
	}
}

// TestRunAtARate: with -rate the callers are paced, so a run cannot make more decisions than the
// rate allows over the warm-up and the window (a decision is measured if it starts in the window;
// the pace catches up when late, never runs ahead; each caller's first is due at once). Its bound
// is one-sided: a slow machine makes fewer.
func TestRunAtARate(t *testing.T) {
	interval := 100 * time.Millisecond
	o := options{domain: "rlqs_bench", name: "api", key: "user", envoys: 1, values: 2, concurrency: 2, rate: 200,
		reportInterval: interval, duration: 300 * time.Millisecond, ready: 10 * time.Second}
	o.addr = startService(t, 1000, interval)
	r, err := run(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", r)
	if most := int64(200*(r.WarmupS+r.DurationS)) + int64(o.concurrency); r.Decisions == 0 || r.Decisions > most {
		t.Errorf("%d decisions at 200/s over %.2fs and %.2fs: want 1 to %d", r.Decisions, r.WarmupS, r.DurationS, most)
	}
	if r.Rate != 200 || r.Refused != 0 {
		t.Errorf("rate_offered %v, refused %d: want 200 and none (the limit is far above)", r.Rate, r.Refused)
	}
}

func TestProbeWithoutHealth(t *testing.T) {
	o := options{addr: startService(t, 10, time.Second), domain: "rlqs_bench", ready: 10 * time.Second}
	if err := waitReady(o); err != nil {
		t.Errorf("a quota service without the health service: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer() // no quota service: the probe's stream is Unimplemented
	go gs.Serve(ln)
	defer gs.Stop()
	o.addr, o.ready = ln.Addr().String(), 100*time.Millisecond
	if err := waitReady(o); err == nil {
		t.Error("a server without the quota service: ready")
	}
}

func TestCheck(t *testing.T) {
	good := options{addr: "x:1", domain: "d", name: "api", key: "user", envoys: 1, values: 1, concurrency: 1,
		reportInterval: time.Second, duration: time.Second}
	if err := good.check(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []func(*options){
		func(o *options) { o.addr = "" }, func(o *options) { o.key = "name" }, func(o *options) { o.envoys = 0 },
		func(o *options) { o.values = 0 }, func(o *options) { o.rate = -1 }, func(o *options) { o.reportInterval = 0 },
		func(o *options) { o.duration = 0 }, func(o *options) { o.steady = -1 },
	} {
		o := good
		bad(&o)
		if o.check() == nil {
			t.Errorf("%+v: no error", o)
		}
	}
}

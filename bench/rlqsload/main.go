// Command rlqsload is a load generator for Envoy's Rate Limit Quota Service
// (envoy.service.rate_limit_quota.v3 StreamRateLimitQuotas): it runs -envoys simulated Envoys in
// its own process (internal/rlqstest Filters, the Go imitation of Envoy's rate_limit_quota
// filter), each with its one stream to the server, and drives requests through them, so that
// what RLQS costs per request can be set beside per-request RLS (bench/rlsload) on the same
// traffic. scripts/bench-rlqs.sh runs both against sluice, and rlsload against
// envoyproxy/ratelimit, in interleaved rounds.
//
//	go run ./bench/rlqsload -addr 127.0.0.1:8081 -domain rlqs_bench -envoys 10 -values 10 \
//		-concurrency 64 [-rate 0] -duration 10s [-warmup 2s] [-report-interval 1s] [-label rlqs]
//
// Every request is one Filter.Decide: the Envoy decides it locally from its assignment (a token
// bucket) and counts it in its next usage report; the server sees nothing of it but the report,
// one per Envoy and -report-interval, holding every bucket's counts. The bucket id is
// {name: NAME, user: value-I} (-name, -key), I drawn uniformly at random (each caller its own
// generator) from -values distinct values: the server's rule for it is one with match
// {name: NAME, user: "*"} (one bucket per value). -concurrency callers share the Envoys
// round-robin (caller i decides on Envoy i mod -envoys), each as fast as it can (a closed loop;
// a decision takes about a microsecond; every 16 it yields, so that the Envoys' reporting keeps
// its pace), or, with -rate R, at R decisions a second in all (each
// caller R/-concurrency a second, paced, catching up when late by less than a second).
//
// -report-interval is the Envoys' reporting interval. Envoy's filter reports on a fixed 5 s
// timer; the default here is 1 s so that a round of seconds holds several reports per Envoy
// (the server's work is per report: at 5 s it does a fifth of it). The server's rls.quota
// report_interval should be the same.
//
// Requests that start during -warmup are not measured. The warm-up also lasts until every Envoy
// holds an assignment for every bucket it has seen (a new bucket has none: the ledger starts in
// learning mode, for the assignment's time to live and a delivery margin, in which it hands out
// no new quota and the Envoys follow their no_assignment_behavior, here Envoy's default, allow
// all), for at most -steady more; the JSON's "steady" says whether that was reached; then
// -settle more, since a new assignment is a token bucket that starts full: its burst, spent in
// the first moments, is not the limit's steady rate. Requests that start in the -duration after
// it are measured.
//
// It prints one line of JSON on stdout and one line for people on stderr: decisions, admitted and
// refused, per second; the reports the Envoys sent and the responses they received in the
// measured window, and the service calls (reports) per 1000 decisions; reports dropped and
// streams opened (more than -envoys: a stream broke).
//
// -cpu NAME=PID,... also measures what the decisions cost those processes (the server, its
// Redis; PID "self": this process, the Envoys' own work): the CPU time (utime+stime of
// /proc/PID/stat, in 10 ms ticks) each spent in the measured window, in all ("cpu_ms"), per
// measured decision ("cpu_us_per_decision") and per admitted request ("cpu_us_per_admitted"),
// in µs, as bench/rlsload -cpu reads it.
//
// Before anything it waits up to -ready for the server: the gRPC health service SERVING for
// RateLimitQuotaService (or health absent or not knowing it: then an empty usage report on a
// stream must be taken). -probe does only that and exits (0 when ready).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/internal/proccpu"
	"github.com/sluicehq/sluice/internal/rlqstest"
)

type options struct {
	addr, domain, name, key, label string
	envoys, values, concurrency    int
	rate                           float64
	reportInterval                 time.Duration
	duration, warmup, steady       time.Duration
	settle                         time.Duration
	ready                          time.Duration
	probe                          bool
	cpu                            []process
}

// process is one whose CPU time -cpu measures.
type process = proccpu.Process

func main() {
	log.SetFlags(0)
	log.SetPrefix("rlqsload: ")
	var o options
	flag.StringVar(&o.addr, "addr", "", "the quota service's gRPC `host:port` (required)")
	flag.StringVar(&o.domain, "domain", "rlqs_bench", "the Envoys' domain (their filter's)")
	flag.StringVar(&o.name, "name", "api", "the bucket id's name entry")
	flag.StringVar(&o.key, "key", "user", "the bucket id's key whose value is drawn (value-0 .. value-(N-1))")
	flag.IntVar(&o.envoys, "envoys", 10, "simulated Envoys, each one stream")
	flag.IntVar(&o.values, "values", 10, "distinct bucket ids (values of -key), drawn uniformly")
	flag.IntVar(&o.concurrency, "concurrency", 64, "callers, each one decision at a time, sharing the Envoys round-robin")
	flag.Float64Var(&o.rate, "rate", 0, "decisions a second in all, paced (0: each caller as fast as it can)")
	flag.DurationVar(&o.reportInterval, "report-interval", time.Second, "the Envoys' reporting interval (Envoy's filter: 5s)")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "the measurement")
	flag.DurationVar(&o.warmup, "warmup", 2*time.Second, "load before the measurement, not measured")
	flag.DurationVar(&o.steady, "steady", 30*time.Second, "after -warmup, wait up to this long for every Envoy to hold an assignment for every bucket (0: do not wait)")
	flag.DurationVar(&o.settle, "settle", 2*time.Second, "once every Envoy holds its assignments, load this much longer before the measurement (a new assignment's token bucket starts full)")
	flag.DurationVar(&o.ready, "ready", 15*time.Second, "how long to wait for the server before starting")
	flag.StringVar(&o.label, "label", "", "a name for this run, copied into the JSON")
	flag.BoolVar(&o.probe, "probe", false, "only wait for the server (up to -ready), then exit: 0 if it answered")
	flag.Func("cpu", "`NAME=PID,...`: report each process's CPU time in the measured window (Linux /proc)", func(v string) error {
		ps, err := proccpu.Parse(v)
		o.cpu = append(o.cpu, ps...)
		return err
	})
	flag.Parse()
	if err := o.check(); err != nil {
		log.Fatal(err)
	}
	if err := waitReady(o); err != nil {
		log.Fatalf("%s is not ready after -ready %v: %v", o.addr, o.ready, err)
	}
	if o.probe {
		return
	}
	r, err := run(o)
	if err != nil {
		log.Fatal(err)
	}
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
	fmt.Fprintf(os.Stderr, "rlqsload%s: %.0f decisions/s (%s) over %v, %d Envoys, %d callers: admitted %.0f/s, refused %d of %d (%.1f %%); %d reports (%.3f per 1000 decisions), %d responses (%d changed assignments), %d dropped, %d streams%s%s\n",
		labelSuffix(o.label), r.PerSecond, rateText(o.rate), o.duration, o.envoys, o.concurrency, r.AdmittedPerSecond,
		r.Refused, r.Decisions, 100*float64(r.Refused)/float64(max(r.Decisions, 1)), r.Reports, r.CallsPer1000,
		r.Responses, r.Rebuilt, r.Dropped, r.Streams, cpuText(r), steadyText(r))
}

func labelSuffix(l string) string {
	if l == "" {
		return ""
	}
	return " " + l
}

func rateText(rate float64) string {
	if rate == 0 {
		return "closed loop"
	}
	return fmt.Sprintf("offered %.0f/s", rate)
}

func cpuText(r result) string {
	if len(r.CPUPerDecision) == 0 {
		return ""
	}
	var b strings.Builder
	for _, name := range sortedKeys(r.CPUPerDecision) {
		fmt.Fprintf(&b, "; %s CPU %.3f µs/decision", name, r.CPUPerDecision[name])
	}
	return b.String()
}

func steadyText(r result) string {
	if r.Steady {
		return ""
	}
	return " (NOT steady: some Envoy held no assignment for a bucket when the measurement began)"
}

func (o options) check() error {
	switch {
	case o.addr == "":
		return errors.New("-addr is required: the quota service's gRPC host:port")
	case o.domain == "":
		return errors.New("-domain must not be empty")
	case o.name == "" || o.key == "" || o.key == "name":
		return errors.New("-name and -key must not be empty, and -key not \"name\"")
	case o.envoys < 1:
		return fmt.Errorf("-envoys %d: want at least 1", o.envoys)
	case o.values < 1:
		return fmt.Errorf("-values %d: want at least 1", o.values)
	case o.concurrency < 1:
		return fmt.Errorf("-concurrency %d: want at least 1", o.concurrency)
	case o.rate < 0:
		return fmt.Errorf("-rate %v: want 0 (closed loop) or more", o.rate)
	case o.reportInterval <= 0:
		return fmt.Errorf("-report-interval %v: want more than 0", o.reportInterval)
	case o.duration <= 0:
		return fmt.Errorf("-duration %v: want more than 0", o.duration)
	case o.warmup < 0 || o.steady < 0 || o.settle < 0:
		return fmt.Errorf("-warmup %v, -steady %v, -settle %v: want 0 or more", o.warmup, o.steady, o.settle)
	}
	return nil
}

// ids are the bucket ids, {NAME-entry: name, KEY: value-I}; the callers only read them.
func (o options) ids() []map[string]string {
	ids := make([]map[string]string, o.values)
	for i := range ids {
		ids[i] = map[string]string{"name": o.name, o.key: "value-" + strconv.Itoa(i)}
	}
	return ids
}

// waitReady polls the server until its health service says RateLimitQuotaService is SERVING, or,
// where health is absent or does not know the service, until a stream takes an empty report, for
// at most o.ready.
func waitReady(o options) error {
	conn, err := grpc.NewClient(o.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	deadline := time.Now().Add(o.ready)
	var last error
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: rlqspb.RateLimitQuotaService_ServiceDesc.ServiceName})
		switch c := status.Code(err); {
		case c == codes.Unimplemented || c == codes.NotFound:
			last = probeStream(ctx, conn, o.domain)
		case err != nil:
			last = err
		case resp.GetStatus() != healthpb.HealthCheckResponse_SERVING:
			last = fmt.Errorf("health of %s: %v", rlqspb.RateLimitQuotaService_ServiceDesc.ServiceName, resp.GetStatus())
		default:
			last = nil
		}
		cancel()
		if last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return last
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// probeStream opens a stream, sends a report of no buckets and closes its side: the server
// answers nothing and ends the stream.
func probeStream(ctx context.Context, conn *grpc.ClientConn, domain string) error {
	s, err := rlqspb.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		return err
	}
	if err := s.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: domain}); err != nil && err != io.EOF {
		return err
	}
	if err := s.CloseSend(); err != nil {
		return err
	}
	for {
		if _, err := s.Recv(); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
	}
}

type result struct {
	Label             string  `json:"label,omitempty"`
	Addr              string  `json:"addr"`
	Domain            string  `json:"domain"`
	Envoys            int     `json:"envoys"`
	Values            int     `json:"values"`
	Pick              string  `json:"pick"`
	Concurrency       int     `json:"concurrency"`
	Rate              float64 `json:"rate_offered"` // 0: closed loop
	ReportIntervalS   float64 `json:"report_interval_s"`
	WarmupS           float64 `json:"warmup_s"` // the warm-up as it was, the wait for assignments included
	Steady            bool    `json:"steady"`
	DurationS         float64 `json:"duration_s"`
	Decisions         int64   `json:"decisions"`
	PerSecond         float64 `json:"decisions_per_s"`
	Admitted          int64   `json:"admitted"`
	AdmittedPerSecond float64 `json:"admitted_per_s"`
	Refused           int64   `json:"refused"`
	// In the measured window, all Envoys together.
	Reports   int `json:"reports"`
	Responses int `json:"responses"`
	Dropped   int `json:"reports_dropped"`
	Streams   int `json:"streams"` // opened since the start
	// Rebuilt: assignments received in the window that differ from the bucket's last one, each a
	// new token bucket, which starts full (Envoy rebuilds its bucket only when the strategy changes).
	Rebuilt      int64   `json:"assignments_changed"`
	CallsPer1000 float64 `json:"calls_per_1000_decisions"`
	// Every second of the clock from the run's start to its end (the first and last partly), the
	// warm-up included (the measurement began WarmupS after the start): the admitted and the
	// refused of all Envoys, so that a reader sees the assignments settle.
	StartUnixS    float64  `json:"start_unix_s"` // the run's start, on the clock: admitted_each_s[0] is the second it fell in
	AdmittedEachS []uint64 `json:"admitted_each_s"`
	RefusedEachS  []uint64 `json:"refused_each_s"`
	GOMAXPROCS    int      `json:"gomaxprocs"`
	// -cpu's measures, by process name.
	CPUMillis      map[string]float64 `json:"cpu_ms,omitempty"`
	CPUPerDecision map[string]float64 `json:"cpu_us_per_decision,omitempty"`
	CPUPerAdmitted map[string]float64 `json:"cpu_us_per_admitted,omitempty"`
}

// yieldEvery is how many decisions a closed-loop caller makes between two runtime.Gosched. Without
// it, 64 callers that never block keep the Envoys' own goroutines (the report timer, the stream's
// sender and receiver, the gRPC transport) waiting for hundreds of ms: goroutines woken by the
// network wait in the global run queue, which busy processors look at once in 61 slices. A 2 s
// closed-loop round then sent 11 reports from 10 Envoys that report every second. In Envoy, the
// workers' decisions and the client's stream run on different threads.
const yieldEvery = 16

// caller is one goroutine's tally of measured decisions.
type caller struct {
	n, admitted int64
	_           [48]byte // its own cache line
}

// steady reports whether every Envoy holds an active assignment for every bucket it tracks and
// tracks at least one.
func steady(fs []*rlqstest.Filter, ids []map[string]string) bool {
	for _, f := range fs {
		seen := 0
		for _, id := range ids {
			s, ok := f.Stats(id)
			if !ok {
				continue
			}
			seen++
			if s.State != rlqstest.Active {
				return false
			}
		}
		if seen == 0 {
			return false
		}
	}
	return true
}

// clientTotals sums the Envoys' stream figures.
func clientTotals(fs []*rlqstest.Filter) rlqstest.ClientStats {
	var t rlqstest.ClientStats
	for _, f := range fs {
		c := f.Client()
		t.ReportsSent += c.ReportsSent
		t.ReportsDropped += c.ReportsDropped
		t.Streams += c.Streams
		t.Responses += c.Responses
		t.UnknownBuckets += c.UnknownBuckets
	}
	return t
}

func run(o options) (result, error) {
	ids := o.ids()
	fs := make([]*rlqstest.Filter, o.envoys)
	// The measured window, [from, to) in Unix ns, 0 until it is set: a decision is measured if
	// it starts in it, by the caller's own clock reading (not by when this goroutine, which may
	// wait behind busy callers for hundreds of ms, gets to flip a switch).
	var w window
	var changed atomic.Int64
	for i := range fs {
		f, err := rlqstest.New(rlqstest.Config{Addr: o.addr, Domain: o.domain, ReportInterval: o.reportInterval,
			OnResponse: rebuilds(&w, &changed)})
		if err != nil {
			return result{}, err
		}
		defer f.Close()
		fs[i] = f
	}
	callers := make([]caller, o.concurrency)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range callers {
		c := &callers[i]
		f := fs[i%len(fs)]
		rng := rand.New(rand.NewPCG(uint64(i)+1, uint64(start.UnixNano())))
		var interval time.Duration
		next := start
		if o.rate > 0 {
			interval = time.Duration(float64(o.concurrency) / o.rate * float64(time.Second))
			next = start.Add(interval * time.Duration(i) / time.Duration(o.concurrency)) // staggered
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			yield := 0
			for {
				if interval > 0 {
					now := time.Now()
					if d := next.Sub(now); d > 0 {
						time.Sleep(d)
					} else if d < -time.Second {
						next = now // too late to catch up: the pace starts again from now
					}
					next = next.Add(interval)
				}
				t0 := time.Now().UnixNano()
				if end := w.to.Load(); end != 0 && t0 >= end {
					return
				}
				ok := f.Decide(ids[rng.IntN(len(ids))])
				if yield++; interval == 0 && yield%yieldEvery == 0 {
					runtime.Gosched()
				}
				if w.in(t0) {
					c.n++
					if ok {
						c.admitted++
					}
				}
			}
		}()
	}
	time.Sleep(o.warmup)
	isSteady := steady(fs, ids)
	for wait := time.Now().Add(o.steady); !isSteady && time.Now().Before(wait); isSteady = steady(fs, ids) {
		time.Sleep(20 * time.Millisecond)
	}
	measureFrom := time.Now().Add(o.settle)
	measureTo := measureFrom.Add(o.duration)
	w.to.Store(measureTo.UnixNano())
	w.from.Store(measureFrom.UnixNano())
	// The CPU times and the stream figures are read when this goroutine wakes at each end: late
	// alike at both on a busy machine, so the window they cover is about -duration long.
	time.Sleep(time.Until(measureFrom))
	cpuBegin := proccpu.Times(o.cpu)
	before := clientTotals(fs)
	time.Sleep(time.Until(measureTo))
	cpuEnd := proccpu.Times(o.cpu)
	after := clientTotals(fs)
	wg.Wait()

	r := result{Label: o.label, Addr: o.addr, Domain: o.domain, Envoys: o.envoys, Values: o.values, Pick: "uniform",
		Concurrency: o.concurrency, Rate: o.rate, ReportIntervalS: o.reportInterval.Seconds(),
		WarmupS: measureFrom.Sub(start).Seconds(), Steady: isSteady, DurationS: o.duration.Seconds(),
		Reports: after.ReportsSent - before.ReportsSent, Responses: after.Responses - before.Responses,
		Dropped: after.ReportsDropped - before.ReportsDropped, Streams: after.Streams,
		GOMAXPROCS: runtime.GOMAXPROCS(0)}
	r.Rebuilt = changed.Load()
	r.StartUnixS = float64(start.UnixNano()) / 1e9
	r.AdmittedEachS, r.RefusedEachS = eachSecond(fs, start, measureTo)
	for i := range callers {
		r.Decisions += callers[i].n
		r.Admitted += callers[i].admitted
	}
	r.Refused = r.Decisions - r.Admitted
	r.PerSecond = float64(r.Decisions) / o.duration.Seconds()
	r.AdmittedPerSecond = float64(r.Admitted) / o.duration.Seconds()
	if r.Decisions > 0 {
		r.CallsPer1000 = 1000 * float64(r.Reports) / float64(r.Decisions)
	}
	if len(o.cpu) > 0 {
		r.CPUMillis = map[string]float64{}
		r.CPUPerDecision = map[string]float64{}
		r.CPUPerAdmitted = map[string]float64{}
		for i, p := range o.cpu {
			if cpuBegin[i] < 0 || cpuEnd[i] < 0 {
				continue
			}
			us := float64((cpuEnd[i] - cpuBegin[i]).Nanoseconds()) / 1e3
			r.CPUMillis[p.Name] = us / 1e3
			if r.Decisions > 0 {
				r.CPUPerDecision[p.Name] = us / float64(r.Decisions)
			}
			if r.Admitted > 0 {
				r.CPUPerAdmitted[p.Name] = us / float64(r.Admitted)
			}
		}
	}
	return r, nil
}

// window is the measured window, [from, to) in Unix ns; 0s until it is set.
type window struct{ from, to atomic.Int64 }

func (w *window) in(t int64) bool {
	from := w.from.Load()
	return from != 0 && t >= from && t < w.to.Load()
}

// rebuilds returns an Envoy's OnResponse: it counts, in the measured window, the assignments
// that differ from the same bucket's last one (the Envoy's responses come one at a time, from its
// one stream).
func rebuilds(w *window, changed *atomic.Int64) func(*rlqspb.RateLimitQuotaResponse) {
	last := map[string]*typev3.RateLimitStrategy{}
	return func(resp *rlqspb.RateLimitQuotaResponse) {
		for _, a := range resp.GetBucketAction() {
			qa := a.GetQuotaAssignmentAction()
			if qa == nil {
				continue
			}
			k := fmt.Sprint(a.GetBucketId().GetBucket()) // fmt sorts a map's keys
			prev, seen := last[k]
			if seen && !proto.Equal(prev, qa.GetRateLimitStrategy()) && w.in(time.Now().UnixNano()) {
				changed.Add(1)
			}
			last[k] = qa.GetRateLimitStrategy()
		}
	}
}

// eachSecond sums the Envoys' counts per second (rlqstest's windows, aligned to the second) from
// the second of from to that of to.
func eachSecond(fs []*rlqstest.Filter, from, to time.Time) (admitted, refused []uint64) {
	first, last := from.Unix(), to.Unix()
	admitted, refused = make([]uint64, last-first+1), make([]uint64, last-first+1)
	for _, f := range fs {
		for _, w := range f.Windows(nil) {
			if i := w.Start.Unix() - first; i >= 0 && i < int64(len(admitted)) {
				admitted[i] += w.Allowed
				refused[i] += w.Denied
			}
		}
	}
	return admitted, refused
}

func sortedKeys(m map[string]float64) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// Command rlsload is a load generator for Envoy's rate limit service (envoy.service.ratelimit.v3
// RateLimitService/ShouldRateLimit), to measure sluice's and envoyproxy/ratelimit's the same way
// (scripts/bench-rls.sh runs it against both, in interleaved rounds).
//
//	go run ./bench/rlsload -addr 127.0.0.1:8081 -domain rls_bench -key client -values 10000 \
//		-concurrency 64 -duration 10s [-warmup 2s] [-rules 1] [-conns 1] [-label peer]
//
// Every request carries one descriptor of one entry, [{KEY, value-I}], I drawn uniformly at
// random (each caller its own generator) from -values distinct values; with -rules N > 1 the key
// too is drawn uniformly from KEY-0 .. KEY-(N-1), so that a configuration of N rules (see
// -write-config) is exercised. -concurrency callers each send one request at a time (a closed
// loop: the next as soon as the answer is in), every request its own stream, spread round-robin
// over -conns gRPC connections (default 1: one HTTP/2 connection, as one Envoy worker holds).
// Requests that start during -warmup are not measured; those that start in the -duration after
// it are.
//
// It prints one line of JSON on stdout and one line for people on stderr: decisions per second,
// the exact p50, p90, p99 and maximum latency (every caller keeps its latencies; all are sorted at
// the end, no histogram), and the counts of OK, OVER_LIMIT and errors. Memory is bounded: past
// -max-samples latencies in all, each caller keeps a uniform random sample of its own
// (reservoir sampling), and the JSON says "sampled": true; the counts and the maximum stay exact.
//
// Before the warm-up it waits up to -ready for the server: the gRPC health service SERVING (or
// absent), and one ShouldRateLimit answered. -probe does only that and exits (0 when ready).
// -write-config FILE writes the Envoy rate limit configuration of the same domain and keys,
// value-less rules of -limit per -unit, and exits.
//
// -cpu NAME=PID,... also measures what the decisions cost those processes (the server under test,
// its Redis): the CPU time (utime+stime of /proc/PID/stat) each spent from the start of the
// measurement to the answer of its last measured request, divided by the measured decisions, in
// µs, in the JSON's "cpu_us_per_decision" under NAME (PID "self": the load generator itself).
// The requests of the warm-up still in flight when the measurement starts (at most -concurrency)
// are the only work in that window not counted, a few in tens of thousands. On a machine whose
// CPUs are shared, this is what a server pays per decision where its decisions/s depend on what
// else runs.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/proccpu"
)

type options struct {
	addr, domain, key, label, writeConfig, unit string
	values, concurrency, conns, rules           int
	duration, warmup, ready                     time.Duration
	maxSamples                                  int
	limit                                       uint64
	probe                                       bool
	cpu                                         []process
}

// process is one whose CPU time -cpu measures.
type process = proccpu.Process

func main() {
	log.SetFlags(0)
	log.SetPrefix("rlsload: ")
	var o options
	flag.StringVar(&o.addr, "addr", "", "the rate limit service's gRPC `host:port` (required)")
	flag.StringVar(&o.domain, "domain", "rls_bench", "the requests' domain")
	flag.StringVar(&o.key, "key", "client", "the descriptor's key (with -rules N > 1, KEY-0 .. KEY-(N-1))")
	flag.IntVar(&o.values, "values", 10000, "distinct descriptor values, value-0 .. value-(N-1), drawn uniformly")
	flag.IntVar(&o.concurrency, "concurrency", 64, "callers, each one request at a time")
	flag.IntVar(&o.conns, "conns", 1, "gRPC connections the callers share (round-robin)")
	flag.IntVar(&o.rules, "rules", 1, "descriptor keys drawn uniformly (1: KEY itself)")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "the measurement")
	flag.DurationVar(&o.warmup, "warmup", 2*time.Second, "load before the measurement, not measured")
	flag.DurationVar(&o.ready, "ready", 15*time.Second, "how long to wait for the server before starting")
	flag.IntVar(&o.maxSamples, "max-samples", 4_000_000, "latencies kept in all (past it, a uniform sample; 8 bytes each)")
	flag.StringVar(&o.label, "label", "", "a name for this run, copied into the JSON")
	flag.BoolVar(&o.probe, "probe", false, "only wait for the server (up to -ready), then exit: 0 if it answered")
	flag.StringVar(&o.writeConfig, "write-config", "", "write the Envoy rate limit configuration for -domain, -key and -rules to `FILE` and exit")
	flag.Func("cpu", "`NAME=PID,...`: report each process's CPU time per measured decision (Linux /proc)", func(v string) error {
		ps, err := proccpu.Parse(v)
		o.cpu = append(o.cpu, ps...)
		return err
	})
	flag.Uint64Var(&o.limit, "limit", 1_000_000, "with -write-config: each rule's requests_per_unit")
	flag.StringVar(&o.unit, "unit", "second", "with -write-config: each rule's unit (second, minute, hour, day, week, month, year)")
	flag.Parse()
	if err := o.check(); err != nil {
		log.Fatal(err)
	}
	if o.writeConfig != "" {
		if err := os.WriteFile(o.writeConfig, []byte(o.config()), 0o644); err != nil {
			log.Fatal(err)
		}
		return
	}
	conns := make([]*grpc.ClientConn, o.conns)
	for i := range conns {
		c, err := grpc.NewClient(o.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			log.Fatalf("-addr %s: %v", o.addr, err)
		}
		defer c.Close()
		conns[i] = c
	}
	if err := waitReady(conns[0], o); err != nil {
		log.Fatalf("%s is not ready after -ready %v: %v", o.addr, o.ready, err)
	}
	if o.probe {
		return
	}
	r := run(conns, o)
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
	fmt.Fprintf(os.Stderr, "rlsload%s: %.0f decisions/s over %v (%d callers, %d conn): p50 %.3f ms, p90 %.3f ms, p99 %.3f ms, max %.3f ms; OK %d, OVER_LIMIT %d, errors %d%s\n",
		labelSuffix(o.label), r.PerSecond, o.duration, o.concurrency, o.conns, r.P50, r.P90, r.P99, r.Max, r.OK, r.OverLimit, r.Errors, sampledNote(r))
	if r.FirstError != "" {
		fmt.Fprintf(os.Stderr, "rlsload: first error: %s\n", r.FirstError)
	}
}

func labelSuffix(l string) string {
	if l == "" {
		return ""
	}
	return " " + l
}

func sampledNote(r result) string {
	if r.Sampled {
		return " (percentiles of a uniform sample)"
	}
	return ""
}

func (o options) check() error {
	switch {
	case o.writeConfig == "" && o.addr == "":
		return errors.New("-addr is required: the rate limit service's gRPC host:port")
	case o.domain == "":
		return errors.New("-domain must not be empty")
	case o.key == "":
		return errors.New("-key must not be empty")
	case o.values < 1:
		return fmt.Errorf("-values %d: want at least 1", o.values)
	case o.concurrency < 1:
		return fmt.Errorf("-concurrency %d: want at least 1", o.concurrency)
	case o.conns < 1:
		return fmt.Errorf("-conns %d: want at least 1", o.conns)
	case o.rules < 1:
		return fmt.Errorf("-rules %d: want at least 1", o.rules)
	case o.duration <= 0:
		return fmt.Errorf("-duration %v: want more than 0", o.duration)
	case o.warmup < 0:
		return fmt.Errorf("-warmup %v: want 0 or more", o.warmup)
	case o.maxSamples < o.concurrency:
		return fmt.Errorf("-max-samples %d: want at least -concurrency (%d)", o.maxSamples, o.concurrency)
	case o.limit > 1<<32-1:
		return fmt.Errorf("-limit %d: requests_per_unit is a uint32", o.limit)
	}
	switch o.unit {
	case "second", "minute", "hour", "day", "week", "month", "year":
	default:
		return fmt.Errorf("-unit %q: want second, minute, hour, day, week, month or year", o.unit)
	}
	return nil
}

func (o options) keys() []string {
	if o.rules == 1 {
		return []string{o.key}
	}
	keys := make([]string, o.rules)
	for i := range keys {
		keys[i] = o.key + "-" + strconv.Itoa(i)
	}
	return keys
}

// config is the Envoy rate limit configuration (envoyproxy/ratelimit's YAML) of o's domain: one
// value-less rule per key, so that every value has its own counter.
func (o options) config() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Written by bench/rlsload -write-config: %d rule(s) of %d per %s, one counter per value.\n", o.rules, o.limit, o.unit)
	fmt.Fprintf(&b, "domain: %s\ndescriptors:\n", o.domain)
	for _, k := range o.keys() {
		fmt.Fprintf(&b, "  - key: %s\n    rate_limit: {unit: %s, requests_per_unit: %d}\n", k, o.unit, o.limit)
	}
	return b.String()
}

// waitReady polls the server until its health service says SERVING (or it has none) and it
// answers a ShouldRateLimit, for at most o.ready.
func waitReady(conn *grpc.ClientConn, o options) error {
	health := healthpb.NewHealthClient(conn)
	rls := rlspb.NewRateLimitServiceClient(conn)
	deadline := time.Now().Add(o.ready)
	var last error
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		switch {
		case status.Code(err) == codes.Unimplemented, err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING:
			_, err = rls.ShouldRateLimit(ctx, request(o.domain, o.keys()[0], "value-0"))
			last = err
		case err != nil:
			last = err
		default:
			last = fmt.Errorf("health: %v", resp.GetStatus())
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

func request(domain, key, value string) *rlspb.RateLimitRequest {
	return &rlspb.RateLimitRequest{
		Domain: domain,
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: key, Value: value}},
		}},
		HitsAddend: 1,
	}
}

type result struct {
	Label       string  `json:"label,omitempty"`
	Addr        string  `json:"addr"`
	Domain      string  `json:"domain"`
	Key         string  `json:"key"`
	Rules       int     `json:"rules"`
	Values      int     `json:"values"`
	Pick        string  `json:"pick"`
	Concurrency int     `json:"concurrency"`
	Conns       int     `json:"conns"`
	WarmupS     float64 `json:"warmup_s"`
	DurationS   float64 `json:"duration_s"`
	Decisions   int64   `json:"decisions"`
	PerSecond   float64 `json:"decisions_per_s"`
	P50         float64 `json:"p50_ms"`
	P90         float64 `json:"p90_ms"`
	P99         float64 `json:"p99_ms"`
	Max         float64 `json:"max_ms"`
	OK          int64   `json:"ok"`
	OverLimit   int64   `json:"over_limit"`
	Errors      int64   `json:"errors"`
	FirstError  string  `json:"first_error,omitempty"`
	Sampled     bool    `json:"sampled"`
	GOMAXPROCS  int     `json:"gomaxprocs"`
	// CPUPerDecision is -cpu's measure: µs of CPU per measured decision, by process name.
	CPUPerDecision map[string]float64 `json:"cpu_us_per_decision,omitempty"`
}

// caller is one goroutine's tally.
type caller struct {
	samples       []int64 // latencies in ns: all of them, or a uniform sample of them
	n             int64   // measured requests
	max           int64
	ok, over, bad int64
	firstErr      string
}

// record keeps latency ns of the caller's n-th measured request: every one while there is room,
// then each with probability room/n in a random slot (Algorithm R), a uniform sample.
func (c *caller) record(ns int64, room int, rng *rand.Rand) {
	c.n++
	c.max = max(c.max, ns)
	if len(c.samples) < room {
		c.samples = append(c.samples, ns)
	} else if j := rng.Int64N(c.n); j < int64(room) {
		c.samples[j] = ns
	}
}

func run(conns []*grpc.ClientConn, o options) result {
	keys := o.keys()
	values := make([]string, o.values)
	for i := range values {
		values[i] = "value-" + strconv.Itoa(i)
	}
	room := o.maxSamples / o.concurrency
	callers := make([]caller, o.concurrency)
	start := time.Now()
	measureFrom := start.Add(o.warmup)
	end := measureFrom.Add(o.duration)
	// The CPU times at the start of the measurement: read by a timer at measureFrom, waited for
	// before the times at the end are read.
	cpuStart := make(chan []time.Duration, 1)
	if len(o.cpu) > 0 {
		time.AfterFunc(time.Until(measureFrom), func() { cpuStart <- proccpu.Times(o.cpu) })
	}
	var wg sync.WaitGroup
	for i := range callers {
		c := &callers[i]
		c.samples = make([]int64, 0, min(room, 1<<16))
		rls := rlspb.NewRateLimitServiceClient(conns[i%len(conns)])
		rng := rand.New(rand.NewPCG(uint64(i)+1, uint64(start.UnixNano())))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				t0 := time.Now()
				if !t0.Before(end) {
					return
				}
				key := keys[0]
				if len(keys) > 1 {
					key = keys[rng.IntN(len(keys))]
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := rls.ShouldRateLimit(ctx, request(o.domain, key, values[rng.IntN(len(values))]))
				cancel()
				ns := time.Since(t0).Nanoseconds()
				if t0.Before(measureFrom) {
					continue
				}
				c.record(ns, room, rng)
				switch {
				case err != nil:
					c.bad++
					if c.firstErr == "" {
						c.firstErr = err.Error()
					}
				case resp.GetOverallCode() == rlspb.RateLimitResponse_OK:
					c.ok++
				case resp.GetOverallCode() == rlspb.RateLimitResponse_OVER_LIMIT:
					c.over++
				default:
					c.bad++
					if c.firstErr == "" {
						c.firstErr = "overall_code " + resp.GetOverallCode().String()
					}
				}
			}
		}()
	}
	wg.Wait()
	var cpuEnd, cpuBegin []time.Duration
	if len(o.cpu) > 0 {
		cpuEnd = proccpu.Times(o.cpu)
		cpuBegin = <-cpuStart
	}

	r := result{Label: o.label, Addr: o.addr, Domain: o.domain, Key: o.key, Rules: o.rules, Values: o.values,
		Pick: "uniform", Concurrency: o.concurrency, Conns: len(conns), WarmupS: o.warmup.Seconds(),
		DurationS: o.duration.Seconds(), GOMAXPROCS: runtime.GOMAXPROCS(0)}
	var all []int64
	var maxNS int64
	for i := range callers {
		c := &callers[i]
		r.Decisions += c.n
		r.OK += c.ok
		r.OverLimit += c.over
		r.Errors += c.bad
		if r.FirstError == "" {
			r.FirstError = c.firstErr
		}
		r.Sampled = r.Sampled || c.n > int64(len(c.samples))
		maxNS = max(maxNS, c.max)
	}
	// Unsampled, these are all the measured latencies. Sampled, each caller's sample stands for its
	// own requests; the callers run alike (closed loops on the same connections), so their samples
	// are pooled as they are.
	for i := range callers {
		all = append(all, callers[i].samples...)
	}
	slices.Sort(all)
	ms := func(ns int64) float64 { return float64(ns) / 1e6 }
	r.PerSecond = float64(r.Decisions) / o.duration.Seconds()
	r.P50, r.P90, r.P99 = ms(percentile(all, 0.50)), ms(percentile(all, 0.90)), ms(percentile(all, 0.99))
	r.Max = ms(maxNS)
	if len(o.cpu) > 0 && r.Decisions > 0 {
		r.CPUPerDecision = make(map[string]float64, len(o.cpu))
		for i, p := range o.cpu {
			if cpuBegin[i] >= 0 && cpuEnd[i] >= 0 {
				r.CPUPerDecision[p.Name] = float64((cpuEnd[i] - cpuBegin[i]).Nanoseconds()) / 1e3 / float64(r.Decisions)
			}
		}
	}
	return r
}

// percentile is the nearest-rank q-quantile of sorted: the smallest value with at least q of the
// values at or below it.
func percentile(sorted []int64, q float64) int64 {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(q * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

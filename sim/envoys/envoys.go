// Package envoys simulates Envoys on sluice's Rate Limit Quota Service (RLQS, package rlqs)
// beside the same Envoys asking sluice per request (RLS), on the same traffic and a virtual
// clock (issue 35; docs/envoy.md, "Quota by demand: RLQS"). Each simulated Envoy is the filter
// model of internal/envoyfilter (the one internal/rlqstest puts behind gRPC): it decides every
// request locally from its assignment, reports its bucket's usage every report interval (a new
// bucket's first request at once), and applies the service's answers. The service is rlqs's own
// Client (Report, and Tick every half report interval) on ledger.Memory, the messages a latency
// apart each way. On RLS, every request goes to sluice's store, the memory store with a token
// bucket of the same limit, period and burst (package sim's Session, the path sluice serve
// takes), a latency away.
//
// The simulator only schedules: the requests at their times, each Envoy's report timer, each
// stream's tick, the messages' deliveries, and the service's death and restart (--kill-at,
// --restart-at: its streams break, its memory ledgers are lost; the Envoys' assignments expire
// and they follow their expired behaviour; a restarted service learns for a TTL and the hold
// before it hands out quota).
//
// `sluice simulate --envoys` runs it (docs/simulate.md).
package envoys

import (
	"cmp"
	"container/heap"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/internal/envoyfilter"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/rlqs"
	"github.com/sluicehq/sluice/sim"
)

// Bucket is the simulated bucket's id: every Envoy's requests match it, and the rule matches it.
var Bucket = map[string]string{"name": "api"}

// RuleName is the rule's name (in the ledger's keys).
const RuleName = "api"

// MaxEnvoys bounds the Envoys of one simulation; MaxIntervals its report intervals and windows.
const (
	MaxEnvoys    = 64
	MaxIntervals = 100_000
)

// Behavior is an Envoy's no_assignment_behavior or expired_assignment_behavior.
type Behavior string

const (
	Allow Behavior = "allow" // blanket ALLOW_ALL (no_assignment_behavior unset is this)
	Deny  Behavior = "deny"  // blanket DENY_ALL
	// Reuse is expired_assignment_behavior reuse_last_assignment: the expired token bucket
	// carries on.
	Reuse Behavior = "reuse"
	// Fallback is no expired_assignment_behavior: back to no_assignment_behavior.
	Fallback Behavior = "no-assignment"
)

// Options is one simulation.
type Options struct {
	// Envoys are the Envoys' names, in the order shown.
	Envoys []string
	// Requests are the Envoys' requests in time order, each Key naming its Envoy.
	Requests []sim.Request
	// Limit per Period (whole seconds) is the bucket's rule; Burst its tokens in all (default
	// Limit). RLS runs a token bucket of the same three.
	Limit  int64
	Period time.Duration
	Burst  int64
	// ReportInterval is the Envoys' (default 5s, Envoy's); TTL an assignment's time to live
	// (default three report intervals; at least two).
	ReportInterval, TTL time.Duration
	// Algorithm is the ledger's split: fair (default) or proportional.
	Algorithm string
	// Latency is the one-way latency between an Envoy and sluice: on every report, response and
	// RLS request. At most a quarter report interval and the hold (1s).
	Latency time.Duration
	// NoAssignment is the Envoys' no_assignment_behavior: Allow (default, Envoy's) or Deny.
	// Expired is their expired_assignment_behavior: Fallback (default: back to NoAssignment),
	// Allow, Deny or Reuse.
	NoAssignment, Expired Behavior
	// KillAt, if > 0, is when the service dies (its streams break, its memory ledgers are lost);
	// RestartAt, if > KillAt, when it comes back. RLS requests while it is down are admitted
	// (Envoy's rate limit filter's failure_mode_deny: false).
	KillAt, RestartAt time.Duration
	// Duration is how long it runs (default: to the end of the period of the last request).
	Duration time.Duration
}

// Row is one Envoy over one report interval.
type Row struct {
	StartMicros int64
	Envoy       string
	Offered     int64
	// Admitted on RLQS, of which Fallback without an active assignment (a new bucket's first
	// request, no_assignment_behavior, expired_assignment_behavior).
	Admitted, Fallback int64
	// RLSAdmitted is what the same requests got from RLS.
	RLSAdmitted int64
	// State, Assigned and MaxTokens are the Envoy's bucket at the interval's end: its state
	// (no_assignment, active, expired, or "" without a bucket), its assignment's rate (per
	// period; -1 for DENY_ALL, -2 for ALLOW_ALL) and token bucket size.
	State     string
	Assigned  int64
	MaxTokens int64
	// Reports the Envoy sent, Responses the service sent it, in the interval.
	Reports, Responses int64
}

// Window is one window of the period, all Envoys together.
type Window struct {
	StartMicros int64
	Offered     int64
	// Admitted on RLQS; Assigned of them under an active assignment; Fallback the rest.
	Admitted, Assigned, Fallback int64
	// Tokens is Σ max_tokens of the token buckets held at the window's start or built in it
	// (Built of them: Envoy builds a full bucket for every new or changed assignment);
	// Bound = L + Tokens, which Assigned must not exceed.
	Tokens, Bound, Built int64
	Held                 bool
	// RLSAdmitted on RLS, of which RLSOpen while the service was down (admitted unasked); the
	// others' bound is the token bucket's B + L.
	RLSAdmitted, RLSBound, RLSOpen int64
	RLSHeld                        bool // RLSAdmitted − RLSOpen ≤ RLSBound
}

// Result is a simulation's outcome.
type Result struct {
	Options Options
	// IntervalMicros is the timeline's row width (the report interval).
	IntervalMicros int64
	Rows           []Row // by interval, then Envoy
	Windows        []Window
	Held, RLSHeld  bool
	// Totals.
	Offered, Admitted, Fallback, RLSAdmitted int64
	// Calls to the service: RLQS reports sent and responses received (their sum is RLQSCalls);
	// RLS requests (one call each), of which RLSDown went unanswered (the service down).
	Reports, Responses, RLQSCalls, RLSCalls, RLSDown int64
	// Streams is how many RLQS streams the Envoys opened.
	Streams int64
}

// OptionError is an option at fault, named as `sluice simulate`'s flag.
type OptionError struct{ Field, Message string }

func (e *OptionError) Error() string { return "envoys: " + e.Message }

// Flag is the error as the command line says it.
func (e *OptionError) Flag() string { return "--" + e.Field + ": " + e.Message }

func optionErr(field, format string, args ...any) error {
	return &OptionError{Field: field, Message: fmt.Sprintf(format, args...)}
}

// Names reads --envoys: a number N (the Envoys e1 … eN) or names separated by commas.
func Names(text string) ([]string, error) {
	text = strings.TrimSpace(text)
	if n, err := strconv.Atoi(text); err == nil {
		if n < 1 || n > MaxEnvoys {
			return nil, optionErr("envoys", "%d Envoys; 1 to %d", n, MaxEnvoys)
		}
		names := make([]string, n)
		for i := range names {
			names[i] = "e" + strconv.Itoa(i+1)
		}
		return names, nil
	}
	var names []string
	seen := map[string]bool{}
	for _, s := range strings.Split(text, ",") {
		s = strings.TrimSpace(s)
		if err := ledger.CheckName("Envoy", s); err != nil {
			return nil, optionErr("envoys", "%v", strings.TrimPrefix(err.Error(), "ledger: "))
		}
		if seen[s] {
			return nil, optionErr("envoys", "Envoy %q is named twice", s)
		}
		seen[s] = true
		names = append(names, s)
	}
	if len(names) > MaxEnvoys {
		return nil, optionErr("envoys", "%d Envoys; 1 to %d", len(names), MaxEnvoys)
	}
	return names, nil
}

// Traffic reads the traffic: a pattern without names is every Envoy's; with names
// ("e1: 20/s for 1m; e2: ..."), each names an Envoy's own.
func Traffic(pattern string, envoys []string) ([]sim.Request, error) {
	reqs, err := sim.ParseClientTraffic(pattern)
	if err != nil {
		return nil, optionErr("traffic", "%v", err)
	}
	named := false
	for _, r := range reqs {
		if r.Key != sim.DefaultKey {
			named = true
			break
		}
	}
	if named || len(reqs) == 0 {
		return reqs, nil
	}
	if len(reqs)*len(envoys) > sim.MaxRequests {
		return nil, optionErr("traffic", "%d Envoys × %d requests; at most %d in all", len(envoys), len(reqs), sim.MaxRequests)
	}
	all := make([]sim.Request, 0, len(reqs)*len(envoys))
	for _, r := range reqs {
		for _, e := range envoys {
			r.Key = e
			all = append(all, r)
		}
	}
	return all, nil
}

// ParseBehavior reads a behaviour; expired says whether it is the expired one (which also
// takes reuse and no-assignment).
func ParseBehavior(s string, expired bool) (Behavior, bool) {
	switch b := Behavior(s); b {
	case Allow, Deny:
		return b, true
	case Reuse, Fallback:
		return b, expired
	}
	return "", false
}

func (o *Options) check() error {
	if len(o.Envoys) == 0 || len(o.Envoys) > MaxEnvoys {
		return optionErr("envoys", "%d Envoys; 1 to %d", len(o.Envoys), MaxEnvoys)
	}
	seen := map[string]bool{}
	for _, e := range o.Envoys {
		seen[e] = true
	}
	for _, r := range o.Requests {
		if !seen[r.Key] {
			return optionErr("traffic", "the traffic names %q, which is not one of the Envoys %v: begin each Envoy's pattern with its name (\"%s: 10/s for 1m\"), or give one pattern without names for every Envoy", r.Key, o.Envoys, o.Envoys[0])
		}
		if r.Cost != 1 {
			return optionErr("traffic", "a request of cost %d; Envoy's quota filter counts requests (cost 1)", r.Cost)
		}
	}
	if o.Burst == 0 {
		o.Burst = o.Limit
	}
	if o.ReportInterval == 0 {
		o.ReportInterval = config.DefaultQuotaReportInterval
	}
	if o.TTL == 0 {
		o.TTL = 3 * o.ReportInterval
	}
	if o.Algorithm == "" {
		o.Algorithm = "fair"
	}
	if o.NoAssignment == "" {
		o.NoAssignment = Allow
	}
	if o.Expired == "" {
		o.Expired = Fallback
	}
	switch {
	case o.Limit < 1 || o.Limit > config.MaxQuotaLimit:
		return optionErr("limit", "limit %d; 1 to %d", o.Limit, int64(config.MaxQuotaLimit))
	case o.Period < time.Second || o.Period%time.Second != 0 || o.Period > 24*time.Hour:
		return optionErr("period", "period %v; whole seconds from 1s to 24h (Envoy's token bucket fills in whole seconds)", o.Period)
	case o.Burst < 1 || o.Burst > config.MaxQuotaLimit:
		return optionErr("burst", "burst %d; 1 to %d", o.Burst, int64(config.MaxQuotaLimit))
	case o.ReportInterval < 10*time.Millisecond || o.ReportInterval > time.Hour:
		return optionErr("report-interval", "report interval %v; 10ms to 1h", o.ReportInterval)
	case o.TTL < 2*o.ReportInterval || o.TTL > 24*time.Hour:
		return optionErr("assignment-ttl", "assignment TTL %v; at least twice the report interval (%v), at most 24h", o.TTL, 2*o.ReportInterval)
	case o.Algorithm != "fair" && o.Algorithm != "proportional":
		return optionErr("ledger-algorithm", "ledger algorithm %q; fair or proportional", o.Algorithm)
	case o.Latency < 0 || o.Latency > o.ReportInterval/4 || o.Latency > time.Second:
		return optionErr("envoy-latency", "latency %v; 0 to a quarter of the report interval (%v) and at most 1s (the ledger's hold for an assignment's way)", o.Latency, o.ReportInterval/4)
	case o.NoAssignment != Allow && o.NoAssignment != Deny:
		return optionErr("no-assignment", "%q; allow or deny", o.NoAssignment)
	case o.Expired != Allow && o.Expired != Deny && o.Expired != Reuse && o.Expired != Fallback:
		return optionErr("expired", "%q; no-assignment, allow, deny or reuse", o.Expired)
	case o.KillAt < 0 || o.RestartAt < 0 || (o.RestartAt > 0 && o.RestartAt <= o.KillAt):
		return optionErr("restart-at", "restart at %v, kill at %v: the restart after the kill", o.RestartAt, o.KillAt)
	case o.RestartAt > 0 && o.KillAt == 0:
		return optionErr("restart-at", "a restart without --kill-at")
	case o.Duration < 0:
		return optionErr("traffic", "duration %v; not negative", o.Duration)
	}
	if o.Duration == 0 {
		end := int64(0)
		if n := len(o.Requests); n > 0 {
			end = o.Requests[n-1].TMicros + 1
		}
		end = max(end, o.KillAt.Microseconds()+1, o.RestartAt.Microseconds()+1)
		P := o.Period.Microseconds()
		o.Duration = time.Duration((end+P-1)/P*P) * time.Microsecond
	}
	if o.Duration.Microseconds() > sim.MaxTimeMicros {
		return optionErr("traffic", "duration %v; at most 2^53 µs", o.Duration)
	}
	if n := o.Duration / o.ReportInterval; n > MaxIntervals {
		return optionErr("report-interval", "%d report intervals of %v in %v; at most %d", n, o.ReportInterval, o.Duration, MaxIntervals)
	}
	if n := o.Duration / o.Period; n > MaxIntervals {
		return optionErr("period", "%d windows of %v in %v; at most %d", n, o.Period, o.Duration, MaxIntervals)
	}
	return nil
}

// Quota is the service's rls.quota of o: the one rule, o's timing.
func (o *Options) Quota() *config.Quota {
	return &config.Quota{ReportInterval: o.ReportInterval, TTL: o.TTL, Idle: config.DefaultQuotaIdle, Algorithm: o.Algorithm,
		Buckets: []config.QuotaBucket{{Name: RuleName, Match: Bucket, Limit: o.Limit, Period: o.Period, Burst: o.Burst}}}
}

// Policy is RLS's policy of o: a token bucket of the same limit, period and burst.
func (o *Options) Policy() sluice.Policy {
	return sluice.Policy{Name: RuleName, Algorithm: algorithm.TokenBucket, Limit: o.Limit, Period: o.Period, Burst: o.Burst}
}

// Run runs the simulation.
func Run(o Options) (*Result, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	w, err := newWorld(o)
	if err != nil {
		return nil, err
	}
	return w.run()
}

type event struct {
	t, seq int64
	do     func()
}

type events []event

func (e events) Len() int { return len(e) }
func (e events) Less(i, j int) bool {
	return cmp.Or(cmp.Compare(e[i].t, e[j].t), cmp.Compare(e[i].seq, e[j].seq)) < 0
}
func (e events) Swap(i, j int) { e[i], e[j] = e[j], e[i] }
func (e *events) Push(x any)   { *e = append(*e, x.(event)) }
func (e *events) Pop() any {
	old := *e
	x := old[len(old)-1]
	*e = old[:len(old)-1]
	return x
}

type world struct {
	o      Options
	clock  *sluice.ManualClock
	origin time.Time
	queue  events
	seq    int64
	ctx    context.Context

	svc   *rlqs.Service // nil while the service is down
	names map[string]string
	envs  []*envoy
	by    map[string]*envoy
	rls   *sim.Session
	res   *Result

	// per window of the period
	assigned, fallback, admitted, offered, tokens, built, rlsAdmitted, rlsOpen []int64
}

type envoy struct {
	i       int
	name    string
	f       *envoyfilter.Filter
	c       *rlqs.Client // the current stream's; nil: none
	streams int
	// The current interval's counts.
	offered, admitted, fallback, rlsAdmitted, reports, responses int64
}

func newWorld(o Options) (*world, error) {
	origin := time.Unix(0, 0).UTC()
	w := &world{o: o, clock: sluice.NewManualClock(origin), origin: origin, ctx: context.Background(),
		names: map[string]string{}, by: map[string]*envoy{}}
	for i, name := range o.Envoys {
		cfg := envoyfilter.Config{NoAssignment: strategy(o.NoAssignment)}
		switch o.Expired {
		case Reuse:
			cfg.Expired = &envoyfilter.ExpiredBehavior{ReuseLast: true}
		case Allow, Deny:
			cfg.Expired = &envoyfilter.ExpiredBehavior{Fallback: strategy(o.Expired)}
		}
		e := &envoy{i: i, name: name, f: envoyfilter.New(cfg)}
		w.envs = append(w.envs, e)
		w.by[name] = e
	}
	var err error
	if w.rls, err = sim.NewSession(o.Policy(), 1); err != nil {
		return nil, fmt.Errorf("envoys: %w", err)
	}
	w.res = &Result{Options: o, IntervalMicros: o.ReportInterval.Microseconds(), Held: true, RLSHeld: true}
	return w, nil
}

func strategy(b Behavior) *typev3.RateLimitStrategy {
	r := typev3.RateLimitStrategy_ALLOW_ALL
	if b == Deny {
		r = typev3.RateLimitStrategy_DENY_ALL
	}
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: r}}
}

// start starts the service: new memory ledgers in one group, the process's, as sluice serve's
// quota service on the memory store has them (a restart loses them, and they learn).
func (w *world) start() {
	group := &ledger.MemoryGroup{}
	w.svc = rlqs.New(w.o.Quota(), rlqs.Options{Now: w.clock.Now, Ledgers: func(name string, lo ledger.Options) (ledger.Ledger, error) {
		l, err := ledger.NewMemory(name, lo, ledger.MemoryOptions{Now: w.clock.Now, Group: group})
		if err != nil {
			return nil, err
		}
		return named{l, w.names}, nil
	}})
}

// kill stops the service: every stream breaks.
func (w *world) kill() {
	w.svc = nil
	for _, e := range w.envs {
		e.c = nil
	}
}

// named is a ledger whose clients are the Envoys' names, not the streams' random ids: the ledger
// splits in the order of its clients' names, so the same names make the same run.
type named struct {
	*ledger.Memory
	names map[string]string
}

func (n named) Refresh(ctx context.Context, client string, r ledger.Report) (ledger.Grant, error) {
	if m, ok := n.names[client]; ok {
		client = m
	}
	return n.Memory.Refresh(ctx, client, r)
}

func (w *world) now() int64 { return w.clock.Now().Sub(w.origin).Microseconds() }

func (w *world) at(t int64, do func()) {
	w.seq++
	heap.Push(&w.queue, event{t: t, seq: w.seq, do: do})
}

func (w *world) win() int64 { return w.now() / w.o.Period.Microseconds() }

// send sends e's report a latency away: the service opens a stream for it if it has none (the
// Envoy's first report on a new stream), answers it, and the answer comes back a latency later.
// A report that reaches no service is lost with its counts, as Envoy loses it.
func (w *world) send(e *envoy, us []envoyfilter.Usage) {
	e.reports++
	w.res.Reports++
	d := w.o.Latency.Microseconds()
	w.at(w.now()+d, func() {
		if w.svc == nil {
			return
		}
		if e.c == nil {
			e.streams++
			w.res.Streams++
			e.c = w.svc.Open(e.name)
			w.names[e.c.ID] = e.name
			if e.streams > 1 {
				w.names[e.c.ID] = e.name + "." + strconv.Itoa(e.streams) // a new stream is a new client of the ledger
			}
			c := e.c
			var tick func()
			tick = func() {
				if e.c != c {
					return // the stream broke
				}
				w.respond(e, c, c.Tick(w.ctx))
				w.at(w.now()+max(1, w.o.ReportInterval.Microseconds()/2), tick)
			}
			w.at(w.now()+max(1, w.o.ReportInterval.Microseconds()/2), tick)
		}
		r := &rlqspb.RateLimitQuotaUsageReports{Domain: "sim"}
		for _, u := range us {
			r.BucketQuotaUsages = append(r.BucketQuotaUsages, &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
				BucketId: &rlqspb.BucketId{Bucket: u.ID}, TimeElapsed: durationpb.New(u.Elapsed),
				NumRequestsAllowed: u.Allowed, NumRequestsDenied: u.Denied})
		}
		actions, err := e.c.Report(w.ctx, r)
		if err != nil {
			panic(fmt.Sprintf("envoys: the service refused a report: %v", err)) // the simulator's reports are valid
		}
		w.respond(e, e.c, actions)
	})
}

// respond sends the actions to e a latency away, if there are any; they are lost if the stream
// broke on the way.
func (w *world) respond(e *envoy, c *rlqs.Client, actions []*rlqspb.RateLimitQuotaResponse_BucketAction) {
	if len(actions) == 0 {
		return
	}
	w.at(w.now()+w.o.Latency.Microseconds(), func() {
		if e.c != c {
			return
		}
		e.responses++
		w.res.Responses++
		now := w.clock.Now()
		for _, a := range actions {
			ap := e.f.Apply(action(a), now)
			if ap.Built {
				if tb := a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket(); tb != nil {
					w.tokens[w.win()] += int64(tb.GetMaxTokens())
					w.built[w.win()]++
				}
			}
		}
	})
}

func action(a *rlqspb.RateLimitQuotaResponse_BucketAction) envoyfilter.Action {
	qa := a.GetQuotaAssignmentAction()
	return envoyfilter.NewAction(a.GetBucketId().GetBucket(), a.GetAbandonAction() != nil, qa != nil, qa.GetRateLimitStrategy(), qa.GetAssignmentTimeToLive())
}

// decide decides one request of e on RLQS (the filter, locally) and on RLS (the store, a
// latency away).
func (w *world) decide(e *envoy, t int64) error {
	now := w.clock.Now()
	win := w.win()
	d := e.f.Decide(Bucket, now)
	e.offered++
	w.offered[win]++
	if d.Allowed {
		e.admitted++
		w.admitted[win]++
		if d.State == envoyfilter.Active {
			w.assigned[win]++
		} else {
			e.fallback++
			w.fallback[win]++
		}
	}
	if d.First != nil {
		w.send(e, d.First)
	}
	// RLS: the request reaches sluice a latency later; while the service is down, Envoy's
	// rate limit filter admits it (failure_mode_deny: false).
	w.res.RLSCalls++
	at := t + w.o.Latency.Microseconds()
	if w.down(at) {
		w.res.RLSDown++
		e.rlsAdmitted++
		w.rlsOpen[at/w.o.Period.Microseconds()]++
		return nil
	}
	row, err := w.rls.Decide(sim.Request{TMicros: at, Key: RuleName, Cost: 1})
	if err != nil {
		return err
	}
	if row.Allowed {
		e.rlsAdmitted++
		w.rlsAdmitted[at/w.o.Period.Microseconds()]++
	}
	return nil
}

// down says whether the service is down at t.
func (w *world) down(t int64) bool {
	k, r := w.o.KillAt.Microseconds(), w.o.RestartAt.Microseconds()
	return k > 0 && t >= k && (r == 0 || t < r)
}

func (w *world) run() (*Result, error) {
	o := w.o
	end := o.Duration.Microseconds()
	I := o.ReportInterval.Microseconds()
	P := o.Period.Microseconds()
	n := (end + P - 1) / P
	for _, s := range []*[]int64{&w.assigned, &w.fallback, &w.admitted, &w.offered, &w.tokens, &w.built, &w.rlsAdmitted, &w.rlsOpen} {
		*s = make([]int64, n+1) // (an RLS request may land in the window after the last)
	}
	w.start()
	if o.KillAt > 0 {
		w.at(o.KillAt.Microseconds(), w.kill)
	}
	if o.RestartAt > 0 {
		w.at(o.RestartAt.Microseconds(), func() {
			w.start()
			// RLS's memory store is the same process's: it starts empty too.
			var err error
			if w.rls, err = sim.NewSession(o.Policy(), 1); err != nil {
				panic(err) // the policy was checked
			}
		})
	}
	for _, e := range w.envs {
		// The Envoys' report timers start a fraction of an interval apart, as Envoys started
		// apart do.
		for t := int64(e.i) * I / int64(len(w.envs)); t < end; t += I {
			w.at(t, func() {
				if us := e.f.Report(w.clock.Now()); us != nil {
					w.send(e, us)
				}
			})
		}
	}
	// Each window's start: the token buckets the Envoys hold then.
	for k := int64(0); k < n; k++ {
		w.at(k*P, func() {
			for _, e := range w.envs {
				if st, ok := e.f.Stats(Bucket, w.clock.Now()); ok && st.State == envoyfilter.Active {
					w.tokens[k] += int64(st.Assignment.GetTokenBucket().GetMaxTokens())
				}
			}
		})
	}
	var err error
	for _, rq := range o.Requests {
		if rq.TMicros >= end {
			break
		}
		e, t := w.by[rq.Key], rq.TMicros
		w.at(t, func() {
			if err == nil {
				err = w.decide(e, t)
			}
		})
	}
	for t := int64(0); t < end; t += I {
		w.advance(min(t+I, end) - 1)
		w.emit(t)
	}
	if err != nil {
		return nil, err
	}
	w.windows(n)
	return w.res, nil
}

// advance runs the events up to and including virtual time t.
func (w *world) advance(t int64) {
	for len(w.queue) > 0 && w.queue[0].t <= t {
		e := heap.Pop(&w.queue).(event)
		w.clock.Set(w.origin.Add(time.Duration(e.t) * time.Microsecond))
		e.do()
	}
	w.clock.Set(w.origin.Add(time.Duration(t) * time.Microsecond))
}

// emit adds the rows of the interval that began at t and resets the counts.
func (w *world) emit(t int64) {
	now := w.clock.Now()
	for _, e := range w.envs {
		r := Row{StartMicros: t, Envoy: e.name, Offered: e.offered, Admitted: e.admitted, Fallback: e.fallback, RLSAdmitted: e.rlsAdmitted,
			Reports: e.reports, Responses: e.responses}
		if st, ok := e.f.Stats(Bucket, now); ok {
			r.State = string(st.State)
			if s := st.Assignment; s != nil && (st.State == envoyfilter.Active || w.o.Expired == Reuse) {
				perFill, _, maxTokens := rlqs.Tokens(s)
				r.Assigned, r.MaxTokens = perFill, maxTokens
				if s.GetTokenBucket() == nil {
					r.Assigned = -2
					if envoyfilter.IsDenyAll(s) {
						r.Assigned = -1
					}
				}
			}
		}
		w.res.Rows = append(w.res.Rows, r)
		w.res.Offered += e.offered
		w.res.Admitted += e.admitted
		w.res.Fallback += e.fallback
		w.res.RLSAdmitted += e.rlsAdmitted
		e.offered, e.admitted, e.fallback, e.rlsAdmitted, e.reports, e.responses = 0, 0, 0, 0, 0, 0
	}
}

// windows adds each window's counts and bounds.
func (w *world) windows(n int64) {
	P := w.o.Period.Microseconds()
	w.res.RLQSCalls = w.res.Reports + w.res.Responses
	for k := range n {
		x := Window{StartMicros: k * P, Offered: w.offered[k], Admitted: w.admitted[k], Assigned: w.assigned[k], Fallback: w.fallback[k],
			Tokens: w.tokens[k], Built: w.built[k], RLSAdmitted: w.rlsAdmitted[k], RLSOpen: w.rlsOpen[k]}
		x.Bound = w.o.Limit + x.Tokens
		x.Held = x.Assigned <= x.Bound
		x.RLSBound = w.o.Burst + w.o.Limit
		x.RLSAdmitted += x.RLSOpen
		x.RLSHeld = x.RLSAdmitted-x.RLSOpen <= x.RLSBound
		w.res.Held = w.res.Held && x.Held
		w.res.RLSHeld = w.res.RLSHeld && x.RLSHeld
		w.res.Windows = append(w.res.Windows, x)
	}
}

// Package regions simulates a global policy across regions (issue 34; docs/design.md, "Limits
// across regions: the ledger") on a virtual clock, with the code sluice serve runs: each region
// has its own memory store and decides every request through decision.Decider, which enforces the
// region's allotment from its region.Refresher; the refreshers report to a ledger.Memory (the Go
// ledger, ledger.lua's steps) over a link with a latency, which a partition cuts and a flush
// empties. The simulator only schedules: a refresh's three phases (region.Refresher.Send,
// Exchange.Call, Refresher.Receive) at the times the latency gives them, the refresher's own
// timers (a shrink's confirmation) on the virtual clock, and the requests at their times.
//
// `sluice simulate --regions` runs it (docs/simulate.md), and so does the browser's regions page
// (web/wasm/regions, web/assets/regions.html); both read their options with Text and ParseQuery.
package regions

import (
	"cmp"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/decision"
	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/sim"
	"github.com/sluicehq/sluice/store/memory"
)

// PolicyName is the simulated global policy's name.
const PolicyName = "global"

// MaxIntervals bounds the refresh intervals and the windows of one simulation.
const MaxIntervals = 100_000

// Partition cuts Region's link to the ledger from From to To (virtual time since the start).
type Partition struct {
	Region   string
	From, To time.Duration
}

// Options is one simulation of regions.
type Options struct {
	// Policy is the global policy: its Limit is the worldwide limit L per Period. fixed-window,
	// sliding-window or token-bucket (the algorithms docs/design.md bounds).
	Policy sluice.Policy
	// Regions are the regions' names (N of them, as the ledger expects), in the order shown.
	Regions []string
	// Requests are the regions' requests in time order, each Key naming its region (the
	// client names of a traffic pattern: "eu: 70/s for 1m; us: ...").
	Requests []sim.Request
	// Refresh is each region's refresh interval (default 5s); Lease a grant's lease (default
	// 3·Refresh; at least 2·Refresh); Hold the ledger's hold (0: per algorithm).
	Refresh, Lease, Hold time.Duration
	// Floor and SafeShare are fractions of the limit (config's region floor and safe_share):
	// Floor 0 … 1/N; SafeShare 0 … 1 (0: the floor).
	Floor, SafeShare float64
	// Algorithm is the ledger's split: "fair" (default) or "proportional".
	Algorithm string
	// LatencyMin and LatencyMax bound the one-way latency to the ledger: each message draws its
	// own, uniformly, from the random sequence numbered Draw (the same number, the same run; as
	// sim.Session.Draw for a balancer's choices).
	LatencyMin, LatencyMax time.Duration
	Draw                   uint64
	// Partitions cut regions off the ledger; Flushes empty the ledger's state at those times.
	Partitions []Partition
	Flushes    []time.Duration
	// Duration is how long it runs (default: to the end of the window of the last request).
	Duration time.Duration
}

// Row is one region over one refresh interval of the timeline.
type Row struct {
	StartMicros int64
	Region      string
	// Want is the demand the region last reported (per period); Allotment what it enforces at
	// the end of the interval.
	Want, Allotment   int64
	Offered, Admitted int64
	Refused           int64
	// Safe: on the safe share at some time in the interval (its lease ran out); Learning: its
	// grant came from a ledger in learning mode (its state new: at the start, after a flush); Floor:
	// no grant yet; Cut: its link was cut.
	Safe, Learning, Floor, Cut bool
}

// Window is one window of the policy's period, worldwide.
type Window struct {
	StartMicros int64
	Admitted    int64   // in all regions
	PerRegion   []int64 // by Options.Regions
	// Bound is docs/design.md's worst case for the window: L (a bucket: its capacity + L) while
	// the ledger is reachable, flushed or not, plus k·max(0, S − F) for the k regions cut off in it
	// or the window before.
	Bound int64
	Cut   int // k
	Held  bool
}

// Result is a simulation's outcome.
type Result struct {
	Options Options
	Limit   int64
	Floor   int64 // F, in units
	Safe    int64 // S, in units
	Lease   time.Duration
	Hold    time.Duration
	// RefreshMicros is the timeline's row width.
	RefreshMicros int64
	Rows          []Row // by interval, then region
	Windows       []Window
	Held          bool // every window within its bound
	// Grants is how many refreshes reached their region; Failed how many did not.
	Grants, Failed int
}

// Run runs the simulation.
func Run(o Options) (*Result, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	s, err := newSim(o)
	if err != nil {
		return nil, err
	}
	return s.run()
}

func (o *Options) check() error {
	switch o.Policy.Algorithm {
	case algorithm.FixedWindow, algorithm.SlidingWindow, algorithm.TokenBucket:
	default:
		return optionErr("algorithm", "algorithm %s: a global policy is simulated with fixed-window, sliding-window or token-bucket", o.Policy.Algorithm)
	}
	if err := o.Policy.Validate(); err != nil {
		return optionErr(policyField(err), "%v", err)
	}
	if len(o.Regions) == 0 || len(o.Regions) > ledger.MaxRegions {
		return optionErr("regions", "%d regions; 1 to %d", len(o.Regions), ledger.MaxRegions)
	}
	seen := map[string]bool{}
	for _, r := range o.Regions {
		if err := ledger.CheckName("region", r); err != nil {
			return optionErr("regions", "%v", err)
		}
		if seen[r] {
			return optionErr("regions", "region %q is named twice", r)
		}
		seen[r] = true
	}
	for _, rq := range o.Requests {
		if !seen[rq.Key] {
			return optionErr("traffic", "the traffic names %q, which is not one of the regions %v: begin each region's pattern with its name (\"%s: 10/s for 1m\")", rq.Key, o.Regions, o.Regions[0])
		}
	}
	if o.Refresh == 0 {
		o.Refresh = 5 * time.Second
	}
	if o.Lease == 0 {
		o.Lease = 3 * o.Refresh
	}
	if o.Algorithm == "" {
		o.Algorithm = "fair"
	}
	switch {
	case o.Refresh < time.Millisecond:
		return optionErr("refresh", "refresh %v; at least 1ms", o.Refresh)
	case o.Lease < 2*o.Refresh:
		return optionErr("lease", "lease %v; at least twice the refresh interval (%v)", o.Lease, 2*o.Refresh)
	case o.Floor < 0 || o.Floor > 1/float64(len(o.Regions)):
		return optionErr("floor", "floor %g; 0 to 1/regions = %g", o.Floor, 1/float64(len(o.Regions)))
	case o.SafeShare < 0 || o.SafeShare > 1:
		return optionErr("safe-share", "safe share %g; 0 to 1", o.SafeShare)
	case o.Algorithm != "fair" && o.Algorithm != "proportional":
		return optionErr("ledger-algorithm", "ledger algorithm %q; fair or proportional", o.Algorithm)
	case o.LatencyMin < 0 || o.LatencyMax < o.LatencyMin:
		return optionErr("ledger-latency", "latency %v-%v; 0 ≤ min ≤ max", o.LatencyMin, o.LatencyMax)
	case o.LatencyMax > o.Refresh/4:
		return optionErr("ledger-latency", "latency up to %v; at most a quarter of the refresh interval (%v)", o.LatencyMax, o.Refresh/4)
	case o.Duration < 0:
		return optionErr("traffic", "duration %v; not negative", o.Duration)
	}
	for _, p := range o.Partitions {
		if !seen[p.Region] {
			return optionErr("partition", "partition of %q, which is not one of the regions %v", p.Region, o.Regions)
		}
		if p.From < 0 || p.To <= p.From {
			return optionErr("partition", "partition of %s from %v to %v: from ≥ 0 and to after from", p.Region, p.From, p.To)
		}
	}
	for _, f := range o.Flushes {
		if f < 0 {
			return optionErr("flush-ledger", "flush at %v; not negative", f)
		}
	}
	if o.Duration == 0 {
		end := int64(0)
		if n := len(o.Requests); n > 0 {
			end = o.Requests[n-1].TMicros + 1
		}
		for _, p := range o.Partitions {
			end = max(end, p.To.Microseconds())
		}
		for _, f := range o.Flushes {
			end = max(end, f.Microseconds()+1)
		}
		P := o.Policy.Period.Microseconds()
		o.Duration = time.Duration((end+P-1)/P*P) * time.Microsecond
	}
	if o.Duration.Microseconds() > sim.MaxTimeMicros {
		return optionErr("traffic", "duration %v; at most 2^53 µs", o.Duration)
	}
	// The timeline's rows and the windows are kept in memory: bounded, as the requests are.
	if n := o.Duration / o.Refresh; n > MaxIntervals {
		return optionErr("refresh", "%d refresh intervals of %v in %v; at most %d (a longer refresh, or shorter traffic)", n, o.Refresh, o.Duration, MaxIntervals)
	}
	if n := o.Duration / o.Policy.Period; n > MaxIntervals {
		return optionErr("period", "%d windows of %v in %v; at most %d (a longer period, or shorter traffic)", n, o.Policy.Period, o.Duration, MaxIntervals)
	}
	return nil
}

// policyField names the field of a policy's error: the first of its limit, period and burst
// the message names (algorithm.Policy.Validate's messages start with it).
func policyField(err error) string {
	msg, field, at := err.Error(), "limit", -1
	for _, f := range []string{"algorithm", "limit", "period", "burst"} {
		if i := strings.Index(msg, ": "+f); i >= 0 && (at < 0 || i < at) {
			field, at = f, i
		}
	}
	return field
}

// event is one thing that happens at a virtual time: seq orders those at the same time.
type event struct {
	t, seq  int64
	do      func()
	request bool // a request's decision, which changes no flag of the timeline
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
	rng    *rand.Rand
	ledger *ledger.Memory
	regs   []*aRegion
	byName map[string]*aRegion
	res    *Result
	row    int // the current interval's first row
}

type aRegion struct {
	i       int
	name    string
	ref     *region.Refresher
	decider *decision.Decider
	limit   decision.Limit
	// The current interval's counts and flags.
	offered, admitted, refused int64
	safe, cut                  bool
	window                     []int64 // admitted per window
}

// regionClock is a region's refresher's clock: the virtual one, its timers events.
type regionClock struct {
	s *world
	r *aRegion
}

func (c regionClock) Now() time.Time { return c.s.clock.Now() }
func (c regionClock) AfterFunc(d time.Duration, f func()) {
	c.s.at(c.s.now()+d.Microseconds(), func() {
		f()
		if c.r.ref.Woken() {
			c.s.refresh(c.r)
		}
	})
}

var errCut = errors.New("the link to the ledger is cut (a partition)")

func newSim(o Options) (*world, error) {
	origin := time.Unix(0, 0).UTC()
	s := &world{o: o, clock: sluice.NewManualClock(origin), origin: origin, rng: rand.New(rand.NewPCG(o.Draw, o.Draw^0x5eed)),
		byName: map[string]*aRegion{}}
	p := o.Policy
	p.Name = PolicyName
	cfgRegion := config.Region{Regions: len(o.Regions), Refresh: o.Refresh, Lease: o.Lease, Hold: o.Hold, Floor: o.Floor,
		SafeShare: o.SafeShare, Algorithm: o.Algorithm}
	var opts ledger.Options
	ledgers := func(policy string, lo ledger.Options) (region.Ledger, error) {
		if s.ledger == nil {
			l, err := ledger.NewMemory(policy, lo, ledger.MemoryOptions{Now: s.clock.Now})
			if err != nil {
				return nil, err
			}
			s.ledger, opts = l, l.Options()
		}
		return s.ledger, nil
	}
	for i, name := range o.Regions {
		rc := cfgRegion
		rc.Name = name
		cfg := &config.Config{Region: &rc, Policies: []*config.Policy{{Policy: p, Global: true}}}
		r := &aRegion{i: i, name: name}
		ref, err := region.NewOn(ledgers, cfg, regionClock{s, r}, nil)
		if err != nil {
			return nil, fmt.Errorf("regions: %w", err)
		}
		store := memory.New(memory.WithClock(s.clock), memory.WithMaxKeys(16*memory.DefaultShards))
		r.ref = ref
		r.decider = &decision.Decider{Store: store, Global: ref}
		r.limit = decision.Limit{Policy: p, PolicyName: PolicyName, Key: name, Global: true}
		s.regs = append(s.regs, r)
		s.byName[name] = r
	}
	s.res = &Result{Options: o, Limit: p.Limit, Floor: opts.Floor, Safe: opts.Safe, Lease: opts.Lease, Hold: opts.Hold,
		RefreshMicros: o.Refresh.Microseconds(), Held: true}
	return s, nil
}

func (s *world) now() int64 { return s.clock.Now().Sub(s.origin).Microseconds() }

// at schedules do at virtual time t (µs since the start).
func (s *world) at(t int64, do func()) { s.push(event{t: t, do: do}) }

// request schedules a request's decision at virtual time t.
func (s *world) request(t int64, do func()) { s.push(event{t: t, do: do, request: true}) }

func (s *world) push(e event) {
	s.seq++
	e.seq = s.seq
	heap.Push(&s.queue, e)
}

func (s *world) latency() int64 {
	lo, hi := s.o.LatencyMin.Microseconds(), s.o.LatencyMax.Microseconds()
	if hi <= lo {
		return lo
	}
	return lo + s.rng.Int64N(hi-lo+1)
}

func (s *world) cut(r *aRegion, t int64) bool {
	for _, p := range s.o.Partitions {
		if p.Region == r.name && p.From.Microseconds() <= t && t < p.To.Microseconds() {
			return true
		}
	}
	return false
}

// refresh runs one refresh of r's policy in its three phases: the report sent now, applied by
// the ledger a latency later (unless the link is cut then), the grant back a latency after that
// (lost if the link is cut then).
func (s *world) refresh(r *aRegion) {
	x := r.ref.Send(PolicyName)
	applied := s.now() + s.latency()
	s.at(applied, func() {
		if s.cut(r, s.now()) {
			x.Fail = errCut
		}
		x.Call(context.Background())
		s.at(s.now()+s.latency(), func() {
			if s.cut(r, s.now()) {
				x.Lose(errCut)
			}
			r.ref.Receive(x)
			if _, err := x.Grant(); err != nil {
				s.res.Failed++
			} else {
				s.res.Grants++
			}
		})
	})
}

func (s *world) run() (*Result, error) {
	o := s.o
	end := o.Duration.Microseconds()
	I := o.Refresh.Microseconds()
	P := o.Policy.Period.Microseconds()
	nWindows := (end + P - 1) / P
	for _, r := range s.regs {
		r.window = make([]int64, nWindows)
		// The regions' loops start a fraction of an interval apart, as gateways started apart do.
		for t := int64(r.i) * I / int64(len(s.regs)); t < end; t += I {
			s.at(t, func() { s.refresh(r) })
		}
	}
	for _, f := range o.Flushes {
		s.at(f.Microseconds(), s.ledger.Flush)
	}
	var err error
	for _, rq := range o.Requests {
		if rq.TMicros >= end {
			break
		}
		r := s.byName[rq.Key]
		cost := rq.Cost
		s.request(rq.TMicros, func() {
			if err == nil {
				err = s.decide(r, cost)
			}
		})
	}
	for t := int64(0); t < end; t += I {
		s.advance(t)
		s.sample() // the flags at the interval's start
		s.advance(min(t+I, end) - 1)
		s.sample()
		s.emit(t)
	}
	if err != nil {
		return nil, err
	}
	s.windows(nWindows)
	return s.res, nil
}

// advance runs the events up to and including virtual time t.
func (s *world) advance(t int64) {
	for len(s.queue) > 0 && s.queue[0].t <= t {
		e := heap.Pop(&s.queue).(event)
		s.clock.Set(s.origin.Add(time.Duration(e.t) * time.Microsecond))
		if !e.request {
			s.sample() // a lease may have run out since the last event
		}
		e.do()
		if !e.request {
			s.sample()
		}
	}
	s.clock.Set(s.origin.Add(time.Duration(t) * time.Microsecond))
}

// sample marks each region's flags of the current interval at the clock's now: at the interval's
// start and end and around every event but requests (a region is on the safe share from its
// lease's end until a grant is received, which an event does).
func (s *world) sample() {
	for _, r := range s.regs {
		st := r.ref.Stats()[0]
		r.safe = r.safe || st.Safe
		r.cut = r.cut || s.cut(r, s.now())
	}
}

func (s *world) decide(r *aRegion, cost int64) error {
	req := decision.Request{Who: identity.Identity{Key: r.name}, Limits: []decision.Limit{r.limit}, Cost: cost}
	v := r.decider.Decide(context.Background(), &req)
	defer v.Release()
	r.offered++
	switch v.Outcome {
	case decision.Allowed, decision.Held:
		r.admitted++
		r.window[s.now()/s.o.Policy.Period.Microseconds()]++
	case decision.Refused:
		r.refused++
	default:
		return fmt.Errorf("regions: region %s at %s: %v", r.name, sim.FormatMillis(s.now()), v.Err)
	}
	return nil
}

// emit adds the rows of the interval that began at t and resets the counts.
func (s *world) emit(t int64) {
	for _, r := range s.regs {
		st := r.ref.Stats()[0]
		s.res.Rows = append(s.res.Rows, Row{StartMicros: t, Region: r.name, Want: st.Want, Allotment: st.Allotment,
			Offered: r.offered, Admitted: r.admitted, Refused: r.refused, Safe: r.safe, Learning: st.Learning, Floor: st.Floor, Cut: r.cut})
		r.offered, r.admitted, r.refused, r.safe, r.cut = 0, 0, 0, false, false
	}
}

// windows adds each window's worldwide count and bound.
func (s *world) windows(n int64) {
	P := s.o.Policy.Period.Microseconds()
	base := s.res.Limit
	if s.o.Policy.Algorithm == algorithm.TokenBucket {
		base += s.o.Policy.Capacity() // at most C + L·τ/P in τ = P
	}
	extra := max(0, s.res.Safe-s.res.Floor)
	for w := range n {
		start := w * P
		win := Window{StartMicros: start, PerRegion: make([]int64, len(s.regs))}
		for i, r := range s.regs {
			win.PerRegion[i] = r.window[w]
			win.Admitted += r.window[w]
			for _, p := range s.o.Partitions {
				if p.Region == r.name && p.From.Microseconds() < start+P && p.To.Microseconds() > start-P {
					win.Cut++
					break
				}
			}
		}
		win.Bound = base + int64(win.Cut)*extra
		win.Held = win.Admitted <= win.Bound
		s.res.Held = s.res.Held && win.Held
		s.res.Windows = append(s.res.Windows, win)
	}
}

package scenario

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/sim"
)

// MaxBuckets bounds the time buckets of a run: the plots' resolution, about two pixels a bucket
// on a laptop's chart (finer, and steady traffic turns into stripes of 1 and 0).
const MaxBuckets = 240

// bucketWidths are the widths Run chooses from, narrowest first, in µs: 1, 2, 5 ms up to 500 ms,
// then those of sim.TimelineWidths (1s up to 7 days), then whole numbers of days.
var bucketWidths = func() []int64 {
	var ws []int64
	for ms := int64(1); ms < 1000; ms *= 10 {
		ws = append(ws, ms*1000, 2*ms*1000, 5*ms*1000)
	}
	return append(ws, sim.TimelineWidths...)
}()

// Result is a scenario's run: every algorithm on the same requests, cut into Buckets buckets of
// WidthMicros from 0, the virtual clock's start.
type Result struct {
	Scenario    Scenario
	Requests    []sim.Request // the requests decided, in time order (jitter applied)
	WidthMicros int64         // the width of a bucket: bucket i is [i·WidthMicros, (i+1)·WidthMicros)
	Buckets     int           // ≥ 1; the timeline ends at Buckets·WidthMicros
	Runs        []Run         // one per algorithm that runs (Scenario.Policies), in the order of algorithm.Algorithms
	Actual      []int64       // each request's real cost (Scenario.Actuals); nil without
	Windows     []Window      // with a calendar: its windows up to the timeline's end (at most MaxWindows, else none)
	// Clients are the clients the traffic names ("buggy: ...; normal: ..."), in the order of each
	// one's first request, as `sluice simulate` lists its per_client; nil when it names none.
	Clients []string
}

// EndMicros is where the timeline ends: after the last request, by the time the slowest policy
// takes to forget it (capped, so that the traffic keeps most of the plot).
func (r *Result) EndMicros() int64 { return int64(r.Buckets) * r.WidthMicros }

// Run is one algorithm's share of a Result. The per-bucket slices have Result.Buckets entries;
// the sampled ones (Level, DrainMicros) Result.Buckets+1, one at each bucket boundary, taken
// after the requests at that very instant.
type Run struct {
	Policy   sluice.Policy
	Capacity int64 // Policy.Capacity: the most that Level can be

	Offered, Allowed, Refused, Delayed []int64 // requests per bucket; Offered = Allowed + Refused
	MaxDelayMicros                     []int64 // the longest delay of a request admitted in the bucket

	// Level is the limiter's state at each boundary, in requests of cost 1, read with a peek
	// (sim.Session.Peek): the windows' count (Limit - Remaining), the token bucket's tokens
	// (Remaining), the leaky bucket's queue (Capacity - Remaining: those waiting or draining).
	// With several clients it is the first client's state (Result.Clients[0]). NoLevel where
	// the shared store is down (Scenario.Outage): there is no state to read.
	Level []int64
	// DrainMicros is the peek's ResetAfter at each boundary: for the leaky bucket, how long a
	// request arriving then would be held (its queue delay); NoLevel where the store is down.
	DrainMicros []int64
	// Ceiling is the most Level can be at each boundary: Capacity, until a change of the
	// scenario's (Scenario.Changes) gives the policy other numbers.
	Ceiling []int64

	// Cumulative[i] totals the requests before the end of bucket i; the last one is Summary.
	Cumulative []sim.Summary
	Summary    sim.Summary
	// InstanceAllowed[i][j], with a fleet (Scenario.Instances): the requests instance j+1 let
	// through before the end of bucket i; nil with one instance. With separate stores, Level
	// and DrainMicros are instance 1's state.
	InstanceAllowed [][]int64
	// ClientCounts[i][j], when the traffic names clients (Result.Clients): what client j got
	// before the end of bucket i; nil otherwise.
	ClientCounts [][]ClientCount
}

// NoLevel is Run.Level and Run.DrainMicros at a boundary where the shared store is down.
const NoLevel = -1

// Run runs the scenario: its requests through a sim.Session per algorithm, peeking at every
// bucket boundary. A scenario from Parse can still fail here on its traffic (the pattern, too
// many requests); the errors name the field.
func (sc *Scenario) Run() (*Result, Errors) {
	reqs, errs := sc.Requests()
	if errs != nil {
		return nil, errs
	}
	policies := sc.Policies()
	res := &Result{Scenario: *sc, Requests: reqs, Actual: sc.Actuals(len(reqs))}
	res.WidthMicros, res.Buckets = timeline(reqs[len(reqs)-1].TMicros, policies, sc.Options())
	res.Windows = windows(sc, policies[0], res.EndMicros())
	clients := clientsOf(reqs)
	if len(clients) > 1 || clients[0] != sim.DefaultKey {
		res.Clients = clients
	}
	for _, p := range policies {
		run, err := runOne(sc.Options(), p, reqs, res.Actual, res.WidthMicros, res.Buckets, clients, res.Clients != nil)
		switch {
		case err != nil && sc.Actual.Set && errors.Is(err, sluice.ErrCostExceedsLimit):
			// A real cost so large that charging it would put the key beyond any clock.
			return nil, Errors{{KeyActual, fmt.Sprintf("is too large for %v: %v", p.Algorithm, err)}}
		case err != nil:
			// Parse validated the policy and Requests the times: only a broken invariant lands here.
			return nil, Errors{{"", err.Error()}}
		}
		res.Runs = append(res.Runs, run)
	}
	return res, nil
}

// timeline chooses the bucket width and count for requests up to last (µs): the timeline runs on
// after the last request by the time the slowest policy takes to be back to full quota from the
// worst state (a window's period, a bucket's refill or drain time; for a calendar, up to the end
// of the window after the last request's), but at most by max(last, 10s), in at most MaxBuckets
// buckets.
func timeline(last int64, policies []sluice.Policy, o sim.Options) (width int64, buckets int) {
	var tail int64
	for _, p := range policies {
		reset := p.PeriodMicros()
		if _, end, ok := o.Window(&p, last); ok {
			_, next, _ := o.Window(&p, end)
			reset = next - last
		}
		if sim.TakesBurst(p.Algorithm) {
			reset = ceilDiv(p.Capacity(), p.PeriodMicros(), p.Limit)
		}
		tail = max(tail, reset)
	}
	tail = min(tail, max(last, 10*int64(time.Second/time.Microsecond)))
	end := last + tail // > last: every period is at least 1ms
	for _, w := range bucketWidths {
		if n := (end + w - 1) / w; n <= MaxBuckets {
			return w, int(n)
		}
	}
	const day = 24 * 3600 * 1_000_000
	w := ((end+day-1)/day + MaxBuckets - 1) / MaxBuckets * day
	return w, int((end + w - 1) / w)
}

// ceilDiv returns ceil(a·b/c) for a·b/c well inside int64 (Validate bounds a refill time).
func ceilDiv(a, b, c int64) int64 {
	q := a / c * b
	r := a % c * b // < c·b
	return q + (r+c-1)/c
}

// runOne runs reqs under p and o, each settled at its real cost in actual (if not nil), counting
// per bucket and peeking at each boundary at the first of clients (clientsOf(reqs)): the state
// it plots is the one settlements leave. perClient counts what each client gets.
func runOne(o sim.Options, p sluice.Policy, reqs []sim.Request, actual []int64, width int64, buckets int, clients []string, perClient bool) (Run, error) {
	s, err := o.NewSession(p, len(clients)) // room for every client: none is evicted
	if err != nil {
		return Run{}, err
	}
	p = s.Policy()
	run := Run{
		Policy: p, Capacity: p.Capacity(),
		Offered: make([]int64, buckets), Allowed: make([]int64, buckets), Refused: make([]int64, buckets),
		Delayed: make([]int64, buckets), MaxDelayMicros: make([]int64, buckets),
		Level: make([]int64, buckets+1), DrainMicros: make([]int64, buckets+1), Ceiling: make([]int64, buckets+1),
		Cumulative: make([]sim.Summary, buckets),
	}
	var sum sim.Summary
	var perInstance []int64 // with a fleet: each instance's approvals so far
	if o.Fleet != nil {
		perInstance = make([]int64, o.Fleet.Instances)
		run.InstanceAllowed = make([][]int64, buckets)
	}
	var byClient []ClientCount // when the traffic names clients: each one's counts so far
	index := map[string]int{}
	if perClient {
		byClient = make([]ClientCount, len(clients))
		for j, key := range clients {
			index[key] = j
			if perInstance != nil {
				byClient[j].Instances = make([]int64, len(perInstance))
			}
		}
		run.ClientCounts = make([][]ClientCount, buckets)
	}
	closeBucket := func(i int) {
		run.Cumulative[i] = sum
		if perInstance != nil {
			run.InstanceAllowed[i] = append([]int64(nil), perInstance...)
		}
		if byClient != nil {
			snap := make([]ClientCount, len(byClient))
			for j, c := range byClient {
				snap[j] = c
				if c.Instances != nil {
					snap[j].Instances = append([]int64(nil), c.Instances...)
				}
			}
			run.ClientCounts[i] = snap
		}
	}
	closed := 0   // buckets whose Cumulative is set: those that end at or before the request at hand
	boundary := 0 // the next boundary to peek at
	// peekBefore peeks at every boundary before t (µs), after the requests at that very boundary.
	peekBefore := func(t int64) error {
		for ; boundary <= buckets && int64(boundary)*width < t; boundary++ {
			d, err := s.Peek(int64(boundary)*width, clients[0])
			p := s.Policy() // as changed by then
			run.Ceiling[boundary] = p.Capacity()
			if o.Fleet != nil && o.Fleet.Outage != nil && (errors.Is(err, sluice.ErrStoreUnavailable) || err == nil && d.Fallback != sluice.NoFallback) {
				// The shared store is down: what the peek reads (nothing, or an instance's
				// fallback) is not the store's state.
				run.Level[boundary], run.DrainMicros[boundary] = NoLevel, NoLevel
				continue
			}
			if err != nil {
				return err
			}
			run.Level[boundary] = level(p, d)
			run.DrainMicros[boundary] = int64(d.ResetAfter / time.Microsecond)
		}
		return nil
	}
	for n, rq := range reqs {
		for ; closed < buckets && int64(closed+1)*width <= rq.TMicros; closed++ {
			closeBucket(closed)
		}
		if err := peekBefore(rq.TMicros); err != nil {
			return Run{}, err
		}
		a := sim.NoActual
		if actual != nil {
			a = actual[n]
		}
		row, err := s.DecideSettled(rq, a)
		if err != nil {
			return Run{}, err
		}
		sum.Add(row)
		if perInstance != nil && row.Allowed {
			perInstance[row.Instance-1]++
		}
		if byClient != nil {
			c := &byClient[index[row.Key]]
			c.Offered++
			if row.Allowed {
				c.Allowed++
				if c.Instances != nil {
					c.Instances[row.Instance-1]++
				}
			} else {
				c.Refused++
			}
		}
		i := rq.TMicros / width
		run.Offered[i]++
		switch {
		case !row.Allowed:
			run.Refused[i]++
		case row.DelayMicros > 0:
			run.Allowed[i]++
			run.Delayed[i]++
			run.MaxDelayMicros[i] = max(run.MaxDelayMicros[i], row.DelayMicros)
		default:
			run.Allowed[i]++
		}
	}
	for ; closed < buckets; closed++ {
		closeBucket(closed)
	}
	if err := peekBefore(int64(buckets)*width + 1); err != nil {
		return Run{}, err
	}
	run.Summary = sum
	return run, nil
}

// level reads the state Run.Level plots from a peek's decision.
func level(p sluice.Policy, d sluice.Decision) int64 {
	switch p.Algorithm {
	case sluice.TokenBucket:
		return d.Remaining
	case sluice.LeakyBucket:
		return p.Capacity() - d.Remaining
	}
	return p.Limit - d.Remaining
}

// Describe says in words what p does, for the page's cards.
func Describe(p sluice.Policy) string {
	if p.Calendar != sluice.NoCalendar {
		return describeCalendar(p)
	}
	per := formatDuration(p.Period)
	switch p.Algorithm {
	case sluice.FixedWindow:
		return fmt.Sprintf("At most %d in each %s window; the windows start at 0, %s, %s, and so on.", p.Limit, per, per, formatDuration(2*p.Period))
	case sluice.SlidingLog:
		return fmt.Sprintf("At most %d in any %s: it keeps the time of every allowed request.", p.Limit, per)
	case sluice.SlidingWindow:
		return fmt.Sprintf("At most %d per %s, counting the previous window's requests in proportion to how much of it is still within the last %s.", p.Limit, per, per)
	case sluice.TokenBucket:
		return fmt.Sprintf("A bucket of %d tokens, refilled %d per %s; a request takes a token or is refused.", p.Capacity(), p.Limit, per)
	case sluice.LeakyBucket:
		if p.Burst == 0 {
			return fmt.Sprintf("A queue drained %d per %s with no room to wait: a request is allowed only once the one before it has drained.", p.Limit, per)
		}
		return fmt.Sprintf("A queue drained %d per %s with room for %d waiting: a request waits its turn, and is refused only when the queue is full.", p.Limit, per, p.Burst)
	}
	return ""
}

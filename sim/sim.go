// Package sim runs sluice's real limiter on a virtual clock, so that people can see what each
// algorithm does to the same traffic before they choose one.
//
// A simulation goes through the same code path as a gateway: a memory store
// (store/memory) on a sluice.ManualClock, and a sluice.Limiter whose AllowN it calls once per
// request, after setting the clock to the request's time. Nothing sleeps: a run of a million
// requests over an hour of virtual time takes well under a second.
//
// Requests come from a traffic pattern (ParseTraffic: "5/s for 10s; 40 in 1s; 5/s for 10s") or
// a CSV trace (ParseTrace). The virtual clock starts at Unix time 0, which is a window boundary
// for every period, or at Options.Start (a calendar policy's windows begin at local midnights). Run decides every request under one policy; Compare runs all five algorithms
// with the same numbers. A Session is the same run taken one request at a time, with peeks at
// the limiter's state in between (the browser simulation plots them).
//
// Requests may also have a real cost known once served (Options.Actual; a trace's actual column,
// ReadTrace): each approved one is settled with it right after its decision, on the
// virtual clock, and its Row says its real cost and the balance after the settlement
// (Session.DecideSettled takes one request so). A request's response may also last a while
// (Options.Durations; a trace's duration_ms column), as a model's streamed answer does: an
// approved one then holds its estimate until the response ends and is settled then, so that
// parallel responses hold their estimates together (a StreamSession). Workloads are
// built-in LLM workloads of this kind.
//
// The policy may change while a simulation runs (Options.Changes, a Change: a new limit or burst
// from an instant on, as a configuration reload gives it).
//
// Run, Simulate and Compare are safe for concurrent use: each run has its own store and clock.
//
// The results have one output schema, shared by `sluice simulate` and the browser simulation:
// see Row.MarshalJSON, Summary.MarshalJSON, CSVHeader and Row.CSVRecord.
package sim

import (
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
)

// Bounds on the input of one simulation, so that a mistyped pattern or a runaway trace cannot
// exhaust memory.
const (
	// MaxRequests is the most requests one pattern or trace may make (32 bytes each as Requests).
	MaxRequests = 1_000_000
	// MaxTimeMicros is the latest virtual time a request may have: 2^53 µs, about 285 years,
	// so that every time is also exact as a double (JSON, JavaScript).
	MaxTimeMicros = 1 << 53
)

// DefaultKey is the key of requests that name none: those of a traffic pattern, and trace lines
// without a key.
const DefaultKey = "k"

// Request is one request offered to the limiter.
type Request struct {
	TMicros int64  // virtual time in µs since the start (Options.Start; Unix time 0); ≥ 0, non-decreasing in a run
	Key     string // the client; DefaultKey when none is given
	Cost    int64  // ≥ 0; 0 peeks without consuming
}

// NeverMicros is Row.RetryAfterMicros for a request whose cost can never fit under the policy.
const NeverMicros = -1

// Row is the limiter's answer to one request.
type Row struct {
	Request
	Allowed          bool
	Remaining        int64 // Decision.Remaining: requests of cost 1 that could still be approved now
	RetryAfterMicros int64 // 0 when allowed; when refused, the exact wait; NeverMicros if the cost can never fit
	DelayMicros      int64 // leaky bucket: how long an allowed request is held before it is served
	Instance         int   // a Fleet's instance that decided it, 1..Instances; 0 without a Fleet
	// Fallback, during a Fleet's Outage: how the instance decided without its store
	// (FallbackOpen, FallbackLocal, FallbackClosed); "" when the store decided.
	Fallback string
	// HasLatency: the Fleet has a StoreLatency, and LatencyMicros is this request's wait for the
	// store: its instance's calls to it × the latency.
	HasLatency    bool
	LatencyMicros int64
	// Settles: the request had a real cost, Actual (Options.Actual), with which it was settled if
	// approved; Balance is then the Remaining its settlement left (a refused one's own
	// Remaining), never below 0: a key in debt shows 0, and how long the debt lasts is the next
	// refusals' RetryAfterMicros.
	//
	// Streams: the request's response lasts from TMicros to EndMicros (Options.Durations; a
	// refused one's EndMicros is its TMicros: it has no response), and an approved one holds its
	// estimate until then, when it is settled; Balance is then the Remaining at its end.
	// InFlight and Reserved are what the key's running responses hold once it is decided (it
	// included, if approved and lasting): how many, and Σ their estimates. WaitMicros: its
	// settlement left the key nothing (Balance 0), and the next request of cost 1 must wait that
	// long, as things stood then — how long an underestimate settled beyond the limit keeps the
	// balance below zero (0 with a Fleet: its instances are not probed).
	Settles, Streams   bool
	held               bool // decided, its settlement still to come (Session.Ended)
	Actual             int64
	Balance            int64
	EndMicros          int64
	InFlight, Reserved int64
	WaitMicros         int64
}

// Delayed reports whether the request was allowed, but only after a delay.
func (r Row) Delayed() bool { return r.Allowed && r.DelayMicros > 0 }

// Never reports whether the request's cost can never fit under the policy.
func (r Row) Never() bool { return !r.Allowed && r.RetryAfterMicros == NeverMicros }

// Summary totals one run. Offered = Allowed + Refused; Delayed counts allowed requests with a
// delay; Never counts the refused requests whose cost can never fit (they are in Refused too).
type Summary struct {
	Offered          int64 // requests decided
	Allowed          int64 // approved (delayed or not)
	Refused          int64 // not approved, Never included
	Delayed          int64 // approved with DelayMicros > 0 (only the leaky bucket delays)
	Never            int64 // refused because the cost can never fit
	OfferedCost      int64 // Σ cost of the requests decided
	AllowedCost      int64 // Σ cost of the approved requests
	MaxDelayMicros   int64 // the longest delay of an approved request
	TotalDelayMicros int64 // Σ delay of the approved requests (mean delay = TotalDelayMicros / Delayed)
	Settled          int64 // approved requests settled with a real cost (Options.Actual)
	SettledCost      int64 // Σ estimate (cost) of the settled requests
	ActualCost       int64 // Σ real cost of the settled requests
	// With durations (Options.Durations, Row.Streams; counted by Run and Simulate, not Add): the
	// most responses one key had running at once and the most its running responses reserved;
	// the settlements that left their key waiting (Row.WaitMicros > 0), and the longest such wait.
	Streams                  bool
	MaxInFlight, MaxReserved int64
	Waits, MaxWaitMicros     int64
	// In a Fleet's Outage: the requests decided without the store, by Row.Fallback.
	Open, Local, Closed int64
	// With a Fleet's StoreLatency (Latency): Σ and the longest of the rows' LatencyMicros.
	Latency                              bool
	TotalLatencyMicros, MaxLatencyMicros int64
}

// Add counts one row into s.
func (s *Summary) Add(r Row) {
	s.Offered++
	s.OfferedCost += r.Cost
	if r.HasLatency {
		s.Latency = true
		s.TotalLatencyMicros += r.LatencyMicros
		s.MaxLatencyMicros = max(s.MaxLatencyMicros, r.LatencyMicros)
	}
	switch r.Fallback {
	case FallbackOpen:
		s.Open++
	case FallbackLocal:
		s.Local++
	case FallbackClosed:
		s.Closed++
	}
	if !r.Allowed {
		s.Refused++
		if r.Never() {
			s.Never++
		}
		return
	}
	s.Allowed++
	s.AllowedCost += r.Cost
	if r.Settles {
		s.Settled++
		s.SettledCost += r.Cost
		s.ActualCost += r.Actual
	}
	if r.DelayMicros > 0 {
		s.Delayed++
		s.TotalDelayMicros += r.DelayMicros
		s.MaxDelayMicros = max(s.MaxDelayMicros, r.DelayMicros)
	}
}

// addStream counts r's response into s, if it has durations (Row.Streams): Run and Simulate do,
// Add does not (the browser simulation, which has no durations, links Add).
func (s *Summary) addStream(r Row) {
	if !r.Streams {
		return
	}
	s.Streams = true
	s.MaxInFlight = max(s.MaxInFlight, r.InFlight)
	s.MaxReserved = max(s.MaxReserved, r.Reserved)
	if r.WaitMicros > 0 {
		s.Waits++
		s.MaxWaitMicros = max(s.MaxWaitMicros, r.WaitMicros)
	}
}

// Result is the outcome of one run: one Row per request, in request order, and their Summary.
type Result struct {
	Policy  sluice.Policy
	Rows    []Row
	Summary Summary
}

// Run decides reqs in order under policy, on a fresh memory store and a virtual clock that it
// sets to each request's time. A request whose cost can never fit is a refused row with
// RetryAfterMicros NeverMicros, not an error. Run returns an error if the policy is invalid
// (naming the field), if reqs are not in time order or have a negative time or cost, or if the
// store fails.
func Run(policy sluice.Policy, reqs []Request) (Result, error) {
	return Options{}.Run(policy, reqs)
}

// Simulate is Run without keeping the rows: it passes each row to emit as it is decided (emit
// may be nil), so that a caller can write a long run out without holding it in memory. An error
// from emit stops the run and is returned as is.
func Simulate(policy sluice.Policy, reqs []Request, emit func(Row) error) (Summary, error) {
	return Options{}.Simulate(policy, reqs, emit)
}

// SimulateFleet is Simulate with the requests dealt to f's instances in turn, each spending local
// budgets of the policy from one shared store (see NewFleetSession).
func SimulateFleet(policy sluice.Policy, f Fleet, reqs []Request, emit func(Row) error) (Summary, error) {
	return Options{Fleet: &f}.Simulate(policy, reqs, emit)
}

// NoActual is an actual cost that is not known: the request keeps its cost.
const NoActual int64 = -1

// simulate decides reqs on s in turn, passing each row to emit (may be nil).
func (s *Session) simulate(reqs []Request, emit func(Row) error, actuals []int64) (Summary, error) {
	var sum Summary
	for i, rq := range reqs {
		actual := NoActual
		if i < len(actuals) {
			actual = actuals[i]
		}
		row, err := s.DecideSettled(rq, actual)
		if err != nil {
			return sum, err
		}
		sum.Add(row)
		if emit != nil {
			if err := emit(row); err != nil {
				return sum, err
			}
		}
	}
	return sum, nil
}

// micros converts a Decision duration to µs; sluice.Never becomes NeverMicros.
func micros(d time.Duration) int64 {
	if d < 0 {
		return NeverMicros
	}
	return int64(d / time.Microsecond)
}

// ComparePolicies returns the policies Compare runs: one per algorithm, in the order of
// algorithm.Algorithms, all with limit and period. Burst goes to the token bucket (its capacity;
// 0 means limit) and the leaky bucket (its queue room; 0 means no queue) only: the window
// algorithms take no burst, so theirs is 0.
func ComparePolicies(limit int64, period time.Duration, burst int64) []sluice.Policy {
	ps := make([]sluice.Policy, 0, len(algorithm.Algorithms))
	for _, a := range algorithm.Algorithms {
		p := sluice.Policy{Algorithm: a, Limit: limit, Period: period}
		if TakesBurst(a) {
			p.Burst = burst
		}
		ps = append(ps, p)
	}
	return ps
}

// TakesBurst reports whether a policy of algorithm a has a burst (only the two buckets do).
func TakesBurst(a sluice.Algorithm) bool {
	return a == sluice.TokenBucket || a == sluice.LeakyBucket
}

// Compare runs reqs under each of ComparePolicies(limit, period, burst), in that order. It
// validates every policy before running any.
func Compare(limit int64, period time.Duration, burst int64, reqs []Request) ([]Result, error) {
	return Options{}.Compare(ComparePolicies(limit, period, burst), reqs)
}

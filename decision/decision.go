// Package decision is sluice's decision layer, the one path every front end takes: identify the
// request's client, find the policies that apply and the request's cost (Policies.Resolve), decide
// them all at once on the store (Decider.Decide: the enforced ones all or nothing, dry-run ones
// alongside), and say what the answer is (a Verdict: allowed, held for a leaky bucket's delay, or
// refused, with its RateLimit fields and, if refused, its problem).
//
// The front ends are thin adapters over it: the proxy's fasthttp engine and its net/http one, the
// net/http middleware around a sluice.Limiter (both through Serve), the decision API
// (POST /v1/check), forward-auth for nginx, Caddy and Traefik, and Envoy's rate limit service
// over gRPC. They differ only in how they read a request and write the answer.
package decision

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/answer"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/identity"
)

// Limit is one policy as it applies to a request: Policy is what to decide with (its Name is
// what the state is kept under, with the key: the policy's own name, or a route's scope),
// PolicyName the configured policy's (or rule's) name for answers and metrics, Key the key it
// counts under ("" the client's, Request.Who.Key), and DryRun that it counts but never refuses.
type Limit = config.AppliedPolicy

// Request is one request to decide.
type Request struct {
	Who    identity.Identity
	Client string // the configured client's name, or "anonymous": bounded metric labels
	Limits []Limit
	Cost   int64
	// NoHold: the front end cannot hold a request (Envoy's rate limit service answers at once),
	// so a leaky-bucket policy that would hold it refuses it instead, consuming nothing.
	NoHold bool
	// Costs, if not nil, is each limit's own cost (in Limits' order), instead of Cost for all:
	// Envoy's descriptors each carry their own hits_addend.
	Costs []int64
	// Charges, if not nil, is each limit's usage (in Limits' order; 0: none), counted whatever
	// the answer: what its decision did not consume of it (all of it when the request is refused,
	// or its cost was 0) is charged afterwards, beyond the limit if need be. Envoy's cost reported
	// once a response has ended is counted so, as envoyproxy/ratelimit counts it.
	Charges []int64
	// After, if not nil, settles the cost once the upstream's response is known (Finish): the
	// route's cost_from, count_only and refund_on.
	After *config.After
	// Usage, if not nil, is a usage route's (usage.go): its costs are tokens or micro-dollars,
	// settled to the usage its response reports.
	Usage *Usage
	// Route is the request's route (nil: none): load shedding reads its priority.
	Route *config.Route
	// Releases: the front end calls ReleaseSlots when the response ends, so the slots of
	// concurrency policies are renewed until then (slots.go); else they last one lease time.
	Releases bool
	// Seen is what the diagnosis notes of the request (seen.go): filled by Resolve.
	Seen Seen
}

// LimitCost returns limit i's cost: Costs[i], else Cost.
func (r *Request) LimitCost(i int) int64 {
	if r.Costs != nil {
		return r.Costs[i]
	}
	return r.Cost
}

// Outcome is what happens to a decided request.
type Outcome uint8

const (
	Unlimited Outcome = iota // no policy applies: it goes on, with no fields
	Allowed                  // it goes on now
	Held                     // it goes on after Verdict.Hold (a leaky-bucket queue)
	Refused                  // a policy refused it: 429 (Verdict.Problem), nothing consumed
	Failed                   // it could not be decided: Verdict.Problem says why (400, 503, 500)
)

func (o Outcome) String() string {
	return [...]string{"unlimited", "allowed", "held", "refused", "failed"}[o]
}

// Verdict is the answer to a request.
type Verdict struct {
	Outcome Outcome
	Hold    time.Duration  // Held: how long to hold it before it goes on
	Problem answer.Problem // Refused, Failed: the answer's status, problem body and fields
	// Decisions are every limit's decision, in Request.Limits' order (dry-run ones included):
	// their RateLimit fields go on the answer, whatever it is. Empty for Unlimited and for most
	// failures. They live in memory the Verdict reuses: read them before Release.
	Decisions []answer.Applied
	Err       error // Failed: the store's error

	sc    *scratch
	slots *heldSlots // concurrency slots taken, until ReleaseSlots (slots.go); not Release's memory
	// settled: what the request charged has been settled — by Finish, or given back by Refund —
	// and no later call settles it again (after.go: the one mark of a settled request).
	settled bool
}

// Passes reports whether the request goes on (now, or after Hold).
func (v *Verdict) Passes() bool { return v.Outcome <= Held }

// Refusing returns the decisions that refused the request: the enforced ones not allowed.
func (v *Verdict) Refusing(req *Request) []answer.Applied {
	var out []answer.Applied
	for i, d := range v.Decisions {
		if !req.Limits[i].DryRun && !d.Decision.Allowed {
			out = append(out, d)
		}
	}
	return out
}

// RetryAfter is how long a refused request's client should wait: until every limit that refused
// it would allow it (0 if it was not refused).
func (v *Verdict) RetryAfter(req *Request) time.Duration {
	if v.Outcome != Refused {
		return 0
	}
	return answer.Wait(v.Refusing(req))
}

// Release hands the Verdict's memory back once nothing reads its Decisions any more (the answer
// is written). A Verdict that is not released only costs an allocation.
func (v *Verdict) Release() {
	if v.sc != nil {
		sc := v.sc
		v.sc, v.Decisions = nil, nil
		*sc = scratch{}
		scratches.Put(sc)
	}
}

// scratch is the memory a decision needs, reused across requests: a request with a few policies
// decides without allocating.
type scratch struct {
	limits  [inline]sluice.Limit
	out     [inline]sluice.Decision
	applied [inline]answer.Applied
}

// inline is how many limits per request scratch holds; more allocate.
const inline = 8

var scratches = sync.Pool{New: func() any { return new(scratch) }}

// Observer sees every decision, for metrics; its methods must be safe for concurrent use.
type Observer interface {
	// Decided is called once a request's limits are decided (v.Outcome is Allowed, Held or
	// Refused), took took to decide, its decisions still in v.
	Decided(req *Request, v *Verdict, took time.Duration)
	// Failed is called for a request the store could not decide.
	Failed(req *Request, err error)
}

// Decider decides requests on a store. Its fields are read-only once it decides.
type Decider struct {
	// Store decides, already guarded by its failure mode (sluice.Guard): its fallbacks show in
	// the decisions, and an error is a request it could not decide.
	Store sluice.Store
	// MaxDelay bounds a leaky-bucket policy's hold: a request it would hold longer is refused by
	// the store, consuming nothing. 0 or less: no hold at all.
	MaxDelay time.Duration
	Observer Observer // nil: none
	// Renewer renews the concurrency slots of requests in flight that their front end releases
	// (Request.Releases); nil: none are renewed (slots.go).
	Renewer *Renewer
	// Settlements, if set, makes the settlements (Finish, Refund) and usage charges
	// (Request.Charges) land: one the store could not confirm is retried in the background until
	// it lands, applied once (sluice.Settlements, on Store's store). nil: one attempt each
	// (sluice.SettleDecision, ChargeDecision).
	Settlements *sluice.Settlements
	// Global, if set, gives the global: true policies their region's allotment (issue 34): a
	// limit whose Global is set is decided with the allotment as its policy's Limit (same Name:
	// the counts are kept), and its decisions are reported back. nil: they are decided on their
	// configured limit.
	Global Global
}

// Global is a region's allotments of the global policies, refreshed in the background from the
// ledger (package region). Its methods must be safe for concurrent use and should not allocate.
type Global interface {
	// Allotment is what this region enforces now of the global policy named policy (its
	// configured name): 0 admits nothing; ok false if it knows no such policy (then the
	// configured limit applies).
	Allotment(policy string) (allotment int64, ok bool)
	// Decided reports a store's decision d of the global policy (refused: d.Allowed false;
	// admitted: allowed, the request passed and consumed), to count the region's demand and use.
	Decided(policy string, admitted bool, d *sluice.Decision)
}

// GlobalStats is one global policy as its region sees it (GET /v1/stats "regions", the metrics).
type GlobalStats struct {
	Policy    string `json:"policy"`
	Limit     int64  `json:"limit"`     // worldwide
	Allotment int64  `json:"allotment"` // what this region enforces now
	Want      int64  `json:"want"`      // the demand last reported, per period
	// WorldWant is the sum of the live regions' demands in the ledger at the last refresh (0:
	// not read): above Limit, the limit cannot meet worldwide demand.
	WorldWant int64     `json:"worldwide_want"`
	Admitted  int64     `json:"admitted"` // in the last refresh interval
	Refused   int64     `json:"refused"`
	Used      int64     `json:"used"`                   // the use of the current window last reported
	Lease     time.Time `json:"lease_expires,omitzero"` // the last grant's lease, on this instance's clock (zero: none yet)
	Safe      bool      `json:"safe_share"`             // on the safe share: the lease ran out without a refresh
	Floor     bool      `json:"floor"`                  // on the floor: no grant yet
	Learning  bool      `json:"learning"`               // the ledger's state is new: it hands out no new quota yet
	Error     string    `json:"error,omitempty"`        // why the last refresh failed
	// Refresher: this instance refreshes the ledger for its region (it holds the pool's lock on
	// the region's Redis); Version is the pooled grant's it enforces (0: not pooled, or none).
	Refresher bool  `json:"refresher"`
	Version   int64 `json:"grant_version,omitempty"`
	// RefreshTook is how long this refresher's last refresh for the region took, from taking
	// the pooled counts to publishing the grant; LockTTL the pool's lock's (three refresh
	// intervals); Slow: it took more than half of it, so that a slower one would lose the lock
	// midway (the instances would take turns, each measuring the demand anew).
	RefreshTook time.Duration `json:"-"`
	LockTTL     time.Duration `json:"-"`
	// RefreshTookMs and LockTTLMs are RefreshTook and LockTTL in milliseconds, for /v1/stats.
	RefreshTookMs float64 `json:"refresh_took_ms,omitempty"`
	LockTTLMs     float64 `json:"lock_ttl_ms,omitempty"`
	Slow          bool    `json:"refresh_slow,omitempty"`
	// Ledger is every region in the ledger at the last read (this instance's region's refresher
	// reads it each refresh; empty until then), sorted by name: the world as the ledger sees it.
	Ledger []LedgerRegion `json:"ledger,omitempty"`
}

// LedgerRegion is one region's record in a global policy's ledger, for GlobalStats.
type LedgerRegion struct {
	Region    string    `json:"region"`
	Want      int64     `json:"want"`          // its demand last reported, per period
	Allotment int64     `json:"allotment"`     // its last grant
	Used      int64     `json:"used"`          // its use last reported (while it counts)
	Holding   int64     `json:"holding"`       // what the ledger counts for it: max(allotment, pending, used)
	Expires   time.Time `json:"lease_expires"` // its lease's end, the ledger's clock
	Live      bool      `json:"live"`          // its lease has not ended
}

// Decide decides req: every limit in one atomic store call, the enforced ones all or nothing, the
// dry-run ones alongside (they count, but never refuse, and consume nothing when an enforced one
// refuses).
func (d *Decider) Decide(ctx context.Context, req *Request) Verdict {
	var v Verdict
	d.DecideInto(ctx, req, &v)
	return v
}

// DecideInto is Decide into *v (whatever it held is overwritten), for a caller whose Verdict is
// already in memory of its own: Decide's is one allocation per request.
func (d *Decider) DecideInto(ctx context.Context, req *Request, v *Verdict) {
	n := len(req.Limits)
	*v = Verdict{}
	if n == 0 {
		v.Outcome = Unlimited
		return
	}
	var limits []sluice.Limit
	var out []sluice.Decision
	if n <= inline {
		v.sc = scratches.Get().(*scratch)
		limits, out, v.Decisions = v.sc.limits[:n], v.sc.out[:n], v.sc.applied[:n]
	} else {
		limits, out, v.Decisions = make([]sluice.Limit, n), make([]sluice.Decision, n), make([]answer.Applied, n)
	}
	hold := d.MaxDelay
	if hold <= 0 || req.NoHold {
		hold = sluice.NoDelay
	}
	global := false
	for i := range req.Limits {
		l := &req.Limits[i]
		limits[i] = sluice.Limit{Key: l.Key, Policy: l.Policy, Cost: req.LimitCost(i), MaxDelay: hold, DryRun: l.DryRun}
		if l.Global && d.Global != nil {
			global = true
			if a, ok := d.Global.Allotment(l.PolicyName); ok {
				limits[i].Policy = allotted(l.Policy, a)
			}
		}
	}
	slots := takeSlots(limits)
	start := time.Now()
	var allowed bool
	var err error
	if global && refuseNone(limits, out) {
		allowed = false // a global policy's allotment is 0 here: refused, no store call, nothing consumed
	} else {
		allowed, err = d.Store.DecideAll(ctx, req.Who.Key, limits, out)
	}
	took := time.Since(start)
	if err != nil {
		d.fail(req, v, err)
		return
	}
	if global {
		for i := range req.Limits {
			if l := &req.Limits[i]; l.Global && !l.DryRun {
				d.Global.Decided(l.PolicyName, allowed && out[i].Allowed, &out[i])
			}
		}
	}
	for i := range req.Limits {
		v.Decisions[i] = answer.Applied{Policy: req.Limits[i].Policy, Decision: out[i], Unit: req.Limits[i].Unit.Noun(), Level: req.Limits[i].Level}
		if req.Limits[i].Global {
			v.Decisions[i].Policy = limits[i].Policy // its allotment: what was enforced
		}
		v.Decisions[i].Policy.Name = req.Limits[i].PolicyName
	}
	if err := d.charge(ctx, req, allowed, out); err != nil {
		d.fail(req, v, err)
		return
	}
	switch {
	case !allowed:
		// Refused by a limit, or by a leaky-bucket queue that would hold it longer than MaxDelay
		// (the store refused it, consuming nothing, with a RetryAfter until its hold would be
		// MaxDelay).
		v.Outcome = Refused
		v.Problem = answer.QuotaExceeded(req.Who.Client, v.Refusing(req))
		v.Problem.Shape = req.Shape()
	default:
		v.Outcome = Allowed
		for i, a := range v.Decisions {
			if !req.Limits[i].DryRun {
				v.Hold = max(v.Hold, a.Decision.Delay)
			}
		}
		if v.Hold > 0 {
			v.Outcome = Held
		}
		if slots {
			d.holdSlots(req, v, limits, out)
		}
	}
	if d.Observer != nil {
		d.Observer.Decided(req, v, took)
	}
}

// fail makes *v the verdict of a request the store could not decide.
func (d *Decider) fail(req *Request, v *Verdict, err error) {
	v.Release()
	*v = Verdict{Outcome: Failed, Err: err, Problem: failure(req, err)}
	v.Problem.Shape = req.Shape()
	if d.Observer != nil {
		d.Observer.Failed(req, err)
	}
}

// charge charges each limit's usage (Request.Charges) that its decision out[i] did not consume:
// the decision consumed its cost only if the request was allowed and so was it. Each is one
// atomic step on the store (sluice.ChargeDecision), after the decision. With Settlements, a
// charge the store could not confirm is queued to be retried until it lands (applied once), and
// counts as made; one that could not be made or queued fails the request, as a decision would
// (an unconfirmed one was made).
func (d *Decider) charge(ctx context.Context, req *Request, allowed bool, out []sluice.Decision) error {
	for i, n := range req.Charges {
		consumed := int64(0)
		if allowed && out[i].Allowed {
			consumed = req.LimitCost(i)
		}
		if n -= consumed; n <= 0 {
			continue
		}
		l := &req.Limits[i]
		key := l.Key
		if key == "" {
			key = req.Who.Key
		}
		var err error
		if d.Settlements != nil {
			err = d.Settlements.Charge(ctx, key, l.Policy, out[i], n)
		} else {
			err = sluice.ChargeDecision(ctx, d.Store, key, l.Policy, out[i], n)
		}
		if !applied(err) {
			return err
		}
		// Applied (or to be, pending): the limit costs consumed + n on the store, as a settlement would leave it.
		d.observeSettled(req, i, out[i], consumed, consumed+n, err)
		if o, ok := d.Observer.(UsageObserver); ok {
			o.Charged(req, i, n)
		}
	}
	return nil
}

// failure is the answer to a request the store could not decide.
func failure(req *Request, err error) answer.Problem {
	switch {
	case errors.Is(err, sluice.ErrInvalidCost):
		for i := range req.Limits {
			if c := req.LimitCost(i); c < 0 {
				return answer.InvalidCost(c)
			}
		}
		return answer.InvalidCost(req.Cost)
	case errors.Is(err, sluice.ErrCostExceedsLimit):
		for i, l := range req.Limits {
			var d sluice.Decision
			c := req.LimitCost(i)
			if l.Policy.Algorithm == sluice.Concurrency {
				c = min(c, 1) // one slot (slots.go)
			}
			if algorithm.CheckCost(&l.Policy, c, &d) != nil {
				p := l.Policy
				p.Name = l.PolicyName
				return answer.CostExceedsLimit(req.Who.Client, answer.Applied{Policy: p, Decision: d, Unit: l.Unit.Noun(), Level: l.Level}, c)
			}
		}
		return answer.BadRequest("the request's cost cannot be decided")
	case errors.Is(err, sluice.ErrStoreUnavailable):
		return answer.StoreUnavailable(req.Who.Client, time.Second)
	default:
		return answer.Problem{Type: answer.TypeBlank, Title: "Internal Server Error",
			Status: http.StatusInternalServerError, Detail: "the limiter failed; the request was not forwarded"}
	}
}

// allotted is global policy p with the region's allotment a as its limit: a token bucket's
// burst scaled alike (its capacity C·a/L, docs/design.md). An allotment of 0 is marked by a
// Limit of 0, which refuseNone answers.
func allotted(p sluice.Policy, a int64) sluice.Policy {
	if a <= 0 {
		p.Limit = 0
		return p
	}
	if p.Burst > 0 && p.Limit > 0 {
		p.Burst = max(1, int64(float64(p.Burst)*float64(a)/float64(p.Limit)))
	}
	p.Limit = a
	return p
}

// refuseNone answers, without the store, a request one of whose enforced global policies has an
// allotment of 0 here: it is refused by that policy (retry after its period: the allotment
// changes within a refresh, the window within the period), the others not decided (allowed,
// nothing consumed, their limit whole). A dry-run one with no allotment is decided on 1 unit.
// It reports whether it answered.
func refuseNone(limits []sluice.Limit, out []sluice.Decision) bool {
	zero := false
	for i := range limits {
		if limits[i].Policy.Limit == 0 {
			if !limits[i].DryRun {
				zero = true
			} else {
				limits[i].Policy.Limit = 1
			}
		}
	}
	if !zero {
		return false
	}
	for i := range limits {
		l := &limits[i]
		if l.Policy.Limit == 0 {
			out[i] = sluice.Decision{Allowed: false, RetryAfter: l.Policy.Period}
		} else {
			out[i] = sluice.Decision{Allowed: true, Limit: l.Policy.Capacity(), Remaining: l.Policy.Capacity()}
		}
	}
	return true
}

package decision

import (
	"context"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/llm"
)

// Response is what became of a request that passed, as the proxy saw it once the upstream's
// response was written (or the request ended without one).
type Response struct {
	Status int                 // the response's status (0 if none)
	Header func(string) string // the response's header field by name ("" if absent); nil: none
	// Usage is the usage the response's body reported, on a usage route (nil: its body was not
	// metered; Found false: it reported none).
	Usage *llm.Usage
	// Aborted: the upstream gave no response — it failed or timed out, its response was cut
	// short (it closed the connection before the body's end), the client left before its header,
	// or the request was never forwarded (its client left while it was held).
	Aborted bool
	// Left: the client left before its response was written whole (with Aborted: before the
	// upstream's header; else in the middle of the body). On a usage route what the upstream did
	// decides, not what the client did: a request the client left is not refunded (no_usage:
	// refund, refund_on's "no response") unless the upstream itself failed; it is charged the
	// usage the response reported before the client left, else its estimate.
	Left bool
	// Unsent: the request was never sent to the upstream (its client left while it was held).
	// On a usage route it produced nothing: its tokens and dollars are refunded (its requests
	// still count), whatever the route's no_usage.
	Unsent bool
}

// SettleOutcome is what Finish did with a request's estimate.
type SettleOutcome uint8

const (
	SettleKept    SettleOutcome = iota // the estimate was the cost: nothing to settle
	Settled                            // settled with the real cost, or refunded
	SettleGarbled                      // cost_from's header was missing or not an integer in 0..2^53: the estimate stands
	SettleFailed                       // the store could not settle (it failed; the breaker is open): the estimate stands
	SettleNoUsage                      // a usage route's response reported no usage: the estimate stands (or no_usage: refund refunded it)
)

func (o SettleOutcome) String() string {
	return [...]string{"kept", "settled", "garbled", "failed", "no_usage"}[o]
}

// SettleObserver is implemented by an Observer that counts settlements (the gateway's metrics).
type SettleObserver interface {
	Settled(req *Request, outcome SettleOutcome)
}

// SETTLED ONCE. A request's charge is settled at most once, whatever ends it: Finish (its
// response is known, or it ended without one) or Refund (it was not forwarded after all). The
// first of them marks the Verdict settled (settle); every later call finds the mark and does
// nothing. So a request shed for load, refunded when it was shed, is not settled again when it
// ends — a second refund would give back quota another request holds.

// settle marks v settled and reports whether it was not already: the one place that does.
func (v *Verdict) settle() bool {
	if v.settled {
		return false
	}
	v.settled = true
	return true
}

// Finish settles a request that passed once its response is known, by the route's rule
// (Request.After; nothing for a request without one, or one that was refused or failed): the
// real cost is
//
//   - 0 if refund_on matches the status, or the upstream gave no response (Aborted) and the
//     route has refund_on;
//   - 0 if the route has count_only and the status is not one of it (an aborted request has none);
//   - cost_from's header's integer, if the route has cost_from (a missing or garbled one, or none
//     because the request was aborted, keeps the estimate);
//   - else the estimate.
//
// Each limit the request charged is settled on the store (sluice.SettleDecision: where its
// decision charged, at the decision's instant) with its own estimate and the real cost, one
// atomic step per limit. A front end calls it after the upstream's response has been written, or
// the request ended without one, and before v.Release().
func (d *Decider) Finish(ctx context.Context, req *Request, v *Verdict, resp Response) {
	if !v.settle() {
		return // refunded already (Refund), or finished
	}
	if req.Usage != nil {
		d.finishUsage(ctx, req, v, resp)
		return
	}
	a := req.After
	if a == nil || !v.Passes() || len(v.Decisions) != len(req.Limits) {
		return
	}
	outcome := SettleKept
	actual := int64(-1) // -1: each limit's estimate
	switch {
	case a.Refunds(resp.Status, resp.Aborted):
		actual = 0
	case a.CountOnly != nil && (resp.Aborted || !a.Counts(resp.Status)):
		actual = 0
	case a.CostFrom != "" && !resp.Aborted:
		h := ""
		if resp.Header != nil {
			h = strings.TrimSpace(resp.Header(a.CostFrom))
		}
		n, err := strconv.ParseInt(h, 10, 64)
		if err != nil || n < 0 || n > algorithm.MaxLimit {
			outcome = SettleGarbled
		} else {
			actual = n
		}
	}
	if actual >= 0 {
		outcome = d.settleAll(ctx, req, v, func(int) int64 { return actual })
	}
	if o, ok := d.Observer.(SettleObserver); ok {
		o.Settled(req, outcome)
	}
}

// Refund gives back everything a request that passed charged, each limit settled at a real
// cost of 0, and marks it settled so that Finish does not settle it again: for a request the
// gateway did not forward after all, such as one shed for load (its client did nothing wrong).
// It is counted as a settlement (SettleObserver), not as a usage route's request (LLMObserver):
// it never reached the upstream.
func (d *Decider) Refund(ctx context.Context, req *Request, v *Verdict) {
	if !v.settle() || !v.Passes() || len(v.Decisions) != len(req.Limits) {
		return
	}
	outcome := d.settleAll(ctx, req, v, func(int) int64 { return 0 })
	if o, ok := d.Observer.(SettleObserver); ok && outcome != SettleKept {
		o.Settled(req, outcome)
	}
}

// finishUsage is Finish for a request on a usage route: each limit is settled to what the
// response's usage (Response.Usage) says it cost, in its unit (a limit counting requests keeps
// its one). What the upstream did decides: a response that reported no usage because the
// upstream failed (an error without usage, a stream it cut short, no answer at all) keeps its
// estimate, or is refunded if the route says no_usage: refund (its requests still count), and
// refund_on refunds a listed status or an upstream that gave no response; a client that left
// before the usage came (Response.Left) keeps the estimate — the upstream was at work, and
// leaving just before a stream's end must not make it free — unless the request never reached
// the upstream (Response.Unsent: it left while held), which refunds its tokens and dollars.
func (d *Decider) finishUsage(ctx context.Context, req *Request, v *Verdict, resp Response) {
	if !v.Passes() || len(v.Decisions) != len(req.Limits) {
		return
	}
	var u llm.Usage
	if resp.Usage != nil && !resp.Aborted {
		u = *resp.Usage
	}
	upstreamFailed := resp.Aborted && !resp.Left
	outcome := SettleNoUsage
	switch {
	case req.After != nil && req.After.Refunds(resp.Status, upstreamFailed):
		u = llm.Usage{}
		outcome = d.settleAll(ctx, req, v, func(int) int64 { return 0 })
	case u.Found:
		outcome = d.settleAll(ctx, req, v, func(i int) int64 { return req.usageActual(i, u) })
		if outcome == SettleKept {
			outcome = Settled // (the estimate was exact)
		}
	case resp.Unsent || (req.Usage.Rule.Refund && !resp.Left):
		if d.settleAll(ctx, req, v, func(i int) int64 {
			if req.Limits[i].Unit == config.UnitRequests {
				return -1
			}
			return 0
		}) == SettleFailed {
			outcome = SettleFailed
		}
	}
	if o, ok := d.Observer.(SettleObserver); ok {
		o.Settled(req, outcome)
	}
	if o, ok := d.Observer.(LLMObserver); ok {
		o.UsageSettled(req, u, outcome)
	}
}

// settleAll settles every limit the request charged with its real cost actual(i) (-1: its
// estimate stands): each on the store (sluice.SettleDecision: where its decision charged, at the
// decision's instant) with its own estimate, one atomic step per limit. Concurrency limits
// charged slots, not units: their slots are given back by ReleaseSlots.
func (d *Decider) settleAll(ctx context.Context, req *Request, v *Verdict, cost func(i int) int64) SettleOutcome {
	outcome := SettleKept
	for i := range req.Limits {
		l, dec := &req.Limits[i], v.Decisions[i].Decision
		estimate, actual := req.LimitCost(i), cost(i)
		if !dec.Allowed || actual < 0 || estimate == actual || l.Policy.Algorithm == sluice.Concurrency {
			continue // charged nothing (a dry-run limit that refused), or charged right
		}
		key := l.Key
		if key == "" {
			key = req.Who.Key
		}
		var err error
		if d.Settlements != nil {
			err = d.Settlements.Settle(ctx, key, l.Policy, dec, estimate, actual)
		} else {
			err = sluice.SettleDecision(ctx, d.Store, key, l.Policy, dec, estimate, actual)
		}
		d.observeSettled(req, i, dec, estimate, actual, err)
		if !applied(err) {
			outcome = SettleFailed // (the other limits are settled still: each is its own step)
		} else if outcome != SettleFailed {
			outcome = Settled
		}
	}
	return outcome
}

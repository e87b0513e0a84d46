package decision

import (
	"errors"

	"github.com/sluicehq/sluice"
)

// LimitSettleObserver is implemented by an Observer that keeps its own account of what requests
// cost, net of what settlements change (the gateway's shares diagnosis counts each instance's
// approvals net of refunds): it is told of every limit whose charge a settlement changed on the
// store, by Finish (cost_from, count_only, refund_on) and by Refund (a request shed for load).
type LimitSettleObserver interface {
	// LimitSettled says that req.Limits[i], which its decision dec charged estimate, now costs
	// actual on the store (0: all given back; more than estimate: charged the difference more).
	LimitSettled(req *Request, i int, dec sluice.Decision, estimate, actual int64)
}

// observeSettled tells d's Observer, if it is a LimitSettleObserver, of a settlement of limit i
// that the store applied: err is nil, or ErrUnconfirmed (applied, not confirmed), or
// ErrSettlementPending (queued: it will be applied once it lands, or counted lost).
func (d *Decider) observeSettled(req *Request, i int, dec sluice.Decision, estimate, actual int64, err error) {
	if o, ok := d.Observer.(LimitSettleObserver); ok && applied(err) {
		o.LimitSettled(req, i, dec, estimate, actual)
	}
}

// UsageObserver is implemented by an Observer that counts usage (Request.Charges): it is told of
// every charge applied on the store beyond what the request's decision consumed.
type UsageObserver interface {
	// Charged says that req.Limits[i] was charged n more than its decision consumed.
	Charged(req *Request, i int, n int64)
}

// applied reports whether a settlement or charge that returned err was made, or will be: nil,
// ErrUnconfirmed (applied, not confirmed by enough replicas), or ErrSettlementPending (queued,
// retried until it lands, applied once).
func applied(err error) bool {
	return err == nil || errors.Is(err, sluice.ErrUnconfirmed) || errors.Is(err, sluice.ErrSettlementPending)
}

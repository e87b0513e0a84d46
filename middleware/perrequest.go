package middleware

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/answer"
	"github.com/sluicehq/sluice/decision"
)

// Limits sets each request's own policies: f returns the limits that apply to it (a tenant's
// contract, a route's quota, several at once), decided all or nothing as the gateway decides a
// request's policies (sluice.Limiter.AllowAll). Each limit counts under its Key, or the request's
// key (KeyFunc) if Key is ""; its cost is its Cost, or if that is 0 the request's (CostFunc,
// default 1); a DryRun limit counts but never refuses. Limit.MaxDelay is not read: MaxDelay bounds
// every leaky-bucket hold. A request for which f returns none passes unlimited, without fields.
//
// With Limits, the Limiter's own policy is not used (include it in f's answer to apply it too),
// and the Limiter may have none (sluice.New). Each policy is checked (sluice.Limiter.CheckPolicy:
// an unnamed one is named by its numbers); an invalid one, or a (key, policy name) given twice,
// is the program's mistake: the request is answered 500, naming the field, and nothing is
// decided. f may return the same slice to many requests at once: it is only read.
func Limits(f func(r *http.Request) []sluice.Limit) Option { return func(c *config) { c.limits = f } }

// Exempt leaves alone the requests for which f reports true (a health check, an internal
// caller): they are passed on untouched, without being keyed or decided, and without fields.
func Exempt(f func(r *http.Request) bool) Option { return func(c *config) { c.exempt = f } }

// OnRefused replaces the answer to a request that a policy refused (the 429 problem): f writes
// it, status included. When f is called, w's header already holds the RateLimit fields (and the
// legacy ones, with LegacyHeaders) and Retry-After; f may change or delete them before writing.
// If f writes nothing, the answer is a bare 429. Requests that could not be decided (a store
// that fails closed, a cost that can never pass) keep their problem answers.
func OnRefused(f func(w http.ResponseWriter, r *http.Request, info Refusal)) Option {
	return func(c *config) { c.refused = f }
}

// Refusal is what OnRefused's function is told of a refused request.
type Refusal struct {
	// Key is the request's key (KeyFunc's).
	Key string
	// RetryAfter is how long until the same request would pass (every refusing limit allowing
	// it); the Retry-After field carries it in whole seconds, rounded up.
	RetryAfter time.Duration
	// Decisions are every limit's policy (named) and decision, in order; Refusing those that
	// refused the request (enforced, not allowed).
	Decisions []answer.Applied
	Refusing  []answer.Applied
	// Problem is the 429 problem the middleware would have written (answer.WriteProblem writes
	// it, Retry-After included).
	Problem answer.Problem
}

// requestLimits makes req's limits of ls: each policy checked and named, each cost ls's or the
// request's.
func (c *config) requestLimits(lim *sluice.Limiter, req *decision.Request, ls []sluice.Limit) error {
	req.Limits = nil
	if len(ls) == 0 {
		return nil // unlimited
	}
	limits := make([]decision.Limit, len(ls))
	costs := make([]int64, len(ls))
	for i := range ls {
		p, err := lim.CheckPolicy(ls[i].Policy)
		if err != nil {
			return fmt.Errorf("middleware: Limits: limits[%d]: %w", i, err)
		}
		limits[i] = decision.Limit{Policy: p, PolicyName: p.Name, Key: ls[i].Key, DryRun: ls[i].DryRun}
		costs[i] = ls[i].Cost
		if costs[i] == 0 {
			costs[i] = req.Cost
		}
		for j := 0; j < i; j++ {
			if limits[j].Policy.Name == p.Name && ls[j].EffectiveKey(req.Who.Key) == ls[i].EffectiveKey(req.Who.Key) {
				return fmt.Errorf("middleware: Limits: limits[%d] and limits[%d] both count policy %q under one key: each (key, policy name) may appear once", j, i, p.Name)
			}
		}
	}
	req.Limits, req.Costs = limits, costs
	return nil
}

// misconfigured is the answer to a request that the program's own mistake kept from being
// decided: a 500 that says what the mistake is (policies are no secret: the RateLimit fields
// publish them), and that nothing was served.
func misconfigured(err error) answer.Problem {
	return answer.Problem{Type: answer.TypeBlank, Title: "Internal Server Error", Status: http.StatusInternalServerError,
		Detail: "the rate limiter cannot decide this request, so it was not served: " + err.Error()}
}

// refuse answers a refused request with OnRefused's function.
func (c *config) refuse(w http.ResponseWriter, r *http.Request, req *decision.Request, v *decision.Verdict) {
	info := Refusal{Key: req.Who.Key, Refusing: v.Refusing(req), Problem: v.Problem}
	info.RetryAfter = answer.Wait(info.Refusing)                   // v.RetryAfter, without finding the refusing limits again
	info.Decisions = append([]answer.Applied(nil), v.Decisions...) // v's memory is reused once released
	h := w.Header()
	answer.Headers(h, v.Decisions, c.legacy)
	v.Release()
	if info.Problem.RetryAfter > 0 {
		h.Set(answer.FieldRetryAfter, strconv.FormatInt(info.Problem.RetryAfter, 10)) // as WriteProblem sets it
	}
	rw := &refusalWriter{ResponseWriter: w}
	c.refused(rw, r, info)
	if !rw.wrote {
		w.WriteHeader(http.StatusTooManyRequests)
	}
}

// refusalWriter records whether OnRefused's function wrote anything.
type refusalWriter struct {
	http.ResponseWriter
	wrote bool
}

func (w *refusalWriter) WriteHeader(code int) {
	if code >= 200 {
		w.wrote = true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *refusalWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the server's writer.
func (w *refusalWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

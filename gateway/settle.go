package gateway

import (
	"context"
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decision"
)

// Costs known after the response: a route with cost_from, count_only or refund_on is settled
// once the upstream's response is known (decision.Finish), by both proxy engines. Forward-auth
// never sees the response (the configuration refuses such routes beside forward_auth; without
// that section, a forward-auth sub-request on one charges the estimate and never settles it),
// and Envoy's rate limit service decides descriptors, not routes.

func newSettlements(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_settlements_total",
		Help: "Requests of routes with cost_from, count_only or refund_on, once their response was known, by client and outcome: settled (the real cost charged, or refunded), kept (the estimate was the cost), garbled (cost_from's header missing or not an integer: the estimate stands), failed (the store could not settle: the estimate stands)."},
		[]string{"client", "outcome"})
	reg.MustRegister(c)
	return c
}

// Settled counts a settlement (decision.SettleObserver).
func (o observer) Settled(req *decision.Request, outcome decision.SettleOutcome) {
	o.g.metrics.settlements.WithLabelValues(req.Client, outcome.String()).Inc()
}

// finishFast settles a request of the fasthttp engine that passed, once its response is in ctx
// (took: how long the upstream took to answer; 0 if it did not), or once it ended without being
// forwarded (aborted). Nothing for a route without a rule.
func (g *Gateway) finishFast(dctx context.Context, req *decision.Request, v *decision.Verdict, ctx *fasthttp.RequestCtx, took time.Duration, aborted bool) {
	if req.After == nil {
		return
	}
	resp := decision.Response{Status: ctx.Response.StatusCode(), Aborted: aborted || took == 0,
		Header: func(name string) string { return string(ctx.Response.Header.Peek(name)) }}
	if resp.Aborted {
		resp.Status = 0
	}
	g.decider.Finish(dctx, req, v, resp)
}

// afterRecorder notes, for the net/http engine, the status of the answer to a request of a route
// with a rule, and whether the upstream failed to give one (noteAborted, from forwardFailed).
type afterRecorder struct {
	http.ResponseWriter
	status  int
	aborted bool
}

func (a *afterRecorder) WriteHeader(code int) {
	if a.status == 0 && code >= 200 {
		a.status = code
	}
	a.ResponseWriter.WriteHeader(code)
}

func (a *afterRecorder) Write(b []byte) (int, error) {
	if a.status == 0 {
		a.status = 200
	}
	return a.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the server's writer.
func (a *afterRecorder) Unwrap() http.ResponseWriter { return a.ResponseWriter }

// noteAborted marks the afterRecorder under w, if there is one, as answered by the proxy for an
// upstream that failed.
func noteAborted(w http.ResponseWriter) {
	for w != nil {
		if a, ok := w.(*afterRecorder); ok {
			a.aborted = true
			return
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return
		}
		w = u.Unwrap()
	}
}

// response is what the net/http engine saw of the response a recorded.
func (a *afterRecorder) response() decision.Response {
	h := a.ResponseWriter.Header()
	resp := decision.Response{Status: a.status, Aborted: a.aborted || a.status == 0, Header: h.Get}
	if resp.Aborted {
		resp.Status = 0
	}
	return resp
}

// The store wrappers pass settlements on (sluice.SettleDecision looks through them).
func (w *watchedStore) Unwrap() sluice.Store { return w.Store }
func (t tracedStore) Unwrap() sluice.Store   { return t.Store }

// afterHTTP prepares a request of the net/http engine whose route has a rule: it returns the
// writer to answer through (recording the response) and the function that settles the request
// once it has been answered. decision.Serve releases v before it forwards, so the decisions
// Finish needs are copied first. The settlement outlives the client: it is not cancelled if the
// client leaves.
func (g *Gateway) afterHTTP(w http.ResponseWriter, r *http.Request, req *decision.Request, v *decision.Verdict) (http.ResponseWriter, func()) {
	rec := &afterRecorder{ResponseWriter: w}
	kept := decision.Verdict{Outcome: v.Outcome, Decisions: slices.Clone(v.Decisions)}
	ctx := context.WithoutCancel(r.Context())
	return rec, func() { g.decider.Finish(ctx, req, &kept, rec.response()) }
}

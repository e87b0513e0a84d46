// Package gateway is sluice's HTTP front ends over the decision layer (package decision): a
// reverse proxy that forwards, holds (leaky bucket) or answers 429 what the decision layer
// decides of each request (the fasthttp engine, ServeFast, and the net/http one, ServeHTTP); and
// an admin listener with metrics, health, stats, the decision API (POST /v1/check) and
// forward-auth for nginx, Caddy and Traefik (/v1/forward-auth).
//
// A Gateway is one configuration; a Server swaps Gateways on reload without dropping requests.
// The Server decides on a store its caller opened (cmd/sluice, the composition root): the
// gateway opens no store to decide on (a what-if of a client's needs replays in the simulator,
// package sim, on a memory store of its own) and mounts no pages of its own.
package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httputil"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/answer"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/decision"
	"github.com/sluicehq/sluice/identity"
	_ "github.com/sluicehq/sluice/identity/jwt" // the jwt identity source, which decision.NewPolicies builds
)

// Gateway serves one configuration. It is safe for concurrent use.
type Gateway struct {
	cfg      *config.Config
	policies *decision.Policies
	decider  decision.Decider
	up       *Upstream
	proxy    *httputil.ReverseProxy // the net/http engine's
	metrics  *Metrics
	retries  *earlyRetries
	access   *accessLog // nil: no access log
	tracing  bool       // spans for requests and store calls (config tracing)
	shed     *shedder   // nil: no load shedding (shed.go)
}

// New returns a Gateway for cfg, deciding on store (already guarded by the caller: see
// sluice.Guard) and forwarding to up (nil: new connections to cfg.Upstream; pass the previous
// Gateway's on a reload to keep its connections).
func New(cfg *config.Config, store sluice.Store, metrics *Metrics, up *Upstream) (*Gateway, error) {
	policies, err := decision.NewPolicies(cfg)
	if err != nil {
		return nil, err
	}
	g := &Gateway{cfg: cfg, policies: policies, metrics: metrics, retries: newEarlyRetries(1 << 16), tracing: cfg.Tracing != nil}
	if g.tracing {
		store = tracedStore{store}
	}
	g.decider = decision.Decider{Store: store, MaxDelay: cfg.Limits.MaxDelay, Observer: observer{g}, Renewer: &decision.Renewer{}}
	g.shed = newShedder(cfg, metrics)
	if cfg.Upstream == nil {
		// No proxy listener (listen: ""): the Gateway decides for the other front ends only.
		g.up = up
		return g, nil
	}
	up = up.For(cfg.Upstream)
	transport := up.transport
	upstream := cfg.Upstream
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			// Rewrite drops the inbound X-Forwarded-For; keep it, and append this hop's peer.
			if xff, ok := pr.In.Header["X-Forwarded-For"]; ok {
				pr.Out.Header["X-Forwarded-For"] = append([]string(nil), xff...)
			}
			pr.SetXForwarded()
			if pr.Out.Body != nil && pr.Out.Body != http.NoBody { // see forwardFailed
				body := netBody{&clientBody{r: pr.Out.Body, closer: pr.Out.Body}}
				pr.Out.Body = body
				// The Transport sends a request with a body again on a fresh connection when the
				// one it took had been closed before anything was written: the body, unread yet.
				pr.Out.GetBody = func() (io.ReadCloser, error) { return body, nil }
			}
		},
		Transport:  timedTransport{transport, metrics},
		BufferPool: copyBuffers, // without one, every response body copy allocates 32 KiB
		// FlushInterval 0: a response of unknown length (a stream, chunked, text/event-stream)
		// is still flushed as it comes; others are written as the copy goes.
	}
	g.up, g.proxy = up, proxy
	proxy.ErrorHandler = g.forwardFailed
	return g, nil
}

// Upstream returns the connections this Gateway forwards over, for the next one (see New).
func (g *Gateway) Upstream() *Upstream { return g.up }

// Policies returns what the Gateway resolves requests with.
func (g *Gateway) Policies() *decision.Policies { return g.policies }

// Decide decides req under this Gateway's configuration, its metrics counted.
func (g *Gateway) Decide(ctx context.Context, req *decision.Request) decision.Verdict {
	return g.decider.Decide(ctx, req)
}

// copyBuffers are the proxy's body-copy buffers.
var copyBuffers = &bufferPool{p: sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}}

type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte  { return *b.p.Get().(*[]byte) }
func (b *bufferPool) Put(x []byte) { b.p.Put(&x) }

// ServeHTTP is the net/http engine: it decides, then forwards (httputil.ReverseProxy), holds or
// refuses the request (decision.Serve). sluice serve runs the fasthttp engine (ServeFast); this
// one is for a Gateway inside a net/http program, and decides exactly the same. The request's
// end (requestEnd, end.go) fires when it returns: ReverseProxy has copied the whole response (or
// the tunnel closed, or the client left, or the copy failed).
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if g.proxy == nil {
		answer.WriteProblem(w, answer.Problem{Type: answer.TypeBlank, Title: http.StatusText(http.StatusBadGateway),
			Status: http.StatusBadGateway, Detail: "this gateway has no upstream (listen: \"\")"})
		return
	}
	path := routePath(r.URL.Path)
	var span trace.Span
	if g.tracing {
		var ctx context.Context
		ctx, span = startSpan(r.Context(), propagation.HeaderCarrier(r.Header), r.Method, path)
		r = r.WithContext(ctx)
		propagator.Inject(ctx, propagation.HeaderCarrier(r.Header)) // forwarded with the request: this span is the upstream's parent
	}
	e := g.begin(r.Context(), span, r.Method, r.URL.Path, false)
	defer e.drop()
	e.w.ResponseWriter = w
	left := false
	// Deferred: ReverseProxy aborts a response whose copy failed by panicking (http.ErrAbortHandler).
	defer func() { e.fire(e.netEnding(r, left)) }()
	if u := g.policies.UsageRoute(r.Method, path); u != nil {
		prob, drained, ok := g.resolveUsageBody(e, identity.HTTP(r), r.Method, path, u,
			usageBody{stream: r.Body, length: r.ContentLength, peer: r.RemoteAddr})
		if !ok {
			if !drained { // (the rest of the body is not read)
				w.Header().Set("Connection", "close")
			}
			e.replyHTTP(&e.w, prob)
			return
		}
		body := e.req.Usage.Body
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		r.Header.Del("Content-Length")
		r.TransferEncoding = nil
		usageHeader(r.Header.Set)
	} else {
		e.req = g.policies.Resolve(identity.HTTP(r), r.Method, path)
	}
	e.req.Releases = true // (the end releases the slots)
	e.v = g.decider.Decide(r.Context(), &e.req)
	if e.req.After != nil || e.req.Usage != nil || g.shed != nil {
		// decision.Serve releases the verdict before it forwards: keep what a settlement or a
		// refund needs.
		e.kept = &decision.Verdict{Outcome: e.v.Outcome, Decisions: slices.Clone(e.v.Decisions)}
	}
	r = r.WithContext(context.WithValue(r.Context(), endKey{}, e)) // for timedTransport, forwardFailed
	if !decision.Serve(&e.w, r, &e.v, g.cfg.Limits.LegacyHeaders, g.shedHandler(e, g.proxy)) {
		g.metrics.abandon(e.req.Client)
		left = true // the client left while held
	}
}

// endWriter is the net/http engine's response writer under decision.Serve: it notes the status
// of the answer and whether writing to the client failed (it left).
type endWriter struct {
	http.ResponseWriter
	status int
	failed bool
}

func (w *endWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *endWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = 200
	}
	n, err := w.ResponseWriter.Write(b)
	if err != nil {
		w.failed = true
	}
	return n, err
}

// Unwrap lets http.ResponseController reach the server's writer.
func (w *endWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// endKey is the request context's key for its requestEnd (net/http engine).
type endKey struct{}

// endOf returns r's requestEnd, if it has one.
func endOf(r *http.Request) *requestEnd {
	e, _ := r.Context().Value(endKey{}).(*requestEnd)
	return e
}

// netEnding is how a request of the net/http engine ended, once its handler is done (left: its
// client left while it was held).
func (e *requestEnd) netEnding(r *http.Request, left bool) ending {
	e.mu.Lock()
	if e.status == 0 || e.upstream == 0 {
		e.status = e.w.status // sluice's own answer (or none: 0)
	}
	e.mu.Unlock()
	switch {
	case e.cut.Load():
		return endCut
	case left || e.w.failed || r.Context().Err() != nil:
		return endClientLeft
	case e.upstream == 0 && e.v.Passes() && e.w.status >= 500:
		return endNoResponse
	}
	return endWhole
}

// routePath is the path routes are matched on: net/http leaves "." and ".." segments in
// URL.Path, and an upstream that resolves them would serve "/a/../reports" as "/reports";
// matching the cleaned path keeps such a request from escaping its route's cost. (The fasthttp
// engine's Path is already cleaned.)
func routePath(p string) string {
	if !strings.Contains(p, "/.") && !strings.Contains(p, "//") {
		return p
	}
	clean := path.Clean(p)
	if strings.HasSuffix(p, "/") && clean != "/" {
		clean += "/"
	}
	return clean
}

// observer counts a Gateway's decisions in its metrics, and notes early retries.
type observer struct{ g *Gateway }

func (o observer) Failed(req *decision.Request, err error) {
	kind := "other"
	switch {
	case errors.Is(err, sluice.ErrInvalidCost):
		kind = "invalid_cost"
	case errors.Is(err, sluice.ErrCostExceedsLimit):
		kind = "cost_exceeds_limit"
	case errors.Is(err, sluice.ErrStoreUnavailable):
		kind = "unavailable"
	}
	o.g.metrics.failures.WithLabelValues(kind).Inc()
	if kind != "invalid_cost" && kind != "cost_exceeds_limit" {
		o.g.metrics.unavailable.Add(1)
	}
}

func (o observer) Decided(req *decision.Request, v *decision.Verdict, took time.Duration) {
	m, passed := o.g.metrics, v.Passes()
	for i, a := range v.Decisions {
		l := &req.Limits[i]
		m.counters(req.Client, l.PolicyName).count(a.Decision, l.DryRun, passed)
		if a.Decision.Fallback != algorithm.NoFallback {
			m.fallbacks.Add(1)
		}
	}
	m.latency.Observe(took.Seconds())
	now := m.now()
	early, wasEarly := o.g.retries.earlyBy(req.Who.Key, now)
	if wasEarly {
		m.earlyRetries.WithLabelValues(req.Client).Inc()
		m.activity.client(req.Client).early.Add(1)
	}
	var retryAt time.Time
	outcome := outcomeAllowed
	switch v.Outcome {
	case decision.Refused:
		outcome, retryAt = outcomeRefused, now.Add(v.RetryAfter(req))
		if exactRefusal(req, v) { // (slots.go)
			o.g.retries.refusedAt(req.Who.Key, now, retryAt)
		}
	case decision.Held:
		outcome = outcomeDelayed
		m.holds.Observe(v.Hold.Seconds())
	}
	m.activity.record(req.Client, outcome, now, retryAt)
	m.needs.decided(req, v, now)
	m.diag.decided(req, v, now, early, wasEarly)
}

// timedTransport counts the upstream's answers (their status class and time to the header) for
// the net/http engine, as forward does for the fasthttp one, and notes each on its request's end,
// whose body it watches (endBody): a body cut short is the upstream's failure.
type timedTransport struct {
	rt      http.RoundTripper
	metrics *Metrics
}

func (t timedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if e := endOf(r); e != nil {
		e.sent.Store(true)
	}
	sent := time.Now()
	resp, err := t.rt.RoundTrip(r)
	if err == nil {
		took := time.Since(sent)
		t.metrics.upstreamAnswered(resp.StatusCode, took)
		if e := endOf(r); e != nil {
			e.answered(resp.StatusCode, took, resp.Header.Get)
			e.meter(resp.Header.Get("Content-Type"), resp.Header.Get("Content-Encoding"))
			if resp.StatusCode != http.StatusSwitchingProtocols { // (an upgrade's body is the connection)
				resp.Body = &endBody{ReadCloser: resp.Body, e: e, r: r}
			}
		}
	}
	return resp, err
}

// endBody is the upstream's response body for the net/http engine: a read that fails while the
// client is still there is a response cut short.
type endBody struct {
	io.ReadCloser
	e *requestEnd
	r *http.Request
}

func (b *endBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if b.e.usage != nil && n > 0 {
		b.e.usage.Write(p[:n])
	}
	if err != nil && err != io.EOF && b.r.Context().Err() == nil {
		b.e.cut.Store(true)
	}
	return n, err
}

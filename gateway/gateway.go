// Package gateway is sluice's HTTP front ends over the decision layer (package decision): a
// reverse proxy that forwards, holds (leaky bucket) or answers 429 what the decision layer
// decides of each request (the fasthttp engine, ServeFast, and the net/http one, ServeHTTP); and
// an admin listener with metrics, health, stats, the decision API (POST /v1/check) and
// forward-auth for nginx, Caddy and Traefik (/v1/forward-auth).
//
// A Gateway is one configuration; a Server swaps Gateways on reload without dropping requests.
// The Server decides on a store its caller opened (cmd/sluice, the composition root): the
// gateway imports no store and mounts no pages of its own.
package gateway

import (
	"context"
	"errors"
	"net/http"
	"net/http/httputil"
	"path"
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
				pr.Out.Body = netBody{&clientBody{r: pr.Out.Body, closer: pr.Out.Body}}
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
// one is for a Gateway inside a net/http program, and decides exactly the same.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if g.proxy == nil {
		answer.WriteProblem(w, answer.Problem{Type: answer.TypeBlank, Title: http.StatusText(http.StatusBadGateway),
			Status: http.StatusBadGateway, Detail: "this gateway has no upstream (listen: \"\")"})
		return
	}
	start := time.Now()
	path := routePath(r.URL.Path)
	var span trace.Span
	if g.tracing {
		var ctx context.Context
		ctx, span = startSpan(r.Context(), propagation.HeaderCarrier(r.Header), r.Method, path)
		r = r.WithContext(ctx)
		propagator.Inject(ctx, propagation.HeaderCarrier(r.Header)) // forwarded with the request: this span is the upstream's parent
	}
	req := g.policies.Resolve(identity.HTTP(r), r.Method, path)
	req.Releases = true // (the deferred ReleaseSlots)
	v := g.decider.Decide(r.Context(), &req)
	defer g.decider.ReleaseSlots(r.Context(), &v) // Serve has written the response, or the client left
	// The cost is settled once the response is known.
	if req.After != nil {
		var finish func()
		w, finish = g.afterHTTP(w, r, &req, &v)
		defer finish()
	}
	if g.access == nil && span == nil {
		if !decision.Serve(w, r, &v, g.cfg.Limits.LegacyHeaders, g.shedHandler(&req, &v, g.proxy)) {
			g.metrics.abandon(req.Client)
		}
		return
	}
	rec := &statusRecorder{ResponseWriter: w}
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.sent = time.Now()
		g.proxy.ServeHTTP(w, r)
	})
	e := entry{start: start, req: &req, outcome: v.Outcome, method: r.Method, path: r.URL.Path}
	if !decision.Serve(rec, r, &v, g.cfg.Limits.LegacyHeaders, g.shedHandler(&req, &v, next)) {
		g.metrics.abandon(req.Client)
		e.status = 499 // the client left while held (nginx's code for it)
	} else {
		e.status = rec.status
		if !rec.sent.IsZero() && !rec.answered.IsZero() {
			e.upstream = rec.answered.Sub(rec.sent)
		}
	}
	g.access.write(&e)
	if span != nil {
		endSpan(span, &req, e.outcome, e.status)
	}
}

// statusRecorder notes the status of the answer and when its header was written, for the access
// log.
type statusRecorder struct {
	http.ResponseWriter
	status         int
	sent, answered time.Time
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 && code >= 200 {
		s.status, s.answered = code, time.Now()
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status, s.answered = 200, time.Now()
	}
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the server's writer.
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

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
	now := time.Now()
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
	m.diag.decided(req, v, now, early, wasEarly)
}

// timedTransport counts the upstream's answers (their status class and time to the header) for
// the net/http engine, as forward does for the fasthttp one.
type timedTransport struct {
	rt      http.RoundTripper
	metrics *Metrics
}

func (t timedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	sent := time.Now()
	resp, err := t.rt.RoundTrip(r)
	if err == nil {
		took := time.Since(sent)
		t.metrics.upstreamAnswered(resp.StatusCode, took)
		noteShedSample(r, took) // (shed.go)
	}
	return resp, err
}

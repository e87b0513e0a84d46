// Package gateway is sluice's HTTP face: a reverse proxy that identifies each request's client,
// decides its policies on the store (all of them at once, all or nothing), and forwards it, holds
// it (leaky bucket) or answers 429 with Retry-After, the IETF RateLimit fields and a problem body;
// and an admin listener with metrics, health and a decision API (POST /v1/check).
//
// A Gateway is one configuration; a Server swaps Gateways on reload without dropping requests.
package gateway

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"net/http/httputil"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/gateway/answer"
	"github.com/sluicehq/sluice/gateway/identity"
)

// Gateway serves one configuration. It is safe for concurrent use.
type Gateway struct {
	cfg     *config.Config
	chain   identity.Chain
	store   sluice.Store // guarded: the failure mode applies
	up      *Upstream
	proxy   *httputil.ReverseProxy // the net/http engine's
	metrics *Metrics
	retries *earlyRetries
}

// New returns a Gateway for cfg, deciding on store (already guarded by the caller: see
// sluice.Guard) and forwarding to up (nil: new connections to cfg.Upstream; pass the previous
// Gateway's on a reload to keep its connections).
func New(cfg *config.Config, store sluice.Store, metrics *Metrics, up *Upstream) (*Gateway, error) {
	chain, err := Chain(cfg)
	if err != nil {
		return nil, err
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
		Transport:  transport,
		BufferPool: copyBuffers, // without one, every response body copy allocates 32 KiB
		// FlushInterval 0: a response of unknown length (a stream, chunked, text/event-stream)
		// is still flushed as it comes; others are written as the copy goes.
	}
	g := &Gateway{cfg: cfg, chain: chain, store: store, up: up, proxy: proxy, metrics: metrics, retries: newEarlyRetries(1 << 16)}
	proxy.ErrorHandler = g.forwardFailed
	return g, nil
}

// Upstream returns the connections this Gateway forwards over, for the next one (see New).
func (g *Gateway) Upstream() *Upstream { return g.up }

// copyBuffers are the proxy's body-copy buffers.
var copyBuffers = &bufferPool{p: sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}}

type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte  { return *b.p.Get().(*[]byte) }
func (b *bufferPool) Put(x []byte) { b.p.Put(&x) }

// Chain builds the identity sources of cfg, in order.
func Chain(cfg *config.Config) (identity.Chain, error) {
	var chain identity.Chain
	for _, id := range cfg.Identity {
		var src interface {
			identity.Source
			Validate() error
		}
		switch {
		case id.APIKey != nil:
			src = identity.APIKey{Header: http.CanonicalHeaderKey(id.APIKey.Header), LookupSum: func(sum [sha256.Size]byte) (string, bool) {
				c, ok := cfg.ClientByKeySum(sum)
				if !ok {
					return "", false
				}
				return c.Name, true
			}}
		case id.JWT != nil:
			j := id.JWT
			src = identity.JWT{Header: http.CanonicalHeaderKey(j.Header), Algorithms: j.Algorithms, HMACSecret: []byte(j.Secret.Value()),
				PublicKey: j.PublicKey, Claim: j.Claim, Issuer: j.Issuer, Audience: j.Audience, Leeway: j.Leeway,
				Lookup: func(sub string) (string, bool) {
					c, ok := cfg.ClientBySubject(sub)
					if !ok {
						return "", false
					}
					return c.Name, true
				}}
		case id.IP != nil:
			src = identity.IP{TrustedProxies: id.IP.TrustedProxies, IPv4Prefix: id.IP.IPv4Prefix,
				IPv6Prefix: id.IP.IPv6Prefix, ForwardedHeader: id.IP.ForwardedHeader}
		default:
			continue
		}
		if err := src.Validate(); err != nil {
			return nil, fmt.Errorf("%s:%d: identity: %w", cfg.File, id.Line, err)
		}
		chain = append(chain, src)
	}
	return chain, nil
}

// request is what a request is decided on.
type request struct {
	who      identity.Identity
	client   string // the configured client's name, or "anonymous": bounded metric labels
	applied  []config.AppliedPolicy
	cost     int64
	decision []answer.Applied // in applied's order
	delay    time.Duration    // if allowed: the longest hold of its enforced leaky-bucket policies
	sc       *scratch         // where decision lives; see release
}

// scratch is the memory a decision needs, reused across requests: a request with a few policies
// decides without allocating.
type scratch struct {
	limits  [inlinePolicies]sluice.Limit
	out     [inlinePolicies]sluice.Decision
	applied [inlinePolicies]answer.Applied
}

// inlinePolicies is how many policies per request scratch holds; more allocate.
const inlinePolicies = 8

var scratches = sync.Pool{New: func() any { return new(scratch) }}

// release hands req's scratch back once nothing reads req.decision any more (the answer is
// written). A request that is not released only costs an allocation.
func (req *request) release() {
	if req.sc != nil {
		sc := req.sc
		req.sc, req.decision = nil, nil
		*sc = scratch{}
		scratches.Put(sc)
	}
}

// verdict is what the decision path tells an engine to do with a request.
type verdict struct {
	forward bool             // forward it, after holding it for hold
	hold    time.Duration    // a leaky-bucket policy's delay
	problem answer.Problem   // if not forward: the answer
	fields  []answer.Applied // the decisions whose RateLimit fields go on the answer, forwarded or not
}

// judge decides req (identified) and says what to do with it. It is the decision path both
// engines share: only reading the request and writing the answer differ between them.
func (g *Gateway) judge(ctx context.Context, req *request) verdict {
	if len(req.applied) == 0 { // nothing limits this request
		return verdict{forward: true}
	}
	allowed, err := g.decide(ctx, req)
	if err != nil {
		return verdict{problem: g.failure(req, err)}
	}
	v := verdict{fields: req.decision}
	if !allowed {
		// Refused by a limit, or by a leaky-bucket queue that would hold it longer than
		// limits.max_delay (the store refused it, consuming nothing, with a RetryAfter until its
		// hold would be max_delay).
		v.problem = answer.QuotaExceeded(req.who.Client, refusedOnes(req.decision, req.applied))
		return v
	}
	v.hold, v.forward = req.delay, true
	return v
}

// ServeHTTP is the net/http engine: it decides, then forwards (httputil.ReverseProxy), holds or
// refuses the request. sluice serve runs the fasthttp engine (ServeFast); this one is for a
// Gateway inside a net/http program, and decides exactly the same.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	req := g.identify(identity.HTTP(r), r.Method, routePath(r.URL.Path))
	v := g.judge(r.Context(), &req)
	if !v.forward {
		answer.Headers(w.Header(), v.fields, g.cfg.Limits.LegacyHeaders)
		req.release()
		answer.WriteProblem(w, v.problem)
		return
	}
	if len(v.fields) > 0 {
		// The fields go on the final answer: ReverseProxy clears the header after passing on
		// a 1xx (100 Continue, say), so fields set now would be lost.
		var h http.Header = make(http.Header, 4)
		answer.Headers(h, v.fields, g.cfg.Limits.LegacyHeaders)
		w = &fieldsWriter{ResponseWriter: w, fields: h}
	}
	req.release() // the fields are formatted, and the problem is built
	if v.hold > 0 {
		t := time.NewTimer(v.hold)
		select {
		case <-t.C:
		case <-r.Context().Done(): // the client left while held: do not forward
			t.Stop()
			g.metrics.abandon(req.client)
			return
		}
	}
	g.proxy.ServeHTTP(w, r)
}

// fieldsWriter adds fields to the response's header when its status is final (not 1xx).
type fieldsWriter struct {
	http.ResponseWriter
	fields http.Header
	done   bool
}

func (f *fieldsWriter) add() {
	if !f.done {
		f.done = true
		h := f.ResponseWriter.Header()
		for k, vs := range f.fields {
			h[k] = append(h[k], vs...)
		}
	}
}

func (f *fieldsWriter) WriteHeader(code int) {
	if code >= 200 || code == http.StatusSwitchingProtocols {
		f.add()
	}
	f.ResponseWriter.WriteHeader(code)
}

func (f *fieldsWriter) Write(b []byte) (int, error) {
	f.add() // an implicit 200
	return f.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController (which ReverseProxy uses to flush and to hijack for an
// upgrade) reach the server's writer.
func (f *fieldsWriter) Unwrap() http.ResponseWriter { return f.ResponseWriter }

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

// identify finds the client, its route and the policies that apply.
func (g *Gateway) identify(r identity.Request, method, path string) request {
	who := g.chain.Identify(r)
	var client *config.Client
	name := "anonymous"
	if who.Client != "" {
		if c, ok := g.cfg.ClientByName(who.Client); ok {
			client, name = c, c.Name
		}
	}
	route, _ := g.cfg.Route(method, path)
	cost := int64(1)
	if route != nil {
		cost = route.Cost
	}
	return request{who: who, client: name, applied: g.cfg.AppliedPoliciesFor(client, route), cost: cost}
}

// decide decides every applied policy of req in one atomic store call: the enforced ones all or
// nothing, the dry-run ones alongside (they count, but never refuse, and consume nothing when an
// enforced one refuses). A leaky-bucket policy holds at most limits.max_delay: a request it
// would hold longer is refused by the store itself, consuming nothing.
func (g *Gateway) decide(ctx context.Context, req *request) (bool, error) {
	start := time.Now()
	n := len(req.applied)
	var limits []sluice.Limit
	if n <= inlinePolicies {
		req.sc = scratches.Get().(*scratch)
		limits, req.decision = req.sc.limits[:n], req.sc.applied[:n]
	} else {
		limits, req.decision = make([]sluice.Limit, n), make([]answer.Applied, n)
	}
	out := req.outs(n)
	hold := g.cfg.Limits.MaxDelay
	if hold <= 0 {
		hold = sluice.NoDelay
	}
	for i := range req.applied {
		a := &req.applied[i]
		limits[i] = sluice.Limit{Policy: a.Policy, Cost: req.cost, MaxDelay: hold, DryRun: a.DryRun}
	}
	allowed, err := g.store.DecideAll(ctx, req.who.Key, limits, out)
	if err != nil {
		return false, err
	}
	for i := range req.applied {
		a := &req.applied[i]
		req.decision[i] = answer.Applied{Policy: a.Policy, Decision: out[i]}
		req.decision[i].Policy.Name = a.PolicyName
		g.metrics.counters(req.client, a.PolicyName).count(out[i], a.DryRun, allowed)
		if out[i].Fallback != algorithm.NoFallback {
			g.metrics.fallbacks.Add(1)
		}
	}
	now := time.Now()
	g.metrics.latency.Observe(now.Sub(start).Seconds())
	if g.retries.early(req.who.Key, now) {
		g.metrics.earlyRetries.WithLabelValues(req.client).Inc()
		g.metrics.activity.client(req.client).early.Add(1)
	}
	var retryAt time.Time
	outcome := outcomeAllowed
	if allowed {
		req.delay = maxDelay(req.decision, req.applied)
	}
	switch {
	case !allowed:
		outcome, retryAt = outcomeRefused, now.Add(answer.Wait(refusedOnes(req.decision, req.applied)))
	case req.delay > 0:
		outcome = outcomeDelayed
	}
	if outcome == outcomeRefused {
		g.retries.refused(req.who.Key, retryAt)
	}
	g.metrics.activity.record(req.client, outcome, now, retryAt)
	return allowed, nil
}

// outs is where the store writes req's n decisions: the scratch's, if req has one.
func (req *request) outs(n int) []sluice.Decision {
	if req.sc != nil {
		return req.sc.out[:n]
	}
	return make([]sluice.Decision, n)
}

// failure is the answer to a request the store could not decide.
func (g *Gateway) failure(req *request, err error) answer.Problem {
	switch {
	case errors.Is(err, sluice.ErrInvalidCost):
		return answer.InvalidCost(req.cost)
	case errors.Is(err, sluice.ErrCostExceedsLimit):
		for _, a := range req.applied {
			var d sluice.Decision
			if algorithm.CheckCost(&a.Policy, req.cost, &d) != nil {
				p := a.Policy
				p.Name = a.PolicyName
				return answer.CostExceedsLimit(req.who.Client, answer.Applied{Policy: p, Decision: d}, req.cost)
			}
		}
		return answer.BadRequest("the request's cost cannot be decided")
	case errors.Is(err, sluice.ErrStoreUnavailable):
		g.metrics.storeErrors.Inc()
		return answer.StoreUnavailable(req.who.Client, time.Second)
	default:
		g.metrics.storeErrors.Inc()
		return answer.Problem{Type: "about:blank", Title: "Internal Server Error",
			Status: http.StatusInternalServerError, Detail: "the limiter failed; the request was not forwarded"}
	}
}

func refusedOnes(ds []answer.Applied, applied []config.AppliedPolicy) []answer.Applied {
	var out []answer.Applied
	for i, d := range ds {
		if !applied[i].DryRun && !d.Decision.Allowed {
			out = append(out, d)
		}
	}
	return out
}

func maxDelay(ds []answer.Applied, applied []config.AppliedPolicy) time.Duration {
	var m time.Duration
	for i, d := range ds {
		if !applied[i].DryRun {
			m = max(m, d.Decision.Delay)
		}
	}
	return m
}

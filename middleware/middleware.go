// Package middleware limits a net/http handler with a sluice.Limiter: the library's face of what
// sluice serve does in front of an API. Each request is keyed (by default its peer's address),
// decided, and then passed on with the RateLimit fields, held for a leaky bucket's delay, or
// answered 429 with Retry-After and a problem body, or 503 when the store cannot decide:
//
//	lim, _ := sluice.NewLimiter(memory.New(), sluice.Policy{Name: "api", Algorithm: sluice.TokenBucket,
//		Limit: 10, Period: time.Second, Burst: 20})
//	http.ListenAndServe(":8080", middleware.New(lim)(mux))
//
// The decisions and answers are the gateway's (packages decision and answer): draft-ietf-httpapi-ratelimit-headers
// fields, RFC 9457 problem details.
//
// The policies can also be each request's own (Limits: a tenant's contract, a route's), with a
// Limiter that has none of its own (sluice.New); some requests can be left alone (Exempt), and a
// refusal answered in the application's own way (OnRefused):
//
//	lim, _ := sluice.New(redisStore)
//	handler := middleware.New(lim,
//		middleware.KeyFunc(byTenant),
//		middleware.Limits(func(r *http.Request) []sluice.Limit { return contracts[tenantOf(r)] }),
//		middleware.Exempt(func(r *http.Request) bool { return r.URL.Path == "/healthz" }),
//		middleware.OnRefused(func(w http.ResponseWriter, r *http.Request, info middleware.Refusal) {
//			w.WriteHeader(http.StatusTooManyRequests) // the RateLimit fields and Retry-After are set
//			fmt.Fprintf(w, "slow down: retry in %v\n", info.RetryAfter)
//		}))(mux)
//
// The package imports no JWT library: only package identity/jwt does.
package middleware

import (
	"net/http"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/answer"
	"github.com/sluicehq/sluice/decision"
	"github.com/sluicehq/sluice/identity"
)

// Option configures New.
type Option func(*config)

type config struct {
	key      func(*http.Request) (string, error)
	cost     func(*http.Request) int64
	limits   func(*http.Request) []sluice.Limit
	exempt   func(*http.Request) bool
	refused  func(http.ResponseWriter, *http.Request, Refusal)
	maxDelay time.Duration
	legacy   bool
}

// KeyFunc sets how a request is keyed: the rate-limit key of its client. An error answers the
// request 400 with the error's text (so it must not quote a credential). The default is the
// peer's address, IPv6 grouped by /64, as "ip:203.0.113.7"; behind a proxy, key by what the
// proxy vouches for instead (see identity.IP with TrustedProxies).
func KeyFunc(f func(r *http.Request) (string, error)) Option { return func(c *config) { c.key = f } }

// CostFunc sets a request's cost (default 1; 0 peeks). A cost the policy can never approve is
// answered 400. With Limits, it is the cost of each limit whose own Cost is 0.
func CostFunc(f func(r *http.Request) int64) Option { return func(c *config) { c.cost = f } }

// MaxDelay bounds how long a leaky-bucket policy holds a request (default 10s; 0 holds none): one
// that would be held longer is refused 429 and consumes nothing from the queue.
func MaxDelay(d time.Duration) Option { return func(c *config) { c.maxDelay = d } }

// LegacyHeaders also sends X-RateLimit-Limit, -Remaining and -Reset.
func LegacyHeaders() Option { return func(c *config) { c.legacy = true } }

var peer = identity.IP{}

// New returns middleware that limits each request with lim: under lim's own policy, or with
// Limits under each request's own policies (then lim's own is not used, and lim may have none:
// sluice.New). A request under no policy at all — Limits returned none — passes unlimited,
// without fields. A Limiter without a policy and without Limits is a mistake of the program, not
// of its clients: every request is answered 500 with a problem that says so (nothing panics, and
// nothing passes unlimited by accident).
func New(lim *sluice.Limiter, opts ...Option) func(http.Handler) http.Handler {
	c := config{maxDelay: 10 * time.Second}
	for _, o := range opts {
		o(&c)
	}
	if c.key == nil {
		c.key = func(r *http.Request) (string, error) {
			id, ok := peer.Identify(identity.HTTP(r))
			if !ok {
				return identity.AnonymousKey, nil
			}
			return id.Key, nil
		}
	}
	var limits []decision.Limit // lim's own policy, when the requests have none of their own
	if policy := lim.Policy(); policy.Algorithm != 0 {
		limits = []decision.Limit{{Policy: policy, PolicyName: policy.Name}}
	}
	// The Limiter's store is guarded by its failure mode; the decision is the gateway's.
	decider := decision.Decider{Store: lim.Store(), MaxDelay: c.maxDelay}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if c.exempt != nil && c.exempt(r) {
				next.ServeHTTP(w, r)
				return
			}
			key, err := c.key(r)
			if err != nil {
				answer.WriteProblem(w, answer.BadRequest(err.Error()))
				return
			}
			req := decision.Request{Who: identity.Identity{Key: key}, Client: "anonymous", Limits: limits, Cost: 1}
			if c.cost != nil {
				req.Cost = c.cost(r)
			}
			switch {
			case c.limits != nil:
				if err := c.requestLimits(lim, &req, c.limits(r)); err != nil {
					answer.WriteProblem(w, misconfigured(err))
					return
				}
			case limits == nil:
				answer.WriteProblem(w, misconfigured(sluice.ErrNoPolicy))
				return
			}
			// A leaky-bucket request that would be held longer than maxDelay is refused by the
			// store, consuming nothing (as the gateway and /v1/check refuse it).
			v := decider.Decide(r.Context(), &req)
			if v.Outcome == decision.Refused && c.refused != nil {
				c.refuse(w, r, &req, &v)
				return
			}
			decision.Serve(w, r, &v, c.legacy, next)
		})
	}
}

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
	maxDelay time.Duration
	legacy   bool
}

// KeyFunc sets how a request is keyed: the rate-limit key of its client. An error answers the
// request 400 with the error's text (so it must not quote a credential). The default is the
// peer's address, IPv6 grouped by /64, as "ip:203.0.113.7"; behind a proxy, key by what the
// proxy vouches for instead (see identity.IP with TrustedProxies).
func KeyFunc(f func(r *http.Request) (string, error)) Option { return func(c *config) { c.key = f } }

// CostFunc sets a request's cost (default 1; 0 peeks). A cost the policy can never approve is
// answered 400.
func CostFunc(f func(r *http.Request) int64) Option { return func(c *config) { c.cost = f } }

// MaxDelay bounds how long a leaky-bucket policy holds a request (default 10s; 0 holds none): one
// that would be held longer is refused 429 and consumes nothing from the queue.
func MaxDelay(d time.Duration) Option { return func(c *config) { c.maxDelay = d } }

// LegacyHeaders also sends X-RateLimit-Limit, -Remaining and -Reset.
func LegacyHeaders() Option { return func(c *config) { c.legacy = true } }

var peer = identity.IP{}

// New returns middleware that limits each request with lim.
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
	policy := lim.Policy()
	limits := []decision.Limit{{Policy: policy, PolicyName: policy.Name}}
	// The Limiter's store is guarded by its failure mode; the decision is the gateway's.
	decider := decision.Decider{Store: lim.Store(), MaxDelay: c.maxDelay}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			key, err := c.key(r)
			if err != nil {
				answer.WriteProblem(w, answer.BadRequest(err.Error()))
				return
			}
			req := decision.Request{Who: identity.Identity{Key: key}, Client: "anonymous", Limits: limits, Cost: 1}
			if c.cost != nil {
				req.Cost = c.cost(r)
			}
			// A leaky-bucket request that would be held longer than maxDelay is refused by the
			// store, consuming nothing (as the gateway and /v1/check refuse it).
			v := decider.Decide(r.Context(), &req)
			decision.Serve(w, r, &v, c.legacy, next)
		})
	}
}

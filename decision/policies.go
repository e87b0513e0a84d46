package decision

import (
	"crypto/sha256"
	"fmt"
	"net/http"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/identity"
)

// Policies resolves requests under one configuration: who sent it (the identity sources in
// order), its route, its cost and the policies that apply. It is safe for concurrent use.
type Policies struct {
	cfg   *config.Config
	chain identity.Chain
}

// NewPolicies returns the Policies of cfg, or the error of an identity source that cannot work
// (with its line).
func NewPolicies(cfg *config.Config) (*Policies, error) {
	chain, err := Chain(cfg)
	if err != nil {
		return nil, err
	}
	return &Policies{cfg: cfg, chain: chain}, nil
}

// Config returns the configuration p resolves under.
func (p *Policies) Config() *config.Config { return p.cfg }

// Chain returns the identity sources.
func (p *Policies) Chain() identity.Chain { return p.chain }

// Resolve identifies r's client and finds what applies to a request of method on path: the
// route's cost and the policies of the client on that route.
func (p *Policies) Resolve(r identity.Request, method, path string) Request {
	return p.For(p.chain.Identify(r), method, path)
}

// For is Resolve for a client already identified.
func (p *Policies) For(who identity.Identity, method, path string) Request {
	var client *config.Client
	name := "anonymous"
	if who.Client != "" {
		if c, ok := p.cfg.ClientByName(who.Client); ok {
			client, name = c, c.Name
		}
	}
	route, _ := p.cfg.Route(method, path)
	cost := int64(config.DefaultCost)
	if route != nil {
		cost = route.Cost
	}
	return Request{Who: who, Client: name, Limits: p.limits(client, route), Cost: cost}
}

// Named is the request of a configured client (nil: an anonymous one keyed by who.Key) under the
// named policy only ("" for those that apply to it outside any route); ok is false if no policy
// has that name.
func (p *Policies) Named(who identity.Identity, client *config.Client, policy string) (req Request, ok bool) {
	req = Request{Who: who, Client: "anonymous", Cost: config.DefaultCost}
	if client != nil {
		req.Client = client.Name
	}
	if policy == "" {
		req.Limits = p.limits(client, nil)
		return req, true
	}
	a, ok := p.cfg.Applied(policy)
	if !ok {
		return req, false
	}
	req.Limits = []Limit{a}
	return req, true
}

// limits returns the Limits of the policies that apply to client on route. They are made once
// per configuration and shared by every request: do not modify them.
func (p *Policies) limits(client *config.Client, route *config.Route) []Limit {
	return p.cfg.AppliedPoliciesFor(client, route)
}

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

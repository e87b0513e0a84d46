package decision

import (
	"crypto/sha256"
	"fmt"
	"net/http"
	"slices"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/identity"
)

// Policies resolves requests under one configuration: who sent it (the identity sources in
// order), its route, its cost and the policies that apply. It is safe for concurrent use.
type Policies struct {
	cfg   *config.Config
	chain identity.Chain
	// For key_by: the jwt claims any policy is keyed by (nil: none), each one's index there,
	// and how the remote address is masked (the ip source's way, or the default prefixes).
	claimNames []string
	claimIndex map[string]int
	ip         identity.IP
	usage      bool // some route has usage (UsageRoute)
}

// NewPolicies returns the Policies of cfg, or the error of an identity source that cannot work
// (with its line).
func NewPolicies(cfg *config.Config) (*Policies, error) {
	chain, err := Chain(cfg)
	if err != nil {
		return nil, err
	}
	p := &Policies{cfg: cfg, chain: chain}
	for _, rt := range cfg.Routes {
		p.usage = p.usage || rt.Usage != nil
	}
	for _, id := range cfg.Identity {
		if id.IP != nil {
			p.ip = ipSource(id.IP)
			break
		}
	}
	for _, pol := range cfg.Policies {
		for _, part := range pol.KeyBy {
			if part.Attr != config.KeyJWTClaim {
				continue
			}
			if p.claimIndex == nil {
				p.claimIndex = map[string]int{}
			}
			if _, ok := p.claimIndex[part.Name]; !ok {
				p.claimIndex[part.Name] = len(p.claimNames)
				p.claimNames = append(p.claimNames, part.Name)
			}
		}
	}
	return p, nil
}

// Config returns the configuration p resolves under.
func (p *Policies) Config() *config.Config { return p.cfg }

// Chain returns the identity sources.
func (p *Policies) Chain() identity.Chain { return p.chain }

// Resolve identifies r's client and finds what applies to a request of method on path: the
// route's cost and the policies of the client on that route, each limit's Key made from r's
// attributes if its policy has a key_by.
func (p *Policies) Resolve(r identity.Request, method, path string) Request {
	var req Request
	if p.claimNames == nil {
		req = p.resolve(p.chain.Identify(r), r, nil, method, path, nil, "")
	} else {
		who, claims := p.chain.IdentifyClaims(r, p.claimNames)
		req = p.resolve(who, r, claims, method, path, nil, "")
	}
	p.seen(r, &req)
	return req
}

// For is Resolve for a client already identified, without the request: a key_by's header,
// query, jwt_claim and remote_address are absent (its client, path, path_prefix and method are
// who's, path's and method's).
func (p *Policies) For(who identity.Identity, method, path string) Request {
	return p.resolve(who, nil, nil, method, path, nil, "")
}

// resolve is Resolve of an identified request (r nil: none), with its token's claims, and on a
// usage route its usage (u) and the model its body names (ResolveUsage; else nil and "").
func (p *Policies) resolve(who identity.Identity, r identity.Request, claims []string, method, path string, u *Usage, model string) Request {
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
	limits := p.limits(client, route)
	if u != nil && u.Model != nil && len(u.Model.Applied()) > 0 { // the model's own policies join
		limits = append(slices.Clip(limits), u.Model.Applied()...)
	}
	for i := range limits {
		if limits[i].KeyBy != nil { // only then a copy: the others decide without allocating
			limits = p.keyed(limits, &attrs{who: who, r: r, method: method, path: path, claims: claims, model: model})
			break
		}
	}
	req := Request{Who: who, Client: name, Limits: limits, Cost: cost, Usage: u}
	if route != nil {
		req.After, req.Route = route.After, route
	}
	return req
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

// limits returns the Limits of the policies that apply to client on route: its own, then those of
// the levels above it (its team's, its organisation's: config.LevelsFor), all decided together.
// They are made once per configuration and shared by every request: do not modify them (a client
// in a group gets a new slice, the two joined).
func (p *Policies) limits(client *config.Client, route *config.Route) []Limit {
	own := p.cfg.AppliedPoliciesFor(client, route)
	if levels := p.cfg.LevelsFor(client, route); len(levels) > 0 {
		return append(slices.Clip(own), levels...)
	}
	return own
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
			var err error // (no JWT library here: package identity/jwt makes the source)
			src, err = identity.NewJWT(identity.JWTConfig{Header: http.CanonicalHeaderKey(j.Header), Algorithms: j.Algorithms, HMACSecret: []byte(j.Secret.Value()),
				PublicKey: j.PublicKey, Claim: j.Claim, Issuer: j.Issuer, Audience: j.Audience, Leeway: j.Leeway,
				Lookup: func(sub string) (string, bool) {
					c, ok := cfg.ClientBySubject(sub)
					if !ok {
						return "", false
					}
					return c.Name, true
				}})
			if err != nil {
				return nil, fmt.Errorf("%s:%d: identity: %w", cfg.File, id.Line, err)
			}
		case id.IP != nil:
			src = ipSource(id.IP)
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

// ipSource is the ip source of cfg.
func ipSource(cfg *config.IPSource) identity.IP {
	return identity.IP{TrustedProxies: cfg.TrustedProxies, IPv4Prefix: cfg.IPv4Prefix,
		IPv6Prefix: cfg.IPv6Prefix, ForwardedHeader: cfg.ForwardedHeader}
}

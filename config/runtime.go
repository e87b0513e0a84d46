// This file merges clients managed at runtime (the clients API, package clients) into a loaded
// configuration: the same lookups and resolutions the file's clients get, with each client's
// overrides of its policies' limits applied.

package config

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
)

// Where a client comes from (Client.Source).
const (
	SourceFile = ""    // the configuration file's clients:
	SourceAPI  = "api" // the clients API (package clients), kept in the store
)

// Override is what a client has of a policy instead of the policy's own: its limit, its burst
// (token and leaky buckets), its period. Nil fields keep the policy's. The state stays the
// policy's (the same key), so an override that changes the limit keeps what was used.
type Override struct {
	Limit  *int64         `json:"limit,omitempty"`
	Burst  *int64         `json:"burst,omitempty"`
	Period *time.Duration `json:"-"`
}

// IsZero reports whether o changes nothing.
func (o Override) IsZero() bool { return o.Limit == nil && o.Burst == nil && o.Period == nil }

// Apply returns p with o's fields in place of its own.
func (o Override) Apply(p sluice.Policy) sluice.Policy {
	if o.Limit != nil {
		p.Limit = *o.Limit
	}
	if o.Burst != nil {
		p.Burst = *o.Burst
	}
	if o.Period != nil {
		p.Period = *o.Period
	}
	return p
}

// FieldError is a runtime client's error, naming the field of the clients API's body it is
// about ("overrides.gold.limit"), so that a 400 says which.
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// CheckClient checks cl as a client of c would be checked in the file: its name, its keys and
// subject (and that some identity source matches them), its policies, its overrides (each
// policy's rules hold with them, and every route's cost still fits). Whether a key or subject is
// another client's is the caller's to check, against the clients it runs. The error is a
// *FieldError.
func (c *Config) CheckClient(cl *Client) error {
	if !clientNameRE.MatchString(cl.Name) || len(cl.Name) > 128 {
		return fieldErr("name", "%q must be 1 to 128 of A-Z, a-z, 0-9, '.', '_' and '-'", cl.Name)
	}
	if cl.Name == reservedClientName {
		return fieldErr("name", "%q names requests of no configured client; choose another name", cl.Name)
	}
	if len(cl.APIKeySHA256) == 0 && cl.JWTSubject == "" {
		return fieldErr("api_key_sha256", "api_key_sha256 (or a generated key) or jwt_subject is required: how else would the client be known?")
	}
	sums := map[[sha256.Size]byte]bool{}
	for i, h := range cl.APIKeySHA256 {
		var sum [sha256.Size]byte
		if len(h) != 2*sha256.Size {
			return fieldErr(fmt.Sprintf("api_key_sha256[%d]", i), "must be 64 hex digits (the SHA-256 of the key: printf %%s KEY | sha256sum), not %d characters", len(h))
		}
		if _, err := hex.Decode(sum[:], []byte(h)); err != nil {
			return fieldErr(fmt.Sprintf("api_key_sha256[%d]", i), "must be 64 hex digits (0-9, a-f)")
		}
		if sums[sum] {
			return fieldErr(fmt.Sprintf("api_key_sha256[%d]", i), "is listed twice")
		}
		sums[sum] = true
	}
	if len(cl.APIKeySHA256) > 0 && !slices.ContainsFunc(c.Identity, func(id Identity) bool { return id.APIKey != nil }) {
		return fieldErr("api_key_sha256", "is never matched: the configuration's identity has no api_key source")
	}
	if cl.JWTSubject != "" && !slices.ContainsFunc(c.Identity, func(id Identity) bool { return id.JWT != nil }) {
		return fieldErr("jwt_subject", "is never matched: the configuration's identity has no jwt source")
	}
	for i, name := range cl.Policy {
		if _, ok := c.policies[name]; !ok {
			return fieldErr(fmt.Sprintf("policy[%d]", i), "%q is not a policy (%s)", name, c.knownPolicies())
		}
	}
	if err := c.checkClientGroups(cl); err != nil { // (config/levels.go)
		return err
	}
	return c.checkOverrides(cl)
}

// checkOverrides checks cl's overrides: each names a policy that applies to cl, changes only
// what that policy's algorithm has, and leaves a valid policy that every route's cost fits.
func (c *Config) checkOverrides(cl *Client) error {
	names := cl.resolutionNames(c)
	for _, name := range slices.Sorted(maps.Keys(cl.Overrides)) {
		o := cl.Overrides[name]
		field := "overrides." + name
		pol, ok := c.policies[name]
		if !ok {
			return fieldErr(field, "%q is not a policy (%s)", name, c.knownPolicies())
		}
		if !slices.Contains(names, name) {
			return fieldErr(field, "policy %q does not apply to this client (its policies: %s)", name, strings.Join(names, ", "))
		}
		if pol.KeyBy != nil {
			return fieldErr(field, "policy %q counts by key_by, not per client: one client cannot have its own limit of it", name)
		}
		if pol.LocalBudget.Size > 0 {
			return fieldErr(field, "policy %q has a local_budget, which instances take by the policy's limit; override a policy without one", name)
		}
		if o.IsZero() {
			return fieldErr(field, "changes nothing: give limit, burst or period")
		}
		if o.Burst != nil && pol.Algorithm != sluice.TokenBucket && pol.Algorithm != sluice.LeakyBucket {
			return fieldErr(field+".burst", "policy %q is %s; only token-bucket and leaky-bucket have a burst", name, pol.Algorithm)
		}
		if o.Period != nil && pol.Calendar != algorithm.NoCalendar {
			return fieldErr(field+".period", "policy %q has a calendar period; its period cannot be overridden", name)
		}
		p := o.Apply(pol.Policy)
		if err := p.Validate(); err != nil {
			f := field + ".limit"
			switch {
			case o.Burst != nil && o.Limit == nil:
				f = field + ".burst"
			case o.Period != nil && o.Limit == nil:
				f = field + ".period"
			}
			return fieldErr(f, "%s", strings.TrimPrefix(err.Error(), sluice.ErrInvalidPolicy.Error()+": "))
		}
		for _, rt := range c.Routes {
			if len(rt.Policy) > 0 || rt.Usage != nil && unitOf(pol, true) != UnitRequests {
				continue // the route's own policies apply there; usage routes estimate
			}
			var d sluice.Decision
			if err := algorithm.CheckCost(&p, rt.Cost, &d); err != nil {
				return fieldErr(field+".limit", "route %s%s costs %d, more than this limit could ever approve", rt.Method+" ", rt.PathPrefix, rt.Cost)
			}
		}
	}
	return nil
}

func (c *Config) knownPolicies() string {
	names := make([]string, 0, len(c.Policies))
	for _, pol := range c.Policies {
		names = append(names, pol.Name)
	}
	if len(names) > 10 {
		names = append(names[:10], "...")
	}
	if len(names) == 0 {
		return "no policies are configured"
	}
	return "known: " + strings.Join(names, ", ")
}

// ErrClientConflict is WithClients' error for two clients with one name, key or subject.
var ErrClientConflict = errors.New("clients conflict")

// WithClients returns a copy of c whose clients are clients (in that order; the file's among
// them as the caller chose: see package clients for which wins), with their lookups and
// resolutions made as Load makes the file's. c is not changed. Each client must have passed
// CheckClient; a name, key or subject that two clients share is ErrClientConflict.
func (c *Config) WithClients(clients []*Client) (*Config, error) {
	n := *c
	n.Clients = make([]*Client, len(clients))
	n.byName = make(map[string]*Client, len(clients))
	n.byKey = make(map[[sha256.Size]byte]*Client, len(clients))
	n.bySubject = map[string]*Client{}
	n.budgets = maps.Clone(c.budgets)
	for i, src := range clients {
		cl := *src // (index and resolution are this configuration's)
		cl.index = i
		if _, ok := n.byName[cl.Name]; ok {
			return nil, fmt.Errorf("%w: two clients are called %q", ErrClientConflict, cl.Name)
		}
		n.byName[cl.Name] = &cl
		for _, h := range cl.APIKeySHA256 {
			var sum [sha256.Size]byte
			if _, err := hex.Decode(sum[:], []byte(h)); err != nil {
				return nil, fmt.Errorf("client %q: api_key_sha256 %q is not hex", cl.Name, h)
			}
			if prev, ok := n.byKey[sum]; ok {
				return nil, fmt.Errorf("%w: clients %q and %q share a key (%s…)", ErrClientConflict, prev.Name, cl.Name, h[:8])
			}
			n.byKey[sum] = &cl
		}
		if cl.JWTSubject != "" {
			if prev, ok := n.bySubject[cl.JWTSubject]; ok {
				return nil, fmt.Errorf("%w: clients %q and %q share jwt_subject %q", ErrClientConflict, prev.Name, cl.Name, cl.JWTSubject)
			}
			n.bySubject[cl.JWTSubject] = &cl
		}
		cl.resolution = n.clientResolution(&cl, "", false)
		n.resolveLevels(&cl) // its team's and organisation's policies (config/levels.go)
		n.Clients[i] = &cl
	}
	n.Routes = make([]*Route, len(c.Routes))
	for i, src := range c.Routes {
		rt := *src
		if rt.scoped != nil {
			n.scopeRoute(&rt)
		}
		n.Routes[i] = &rt
	}
	n.sortRoutes()
	return &n, nil
}

// clientResolution is the resolution of cl's policies (its own, or the default) under scope,
// with its overrides applied (each overridden policy keeps its Name: its state is the
// policy's, read with the client's limit).
func (c *Config) clientResolution(cl *Client, scope string, usage bool) resolution {
	if len(cl.Policy) == 0 && scope == "" && !usage && len(cl.Overrides) == 0 {
		return c.defaults
	}
	res := c.resolution(cl.resolutionNames(c), scope, usage)
	if len(cl.Overrides) == 0 {
		return res
	}
	for i := range res.applied {
		a := &res.applied[i]
		if o, ok := cl.Overrides[a.PolicyName]; ok {
			a.Policy = o.Apply(a.Policy)
			res.policies[i] = a.Policy
		}
	}
	return res
}

// scopeRoute makes rt's resolutions per client (a route with a scope or usage, and no
// policies of its own).
func (c *Config) scopeRoute(rt *Route) {
	usage := rt.Usage != nil
	rt.scoped = make([]resolution, len(c.Clients)+1)
	for j, cl := range c.Clients {
		rt.scoped[j] = c.clientResolution(cl, rt.Scope, usage)
	}
	rt.scoped[len(c.Clients)] = c.resolution(c.DefaultPolicy, rt.Scope, usage)
}

// sortRoutes orders matchList: longest path_prefix first, then method-specific before any.
func (c *Config) sortRoutes() {
	c.matchList = slices.Clone(c.Routes)
	slices.SortStableFunc(c.matchList, func(a, b *Route) int {
		if d := len(b.PathPrefix) - len(a.PathPrefix); d != 0 {
			return d
		}
		switch {
		case a.Method != "" && b.Method == "":
			return -1
		case a.Method == "" && b.Method != "":
			return 1
		}
		return 0
	})
}

// Kinds of groups (CheckGroup).
const (
	GroupTeam         = "team"
	GroupOrganisation = "organisation"
)

// CheckGroup checks g as a team or an organisation (kind) of c would be checked in the file: its
// name, its policies (at least one, each known, none with a key_by), and a team's organisation
// (one of c's). The error is a *FieldError.
func (c *Config) CheckGroup(g *Group, kind string) error {
	if !clientNameRE.MatchString(g.Name) || len(g.Name) > 128 {
		return fieldErr("name", "%q must be 1 to 128 of A-Z, a-z, 0-9, '.', '_' and '-'", g.Name)
	}
	if len(g.Policy) == 0 {
		return fieldErr("policy", "is required: the policies its clients' requests are charged together")
	}
	for i, name := range g.Policy {
		pol, ok := c.policies[name]
		switch {
		case !ok:
			return fieldErr(fmt.Sprintf("policy[%d]", i), "%q is not a policy (%s)", name, c.knownPolicies())
		case pol.KeyBy != nil:
			return fieldErr(fmt.Sprintf("policy[%d]", i), "policy %q has a key_by; a group's policies count for the whole group (its key is the group's)", name)
		case slices.Contains(g.Policy[:i], name):
			return fieldErr(fmt.Sprintf("policy[%d]", i), "%q is listed twice", name)
		}
	}
	switch {
	case kind == GroupOrganisation && g.Organisation != "":
		return fieldErr("organisation", "an organisation is in no other")
	case kind == GroupTeam && g.Organisation != "" && c.orgs[g.Organisation] == nil:
		return fieldErr("organisation", "%q is not an organisation (%s)", g.Organisation, knownGroups(c.Organisations, "organisations"))
	}
	return nil
}

// WithGroups returns a copy of c whose teams and organisations are teams and orgs (each passed
// CheckGroup; the file's among them as the caller chose). Merge clients into it after
// (WithClients): their levels are resolved from these.
func (c *Config) WithGroups(teams, orgs []*Group) *Config {
	n := *c
	n.Teams, n.Organisations = teams, orgs
	n.teams, n.orgs = make(map[string]*Group, len(teams)), make(map[string]*Group, len(orgs))
	for _, g := range teams {
		n.teams[g.Name] = g
	}
	for _, g := range orgs {
		n.orgs[g.Name] = g
	}
	return &n
}

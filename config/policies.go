// This file reads policies, clients and routes, checks the policy names they refer to, and
// resolves, once the file is valid, which policies apply to each client and route.

package config

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/shed"
)

// refs remembers what the file refers to, checked once every policy is known.
type refs struct {
	lists []refList             // every list of policy names
	scope map[*Route]*yaml.Node // where each route's scope is written
	cost  map[*Route]*yaml.Node // where each route's cost is written (absent: the default)
	route map[*Route]string     // each route's path, for errors
	prio  map[*Route]*yaml.Node // where each route's priority is written
}

// refList is one list of policy names and where its resolution goes.
type refList struct {
	path, field string
	list        []ref
	dst         *[]string
}

// itemPath is the path of a list's item i, with its name if it has one: policies[2] "gold".
func (p *parser) itemPath(list string, i int, m *mapping) string {
	path := fmt.Sprintf("%s[%d]", list, i)
	if n := p.get(m, "name"); n != nil && n.Kind == yaml.ScalarNode && n.Value != "" {
		v := n.Value
		if len(v) > 40 {
			v = v[:37] + "..."
		}
		path += " " + strconv.Quote(v)
	}
	return path
}

// listItems reads a list of mappings, calling f for each one.
func (p *parser) listItems(n *yaml.Node, field string, f func(i int, item *yaml.Node, m *mapping)) {
	items, ok := p.seq(n, "", field)
	if !ok {
		return
	}
	for i, item := range items {
		at := item
		if item = p.deref(item); item == nil {
			p.errorf(at, fmt.Sprintf("%s[%d]", field, i), nil, "is empty")
			continue
		}
		if m := p.mapping(item, item, fmt.Sprintf("%s[%d]", field, i), ""); m != nil {
			f(i, item, m)
		}
	}
}

// name reads a required name that must match re and be unique among seen.
func (p *parser) name(m *mapping, path string, re *regexp.Regexp, chars string, seen map[string]*yaml.Node) (string, bool) {
	n := p.get(m, "name")
	if n == nil {
		p.errorf(m.node, path, nil, "name is required")
		return "", false
	}
	s, ok := p.str(n, path, "name")
	if !ok {
		return "", false
	}
	switch {
	case !re.MatchString(s):
		p.errorf(n, path, nil, "name %q may only have %s", s, chars)
		return "", false
	case len(s) > maxNameLen:
		p.errorf(n, path, nil, "name is longer than %d characters", maxNameLen)
		return "", false
	}
	if prev, ok := seen[s]; ok {
		p.errorf(n, path, nil, "name %q is already used at line %d", s, prev.Line)
		return "", false
	}
	if s == reservedClientName && re == clientNameRE {
		p.errorf(n, path, nil, "name %q is the key of clients that no source names; choose another", s)
		return "", false
	}
	seen[s] = n
	return s, true
}

func (p *parser) policies(n *yaml.Node, c *Config) {
	seen := map[string]*yaml.Node{}
	p.listItems(n, "policies", func(i int, item *yaml.Node, m *mapping) {
		path := p.itemPath("policies", i, m)
		p.checkKnown(m, path, policyFields...)
		pol := &Policy{Line: item.Line}
		name, nameOK := p.name(m, path, policyNameRE, "a-z, 0-9, '.', '_' and '-'", seen)
		pol.Name = name
		good := true // the fields that make the policy; the name is not one of them
		algN, limitN, periodN, burstN := p.get(m, "algorithm"), p.get(m, "limit"), p.get(m, "period"), p.get(m, "burst")
		if algN == nil {
			p.errorf(m.node, path, nil, "algorithm is required (fixed-window, sliding-log, sliding-window, token-bucket, leaky-bucket or concurrency)")
			good = false
		} else if s, ok := p.str(algN, path, "algorithm"); ok {
			a, err := sluice.ParseAlgorithm(s)
			if err != nil {
				p.errorf(algN, path, nil, "algorithm %q is unknown (want fixed-window, sliding-log, sliding-window, token-bucket, leaky-bucket or concurrency)", s)
				good = false
			}
			pol.Algorithm = a
		} else {
			good = false
		}
		at := map[string]*yaml.Node{"algorithm": algN, "limit": limitN, "period": periodN, "burst": burstN}
		// Validate stops at a policy's first problem; each field's own bounds are checked alone
		// first, so that a bad limit and a bad period are both reported, each at its line. A
		// probe is a valid policy with that one field replaced.
		probe := func(field string, set func(*sluice.Policy)) {
			pr := sluice.Policy{Name: "probe", Algorithm: sluice.FixedWindow, Limit: 1, Period: time.Second}
			set(&pr)
			if err := pr.Validate(); err != nil {
				p.policyError(err, pr.Name, path, m.node, map[string]*yaml.Node{field: at[field]})
				good = false
			}
		}
		if n := p.get(m, "counts"); n != nil {
			if s, ok := p.str(n, path, "counts"); ok {
				switch s {
				case "requests":
					pol.Counts = UnitRequests
				case "tokens":
					pol.Counts = UnitTokens
				case "usd":
					pol.Counts = UnitUSD
				default:
					p.errorf(n, path, nil, "counts %q is unknown (want requests, tokens or usd)", s)
				}
				if pol.Counts.usageOnly() && pol.Algorithm == sluice.Concurrency {
					p.errorf(n, path, nil, "counts: %s is not for a concurrency policy (it counts requests in flight)", s)
				}
			}
		}
		if limitN == nil {
			p.errorf(m.node, path, nil, "limit is required: the requests (cost units) allowed per period")
			good = false
		} else if pol.Counts == UnitUSD {
			if v, ok := p.usdLimit(limitN, path); ok {
				pol.Limit = v
				probe("limit", func(pr *sluice.Policy) { pr.Limit = v })
			} else {
				good = false
			}
		} else if v, ok := p.int(limitN, path, "limit"); ok {
			pol.Limit = v
			probe("limit", func(pr *sluice.Policy) { pr.Limit = v })
		} else {
			good = false
		}
		calN := p.get(m, "calendar")
		if calN != nil || p.get(m, "time_zone") != nil {
			good = p.calendar(m, path, pol, good)
		}
		if leaseN := p.get(m, "lease"); leaseN != nil || pol.Algorithm == sluice.Concurrency {
			good = p.lease(pol, path, periodN, leaseN) && good // (concurrency.go)
		} else if periodN == nil {
			if calN == nil {
				p.errorf(m.node, path, nil, "period is required (e.g. 1s, 1m, 24h), or calendar (day, week, month or year)")
				good = false
			}
		} else if calN != nil {
			p.errorf(periodN, path, nil, "period and calendar exclude each other: a calendar window's length is the calendar's (remove one)")
			good = false
		} else if d, ok := p.duration(periodN, path, "period"); ok {
			pol.Period = d
			probe("period", func(pr *sluice.Policy) { pr.Period = d })
		} else {
			good = false
		}
		if burstN != nil {
			if v, ok := p.int(burstN, path, "burst"); ok {
				pol.Burst = v
				// A token bucket takes any burst in range; its limit and period keep the
				// refill-time bound out of the way.
				probe("burst", func(pr *sluice.Policy) {
					pr.Algorithm, pr.Limit, pr.Period, pr.Burst = sluice.TokenBucket, algorithm.MaxLimit, time.Millisecond, v
				})
			} else {
				good = false
			}
		}
		if n := p.get(m, "dry_run"); n != nil {
			pol.DryRun, _ = p.bool(n, path, "dry_run")
		}
		if n := p.get(m, "key_by"); n != nil {
			pol.KeyBy = p.keyBy(n, path, c)
		}
		budgetN := p.get(m, "local_budget")
		if budgetN != nil {
			pol.LocalBudget, good = p.localBudget(budgetN, path, pol, good)
		}
		if n := p.get(m, "global"); n != nil {
			p.globalPolicy(n, path, pol, c, m) // (config/region.go)
		}
		if good { // every field good on its own (the name aside): what is left is how they combine
			whole := pol.Policy
			whole.Name = "probe" // the name is checked above; it is only cut out of the message
			if err := whole.Validate(); err != nil {
				p.policyError(err, whole.Name, path, m.node, at)
			} else if budgetN != nil {
				p.budgetError(pol.LocalBudget.Validate(whole), whole.Name, path, budgetN)
			}
		}
		if nameOK {
			c.policies[name] = pol // even if invalid: references to it are not the problem
			c.Policies = append(c.Policies, pol)
		}
	})
}

// calendar reads a policy's calendar (day, week, month, year) and time_zone (an IANA name,
// default UTC) into pol; good says whether the policy's other fields are, and stays so only if
// these are too. Only the window algorithms count by the calendar, and a zone needs one.
func (p *parser) calendar(m *mapping, path string, pol *Policy, good bool) bool {
	calN, zoneN := p.get(m, "calendar"), p.get(m, "time_zone")
	if calN != nil {
		if s, ok := p.str(calN, path, "calendar"); !ok {
			good = false
		} else if c, err := sluice.ParseCalendar(s); err != nil {
			p.errorf(calN, path, nil, "calendar %q is unknown (want day, week, month or year)", s)
			good = false
		} else if a := pol.Algorithm; a != 0 && a != sluice.FixedWindow && a != sluice.SlidingWindow {
			p.errorf(calN, path, nil, "calendar has no meaning for %v: only fixed-window and sliding-window count by the calendar", a)
			good = false
		} else {
			pol.Calendar = c
		}
	}
	if zoneN == nil {
		return good
	}
	s, ok := p.str(zoneN, path, "time_zone")
	switch {
	case !ok:
		return false
	case calN == nil:
		p.errorf(zoneN, path, nil, "time_zone has no meaning without calendar: a period's windows are the same in every zone")
		return false
	case s == "" || s == "Local":
		// LoadLocation takes both, as UTC and as this machine's zone, which other instances
		// may not share.
		p.errorf(zoneN, path, nil, "time_zone %q is not a zone name (e.g. Europe/Berlin, America/New_York, UTC)", s)
		return false
	}
	loc, err := time.LoadLocation(s)
	if err != nil {
		p.errorf(zoneN, path, nil, "time_zone %q is not a known IANA time zone (e.g. Europe/Berlin, America/New_York, UTC)", s)
		return false
	}
	pol.Location = loc
	return good
}

// localBudget reads a policy's local_budget: {size: N, max_age: D}, both required. good says
// whether the policy's own fields are; it stays so only if the budget's are too (their bounds
// against the policy are checked once the policy is whole).
func (p *parser) localBudget(n *yaml.Node, path string, pol *Policy, good bool) (sluice.LocalBudget, bool) {
	var b sluice.LocalBudget
	m := p.mapping(n, n, path, "local_budget")
	if m == nil {
		return b, false
	}
	p.checkKnown(m, path+" local_budget", budgetFields...)
	sizeN, ageN := p.get(m, "size"), p.get(m, "max_age")
	if sizeN == nil {
		p.errorf(n, path, nil, "local_budget.size is required: the units an instance takes from the store at once")
		good = false
	} else if v, ok := p.int(sizeN, path, "local_budget.size"); ok {
		b.Size = v
	} else {
		good = false
	}
	if ageN == nil {
		p.errorf(n, path, nil, "local_budget.max_age is required: how long an instance may spend a budget (e.g. 100ms)")
		good = false
	} else if d, ok := p.duration(ageN, path, "local_budget.max_age"); ok {
		b.MaxAge = d
	} else {
		good = false
	}
	if b.Size < 0 || (sizeN != nil && b.Size == 0) {
		p.errorf(sizeN, path, nil, "local_budget.size %d must be > 0", b.Size)
		good = false
	}
	if ageN != nil && b.MaxAge < time.Millisecond && good {
		p.errorf(ageN, path, nil, "local_budget.max_age %v must be ≥ 1ms", b.MaxAge)
		good = false
	}
	return b, good
}

// budgetError reports a LocalBudget.Validate error at the budget's field it names.
func (p *parser) budgetError(err error, name, path string, n *yaml.Node) {
	if err == nil {
		return
	}
	msg := err.Error()
	if _, rest, ok := strings.Cut(msg, fmt.Sprintf("policy %q: ", name)); ok {
		msg = rest
	}
	where := n
	if m := p.mapping(n, n, path, "local_budget"); m != nil {
		field, _, _ := strings.Cut(msg, " ")
		if sub, ok := strings.CutPrefix(field, "local_budget."); ok && p.get(m, sub) != nil {
			where = p.get(m, sub)
		}
	}
	p.errorf(where, path, err, "%s", msg)
}

// policyError reports a Validate error of the policy called name at the field it names
// ("burst -5 must be ≥ 0").
func (p *parser) policyError(err error, name string, path string, item *yaml.Node, at map[string]*yaml.Node) {
	msg := err.Error()
	if _, rest, ok := strings.Cut(msg, fmt.Sprintf("policy %q: ", name)); ok {
		msg = rest
	}
	where := item
	field, _, _ := strings.Cut(msg, " ")
	if n := at[strings.Trim(field, "(")]; n != nil {
		where = n
	}
	p.errorf(where, path, err, "%s", msg)
}

func (p *parser) clients(n *yaml.Node, c *Config, r *refs) {
	seen := map[string]*yaml.Node{}
	keys := map[[sha256.Size]byte]*yaml.Node{}
	subjects := map[string]*yaml.Node{}
	c.byName, c.byKey, c.bySubject = map[string]*Client{}, map[[sha256.Size]byte]*Client{}, map[string]*Client{}
	p.listItems(n, "clients", func(i int, item *yaml.Node, m *mapping) {
		path := p.itemPath("clients", i, m)
		p.checkKnown(m, path, clientFields...)
		cl := &Client{Line: item.Line, index: len(c.Clients)}
		name, ok := p.name(m, path, clientNameRE, "A-Z, a-z, 0-9, '.', '_' and '-'", seen)
		cl.Name = name
		hashN, subjN := p.get(m, "api_key_sha256"), p.get(m, "jwt_subject")
		if hashN != nil {
			var hashes []*yaml.Node
			switch hashN.Kind {
			case yaml.SequenceNode:
				if len(hashN.Content) == 0 {
					p.errorf(hashN, path, nil, "api_key_sha256 is an empty list")
				}
				for i, h := range hashN.Content {
					if h = p.deref(h); h == nil {
						p.errorf(hashN.Content[i], path, nil, "api_key_sha256[%d] is empty", i)
					} else {
						hashes = append(hashes, h)
					}
				}
			default:
				hashes = []*yaml.Node{hashN}
			}
			for _, h := range hashes {
				s, ok := p.str(h, path, "api_key_sha256")
				if !ok {
					continue
				}
				var sum [sha256.Size]byte
				if len(s) != 2*sha256.Size {
					p.errorf(h, path, nil, "api_key_sha256 %q must be 64 hex digits (the SHA-256 of the key: printf %%s KEY | sha256sum), not %d characters", s, len(s))
					continue
				}
				if _, err := hex.Decode(sum[:], []byte(s)); err != nil {
					p.errorf(h, path, nil, "api_key_sha256 %q must be 64 hex digits (0-9, a-f)", s)
					continue
				}
				if prev, ok := keys[sum]; ok {
					p.errorf(h, path, nil, "api_key_sha256 %s… is already a key at line %d; a key names one client", strings.ToLower(s[:8]), prev.Line)
					continue
				}
				keys[sum] = h
				cl.APIKeySHA256 = append(cl.APIKeySHA256, strings.ToLower(s))
				c.byKey[sum] = cl
			}
		}
		if subjN != nil {
			if s, ok := p.str(subjN, path, "jwt_subject"); ok {
				if prev, ok := subjects[s]; ok {
					p.errorf(subjN, path, nil, "jwt_subject %q is already a client's at line %d", s, prev.Line)
				} else if s == "" {
					p.errorf(subjN, path, nil, "jwt_subject is empty")
				} else {
					subjects[s] = subjN
					cl.JWTSubject = s
					c.bySubject[s] = cl
				}
			}
		}
		if hashN == nil && subjN == nil {
			p.errorf(m.node, path, nil, "api_key_sha256 or jwt_subject is required: how else would the client be known?")
		}
		if hashN != nil && !p.identityBad && !slices.ContainsFunc(c.Identity, func(id Identity) bool { return id.APIKey != nil }) {
			p.errorf(hashN, path, nil, "api_key_sha256 is never matched: identity has no api_key source")
		}
		if subjN != nil && !p.identityBad && !slices.ContainsFunc(c.Identity, func(id Identity) bool { return id.JWT != nil }) {
			p.errorf(subjN, path, nil, "jwt_subject is never matched: identity has no jwt source")
		}
		if n := p.get(m, "policy"); n != nil {
			r.lists = append(r.lists, refList{path, "policy", p.names(n, path, "policy"), &cl.Policy})
		}
		p.clientGroups(m, path, cl, c) // team, organisation (config/levels.go)
		if ok {
			c.byName[name] = cl
			c.Clients = append(c.Clients, cl)
		}
	})
}

func (p *parser) routes(n *yaml.Node, c *Config, r *refs) {
	seen := map[string]*yaml.Node{}
	p.listItems(n, "routes", func(i int, item *yaml.Node, m *mapping) {
		path := fmt.Sprintf("routes[%d]", i)
		if n := p.get(m, "path_prefix"); n != nil && n.Kind == yaml.ScalarNode && len(n.Value) <= 60 {
			what := n.Value
			if mn := p.get(m, "method"); mn != nil && mn.Kind == yaml.ScalarNode && len(mn.Value) <= 20 && mn.Value != "" {
				what = strings.ToUpper(mn.Value) + " " + what
			}
			path += " " + strconv.Quote(what)
		}
		p.checkKnown(m, path, routeFields...)
		rt := &Route{Line: item.Line, Cost: DefaultCost}
		if n := p.get(m, "method"); n != nil {
			if s, ok := p.str(n, path, "method"); ok {
				if s != "" && !headerNameRE.MatchString(s) {
					p.errorf(n, path, nil, "method %q is not an HTTP method", s)
				}
				rt.Method = strings.ToUpper(s)
			}
		}
		prefixN := p.get(m, "path_prefix")
		if prefixN == nil {
			p.errorf(m.node, path, nil, "path_prefix is required (e.g. path_prefix: /reports; / matches every path)")
		} else if s, ok := p.str(prefixN, path, "path_prefix"); ok {
			if !strings.HasPrefix(s, "/") {
				p.errorf(prefixN, path, nil, "path_prefix %q must start with /", s)
			} else {
				rt.PathPrefix = s
				key := rt.Method + " " + s
				if prev, ok := seen[key]; ok {
					p.errorf(prefixN, path, nil, "%s is already a route at line %d", strings.TrimSpace(key), prev.Line)
				}
				seen[key] = prefixN
			}
		}
		r.route[rt] = path
		if n := p.get(m, "cost"); n != nil {
			r.cost[rt] = n
			if v, ok := p.int(n, path, "cost"); ok {
				if v < 0 {
					p.errorf(n, path, nil, "cost %d must be ≥ 0", v)
				} else {
					rt.Cost = v
				}
			}
		}
		if n := p.get(m, "policy"); n != nil {
			r.lists = append(r.lists, refList{path, "policy", p.names(n, path, "policy"), &rt.Policy})
		}
		if n := p.get(m, "scope"); n != nil {
			if s, ok := p.str(n, path, "scope"); ok {
				if !policyNameRE.MatchString(s) || len(s) > maxNameLen {
					p.errorf(n, path, nil, "scope %q may only have a-z, 0-9, '.', '_' and '-' (at most %d)", s, maxNameLen)
				} else {
					rt.Scope = s
					r.scope[rt] = n
				}
			}
		}
		rt.After = p.after(m, path, rt)
		if n := p.get(m, "usage"); n != nil {
			rt.Usage = p.usage(n, path) // (config/usage.go)
			if rt.After != nil && rt.After.Field != "refund_on" {
				p.errorf(&yaml.Node{Line: rt.After.Line, Column: 1}, path, nil, "%s and usage exclude each other: a usage route's cost is the usage its response reports", rt.After.Field)
			}
			if cn := p.get(m, "cost"); cn != nil {
				p.errorf(cn, path, nil, "cost and usage exclude each other: a usage route's cost is its tokens (a policy with counts: requests counts each request once)")
			}
		}
		if n := p.get(m, "priority"); n != nil {
			r.prio[rt] = n
			if s, ok := p.str(n, path, "priority"); ok {
				if pr, ok := shed.ParsePriority(s); ok {
					rt.Priority = &pr
				} else {
					p.errorf(n, path, nil, "priority %q must be low, normal or high (load shedding's order)", s)
				}
			}
		}
		c.Routes = append(c.Routes, rt)
	})
}

// references checks every policy name the file refers to, and the routes' scopes.
func (p *parser) references(c *Config, r *refs) {
	for _, l := range r.lists {
		var names []string
		for i, rf := range l.list {
			f := l.field
			if len(l.list) > 1 {
				f = fmt.Sprintf("%s[%d]", l.field, i)
			}
			switch {
			case c.policies[rf.name] == nil:
				p.errorf(rf.node, l.path, nil, "%s %q is not defined in policies (%s)", f, rf.name, p.known(c))
			case slices.Contains(names, rf.name):
				p.errorf(rf.node, l.path, nil, "%s %q is listed twice", f, rf.name)
			default:
				names = append(names, rf.name)
			}
		}
		*l.dst = names
	}
	scopes := map[string]*Route{}
	for _, rt := range c.Routes {
		if rt.Scope == "" {
			continue
		}
		at, path := r.scope[rt], r.route[rt]
		if _, ok := c.policies[rt.Scope]; ok {
			p.errorf(at, path, nil, "scope %q is also a policy's name; pick another, so that their counters stay apart", rt.Scope)
		}
		if prev, ok := scopes[rt.Scope]; ok && !slices.Equal(prev.Policy, rt.Policy) {
			p.errorf(at, path, nil, "scope %q is also the scope of the route at line %d, with other policies; routes that share a scope must share their policy", rt.Scope, prev.Line)
		} else if !ok {
			scopes[rt.Scope] = rt
		}
	}
}

// known lists the policy names for "is not a policy" errors.
func (p *parser) known(c *Config) string { return c.knownPolicies() }

// resolveAll builds the lookups and every resolution, once the file is known to be valid, and
// checks that every route's cost can fit the policies that apply on it.
func (p *parser) resolveAll(c *Config, r *refs) {
	c.defaults = c.resolution(c.DefaultPolicy, "", false)
	for _, cl := range c.Clients {
		cl.resolution = c.clientResolution(cl, "", false)
		c.resolveLevels(cl) // its team's and organisation's policies (config/levels.go)
	}
	p.usageResolutions(c, r) // (config/usage.go)
	for _, rt := range c.Routes {
		usage := rt.Usage != nil
		if len(rt.Policy) > 0 {
			res := c.resolution(rt.Policy, rt.Scope, usage)
			rt.own = &res
		} else if rt.Scope != "" || usage {
			// (a usage route counts tokens where the client's policies elsewhere count requests)
			c.scopeRoute(rt)
		}
		// A cost that no state could ever approve is a configuration error, not a 429 forever.
		checked := map[string]bool{}
		checkAll := func(res *resolution) {
			for _, a := range res.applied {
				if checked[a.PolicyName] {
					continue
				}
				checked[a.PolicyName] = true
				var d sluice.Decision
				pol := c.policies[a.PolicyName].Policy
				cost := rt.Cost
				if a.Unit != UnitRequests { // (a usage route's estimates: config/usage.go)
					continue
				}
				if err := algorithm.CheckCost(&pol, cost, &d); err != nil {
					at := r.cost[rt]
					if at == nil {
						at = &yaml.Node{Line: rt.Line}
					}
					msg := strings.TrimPrefix(err.Error(), sluice.ErrCostExceedsLimit.Error()+": ")
					p.errorf(at, r.route[rt], err, "%s", msg)
				}
			}
		}
		switch {
		case rt.own != nil:
			checkAll(rt.own)
		case rt.scoped != nil:
			for j := range rt.scoped {
				checkAll(&rt.scoped[j])
			}
		default:
			checkAll(&c.defaults)
			for _, cl := range c.Clients {
				checkAll(&cl.resolution)
			}
		}
		for _, cl := range c.Clients { // (its groups' policies apply on every route)
			checkAll(&resolution{applied: c.LevelsFor(cl, rt)})
		}
	}
	c.sortRoutes()
}

// resolutionNames is the names of the client's policies: its own, or the default.
func (cl *Client) resolutionNames(c *Config) []string {
	if len(cl.Policy) > 0 {
		return cl.Policy
	}
	return c.DefaultPolicy
}

// resolution resolves names (all known) under scope.
func (c *Config) resolution(names []string, scope string, usage bool) resolution {
	res := resolution{policies: make([]sluice.Policy, 0, len(names)), applied: make([]AppliedPolicy, 0, len(names))}
	for _, name := range names {
		pol := c.policies[name]
		if !usage && pol.Counts.usageOnly() {
			continue // tokens and money are counted on usage routes only
		}
		sp := pol.Policy
		switch {
		case scope == "":
		case len(names) == 1:
			sp.Name = scope
		default:
			sp.Name = scope + "/" + name
		}
		if pol.LocalBudget.Size > 0 {
			if c.budgets == nil {
				c.budgets = map[string]sluice.LocalBudget{}
			}
			c.budgets[sp.Name] = pol.LocalBudget
		}
		res.policies = append(res.policies, sp)
		res.applied = append(res.applied, AppliedPolicy{Policy: sp, PolicyName: name, DryRun: pol.DryRun, KeyBy: pol.KeyBy, Unit: unitOf(pol, usage), Global: pol.Global})
	}
	return res
}

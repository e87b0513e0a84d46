// This file reads what a route in front of an LLM API needs: the route's usage (how its cost is
// read from the response's body, and estimated from the request's), what each policy counts
// there (requests, tokens or micro-dollars), and the models' table (prices, and each model's
// own policies).

package config

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/answer"
	"github.com/sluicehq/sluice/llm"
)

// Unit is what a policy counts.
type Unit uint8

const (
	// UnitDefault is a policy without counts: requests (the route's cost) on a route without
	// usage, tokens on a route with one.
	UnitDefault  Unit = iota
	UnitRequests      // the route's cost per request (1 by default), on every route
	UnitTokens        // a usage route's tokens (Usage.Count); it applies on usage routes only
	UnitUSD           // micro-dollars: a usage route's tokens at their model's price; on usage routes only
)

var unitNames = [...]string{UnitDefault: "", UnitRequests: "requests", UnitTokens: "tokens", UnitUSD: "usd"}

func (u Unit) String() string {
	if int(u) < len(unitNames) {
		return unitNames[u]
	}
	return "Unit(" + strconv.Itoa(int(u)) + ")"
}

// Noun is what an answer calls the unit, plural ("" for requests).
func (u Unit) Noun() string {
	switch u {
	case UnitTokens:
		return "tokens"
	case UnitUSD:
		return "micro-dollars"
	}
	return ""
}

// usageOnly reports whether a policy counting u applies on usage routes only.
func (u Unit) usageOnly() bool { return u == UnitTokens || u == UnitUSD }

// Usage is a route's cost read from its response's body: an LLM API's token usage. Each request
// is charged an estimate up front, read from its body (Estimate), and settled once its response
// ends to the usage the response reports (llm.Meter), counted as Count says.
type Usage struct {
	Format  llm.Format
	Field   llm.Path    // Format llm.Field: where the number is
	Count   llm.Count   // which tokens are the cost; default total
	Weights llm.Weights // Count llm.CountWeighted
	// Estimate is how a request's body is turned into the tokens it reserves.
	Estimate llm.EstimateRule
	// MaxBody is the most bytes of a request body read for the estimate; a longer body is
	// answered 413.
	MaxBody int64
	// InjectUsage asks an OpenAI-style upstream to report a stream's usage, by adding
	// stream_options.include_usage to a streamed request that lacks it.
	InjectUsage bool
	// Refund: a response that reports no usage (an error, a stream cut short, a client gone) is
	// refunded; false (the default) keeps its estimate.
	Refund bool
	// Errors is the shape of sluice's own answers on the route (refusals, a body it cannot
	// read): the upstream's, by default.
	Errors answer.Shape
	Line   int

	maxLine int // estimate.max's
}

// Defaults of a route's usage.
const (
	DefaultMaxBody       = 4 << 20 // bytes of request body read for an estimate
	DefaultDefaultOutput = 4096    // output tokens a request that sets no maximum reserves
	maxMaxBody           = 64 << 20
)

// Model is one entry of models: a model's price and its own policies, on usage routes.
type Model struct {
	Name  string // as requests name it (their body's "model"); "*": every model not listed
	Price *Price // nil: none (a usd policy cannot charge a request for it)
	// Policy are policies that apply to every request for this model on a usage route, beside
	// its route's or client's: "gpt-4o: 30,000 tokens a minute" for each client. Each counts
	// under its own name for this model: another model with the same policy counts apart.
	Policy []string
	Line   int

	applied []AppliedPolicy
}

// Applied returns the policies of the model as they apply (their state kept per model).
func (m *Model) Applied() []AppliedPolicy { return m.applied }

// Price is a model's price, in thousandths of a dollar per million tokens (which is thousandths
// of a micro-dollar per token): $2.50 per million is 2500.
type Price struct {
	Input, CachedInput, Output int64
}

// Weights returns the price as the weights that turn a usage into micro-dollars
// (llm.Cost with llm.CountWeighted).
func (p Price) Weights() llm.Weights {
	return llm.Weights{Input: p.Input, CachedInput: p.CachedInput, Output: p.Output}
}

// ModelFor returns the models entry for a request naming model: its own, else "*"'s, else nil.
func (c *Config) ModelFor(model string) *Model {
	if m, ok := c.models[model]; ok {
		return m
	}
	return c.models["*"]
}

// usage reads a route's usage.
func (p *parser) usage(n *yaml.Node, path string) *Usage {
	m := p.mapping(n, n, path, "usage")
	if m == nil {
		return nil
	}
	path += " usage"
	p.checkKnown(m, path, usageFields...)
	u := &Usage{Line: n.Line, MaxBody: DefaultMaxBody,
		Estimate: llm.EstimateRule{BytesPerToken: llm.DefaultBytesPerToken, DefaultOutput: DefaultDefaultOutput, MediaTokens: llm.DefaultMediaTokens}}
	formatN := p.get(m, "format")
	if formatN == nil {
		p.errorf(n, path, nil, "format is required: openai, anthropic or field (with field: the JSON path of the cost)")
		return nil
	}
	if s, ok := p.str(formatN, path, "format"); ok {
		switch s {
		case "openai":
			u.Format, u.Errors = llm.OpenAI, answer.ShapeOpenAI
		case "anthropic":
			u.Format, u.Errors = llm.Anthropic, answer.ShapeAnthropic
		case "field":
			u.Format = llm.Field
		default:
			p.errorf(formatN, path, nil, "format %q is unknown (want openai, anthropic or field)", s)
		}
	}
	fieldN := p.get(m, "field")
	switch {
	case fieldN != nil && u.Format != llm.Field:
		p.errorf(fieldN, path, nil, "field is only for format: field (openai and anthropic read their own usage)")
	case fieldN == nil && u.Format == llm.Field:
		p.errorf(formatN, path, nil, "format: field needs field: the JSON path of the cost in the body or its events (e.g. field: usage.total_tokens)")
	case fieldN != nil:
		if s, ok := p.str(fieldN, path, "field"); ok {
			f, err := llm.ParsePath(s)
			if err != nil {
				p.errorf(fieldN, path, nil, "field: %v", err)
			}
			u.Field = f
		}
	}
	countN, weightsN := p.get(m, "count"), p.get(m, "weights")
	if countN != nil {
		if s, ok := p.str(countN, path, "count"); ok {
			c, err := llm.ParseCount(s)
			if err != nil {
				p.errorf(countN, path, nil, "count %q is unknown (want input, output, total or weighted)", s)
			}
			u.Count = c
		}
	} else if weightsN != nil {
		u.Count = llm.CountWeighted
	}
	if u.Format == llm.Field && u.Count != llm.CountTotal && countN != nil {
		p.errorf(countN, path, nil, "count is total for format: field (its one number is the cost)")
	}
	switch {
	case weightsN != nil && u.Count != llm.CountWeighted:
		p.errorf(weightsN, path, nil, "weights are only for count: weighted (count is %s)", u.Count)
	case weightsN == nil && u.Count == llm.CountWeighted:
		p.errorf(countN, path, nil, "count: weighted needs weights (e.g. weights: {input: 1, cached_input: 0.1, output: 4})")
	case weightsN != nil:
		wm := p.mapping(weightsN, weightsN, path, "weights")
		p.checkKnown(wm, path+" weights", weightsFields...)
		u.Weights.Input = p.decimal(wm, path, "weights", "input", 1000)
		u.Weights.CachedInput = p.decimal(wm, path, "weights", "cached_input", u.Weights.Input)
		u.Weights.Output = p.decimal(wm, path, "weights", "output", 1000)
	}
	if en := p.get(m, "estimate"); en != nil {
		em := p.mapping(en, en, path, "estimate")
		p.checkKnown(em, path+" estimate", estimateFields...)
		count := func(field string, dst *int64, least int64) {
			if fn := p.get(em, field); fn != nil {
				if v, ok := p.int(fn, path, "estimate."+field); ok {
					if v < least || v > algorithm.MaxLimit {
						p.errorf(fn, path, nil, "estimate.%s %d must be in %d..%d", field, v, least, int64(algorithm.MaxLimit))
					} else {
						*dst = v
					}
				}
			}
		}
		count("bytes_per_token", &u.Estimate.BytesPerToken, 1)
		count("default_output", &u.Estimate.DefaultOutput, 0)
		count("media_tokens", &u.Estimate.MediaTokens, 0)
		count("max", &u.Estimate.Max, 1)
		if mn := p.get(em, "max"); mn != nil {
			u.maxLine = mn.Line
		}
	}
	if bn := p.get(m, "max_body"); bn != nil {
		if v, ok := p.int(bn, path, "max_body"); ok {
			if v < 1024 || v > maxMaxBody {
				p.errorf(bn, path, nil, "max_body %d must be in 1024..%d (bytes of a request body read for its estimate)", v, maxMaxBody)
			} else {
				u.MaxBody = v
			}
		}
	}
	if in := p.get(m, "inject_usage"); in != nil {
		u.InjectUsage, _ = p.bool(in, path, "inject_usage")
		if u.InjectUsage && u.Format != llm.OpenAI {
			p.errorf(in, path, nil, "inject_usage is for format: openai (stream_options.include_usage is OpenAI's; Anthropic reports a stream's usage unasked)")
		}
	}
	if nn := p.get(m, "no_usage"); nn != nil {
		if s, ok := p.str(nn, path, "no_usage"); ok {
			switch s {
			case "estimate":
			case "refund":
				u.Refund = true
			default:
				p.errorf(nn, path, nil, "no_usage %q is unknown (want estimate: the estimate stands, or refund)", s)
			}
		}
	}
	if sn := p.get(m, "errors"); sn != nil {
		if s, ok := p.str(sn, path, "errors"); ok {
			if sh, ok := answer.ParseShape(s); ok {
				u.Errors = sh
			} else {
				p.errorf(sn, path, nil, "errors %q is unknown (want openai, anthropic or problem)", s)
			}
		}
	}
	return u
}

// decimal reads m's field as a decimal with at most 3 decimals, in thousandths (def if absent).
func (p *parser) decimal(m *mapping, path, parent, field string, def int64) int64 {
	n := p.get(m, field)
	if n == nil {
		return def
	}
	if n.Kind != yaml.ScalarNode || (n.ShortTag() != "!!int" && n.ShortTag() != "!!float") {
		p.errorf(n, path, nil, "%s.%s %s must be a number", parent, field, describe(n))
		return def
	}
	w, err := llm.ParseWeight(n.Value)
	if err != nil {
		p.errorf(n, path, nil, "%s.%s: %v", parent, field, err)
		return def
	}
	return w
}

// usdLimit reads a usd policy's limit, written in dollars ("$50", "$0.25"), into micro-dollars.
func (p *parser) usdLimit(n *yaml.Node, path string) (int64, bool) {
	s, ok := p.str(n, path, "limit")
	if !ok {
		return 0, false
	}
	bad := func() (int64, bool) {
		p.errorf(n, path, nil, "limit %q of a counts: usd policy must be dollars, e.g. $50 or $0.25 (at most 6 decimals)", s)
		return 0, false
	}
	d, ok := strings.CutPrefix(s, "$")
	if !ok {
		return bad()
	}
	in, frac, dot := strings.Cut(d, ".")
	if in == "" || len(frac) > 6 || dot && frac == "" || len(in) > 9 {
		return bad()
	}
	var v int64
	for _, c := range in + (frac + "000000")[:6] {
		if c < '0' || c > '9' {
			return bad()
		}
		v = v*10 + int64(c-'0')
	}
	return v, true
}

// models reads the models' table.
func (p *parser) models(n *yaml.Node, c *Config, r *refs) {
	c.models = map[string]*Model{}
	p.listItems(n, "models", func(i int, item *yaml.Node, m *mapping) {
		path := fmt.Sprintf("models[%d]", i)
		if nn := p.get(m, "name"); nn != nil && nn.Kind == yaml.ScalarNode && len(nn.Value) <= 60 {
			path += " " + strconv.Quote(nn.Value)
		}
		p.checkKnown(m, path, modelFields...)
		md := &Model{Line: item.Line}
		if nn := p.get(m, "name"); nn == nil {
			p.errorf(m.node, path, nil, "name is required: the model as requests name it (e.g. gpt-4o), or * for every other")
		} else if s, ok := p.str(nn, path, "name"); ok {
			switch {
			case s == "" || len(s) > llm.MaxModel || strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r > '~' }):
				p.errorf(nn, path, nil, "name %q must be 1..%d printable ASCII characters without spaces (as requests name the model)", s, llm.MaxModel)
			case c.models[s] != nil:
				p.errorf(nn, path, nil, "model %q is already listed at line %d", s, c.models[s].Line)
			default:
				md.Name = s
				c.models[s] = md
			}
		}
		if pn := p.get(m, "price"); pn != nil {
			pm := p.mapping(pn, pn, path, "price")
			p.checkKnown(pm, path+" price", priceFields...)
			if pm != nil && p.get(pm, "input") == nil && p.get(pm, "output") == nil {
				p.errorf(pn, path, nil, "price needs input and output: dollars per million tokens (e.g. price: {input: 2.50, cached_input: 1.25, output: 10})")
			}
			pr := &Price{}
			pr.Input = p.decimal(pm, path, "price", "input", 0)
			pr.CachedInput = p.decimal(pm, path, "price", "cached_input", pr.Input)
			pr.Output = p.decimal(pm, path, "price", "output", 0)
			md.Price = pr
		}
		if pn := p.get(m, "policy"); pn != nil {
			r.lists = append(r.lists, refList{path, "policy", p.names(pn, path, "policy"), &md.Policy})
		}
		c.Models = append(c.Models, md)
	})
}

// unitOf is what policy pol counts on a route with usage (usage) or without.
func unitOf(pol *Policy, usage bool) Unit {
	switch {
	case pol.Counts != UnitDefault:
		return pol.Counts
	case usage && pol.Algorithm != sluice.Concurrency:
		return UnitTokens
	}
	return UnitRequests
}

// usageResolutions checks what counts tokens and money against the routes that count them, and
// resolves the models' policies (each model's state under its own name: policy@model).
func (p *parser) usageResolutions(c *Config, r *refs) {
	usageRoutes := false
	for _, rt := range c.Routes {
		if rt.Usage != nil {
			usageRoutes = true
			continue
		}
		for _, name := range rt.Policy {
			if u := c.policies[name].Counts; u.usageOnly() {
				p.errorf(&yaml.Node{Line: rt.Line, Column: 1}, r.route[rt], nil,
					"policy %q counts %s, but this route has no usage to count them from (add usage: {format: openai}, or counts: requests)", name, u)
			}
		}
	}
	priced := false
	for _, md := range c.Models {
		priced = priced || md.Price != nil
		res := c.resolution(md.Policy, "", true)
		for i := range res.applied {
			a := &res.applied[i]
			b := c.policies[a.PolicyName].LocalBudget
			a.Policy.Name += "@" + md.Name
			a.PolicyName = a.Policy.Name // (answers, metrics and /v1/check name the model too)
			if b.Size > 0 {
				c.budgets[a.Policy.Name] = b // (resolution made the map: the policy has a budget)
			}
		}
		md.applied = res.applied
	}
	if len(c.Models) > 0 && !usageRoutes {
		p.errorf(&yaml.Node{Line: c.Models[0].Line, Column: 1}, "models", nil, "models apply on usage routes, and no route has usage (e.g. routes: [{path_prefix: /v1/chat/completions, usage: {format: openai}}])")
	}
	for _, pol := range c.Policies {
		if pol.Counts == UnitUSD && !priced {
			p.errorf(&yaml.Node{Line: pol.Line, Column: 1}, "policies", nil, "policy %q counts usd, but no model has a price (models: [{name: gpt-4o, price: {input: 2.50, output: 10}}])", pol.Name)
		}
	}
	// An estimate's cap that a tokens policy could never approve would refuse every large request
	// for good: the cap is the configuration's to fit.
	for _, rt := range c.Routes {
		if rt.Usage == nil || rt.Usage.Estimate.Max == 0 {
			continue
		}
		names := rt.Policy
		if len(names) == 0 {
			names = c.DefaultPolicy
			for _, cl := range c.Clients {
				names = append(names, cl.resolutionNames(c)...)
			}
		}
		names = append(slices.Clip(names), c.groupPolicyNames()...) // (theirs apply on every route)
		// (A model's own policy smaller than the cap refuses that model's large requests with a
		// 400 that says so, as a provider answers a request too large for its model.)
		seen := map[string]bool{}
		for _, name := range names {
			pol := c.policies[name]
			if seen[name] || unitOf(pol, true) != UnitTokens {
				continue
			}
			seen[name] = true
			var d sluice.Decision
			sp := pol.Policy
			if err := algorithm.CheckCost(&sp, rt.Usage.Estimate.Max, &d); err != nil {
				p.errorf(&yaml.Node{Line: rt.Usage.maxLine, Column: 1}, r.route[rt], nil,
					"usage.estimate.max %d is more than policy %q ever allows at once (%d): a request estimated at the cap could never be approved; lower the cap or raise the policy",
					rt.Usage.Estimate.Max, name, sp.Capacity())
			}
		}
	}
}

// modelApplied returns the model's policy named "policy@model", as it applies on usage routes.
func (c *Config) modelApplied(name string) (AppliedPolicy, bool) {
	i := strings.LastIndexByte(name, '@')
	if i < 0 {
		return AppliedPolicy{}, false
	}
	if md, ok := c.models[name[i+1:]]; ok {
		for _, a := range md.applied {
			if a.PolicyName == name {
				return a, true
			}
		}
	}
	return AppliedPolicy{}, false
}

package config

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// After is what a route settles once the upstream's response is known (Route.After; nil: nothing,
// the cost charged up front stands). The route's cost is charged up front as an estimate, then
// settled with the real cost (sluice.Settler):
//
//   - CostFrom: the response header whose integer value is the real cost (a missing or garbled
//     one keeps the estimate);
//   - CountOnly: only a response with one of these statuses costs (the estimate); any other is
//     refunded — "5 failed logins in 15 minutes", successful ones costing nothing. The charge up
//     front makes the limit a hard check even for attempts in flight at once;
//   - RefundOn: a response whose status matches, or an upstream that failed or timed out, is
//     refunded.
//
// Only the proxy listener sees responses; forward-auth (whose proxy serves the response) cannot.
type After struct {
	CostFrom  string // canonical header name; "" if none
	CountOnly []int  // statuses, 100..599; nil if none
	RefundOn  []StatusMatch
	Line      int
	Field     string // the first of its fields in the file: cost_from, count_only or refund_on
}

// StatusMatch is one entry of refund_on: a status code (Code), or a class of them (Class 1..5:
// "5xx" is every status 500..599).
type StatusMatch struct {
	Code  int
	Class int
}

// Matches reports whether status is s's.
func (s StatusMatch) Matches(status int) bool {
	if s.Class != 0 {
		return status/100 == s.Class
	}
	return status == s.Code
}

func (s StatusMatch) String() string {
	if s.Class != 0 {
		return strconv.Itoa(s.Class) + "xx"
	}
	return strconv.Itoa(s.Code)
}

// Counts reports whether a response of status is charged under count_only (always, without it).
func (a *After) Counts(status int) bool {
	if a.CountOnly == nil {
		return true
	}
	for _, s := range a.CountOnly {
		if s == status {
			return true
		}
	}
	return false
}

// Refunds reports whether a response of status, or an upstream that failed (failed), is refunded
// under refund_on.
func (a *After) Refunds(status int, failed bool) bool {
	if a.RefundOn == nil {
		return false
	}
	if failed {
		return true
	}
	for _, s := range a.RefundOn {
		if s.Matches(status) {
			return true
		}
	}
	return false
}

// after reads a route's cost_from, count_only and refund_on (nil if it has none).
func (p *parser) after(m *mapping, path string, rt *Route) *After {
	a := &After{}
	set := false
	first := func(field string, n *yaml.Node) {
		if !set {
			a.Line, a.Field, set = n.Line, field, true
		}
	}
	if n := p.get(m, "cost_from"); n != nil {
		first("cost_from", n)
		cm := p.mapping(n, n, path, "cost_from")
		p.checkKnown(cm, path+" cost_from", costFromFields...)
		if h := p.get(cm, "header"); h == nil {
			if cm != nil {
				p.errorf(n, path, nil, "cost_from: header is required: the response header whose integer is the real cost (e.g. cost_from: {header: X-Usage-Tokens})")
			}
		} else if s, ok := p.str(h, path, "cost_from.header"); ok {
			if !headerNameRE.MatchString(s) {
				p.errorf(h, path, nil, "cost_from.header %q is not a header name", s)
			} else {
				a.CostFrom = http.CanonicalHeaderKey(s)
			}
		}
	}
	if n := p.get(m, "count_only"); n != nil {
		first("count_only", n)
		cm := p.mapping(n, n, path, "count_only")
		p.checkKnown(cm, path+" count_only", countOnlyFields...)
		if sn := p.get(cm, "status"); sn == nil {
			if cm != nil {
				p.errorf(n, path, nil, "count_only: status is required: the response statuses that cost (e.g. count_only: {status: [401, 403]})")
			}
		} else if items, ok := p.seq(sn, path, "count_only.status"); ok {
			if len(items) == 0 {
				p.errorf(sn, path, nil, "count_only.status is empty: list the statuses that cost (e.g. [401, 403])")
			}
			a.CountOnly = []int{}
			for i, it := range items {
				field := fmt.Sprintf("count_only.status[%d]", i)
				if v, ok := p.int(p.deref(it), path, field); ok {
					if v < 100 || v > 599 {
						p.errorf(it, path, nil, "%s %d is not an HTTP status (100..599)", field, v)
						continue
					}
					a.CountOnly = append(a.CountOnly, int(v))
				}
			}
		}
		if rt.Cost == 0 {
			p.errorf(n, path, nil, "count_only needs a cost ≥ 1 (the route's cost is 0): the cost is charged up front and refunded unless the status is one of count_only's")
		}
	}
	if n := p.get(m, "refund_on"); n != nil {
		first("refund_on", n)
		if items, ok := p.seq(n, path, "refund_on"); ok {
			if len(items) == 0 {
				p.errorf(n, path, nil, "refund_on is empty: list statuses or classes to refund (e.g. [5xx, 429])")
			}
			a.RefundOn = []StatusMatch{}
			for i, it := range items {
				it = p.deref(it)
				field := fmt.Sprintf("refund_on[%d]", i)
				if it == nil || it.Kind != yaml.ScalarNode {
					p.errorf(it, path, nil, "%s must be a status (500) or a class of them (5xx)", field)
					continue
				}
				v := strings.ToLower(it.Value)
				if len(v) == 3 && v[1:] == "xx" && v[0] >= '1' && v[0] <= '5' {
					a.RefundOn = append(a.RefundOn, StatusMatch{Class: int(v[0] - '0')})
					continue
				}
				code, err := strconv.Atoi(v)
				if err != nil || code < 100 || code > 599 {
					p.errorf(it, path, nil, "%s %q is not a status (100..599) nor a class of them (1xx..5xx)", field, it.Value)
					continue
				}
				a.RefundOn = append(a.RefundOn, StatusMatch{Code: code})
			}
		}
	}
	if !set {
		return nil
	}
	return a
}

// afterNotForwardAuth refuses a route that settles after the response in a configuration that
// also serves forward-auth (its forward_auth section, at fa): the proxy that asks forward-auth
// serves the response itself, and sluice never sees it, so such a route could not settle there.
func (p *parser) afterNotForwardAuth(c *Config, fa *yaml.Node, r *refs) {
	for _, rt := range c.Routes {
		if rt.Usage != nil {
			p.errorf(&yaml.Node{Line: rt.Usage.Line, Column: 1}, r.route[rt], nil,
				"usage needs the upstream's response, which forward-auth never sees (forward_auth is configured at line %d): serve this route through the proxy listener (listen), or remove usage", fa.Line)
		}
		if rt.After == nil {
			continue
		}
		p.errorf(&yaml.Node{Line: rt.After.Line, Column: 1}, r.route[rt], nil,
			"%s needs the upstream's response, which forward-auth never sees (forward_auth is configured at line %d): serve this route through the proxy listener (listen), or remove %s",
			rt.After.Field, fa.Line, rt.After.Field)
	}
}

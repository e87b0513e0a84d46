package config

import (
	"math"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/shed"
)

// LoadShedding is load_shedding: an adaptive limit on the requests in flight to the upstream,
// per instance (package shed), apart from the quotas. A request the quotas let through is shed
// (503, temporary-reduced-capacity) when the requests in flight reach the limit times its
// priority's share.
type LoadShedding struct {
	shed.Params
	RetryAfter      time.Duration            // the Retry-After of a shed request; whole seconds, ≥ 1s
	Anonymous       shed.Priority            // the priority of requests no identity source names (default low)
	DefaultPriority shed.Priority            // the priority of configured clients not in Priorities (default normal)
	Priorities      map[string]shed.Priority // by configured client's name
	Line            int
}

// Defaults of load_shedding.
const (
	DefaultShedMinLimit       = 4
	DefaultShedMaxLimit       = 1000
	DefaultShedWindow         = time.Second
	DefaultShedBaselineWindow = time.Minute
	DefaultShedTolerance      = 2.0
	DefaultShedSlack          = 5 * time.Millisecond
	DefaultShedRetryAfter     = time.Second
	maxShedLimit              = 1 << 20
)

// Priority returns the priority of a request of client (its configured name, or "anonymous")
// on route (nil: none): the route's, if it has one, whoever sends it; else the client's.
func (l *LoadShedding) Priority(client string, route *Route) shed.Priority {
	if route != nil && route.Priority != nil {
		return *route.Priority
	}
	if client == reservedClientName {
		return l.Anonymous
	}
	if p, ok := l.Priorities[client]; ok {
		return p
	}
	return l.DefaultPriority
}

// loadShedding reads load_shedding, once the clients are known (priorities names them).
func (p *parser) loadShedding(n *yaml.Node, c *Config) *LoadShedding {
	const path = "load_shedding"
	m := p.mapping(n, n, "", path)
	if m == nil {
		return nil
	}
	p.checkKnown(m, path, loadSheddingFields...)
	l := &LoadShedding{Params: shed.Params{MinLimit: DefaultShedMinLimit, MaxLimit: DefaultShedMaxLimit, Window: DefaultShedWindow,
		BaselineWindow: DefaultShedBaselineWindow, Tolerance: DefaultShedTolerance, Slack: DefaultShedSlack},
		RetryAfter: DefaultShedRetryAfter, Anonymous: shed.Low, DefaultPriority: shed.Normal, Line: m.node.Line}
	if c.Listen == "" {
		p.errorf(m.node, path, nil, "load_shedding limits the requests the proxy forwards, and there is no proxy listener (listen: \"\")")
	}
	limit := func(field string, v *int) bool {
		n := p.get(m, field)
		if n == nil {
			return true
		}
		i, ok := p.int(n, path, field)
		if !ok {
			return false
		}
		if i < 1 || i > maxShedLimit {
			p.errorf(n, path, nil, "%s %d must be from 1 to %d (requests in flight)", field, i, maxShedLimit)
			return false
		}
		*v = int(i)
		return true
	}
	minOK, maxOK := limit("min_limit", &l.MinLimit), limit("max_limit", &l.MaxLimit)
	if minOK && maxOK && l.MinLimit > l.MaxLimit {
		at := m.values["min_limit"]
		if at == nil {
			at = m.values["max_limit"]
		}
		p.errorf(at, path, nil, "min_limit %d is above max_limit %d", l.MinLimit, l.MaxLimit)
	}
	dur := func(field string, v *time.Duration, least time.Duration) {
		n := p.get(m, field)
		if n == nil {
			return
		}
		d, ok := p.duration(n, path, field)
		if !ok {
			return
		}
		if d < least {
			p.errorf(n, path, nil, "%s %v must be ≥ %v", field, d, least)
			return
		}
		*v = d
	}
	dur("window", &l.Window, time.Millisecond)
	dur("baseline_window", &l.BaselineWindow, time.Millisecond)
	dur("slack", &l.Slack, 0)
	dur("retry_after", &l.RetryAfter, time.Second)
	if l.BaselineWindow < l.Window {
		p.errorf(m.values["baseline_window"], path, nil, "baseline_window %v is shorter than window %v: the baseline is the lowest window mean over baseline_window", l.BaselineWindow, l.Window)
	}
	if l.RetryAfter%time.Second != 0 {
		p.errorf(m.values["retry_after"], path, nil, "retry_after %v must be whole seconds (Retry-After counts seconds)", l.RetryAfter)
	}
	if n := p.get(m, "tolerance"); n != nil {
		if v, ok := p.float(n, path, "tolerance"); ok {
			if !(v >= 1 && v <= 100) || math.IsNaN(v) {
				p.errorf(n, path, nil, "tolerance %v must be from 1 to 100: latency up to tolerance × the baseline (+ slack) is healthy", v)
			} else {
				l.Tolerance = v
			}
		}
	}
	priority := func(n *yaml.Node, field string) (shed.Priority, bool) {
		s, ok := p.str(n, path, field)
		if !ok {
			return 0, false
		}
		pr, ok := shed.ParsePriority(s)
		if !ok {
			p.errorf(n, path, nil, "%s %q must be low, normal or high", field, s)
		}
		return pr, ok
	}
	if n := p.get(m, "default_priority"); n != nil {
		if pr, ok := priority(n, "default_priority"); ok {
			l.DefaultPriority = pr
		}
	}
	if n := p.get(m, "priorities"); n != nil {
		pm := p.mapping(n, n, path, "priorities")
		if pm != nil {
			l.Priorities = map[string]shed.Priority{}
			for _, k := range pm.keys {
				v := p.deref(pm.values[k.Value])
				field := "priorities." + k.Value
				if v == nil {
					p.errorf(k, path, nil, "%s is empty (low, normal or high)", field)
					continue
				}
				pr, ok := priority(v, field)
				if !ok {
					continue
				}
				switch _, known := c.byName[k.Value]; {
				case k.Value == reservedClientName:
					l.Anonymous = pr
				case known:
					l.Priorities[k.Value] = pr
				default:
					p.errorf(k, path, nil, "priorities names %q, which is no configured client (%s)", k.Value, clientNames(c))
				}
			}
		}
	}
	return l
}

// routePriorities refuses a route's priority without load_shedding: it would order nothing.
func (p *parser) routePriorities(c *Config, r *refs) {
	if c.LoadShedding != nil {
		return
	}
	for _, rt := range c.Routes {
		if n := r.prio[rt]; n != nil {
			p.errorf(n, r.route[rt], nil, "priority orders what load shedding sheds first, and there is no load_shedding section")
		}
	}
}

// clientNames lists the configured clients for an error.
func clientNames(c *Config) string {
	if len(c.Clients) == 0 {
		return "no clients are configured; anonymous is the requests no identity source names"
	}
	s := "known: anonymous"
	for i, cl := range c.Clients {
		if i == 10 {
			return s + ", ..."
		}
		s += ", " + cl.Name
	}
	return s
}

package decision

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"

	"github.com/sluicehq/sluice/answer"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/llm"
)

// USAGE ROUTES. A route with usage (config.Usage) sits in front of an LLM API: its cost is
// tokens. Its request's body is read first (the front end reads it, bounded by the route's
// max_body) and ResolveUsage reads what it needs from it (package llm: the model, the output
// maximum, the prompt's size), so that each limit is charged an estimate up front, in what the
// limit counts (config.Unit): requests one each, tokens the estimate counted as the route counts
// a response's usage, micro-dollars the estimate at the model's price. The model's own policies
// (models[].policy) join the request's. Once the response has ended, Finish settles each limit to
// the usage the response reported, read by an llm.Meter the front end feeds the response's body
// (Response.Usage).

// Usage is what a request on a usage route carries to its settlement.
type Usage struct {
	Rule *config.Usage
	// Model is the request's model's entry in models (nil: none), for its price.
	Model *config.Model
	// Label is the model as metrics and stats name it: the entry's name, "other" for a model
	// listed by no entry but "*", "unlisted" for one no entry lists, "" for a request that
	// names none. A model that is not listed is
	// never a label: its name is the client's, and labels must stay few.
	Label string
	// Estimate is the usage reserved up front.
	Estimate llm.Usage
	// Stream: the request asked for a stream.
	Stream bool
	// Body is the request's body to forward: the one read, or with stream_options.include_usage
	// added (the route's inject_usage) — in the same array when it has room after the body
	// (llm.Edit.Apply), else in a new one. ResolveUsage's caller must not use the body it passed
	// in afterwards: it may have been edited.
	Body []byte
}

// Reading a usage route's body: what the front end needs to know.
var (
	// ErrBodyTooLarge is a usage route's request body over its max_body (413).
	ErrBodyTooLarge = errors.New("request body larger than the route's max_body")
)

// UsageRoute returns the usage of the route a request of method on path takes, or nil: the front
// end reads the body of a request whose route has one (at most MaxBody bytes) before it resolves.
func (p *Policies) UsageRoute(method, path string) *config.Usage {
	if !p.usage {
		return nil // (no second route lookup for every request of a configuration without usage)
	}
	if rt, ok := p.cfg.Route(method, path); ok && rt != nil {
		return rt.Usage
	}
	return nil
}

// ResolveUsage is Resolve for a request on a usage route, whose body the front end read whole:
// it estimates the request from body and charges each limit in its unit (Request.Costs), with
// the model's own policies added. A body that is not a request the estimate can read is the
// problem to answer (400; 413 for ErrBodyTooLarge), in the route's error shape, and ok false.
func (p *Policies) ResolveUsage(r identity.Request, method, path string, body []byte, bodyErr error) (req Request, ok bool, prob answer.Problem) {
	rt, _ := p.cfg.Route(method, path)
	shape := answer.ShapeProblem
	if rt != nil && rt.Usage != nil {
		shape = rt.Usage.Errors
	}
	if bodyErr != nil {
		return Request{}, false, bodyProblem(bodyErr, shape)
	}
	// A request without a body (a GET of /v1/models under a /v1 route, say) asks for no tokens:
	// its estimate is 0, settled to a usage if its response reports one.
	empty := len(bytes.TrimSpace(body)) == 0
	var lr llm.Request
	estimate := llm.Usage{Found: true}
	if !empty {
		var err error
		if lr, err = llm.ParseRequest(body, int(rt.Usage.MaxBody)); err != nil {
			return Request{}, false, bodyProblem(err, shape)
		}
		estimate = llm.EstimateUsage(lr, rt.Usage.Estimate)
	}
	u := &Usage{Rule: rt.Usage, Stream: lr.Stream, Estimate: estimate, Body: body}
	if rt.Usage.InjectUsage && lr.Stream && !lr.IncludeUsage {
		if e, ok := llm.UsageEdit(body); ok {
			u.Body = e.Apply(body) // (in place when the front end read the body with room after it)
		}
	}
	if lr.Model != "" {
		u.Model = p.cfg.ModelFor(lr.Model)
		switch {
		case u.Model == nil:
			u.Label = "unlisted"
		case u.Model.Name == "*":
			u.Label = "other"
		default:
			u.Label = u.Model.Name
		}
	}
	if p.claimNames == nil {
		req = p.resolve(p.chain.Identify(r), r, nil, method, path, u, lr.Model)
	} else {
		who, claims := p.chain.IdentifyClaims(r, p.claimNames)
		req = p.resolve(who, r, claims, method, path, u, lr.Model)
	}
	p.seen(r, &req)
	req.Costs = make([]int64, len(req.Limits))
	for i := range req.Limits {
		switch req.Limits[i].Unit {
		case config.UnitTokens:
			req.Costs[i] = llm.Cost(u.Estimate, u.Rule.Count, u.Rule.Weights)
		case config.UnitUSD:
			if empty {
				req.Costs[i] = 0
				continue
			}
			if u.Model == nil || u.Model.Price == nil {
				what := "names no model"
				if lr.Model != "" {
					what = "is for a model that has no price"
				}
				return Request{}, false, answer.Problem{Type: answer.TypeBlank, Title: http.StatusText(http.StatusBadRequest), Status: http.StatusBadRequest,
					Shape: shape, Detail: fmt.Sprintf("this request %s, and policy %q counts its price in dollars; name a model this gateway has a price for", what, req.Limits[i].PolicyName)}
			}
			req.Costs[i] = llm.Cost(u.Estimate, llm.CountWeighted, u.Model.Price.Weights())
		default:
			req.Costs[i] = config.DefaultCost
		}
	}
	return req, true, answer.Problem{}
}

// bodyProblem is the answer to a usage route's body that cannot be read or estimated.
func bodyProblem(err error, shape answer.Shape) answer.Problem {
	if errors.Is(err, ErrBodyTooLarge) || errors.Is(err, llm.ErrTooLarge) {
		return answer.Problem{Type: answer.TypeBlank, Title: http.StatusText(http.StatusRequestEntityTooLarge),
			Status: http.StatusRequestEntityTooLarge, Shape: shape,
			Detail: "the request body is larger than this route reads to estimate its tokens (its usage.max_body); nothing was charged"}
	}
	p := answer.BadRequest("the request body is not an LLM API request this route can estimate: " + err.Error() + "; nothing was charged")
	p.Shape = shape
	return p
}

// Shape is the shape of the request's answers: its usage route's errors, else a problem's.
func (r *Request) Shape() answer.Shape {
	if r.Usage != nil {
		return r.Usage.Rule.Errors
	}
	return answer.ShapeProblem
}

// usageActual returns what limit i of a request that reported usage u really cost, in its unit
// (-1: its estimate stands: it counts requests).
func (r *Request) usageActual(i int, u llm.Usage) int64 {
	switch r.Limits[i].Unit {
	case config.UnitTokens:
		return llm.Cost(u, r.Usage.Rule.Count, r.Usage.Rule.Weights)
	case config.UnitUSD:
		if m := r.Usage.Model; m != nil && m.Price != nil { // (none: a request without a body)
			return llm.Cost(u, llm.CountWeighted, m.Price.Weights())
		}
	}
	return -1
}

// LLMObserver is implemented by an Observer that counts LLM usage (the gateway's metrics and
// stats): once per request of a usage route that passed, when Finish settled it (u is the
// response's usage, Found false if it reported none; outcome what Finish did).
type LLMObserver interface {
	UsageSettled(req *Request, u llm.Usage, outcome SettleOutcome)
}

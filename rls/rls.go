// Package rls is sluice as Envoy's rate limit service: envoy.service.ratelimit.v3's
// RateLimitService/ShouldRateLimit over gRPC (what Envoy, Istio and Envoy Gateway call), with its
// limits read from envoyproxy/ratelimit's own configuration files (package rls/envoyconf). It is a
// front end like the proxy: each request's descriptors become limits of one decision.Request,
// decided all at once on the store by the decision layer.
//
// The answer is what Envoy expects: OVER_LIMIT if any descriptor is over its limit; a status per
// descriptor, in the request's order, with its current limit, what remains and when the window
// resets; the RateLimit fields (and Retry-After when over) to add to the response; and, when over,
// the problem body for Envoy to answer with. A store failure is a gRPC error (Unavailable), which
// Envoy maps with its failure_mode_deny, never OVER_LIMIT.
package rls

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/answer"
	"github.com/sluicehq/sluice/decision"
	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/internal/sat"
	"github.com/sluicehq/sluice/rls/envoyconf"
)

// Decide is how the service decides: the gateway's decision layer (its metrics and operator page
// count the service's requests too, as client "rls/DOMAIN").
type Decide func(ctx context.Context, req *decision.Request) decision.Verdict

// Service implements RateLimitService. It is safe for concurrent use; Swap changes its
// configuration under running requests (each is answered whole by one configuration).
type Service struct {
	rlspb.UnimplementedRateLimitServiceServer
	conf   atomic.Pointer[loaded]
	decide Decide
	legacy atomic.Bool
}

// New returns a Service answering by conf, deciding with decide. With conf nil (rules that are
// still to come, over xDS), every request fails (Unknown: no rate limit configuration loaded)
// until Swap.
func New(conf *envoyconf.Config, decide Decide) *Service {
	s := &Service{decide: decide}
	s.Swap(conf)
	return s
}

// Swap makes conf the configuration of the requests that start from now on.
func (s *Service) Swap(conf *envoyconf.Config) {
	l := &loaded{conf: conf}
	if conf != nil {
		l.clients = make(map[string]string)
		for _, d := range conf.Domains() {
			l.clients[d] = "rls/" + d
		}
	}
	s.conf.Store(l)
}

// loaded is a configuration and the client name of each of its domains ("rls/DOMAIN"), made
// once rather than for every request.
type loaded struct {
	conf    *envoyconf.Config
	clients map[string]string
}

// client is the decision layer's client for domain.
func (l *loaded) client(domain string) string {
	if c, ok := l.clients[domain]; ok {
		return c
	}
	return "rls/" + domain // a domain not configured: nothing matches, the request decides nothing
}

// SetLegacyHeaders also adds X-RateLimit-Limit, -Remaining and -Reset to the answers' headers
// (limits.legacy_headers).
func (s *Service) SetLegacyHeaders(on bool) { s.legacy.Store(on) }

// Bounds of a request: more descriptors or entries than these are refused (InvalidArgument),
// so that one request cannot make the service allocate without bound.
const (
	maxDescriptors = 64
	maxEntries     = 64
)

// ShouldRateLimit decides a request's descriptors.
func (s *Service) ShouldRateLimit(ctx context.Context, in *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	l := s.conf.Load()
	conf := l.conf
	if conf == nil { // rules over xDS, before the first update: the reference's answer
		return nil, status.Error(codes.Unknown, "no rate limit configuration loaded")
	}
	if in.GetDomain() == "" {
		return nil, status.Error(codes.InvalidArgument, "rate limit domain must not be empty")
	}
	ds := in.GetDescriptors()
	if len(ds) == 0 {
		return nil, status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty")
	}
	if len(ds) > maxDescriptors {
		return nil, status.Errorf(codes.InvalidArgument, "%d descriptors: at most %d in one request", len(ds), maxDescriptors)
	}
	hits := uint64(max(in.GetHitsAddend(), 1)) // Envoy sends 0 for 1
	// matches[i] is descriptor i's; on the stack for a descriptor or two, as Envoy sends.
	var matchRoom [2]envoyconf.Match
	matches := matchRoom[:0]
	if len(ds) > len(matchRoom) {
		matches = make([]envoyconf.Match, 0, len(ds))
	}
	matches = matches[:len(ds)]
	found := make([]bool, len(ds))
	costs := make([]int64, len(ds))
	usage := make([]bool, len(ds)) // descriptor i has its own hits_addend: usage, charged whatever the answer
	entries := make([]envoyconf.Entry, 0, 4)
	for i, d := range ds {
		if len(d.GetEntries()) > maxEntries {
			return nil, status.Errorf(codes.InvalidArgument, "descriptor %d has %d entries: at most %d", i, len(d.GetEntries()), maxEntries)
		}
		if d.GetIsNegativeHits() {
			return nil, status.Errorf(codes.InvalidArgument, "descriptor %d: is_negative_hits (giving quota back) is not supported", i)
		}
		entries = entries[:0]
		for _, e := range d.GetEntries() {
			entries = append(entries, envoyconf.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		var override *envoyconf.Override
		if l := d.GetLimit(); l != nil {
			override = &envoyconf.Override{RequestsPerUnit: l.GetRequestsPerUnit(), Unit: envoyconf.Unit(l.GetUnit())}
			if n := l.GetUnitMultiplier(); n != nil {
				if n.GetValue() == 0 {
					return nil, status.Errorf(codes.InvalidArgument, "descriptor %d: limit.unit_multiplier must be greater than 0", i)
				}
				override.UnitMultiplier = n.GetValue()
			}
			if err := override.Validate(); err != nil {
				return nil, status.Errorf(codes.InvalidArgument, "descriptor %d: %v", i, err)
			}
		}
		matches[i], found[i] = conf.Match(in.GetDomain(), entries, override)
		h := hits
		if d.GetHitsAddend() != nil {
			h, usage[i] = d.GetHitsAddend().GetValue(), true
		}
		if h > math.MaxInt64 {
			return nil, status.Errorf(codes.InvalidArgument, "descriptor %d: hits_addend %d is over 2^63-1", i, h)
		}
		costs[i] = int64(h)
	}
	replaced := envoyconf.Replaced(matches)

	// The limits to decide: every descriptor that matched a limit, not unlimited, not replaced.
	// Shadow-mode and quota-mode ones never refuse the request (dry run). One that can never
	// pass (a limit of 0, or a cost above what its limit can ever hold) is over; if it refuses
	// the request, the others are only peeked at (cost 0), so that nothing is consumed. The same
	// counter twice in one request is one limit of their summed cost (saturating at 2^63-1, a
	// cost no limit can ever hold); each of its statuses says what remained after its own hits,
	// in the request's order, as the reference counts.
	//
	// A descriptor with its own hits_addend is usage, as Envoy sends it (a cost, or a check of
	// 0): its hits are counted whatever the answer, beyond the limit if need be (Request.Charges),
	// and it is over when its counter then passes the limit, as the reference counts. A counter
	// that usage charges is charged with every hit of the request on it.
	r := &request{}
	r.req = decision.Request{Client: l.client(in.GetDomain()), NoHold: true, Limits: r.limits[:0], Costs: r.costs[:0]}
	req := &r.req
	at := make([]int, len(ds))      // descriptor i's index in req.Limits, or -1
	later := make([]int64, len(ds)) // the cost of the descriptors after i on the same counter
	never := make([]bool, len(ds))  // descriptor i can never pass
	peek := false
	var charged []bool // limit k is charged by usage
	for i := range ds {
		at[i] = -1
		m := &matches[i]
		if !found[i] || m.Unlimited || replaced[i] {
			continue
		}
		if m.RequestsPerUnit == 0 { // not a policy a store can hold
			never[i] = costs[i] > 0
			peek = peek || (never[i] && !m.ShadowMode && !m.QuotaMode)
			continue
		}
		dup := slices.IndexFunc(req.Limits, func(l decision.Limit) bool { return l.Key == m.Key })
		if dup >= 0 {
			at[i] = dup
			req.Costs[dup] = sat.Add(req.Costs[dup], costs[i])
			charged[dup] = charged[dup] || usage[i]
			for j := range i {
				if at[j] == dup {
					later[j] = sat.Add(later[j], costs[i])
				}
			}
			continue
		}
		at[i] = len(req.Limits)
		p := m.Policy
		p.Name = "rls" // the state is kept under the counter's key (m.Key) and this
		req.Limits = append(req.Limits, decision.Limit{Policy: p, PolicyName: nameOf(m), Key: m.Key, DryRun: m.ShadowMode || m.QuotaMode})
		req.Costs = append(req.Costs, costs[i])
		charged = append(charged, usage[i])
	}
	if len(req.Limits) == 0 {
		req.Limits, req.Costs = nil, nil // as if never appended to
	}
	req.Charges = r.charges[:0]
	if len(req.Limits) > len(r.charges) {
		req.Charges = make([]int64, 0, len(req.Limits))
	}
	req.Charges = req.Charges[:len(req.Limits)]
	for k, c := range req.Costs {
		if charged[k] {
			req.Charges[k] = min(c, algorithm.MaxLimit) // (counts stop there)
		}
	}
	for k, c := range req.Costs {
		var d sluice.Decision
		if algorithm.CheckCost(&req.Limits[k].Policy, c, &d) != nil { // the (summed) cost never fits
			req.Costs[k] = 0 // peek at it: its statuses say over
			for i := range ds {
				if at[i] == k {
					never[i] = true
					peek = peek || (!matches[i].ShadowMode && !matches[i].QuotaMode)
				}
			}
		}
	}
	if peek { // usage is still charged, each status saying what it left
		for k := range req.Costs {
			if !charged[k] {
				req.Costs[k] = 0
			}
		}
		for i := range ds {
			if at[i] >= 0 && !charged[at[i]] {
				later[i] = 0
			}
		}
	}
	if len(req.Limits) > 0 {
		req.Who = identity.Identity{Key: req.Limits[0].Key, Source: "rls"}
	}
	v := s.decide(ctx, req)
	defer v.Release()
	msgs := newMessages(len(ds))
	out := &msgs.out
	out.OverallCode = rlspb.RateLimitResponse_OK
	switch v.Outcome {
	case decision.Failed:
		if errors.Is(v.Err, sluice.ErrStoreUnavailable) {
			return nil, status.Error(codes.Unavailable, "the rate limit store is unavailable: "+v.Problem.Detail)
		}
		return nil, status.Error(codes.Internal, v.Problem.Detail)
	case decision.Refused:
		out.OverallCode = rlspb.RateLimitResponse_OVER_LIMIT
	}
	for i := range ds {
		st := out.Statuses[i] // Code OK
		m := &matches[i]
		switch {
		case !found[i] || replaced[i]:
			continue // no limit: OK, with nothing else (as envoyproxy/ratelimit answers)
		case m.Unlimited:
			st.LimitRemaining = math.MaxUint32
			continue
		}
		st.CurrentLimit = msgs.currentLimit(i, m)
		over := never[i]
		if at[i] >= 0 {
			d := v.Decisions[at[i]].Decision
			st.LimitRemaining = clampUint32(sat.Add(d.Remaining, later[i]))
			st.DurationUntilReset = msgs.duration(i, untilReset(m, d))
			over = over || !d.Allowed
		} else {
			st.DurationUntilReset = msgs.duration(i, untilReset(m, sluice.Decision{}))
		}
		switch {
		case !over:
		case m.QuotaMode:
			// Over its quota: OK, nothing left, and no reset time (as envoyproxy/ratelimit says).
			st.LimitRemaining, st.DurationUntilReset = 0, nil
		case m.ShadowMode:
			st.LimitRemaining = 0
		default:
			st.Code, st.LimitRemaining = rlspb.RateLimitResponse_OVER_LIMIT, 0
			out.OverallCode = rlspb.RateLimitResponse_OVER_LIMIT
		}
	}
	if len(v.Decisions) > 0 {
		out.ResponseHeadersToAdd = msgs.headers(v.Decisions, s.legacy.Load())
	}
	if out.OverallCode == rlspb.RateLimitResponse_OVER_LIMIT {
		var names []string
		hopeless := false // a limit that refused can never pass this request
		for i, st := range out.Statuses {
			if st.Code == rlspb.RateLimitResponse_OVER_LIMIT {
				names = append(names, nameOf(&matches[i]))
				hopeless = hopeless || never[i]
			}
		}
		problem := answer.QuotaExceeded("", nil)
		problem.ViolatedPolicies = names
		if hopeless {
			// No Retry-After: the same request is refused whenever it comes (the statuses
			// still say when the window ends, as the reference's do).
			out.ResponseHeadersToAdd = append(out.ResponseHeadersToAdd, header("Content-Type", answer.ContentType))
			problem.RetryAfter = 0
			problem.Detail = fmt.Sprintf("the request exceeded %s of domain %q, which can never allow it (its hits are more than the limit ever holds, or the limit is 0), so retrying will not help", violated(names), in.GetDomain())
		} else {
			var wait time.Duration
			if v.Outcome == decision.Refused {
				wait = v.RetryAfter(req)
			}
			retry := answer.RetryAfter(wait)
			out.ResponseHeadersToAdd = append(out.ResponseHeadersToAdd, header("Retry-After", retry),
				header("Content-Type", answer.ContentType))
			problem.RetryAfter, _ = strconv.ParseInt(retry, 10, 64)
			problem.Detail = fmt.Sprintf("the request exceeded %s of domain %q; retry after %s s", violated(names), in.GetDomain(), retry)
		}
		out.RawBody = problem.AppendJSON(nil)
	}
	return out, nil
}

func violated(names []string) string {
	if len(names) == 1 {
		return strconv.Quote(names[0])
	}
	return fmt.Sprintf("the limits %q", names)
}

// untilReset is duration_until_reset: for a fixed window, as envoyproxy/ratelimit says it, the
// time until the current window ends; for the other algorithms, until the state is empty again
// (or, if that is sooner, until the request would be allowed).
func untilReset(m *envoyconf.Match, d sluice.Decision) time.Duration {
	if t := max(d.ResetAfter, d.RetryAfter); t > 0 || m.Policy.Algorithm != sluice.FixedWindow {
		return t
	}
	// Nothing counted in this window (a shadow-mode peek, say): its end by this clock.
	now := time.Now().UnixMicro()
	_, _, end := m.Policy.WindowOf(now)
	return time.Duration(end-now) * time.Microsecond
}

func clampUint32(v int64) uint32 {
	switch {
	case v < 0:
		return 0
	case v > math.MaxUint32:
		return math.MaxUint32
	}
	return uint32(v)
}

func header(k, v string) *corepb.HeaderValue { return &corepb.HeaderValue{Key: k, Value: v} }

// request is a request's decision.Request and room for the limits of its first descriptors,
// allocated together (the decision layer keeps the request it is given while it decides, so it
// is on the heap): one allocation instead of four for a request of a descriptor or two.
type request struct {
	req            decision.Request
	limits         [2]decision.Limit
	costs, charges [2]int64
}

// messages are the messages of one answer, allocated together: the response, room for its
// headers, and for each descriptor its status, its current limit and its duration until reset.
// They were a dozen allocations for a request of one descriptor and are three, whatever its
// descriptors. The answer is the same message, field for field; gRPC marshals it once the
// handler returns, and nothing keeps it after.
type messages struct {
	out rlspb.RateLimitResponse
	hv  [2]corepb.HeaderValue           // the RateLimit fields
	hp  [maxHeaders]*corepb.HeaderValue // all the headers
	per []perDescriptor
}

// maxHeaders: the RateLimit fields, the three legacy ones, Retry-After and Content-Type.
const maxHeaders = 7

type perDescriptor struct {
	st    rlspb.RateLimitResponse_DescriptorStatus
	limit rlspb.RateLimitResponse_RateLimit
	mult  wrapperspb.UInt32Value
	reset durationpb.Duration
}

// newMessages returns the messages of an answer to n descriptors: each status OK, nothing else set.
func newMessages(n int) *messages {
	b := &messages{per: make([]perDescriptor, n)}
	b.out.Statuses = make([]*rlspb.RateLimitResponse_DescriptorStatus, n)
	for i := range b.per {
		b.per[i].st.Code = rlspb.RateLimitResponse_OK
		b.out.Statuses[i] = &b.per[i].st
	}
	return b
}

// currentLimit is match m's limit as Envoy's answer states it, for descriptor i.
func (b *messages) currentLimit(i int, m *envoyconf.Match) *rlspb.RateLimitResponse_RateLimit {
	p := &b.per[i]
	l := &p.limit
	l.Name, l.RequestsPerUnit, l.Unit = m.Name, m.RequestsPerUnit, rlspb.RateLimitResponse_RateLimit_Unit(m.Unit)
	if m.UnitMultiplier > 1 {
		p.mult.Value = m.UnitMultiplier
		l.UnitMultiplier = &p.mult
	}
	return l
}

// duration is d as descriptor i's duration_until_reset (what durationpb.New makes of it).
func (b *messages) duration(i int, d time.Duration) *durationpb.Duration {
	r := &b.per[i].reset
	nanos := d.Nanoseconds()
	secs := nanos / 1e9
	r.Seconds, r.Nanos = secs, int32(nanos-secs*1e9)
	return r
}

// headers are the RateLimit fields of decisions (and the legacy ones), as
// response_headers_to_add: both fields' values in one string.
func (b *messages) headers(ds []answer.Applied, legacy bool) []*corepb.HeaderValue {
	var buf, both [256]byte
	policy, limit := answer.FieldValues(buf[:0], ds)
	values := string(append(append(both[:0], policy...), limit...))
	b.hv[0].Key, b.hv[0].Value = "RateLimit-Policy", values[:len(policy)]
	b.hv[1].Key, b.hv[1].Value = "RateLimit", values[len(policy):]
	out := append(b.hp[:0], &b.hv[0], &b.hv[1])
	if legacy {
		l, r, t := answer.LegacyValues(ds)
		out = append(out, header("X-RateLimit-Limit", strconv.FormatInt(l, 10)),
			header("X-RateLimit-Remaining", strconv.FormatInt(r, 10)), header("X-RateLimit-Reset", strconv.FormatInt(t, 10)))
	}
	return out
}

// nameOf is what answers and metrics call a match's limit: its name, or the rule's.
func nameOf(m *envoyconf.Match) string {
	if m.Name != "" {
		return m.Name
	}
	return m.Rule
}

// Package rlqs is Envoy's Rate Limit Quota Service (envoy.service.rate_limit_quota.v3,
// StreamRateLimitQuotas) on sluice's ledger: Envoys decide every request locally from an
// assignment and report their buckets' usage on a stream; the service splits each bucket's limit
// between the Envoys that report it by their demand (allowed + denied), with the allotment of
// package ledger that regions use too (one ledger per bucket: in Redis, so that several sluice
// instances serve one fleet of Envoys, or in memory), and answers with token bucket assignments
// whose rates never add up to more than the limit. docs/envoy.md ("Quota by demand: RLQS") is
// the operator's view; docs/design.md states the bounds.
//
// A Client is one Envoy's stream, independent of gRPC (Report, Tick), so that the simulator runs
// the same code on a virtual clock; Service.StreamRateLimitQuotas is the gRPC side.
package rlqs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/ledger"
)

// Options configure a Service.
type Options struct {
	// Ledgers gives a bucket's ledger: store/redis's (every instance on that Redis shares it) or
	// ledger.Memory's.
	Ledgers ledger.Ledgers
	// Now is the clock; time.Now if nil.
	Now func() time.Time
	Log *slog.Logger
}

// Service is the Rate Limit Quota Service. Its methods are safe for concurrent use.
type Service struct {
	ledgers ledger.Ledgers
	now     func() time.Time
	log     *slog.Logger

	rules   atomic.Pointer[Rules]
	version atomic.Int64 // bumped by Swap: clients match their buckets again

	mu        sync.Mutex
	clients   map[*Client]struct{}
	books     map[string]*book // the buckets' ledgers, by ledger name
	lastSweep time.Time
	closing   chan struct{}
	closed    bool
	lastErr   LedgerError // the last ledger error (zero: none)

	counters counters
}

// book is one bucket's ledger, with the options it was made for.
type book struct {
	l        ledger.Ledger
	opts     ledger.Options
	lastUsed time.Time
}

type counters struct {
	reports, assignments, abandons, ledgerErrors, refusedBuckets atomic.Int64
}

// New returns the service of rls.quota q.
func New(q *config.Quota, o Options) *Service {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	s := &Service{ledgers: o.Ledgers, now: o.Now, log: o.Log, clients: map[*Client]struct{}{}, books: map[string]*book{}, closing: make(chan struct{})}
	s.rules.Store(Compile(q))
	return s
}

// Swap replaces the rules (a reload): each client matches its buckets again at its next report
// or tick, abandons those without a rule and sends the new assignments.
func (s *Service) Swap(q *config.Quota) {
	s.rules.Store(Compile(q))
	s.version.Add(1)
}

// Rules returns the rules in force.
func (s *Service) Rules() *Rules { return s.rules.Load() }

// Close ends every stream (its handler returns Unavailable) so that a graceful stop of the gRPC
// server need not wait for streams that never end.
func (s *Service) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		close(s.closing)
	}
}

// ledger returns the ledger named name with opts, made once and remade if opts change. Ledgers
// unused for longer than their lease, hold and a minute are forgotten (their state ends with
// its lease anyway).
func (s *Service) ledger(name string, opts ledger.Options, now time.Time) (ledger.Ledger, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.books[name]
	if b == nil || b.opts != opts {
		l, err := s.ledgers(name, opts)
		if err != nil {
			return nil, err
		}
		b = &book{l: l, opts: opts}
		s.books[name] = b
	}
	b.lastUsed = now
	return b.l, nil
}

// sweep forgets the ledgers unused for longer than their lease, hold and a minute; at most once
// a second, whichever stream's timer calls it.
func (s *Service) sweep(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now.Sub(s.lastSweep) < time.Second {
		return
	}
	s.lastSweep = now
	for name, b := range s.books {
		if now.Sub(b.lastUsed) > b.opts.Lease+b.opts.Hold+time.Minute {
			delete(s.books, name)
		}
	}
}

// Client is one Envoy's stream: its buckets and what was assigned to them. Report and Tick are
// called by one goroutine at a time (the stream's); Stats by any.
type Client struct {
	s      *Service
	ID     string // the ledger's name for this Envoy: one per stream
	Peer   string
	Since  time.Time
	domain string

	mu         sync.Mutex
	buckets    map[string]*sub
	version    int64
	lastReport time.Time
	reports    int64
	// failed is set by the first ledger error of a report or a tick: the rest of its buckets are
	// not refreshed (they keep their assignments; the next round tries again), so that a Redis
	// that does not answer holds the stream one timeout, not one per bucket.
	failed bool
}

// sub is one bucket of one client.
type sub struct {
	id         map[string]string
	key        string
	rule       *Rule
	name       string // in the ledger
	want       int64
	seen       time.Time // its last report
	active     time.Time // its last report with a request
	last       [2]uint64 // allowed, denied in its last report
	total      [2]uint64
	grant      ledger.Grant
	sent       *typev3.RateLimitStrategy // the assignment the Envoy holds (nil: none)
	sentAllot  int64                     // its rate, in units per period (a limit rule's)
	sentAt     time.Time
	sentExpiry time.Time // when it ends on this clock (the Envoy's ends up to the delivery later)
	// builtAt is when the Envoy's current token bucket was sent (it built it full then),
	// builtMax its max_tokens, and spent the requests the Envoy reported admitting since: a new
	// bucket holds no more than the current one has left by that count (rebuild).
	builtAt  time.Time
	builtMax int64
	spent    int64
	held     int64 // the Holds of its last refresh
	recent   [demandReports]interval
	errors   int64
}

// interval is one report's requests and the time they took.
type interval struct {
	n int64
	d time.Duration
}

// demandReports is how many reports a sparse bucket's demand is measured over.
const demandReports = 4

// Open starts a client for a new stream from peer.
func (s *Service) Open(peer string) *Client {
	var b [8]byte
	_, _ = rand.Read(b[:])
	c := &Client{s: s, ID: "envoy-" + hex.EncodeToString(b[:]), Peer: peer, Since: s.now(), buckets: map[string]*sub{}, version: s.version.Load()}
	s.mu.Lock()
	s.clients[c] = struct{}{}
	s.mu.Unlock()
	return c
}

// Close forgets the client: its buckets' shares go back to the other Envoys once their
// assignments' time to live (the ledger's lease) and the hold have passed.
func (c *Client) Close() {
	c.s.mu.Lock()
	delete(c.s.clients, c)
	c.s.mu.Unlock()
}

// ReportError is a report the service refuses whole: the stream ends with InvalidArgument.
type ReportError struct{ Msg string }

func (e *ReportError) Error() string { return e.Msg }

// Report takes one usage report and returns the actions to send: an assignment for each bucket
// with a rule (the same one again extends its time to live), an abandon for each without one, or
// gone idle, or beyond the stream's bound.
func (c *Client) Report(ctx context.Context, r *rlqspb.RateLimitQuotaUsageReports) ([]*rlqspb.RateLimitQuotaResponse_BucketAction, error) {
	rs := c.s.rules.Load()
	q := rs.quota
	c.mu.Lock() // (Stats reads the domain)
	if c.domain == "" {
		c.domain = r.GetDomain()
	}
	c.mu.Unlock()
	if q.Domain != "" && r.GetDomain() != q.Domain {
		return nil, &ReportError{fmt.Sprintf("domain %q is not this service's: rls.quota.domain is %q (the filter's domain must be the same)", r.GetDomain(), q.Domain)}
	}
	if n := len(r.GetBucketQuotaUsages()); n > maxReportBuckets {
		return nil, &ReportError{fmt.Sprintf("a report of %d buckets; at most %d", n, maxReportBuckets)}
	}
	now := c.s.now()
	c.s.counters.reports.Add(1)
	c.mu.Lock()
	c.lastReport = now
	c.reports++
	c.failed = false
	c.rematch(rs)
	var actions []*rlqspb.RateLimitQuotaResponse_BucketAction
	for _, u := range r.GetBucketQuotaUsages() {
		id := u.GetBucketId().GetBucket()
		if err := checkID(id); err != nil {
			c.s.counters.refusedBuckets.Add(1)
			actions = append(actions, abandon(id))
			continue
		}
		k := idKey(id)
		b := c.buckets[k]
		if b == nil {
			rule := rs.Match(id)
			if rule == nil || len(c.buckets) >= MaxStreamBuckets {
				if rule != nil {
					c.s.counters.refusedBuckets.Add(1)
				}
				actions = append(actions, abandon(id))
				continue
			}
			b = &sub{id: id, key: k, rule: rule, active: now}
			if !rule.blanket() {
				b.name = ledgerName(rule.Name, k)
			}
			c.buckets[k] = b
		}
		allowed, denied := u.GetNumRequestsAllowed(), u.GetNumRequestsDenied()
		interval := q.ReportInterval
		switch {
		case !b.seen.IsZero():
			interval = now.Sub(b.seen)
		case u.GetTimeElapsed().AsDuration() > 0:
			interval = u.GetTimeElapsed().AsDuration()
		}
		b.seen = now
		b.last = [2]uint64{allowed, denied}
		b.spent += int64(min(allowed, ledger.MaxLimit))
		b.total[0] += allowed
		b.total[1] += denied
		if allowed+denied > 0 {
			b.active = now
		} else if now.Sub(b.active) >= q.Idle {
			actions = append(actions, c.drop(b))
			continue
		}
		if b.rule.blanket() {
			actions = append(actions, c.assignBlanket(b, rs, now))
			continue
		}
		b.want = b.demand(int64(min(allowed, ledger.MaxLimit)), int64(min(denied, ledger.MaxLimit)), max(interval, time.Millisecond))
		if a := c.refresh(ctx, b, rs, now, int64(min(allowed, ledger.MaxLimit)), int64(min(denied, ledger.MaxLimit))); a != nil {
			actions = append(actions, a)
		}
	}
	c.mu.Unlock()
	return actions, nil
}

// Tick is the stream's timer (every half report interval): it refreshes the assignments due
// (an Envoy that has not reported for half their time to live, or one short of its share while
// others give theirs back), abandons buckets gone idle or without a rule since a reload, and
// returns the actions to send.
func (c *Client) Tick(ctx context.Context) []*rlqspb.RateLimitQuotaResponse_BucketAction {
	rs := c.s.rules.Load()
	now := c.s.now()
	c.s.sweep(now)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failed = false
	c.rematch(rs)
	var actions []*rlqspb.RateLimitQuotaResponse_BucketAction
	for _, k := range c.sortedKeys() {
		b := c.buckets[k]
		if b.rule == nil {
			actions = append(actions, c.drop(b)) // (rematch found no rule)
			continue
		}
		if now.Sub(b.active) >= rs.quota.Idle {
			actions = append(actions, c.drop(b))
			continue
		}
		due := b.sent == nil || b.sentExpiry.Sub(now) < rs.quota.TTL/2
		if b.rule.blanket() {
			if due {
				actions = append(actions, c.assignBlanket(b, rs, now))
			}
			continue
		}
		// A shrink is confirmed once the assignment has had its delivery margin to reach the
		// Envoy: the ledger then counts the smaller allotment and gives the rest to the others.
		confirm := b.grant.Confirm && b.sentAllot < b.held && now.Sub(b.sentAt) >= rs.margin()
		if due || b.grant.Share > b.grant.Allotment || confirm {
			if a := c.refresh(ctx, b, rs, now, 0, 0); a != nil {
				actions = append(actions, a)
			}
		}
	}
	return actions
}

// Rematch matches the client's buckets again if the rules changed since (under c.mu): a bucket
// whose rule is gone keeps a nil rule, for Tick or Report to abandon.
func (c *Client) rematch(rs *Rules) {
	v := c.s.version.Load()
	if v == c.version {
		return
	}
	c.version = v
	for _, b := range c.buckets {
		r := rs.Match(b.id)
		if r != nil && !r.blanket() {
			b.name = ledgerName(r.Name, b.key)
		}
		if r == nil || r.blanket() != b.rule.blanket() || r.Name != b.rule.Name {
			b.sent, b.sentAllot, b.grant = nil, 0, ledger.Grant{} // a new answer is sent at once
		}
		b.rule = r
	}
}

// sortedKeys are the buckets' keys in order (under c.mu), so that a tick's actions are too.
func (c *Client) sortedKeys() []string {
	keys := make([]string, 0, len(c.buckets))
	for k := range c.buckets {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// drop abandons a bucket (under c.mu).
func (c *Client) drop(b *sub) *rlqspb.RateLimitQuotaResponse_BucketAction {
	delete(c.buckets, b.key)
	return abandon(b.id)
}

func abandon(id map[string]string) *rlqspb.RateLimitQuotaResponse_BucketAction {
	return &rlqspb.RateLimitQuotaResponse_BucketAction{
		BucketId:     &rlqspb.BucketId{Bucket: id},
		BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction{}},
	}
}

// assignBlanket assigns a blanket rule's answer for the time to live (under c.mu).
func (c *Client) assignBlanket(b *sub, rs *Rules, now time.Time) *rlqspb.RateLimitQuotaResponse_BucketAction {
	rule := typev3.RateLimitStrategy_ALLOW_ALL
	if b.rule.Blanket == "deny" {
		rule = typev3.RateLimitStrategy_DENY_ALL
	}
	b.sent = &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: rule}}
	b.sentAt, b.sentExpiry = now, now.Add(rs.quota.TTL)
	c.s.counters.assignments.Add(1)
	return assign(b.id, b.sent, rs.quota.TTL)
}

func assign(id map[string]string, s *typev3.RateLimitStrategy, ttl time.Duration) *rlqspb.RateLimitQuotaResponse_BucketAction {
	return &rlqspb.RateLimitQuotaResponse_BucketAction{
		BucketId: &rlqspb.BucketId{Bucket: id},
		BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			AssignmentTimeToLive: durationpb.New(ttl), RateLimitStrategy: s}},
	}
}

// refresh is one refresh of a limit bucket on its ledger (under c.mu): it reports what the Envoy
// wants and holds, and returns the assignment to send, or nil (the ledger could not be reached:
// the Envoy keeps its assignment until it expires, then follows its expired_assignment_behavior;
// or the ledger is learning and the Envoy holds nothing it knows of: no new quota).
func (c *Client) refresh(ctx context.Context, b *sub, rs *Rules, now time.Time, admitted, refused int64) *rlqspb.RateLimitQuotaResponse_BucketAction {
	if c.failed {
		return nil
	}
	opts := rs.options(b.rule)
	l, err := c.s.ledger(b.name, opts, now)
	if err != nil {
		c.fail(ctx, b, err)
		return nil
	}
	rep := ledger.Report{Want: min(b.want, ledger.MaxLimit), Admitted: admitted, Refused: refused}
	if b.sent != nil && now.Before(b.sentExpiry) && !b.grant.Expires.IsZero() {
		rep.Holds, rep.HoldsExpires = b.sentAllot, b.grant.Expires
	}
	g, err := l.Refresh(ctx, c.ID, rep)
	if err != nil {
		c.fail(ctx, b, err)
		return nil
	}
	b.grant, b.held = g, rep.Holds
	ttl := g.LocalExpires.Sub(c.s.now())
	if ttl <= 0 {
		return nil // the ledger answered after the lease it gave: nothing safe to send
	}
	if g.Learning && g.Allotment == 0 && rep.Holds == 0 {
		return nil // Doorman's learning mode: no new quota; the Envoy keeps what it has
	}
	a := g.Allotment
	live := b.sent != nil && now.Before(b.sentExpiry)
	switch {
	case live && b.sentAllot > 0 && a >= b.sentAllot && a-b.sentAllot <= b.sentAllot/assignmentGrowMin:
		// A small growth: the Envoy keeps the bucket it has (a new one would start full), and
		// holds less than the ledger counts for it.
		a = b.sentAllot
	case live && b.sentAllot > 0 && a < b.sentAllot && b.sentAllot-a <= b.sentAllot/assignmentGrowMin && rep.Holds == b.sentAllot:
		// A small shrink, likewise: the Envoy keeps what it holds, which it reports holding at
		// every refresh, so that the ledger counts it (pending) and the others get no more.
		a = b.sentAllot
	}
	s := c.rebuild(b, strategy(a, b.rule), a, now)
	b.sent, b.sentAllot, b.sentAt, b.sentExpiry = s, a, now, now.Add(ttl)
	c.s.counters.assignments.Add(1)
	return assign(b.id, s, ttl)
}

// rebuild is the strategy to send for an allotment a, given the one the Envoy holds (under c.mu).
// Envoy builds a new token bucket full for any strategy but the one it holds, so a new bucket
// holds at most what the current one has left by the service's count: its tokens when built,
// plus its refill since, less the requests the Envoy reported admitting since (at least one
// token). An Envoy whose assignment changes at every report, busy, gets no burst at each change
// (docs/design.md); an idle one keeps its burst. The same assignment, sent again, extends it; a
// bucket built smaller is built again at its full size once, by that count, it would be full.
func (c *Client) rebuild(b *sub, s *typev3.RateLimitStrategy, a int64, now time.Time) *typev3.RateLimitStrategy {
	tb := s.GetTokenBucket()
	if tb == nil {
		return s // a blanket answer: no tokens
	}
	full := int64(tb.GetMaxTokens())
	held := b.sent.GetTokenBucket()
	live := held != nil && now.Before(b.sentExpiry)
	if live && held.GetTokensPerFill().GetValue() == tb.GetTokensPerFill().GetValue() && int64(held.GetMaxTokens()) == b.builtMax {
		if b.builtMax >= full || b.left(now) < full {
			return b.sent // the same: extended, not built again
		}
	}
	tokens := full
	if live {
		// At least the tokens of a quarter of the delivery margin: an Envoy whose demand is
		// about its share spends its tokens as they come too, and a bucket of one token would
		// refuse every request that comes a moment early.
		jitter := int64(float64(a) * float64(c.s.rules.Load().margin()/4) / float64(b.rule.Period))
		tokens = min(full, max(1, jitter, b.left(now)))
	}
	if tokens != full {
		tb = proto.Clone(tb).(*typev3.TokenBucket)
		tb.MaxTokens = uint32(tokens)
		s = &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: tb}}
	}
	b.builtAt, b.builtMax, b.spent = now, tokens, 0
	return s
}

// left is what the Envoy's current token bucket has left by the service's count: its tokens when
// built, plus its refill since, less what the Envoy reported admitting since, and less its refill
// since its last report if it then refused some (a busy Envoy spends its tokens as they come).
func (b *sub) left(now time.Time) int64 {
	rate := float64(b.sentAllot) / float64(b.rule.Period)
	n := b.builtMax + int64(rate*float64(now.Sub(b.builtAt))) - b.spent
	if since := b.seen; b.last[1] > 0 {
		if since.Before(b.builtAt) {
			since = b.builtAt
		}
		n -= int64(rate * float64(now.Sub(since)))
	}
	return n
}

// demand is the bucket's want after a report of allowed + denied requests over d: their rate per
// period, so that a change of demand is seen in one report; but a report without a request after
// some within the last four is the four's rate instead, so that an Envoy with a request every
// few reports keeps a share the size of its demand rather than none every other report.
func (b *sub) demand(allowed, denied int64, d time.Duration) int64 {
	copy(b.recent[1:], b.recent[:demandReports-1])
	b.recent[0] = interval{allowed + denied, d}
	if allowed+denied > 0 {
		return ledger.Demand(allowed, denied, d, b.rule.Period)
	}
	var n int64
	var total time.Duration
	for _, r := range b.recent {
		n, total = n+r.n, total+r.d
	}
	return ledger.Demand(n, 0, total, b.rule.Period)
}

// fail records a ledger error (under c.mu); not the end of the stream's own context (an Envoy
// that went away mid-report), which is no error of the ledger's.
func (c *Client) fail(ctx context.Context, b *sub, err error) {
	if ctx.Err() != nil {
		c.failed = true
		return
	}
	c.failed = c.failed || errors.Is(err, sluice.ErrStoreUnavailable) // (not a bucket's own error: too many Envoys)
	b.errors++
	c.s.counters.ledgerErrors.Add(1)
	c.s.mu.Lock()
	c.s.lastErr = LedgerError{At: c.s.now(), Rule: b.rule.Name, Error: err.Error()}
	c.s.mu.Unlock()
	c.s.log.Warn("rlqs: the bucket's ledger did not answer; the Envoy keeps its assignment until it expires", "client", c.ID, "rule", b.rule.Name, "bucket", b.name, "err", err)
}

// strategy is the token bucket of an allotment a of rule r (units per period): a per period,
// refilled continuously, holding a's part of the rule's burst (at least one token); DENY_ALL for
// nothing (Envoy's token bucket needs a token per fill).
func strategy(a int64, r *Rule) *typev3.RateLimitStrategy {
	if a <= 0 {
		return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}}
	}
	burst := max(1, int64(float64(a)*float64(r.Burst)/float64(r.Limit)))
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens: uint32(min(burst, config.MaxQuotaLimit)), TokensPerFill: wrapperspb.UInt32(uint32(min(a, config.MaxQuotaLimit))),
		FillInterval: durationpb.New(r.Period)}}}
}

// Tokens is an assignment's rate and burst (tokens per fill, fill interval, max tokens), for
// stats; 0s for a blanket rule.
func Tokens(s *typev3.RateLimitStrategy) (perFill int64, interval time.Duration, maxTokens int64) {
	tb := s.GetTokenBucket()
	if tb == nil {
		return 0, 0, 0
	}
	return int64(tb.GetTokensPerFill().GetValue()), tb.GetFillInterval().AsDuration(), int64(tb.GetMaxTokens())
}

// Package envoyfilter is the decision logic of Envoy's HTTP rate limit quota filter
// (envoy.extensions.filters.http.rate_limit_quota.v3) without its transport: the buckets, their
// states (no assignment, active, expired), the limiters an assignment or a fallback builds, the
// first request of a new bucket, the usage a report carries and the actions a response applies.
// internal/rlqstest puts it behind a real gRPC stream; the simulator (sim/envoys) drives it on a
// virtual clock. It imports no gRPC: only Envoy's type protos for the strategies.
//
// internal/rlqstest's package doc says which Envoy sources it follows and where it differs from
// Envoy's current filter on purpose (a fixed window for requests_per_time_unit, exact
// time_elapsed, reuse_last_assignment applied, the expired behaviour's timeout abandoning the
// bucket).
//
// A Filter is not safe for concurrent use: its caller holds a lock, or runs on one goroutine.
package envoyfilter

import (
	"sort"
	"strings"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// ExpiredBehavior is the filter's expired_assignment_behavior.
type ExpiredBehavior struct {
	// Fallback is fallback_rate_limit; ignored if ReuseLast.
	Fallback *typev3.RateLimitStrategy
	// ReuseLast is reuse_last_assignment: keep applying the expired
	// assignment (its limiter state carries on).
	ReuseLast bool
	// Timeout is expired_assignment_behavior_timeout: that long after expiry
	// the bucket is abandoned. Zero: never.
	Timeout time.Duration
}

// Config is the filter's configuration, as far as its decisions go.
type Config struct {
	// NoAssignment is no_assignment_behavior's fallback_rate_limit; nil allows all.
	NoAssignment *typev3.RateLimitStrategy
	// Expired is expired_assignment_behavior; nil goes back to NoAssignment.
	Expired *ExpiredBehavior
	// DeferFirstReport leaves a new bucket's first request to the next
	// periodic report instead of reporting it at once.
	DeferFirstReport bool
	// Window is the width of the per-window counts; 1 s if zero.
	Window time.Duration
}

// State is where a bucket is in the filter's life cycle.
type State string

const (
	NoAssignment State = "no_assignment"
	Active       State = "active"
	Expired      State = "expired"
)

// Counts are admitted and denied requests.
type Counts struct{ Allowed, Denied uint64 }

func (c *Counts) add(ok bool) {
	if ok {
		c.Allowed++
	} else {
		c.Denied++
	}
}

// Window is the counts of one window, starting at Start.
type Window struct {
	Start time.Time
	Counts
}

// BucketStats is a bucket's view.
type BucketStats struct {
	Total Counts
	State State
	// Assignment is the strategy of the latest assignment (nil before one).
	Assignment *typev3.RateLimitStrategy
	// Expires is when the assignment expires (zero: never or none).
	Expires time.Time
}

// Usage is one bucket's part of a report: its requests since its last report.
type Usage struct {
	ID      map[string]string
	Elapsed time.Duration
	Allowed uint64
	Denied  uint64
}

// Action is one bucket action of a response: an abandon, or an assignment of Strategy (nil
// allows all) for TTL (Forever: the response set no assignment_time_to_live).
type Action struct {
	ID       map[string]string
	Abandon  bool
	Strategy *typev3.RateLimitStrategy
	TTL      time.Duration
	Forever  bool
}

// NewAction is a response's bucket action from its parts (the proto's getters): an abandon, or an
// assignment of strategy for ttl (nil: it never expires).
func NewAction(id map[string]string, abandon, assign bool, strategy *typev3.RateLimitStrategy, ttl *durationpb.Duration) Action {
	x := Action{ID: id, Abandon: abandon}
	if assign && !abandon {
		x.Strategy = strategy
		if ttl != nil {
			x.TTL = ttl.AsDuration()
		} else {
			x.Forever = true
		}
	}
	return x
}

// Decision is how the filter decided one request.
type Decision struct {
	Allowed bool
	// State is the bucket's state the request was decided in; NoAssignment for a new bucket's
	// first request.
	State State
	// First is the report of a new bucket's first request (nil unless the bucket is new and its
	// first request is reported at once): the caller sends it.
	First []Usage
}

type bucket struct {
	id         map[string]string
	usage      Counts // since the last report
	lastReport time.Time
	total      Counts
	windows    map[int64]*Counts

	assignment *typev3.RateLimitStrategy // nil: none yet
	assigned   limiter
	expires    time.Time // zero: never
	fallback   limiter   // no_assignment or expired fallback, by state
	fallbackOf State
}

// Filter is one Envoy's filter: its buckets.
type Filter struct {
	cfg     Config
	buckets map[string]*bucket
	windows map[int64]*Counts
}

// New returns a filter without buckets.
func New(cfg Config) *Filter {
	if cfg.Window <= 0 {
		cfg.Window = time.Second
	}
	return &Filter{cfg: cfg, buckets: map[string]*bucket{}, windows: map[int64]*Counts{}}
}

// Key is a bucket id as one string (its entries sorted).
func Key(id map[string]string) string {
	ks := make([]string, 0, len(id))
	for k := range id {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var b strings.Builder
	for _, k := range ks {
		b.WriteString(k)
		b.WriteByte(0)
		b.WriteString(id[k])
		b.WriteByte(0)
	}
	return b.String()
}

// Decide decides one request matched into the bucket id at now, as the filter does, and counts
// it.
func (f *Filter) Decide(id map[string]string, now time.Time) Decision {
	k := Key(id)
	b := f.buckets[k]
	if b != nil && f.abandonExpired(b, now) {
		delete(f.buckets, k)
		b = nil
	}
	fresh := b == nil
	var d Decision
	if fresh {
		b = &bucket{id: copyID(id), lastReport: now, windows: map[int64]*Counts{}}
		f.buckets[k] = b
		// filter.cc decides a new bucket's first request before the bucket
		// exists: only a blanket DENY_ALL no_assignment_behavior denies it.
		d.Allowed, d.State = !IsDenyAll(f.cfg.NoAssignment), NoAssignment
	} else {
		var l limiter
		l, d.State = f.limiterFor(b, now)
		d.Allowed = l.allow(now)
	}
	b.usage.add(d.Allowed)
	b.total.add(d.Allowed)
	w := now.UnixNano() / int64(f.cfg.Window)
	for _, m := range []map[int64]*Counts{b.windows, f.windows} {
		if m[w] == nil {
			m[w] = &Counts{}
		}
		m[w].add(d.Allowed)
	}
	if fresh && !f.cfg.DeferFirstReport {
		// The first request of a new bucket: report it at once.
		d.First = f.report(now, b)
		d.First[0].Elapsed = 0
	}
	return d
}

// IsDenyAll reports whether s is a blanket DENY_ALL.
func IsDenyAll(s *typev3.RateLimitStrategy) bool {
	r, ok := s.GetStrategy().(*typev3.RateLimitStrategy_BlanketRule_)
	return ok && r.BlanketRule == typev3.RateLimitStrategy_DENY_ALL
}

// abandonExpired says whether the bucket's expired assignment has outlived
// expired_assignment_behavior_timeout.
func (f *Filter) abandonExpired(b *bucket, now time.Time) bool {
	e := f.cfg.Expired
	return e != nil && e.Timeout > 0 && b.assignment != nil && !b.expires.IsZero() &&
		!now.Before(b.expires.Add(e.Timeout))
}

func (f *Filter) state(b *bucket, now time.Time) State {
	switch {
	case b.assignment == nil:
		return NoAssignment
	case !b.expires.IsZero() && !now.Before(b.expires):
		return Expired
	}
	return Active
}

// limiterFor is the limiter that applies to the bucket now, and the state it applies in.
func (f *Filter) limiterFor(b *bucket, now time.Time) (limiter, State) {
	st := f.state(b, now)
	if st == Active {
		return b.assigned, st
	}
	if st == Expired {
		e := f.cfg.Expired
		if e == nil {
			// No expired behaviour: back to the no-assignment state.
			b.assignment, b.assigned, b.expires = nil, nil, time.Time{}
			b.fallback, st = nil, NoAssignment
		} else if e.ReuseLast {
			return b.assigned, st
		}
	}
	if b.fallback == nil || b.fallbackOf != st {
		s := f.cfg.NoAssignment
		if st == Expired {
			s = f.cfg.Expired.Fallback
		}
		b.fallback, b.fallbackOf = newLimiter(s, now), st
	}
	return b.fallback, st
}

func copyID(id map[string]string) map[string]string {
	c := make(map[string]string, len(id))
	for k, v := range id {
		c[k] = v
	}
	return c
}

// Report is a periodic report: every bucket's usage since its last report (their counters
// reset, as the filter's buildReports does), in the order of their keys; nil without buckets.
func (f *Filter) Report(now time.Time) []Usage {
	if len(f.buckets) == 0 {
		return nil
	}
	keys := make([]string, 0, len(f.buckets))
	for k := range f.buckets {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	bs := make([]*bucket, len(keys))
	for i, k := range keys {
		bs[i] = f.buckets[k]
	}
	return f.report(now, bs...)
}

func (f *Filter) report(now time.Time, bs ...*bucket) []Usage {
	us := make([]Usage, 0, len(bs))
	for _, b := range bs {
		us = append(us, Usage{ID: copyID(b.id), Elapsed: now.Sub(b.lastReport), Allowed: b.usage.Allowed, Denied: b.usage.Denied})
		b.usage, b.lastReport = Counts{}, now
	}
	return us
}

// Applied is what Apply did with one action.
type Applied struct {
	// Unknown: the action named no bucket the filter has (ignored).
	Unknown bool
	// Built: a new limiter was built from the assignment (a token bucket starts full): a new
	// strategy, or the bucket was not active.
	Built bool
}

// Apply applies one bucket action at now.
func (f *Filter) Apply(a Action, now time.Time) Applied {
	k := Key(a.ID)
	b := f.buckets[k]
	if b == nil || len(a.ID) == 0 {
		return Applied{Unknown: true}
	}
	if a.Abandon {
		delete(f.buckets, k)
		return Applied{}
	}
	var out Applied
	s := a.Strategy
	if f.state(b, now) != Active || !proto.Equal(s, b.assignment) {
		b.assigned = newLimiter(s, now)
		out.Built = true
	}
	if s == nil {
		s = &typev3.RateLimitStrategy{}
	}
	b.assignment = s
	b.expires = time.Time{}
	if !a.Forever {
		b.expires = now.Add(a.TTL)
	}
	return out
}

// Stats is the bucket's counts and assignment at now; ok is false if the filter does not track
// the bucket (never seen, or abandoned).
func (f *Filter) Stats(id map[string]string, now time.Time) (s BucketStats, ok bool) {
	b := f.buckets[Key(id)]
	if b == nil {
		return BucketStats{}, false
	}
	return BucketStats{Total: b.total, State: f.state(b, now), Assignment: b.assignment, Expires: b.expires}, true
}

// Windows is the bucket's counts per window, oldest first; all buckets' if id is nil.
func (f *Filter) Windows(id map[string]string) []Window {
	m := f.windows
	if id != nil {
		b := f.buckets[Key(id)]
		if b == nil {
			return nil
		}
		m = b.windows
	}
	ws := make([]Window, 0, len(m))
	for w, c := range m {
		ws = append(ws, Window{Start: time.Unix(0, w*int64(f.cfg.Window)), Counts: *c})
	}
	sort.Slice(ws, func(i, j int) bool { return ws[i].Start.Before(ws[j].Start) })
	return ws
}

// Buckets is how many buckets the filter tracks.
func (f *Filter) Buckets() int { return len(f.buckets) }

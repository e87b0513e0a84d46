// Package rlqstest imitates Envoy's HTTP rate limit quota filter
// (envoy.extensions.filters.http.rate_limit_quota.v3) talking to a Rate Limit
// Quota Service (envoy.service.rate_limit_quota.v3.RateLimitQuotaService), so
// that tests can put simulated Envoys in front of an RLQS server and count what
// they admit. A Filter is one Envoy instance with one filter config and one
// bucket settings for all its buckets.
//
// What it follows, by path in github.com/envoyproxy/envoy:
//
//   - api/envoy/service/rate_limit_quota/v3/rlqs.proto: the stream, the first
//     report of a bucket subscribing it, QuotaAssignmentAction (an unset
//     assignment_time_to_live never expires, 0 expires at once; the same
//     strategy again extends the active assignment, a different one replaces
//     it; no rate_limit_strategy allows all), AbandonAction (the bucket and
//     its usage are erased, reports stop, the next request starts over as the
//     first of a new bucket).
//   - api/envoy/extensions/filters/http/rate_limit_quota/v3/rate_limit_quota.proto:
//     no_assignment_behavior (unset: allow all), expired_assignment_behavior
//     (fallback_rate_limit or reuse_last_assignment, limited by
//     expired_assignment_behavior_timeout), and the first request of a bucket
//     reported at once.
//   - source/extensions/filters/http/rate_limit_quota/filter.cc: a new
//     bucket's first request is decided before the bucket exists, denied only
//     by a blanket DENY_ALL no_assignment_behavior (any other fallback admits
//     it), and counted in the bucket's usage; later requests apply the
//     bucket's assignment, or the no-assignment fallback.
//   - source/extensions/filters/http/rate_limit_quota/global_client_impl.cc
//     (client_impl.cc in older releases): one stream per client, the domain in
//     every report, a report holds every bucket's allowed/denied since its
//     last report and the time elapsed, counters reset when a report is
//     built; on the reporting timer a closed stream is restarted, and if that
//     fails the built report is dropped (its counts are lost, as Envoy loses
//     them); a response for an unknown bucket is ignored; a token bucket
//     assignment becomes a TokenBucketImpl (starts full, continuous refill),
//     rebuilt only when the token bucket changes.
//
// Where the harness differs from Envoy's current filter, on purpose:
//
//   - ReportInterval is a parameter. Envoy's filter ignores the bucket
//     settings' reporting_interval and reports on one fixed 5 s timer
//     (source/extensions/filters/http/rate_limit_quota/filter_persistence.cc;
//     envoyproxy/envoy#46662 proposed a fixed 1 s and was closed, #47104
//     proposes a configurable one); the default here is that 5 s.
//   - A new bucket is reported at once, as the proto and the older
//     client_impl.cc do, in a report of that bucket alone with time_elapsed 0;
//     global_client_impl.cc only adds the bucket for the next periodic report
//     (Config.DeferFirstReport does that).
//   - requests_per_time_unit is applied as a fixed window aligned to the unit
//     (a second starts on the second); Envoy's filter does not implement it
//     yet and admits every request (filter.cc logs a warning).
//   - time_elapsed is exact; Envoy's client rounds it down to whole seconds
//     (envoyproxy/envoy#46723), and converts a token bucket's fill_interval
//     to whole seconds too.
//   - reuse_last_assignment is applied (the expired assignment's limiter
//     carries on); Envoy's filter.cc only reads fallback_rate_limit.
//   - An expired assignment without expired_assignment_behavior goes back to
//     no_assignment_behavior (the bucket stays subscribed). With
//     ExpiredBehavior.Timeout > 0 the bucket is abandoned that long after
//     expiry, as the proto says, so the next request is a new bucket's (Envoy
//     goes back to the no-assignment fallback instead; the decisions are the
//     same apart from the first request and its immediate report). A zero
//     Timeout means no limit, not "abandon at once" as the proto reads zero.
//   - The harness does not send the extra report the proto asks for when an
//     assignment arrives (Envoy's filter does not either).
//   - Requests are decided by Decide with a bucket id; there is no matcher
//     tree, no filter_enabled/filter_enforced and no deny response.
//
// The decisions themselves (buckets, states, limiters, reports' usage,
// responses' actions) are package internal/envoyfilter's, which the simulator
// runs too, without gRPC; this package is their transport.
//
// Every Decide is counted: per bucket in total and per Window, and in the
// usage of the next report. A bucket's counts go with it when it is
// abandoned; Windows(nil) keeps every decision of the Filter.
package rlqstest

import (
	"context"
	"errors"
	"sync"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/internal/envoyfilter"
)

// DefaultReportInterval is the filter's fixed reporting interval today (see
// the package doc).
const DefaultReportInterval = 5 * time.Second

// ExpiredBehavior is the filter's expired_assignment_behavior: Fallback is
// fallback_rate_limit (ignored if ReuseLast); ReuseLast is
// reuse_last_assignment (the expired assignment's limiter carries on); Timeout
// is expired_assignment_behavior_timeout, after which the bucket is abandoned
// (zero: never; see the package doc).
type ExpiredBehavior = envoyfilter.ExpiredBehavior

// Config is one simulated Envoy's filter configuration.
type Config struct {
	Addr   string // RLQS server, dialled insecurely
	Domain string
	// ReportInterval between periodic reports; DefaultReportInterval if zero.
	// Ignored when Ticks is set.
	ReportInterval time.Duration
	// Ticks, if set, replaces the reporting timer: a report is sent per value.
	Ticks <-chan time.Time
	// NoAssignment is no_assignment_behavior's fallback_rate_limit; nil allows all.
	NoAssignment *typev3.RateLimitStrategy
	// Expired is expired_assignment_behavior; nil goes back to NoAssignment.
	Expired *ExpiredBehavior
	// DeferFirstReport leaves a new bucket's first request to the next
	// periodic report, as Envoy's current client does, instead of reporting
	// it at once as the proto says.
	DeferFirstReport bool
	// Now is the clock; time.Now if nil.
	Now func() time.Time
	// Window is the width of the per-window counts; 1 s if zero.
	Window time.Duration
	// OnResponse, if set, is called after a response has been applied.
	OnResponse func(*rlqspb.RateLimitQuotaResponse)
	// OnStream, if set, is called when a stream opens (true) and when it
	// breaks (false).
	OnStream func(up bool)
	// DialOptions are added to the insecure transport credentials.
	DialOptions []grpc.DialOption
}

// State is where a bucket is in the filter's life cycle.
type State = envoyfilter.State

const (
	NoAssignment = envoyfilter.NoAssignment
	Active       = envoyfilter.Active
	Expired      = envoyfilter.Expired
)

// Counts, Window and BucketStats are the filter model's (package envoyfilter): admitted and
// denied requests, the counts of one window, and a bucket's view for tests.
type (
	Counts      = envoyfilter.Counts
	Window      = envoyfilter.Window
	BucketStats = envoyfilter.BucketStats
)

// Filter is one simulated Envoy. Its methods are safe for concurrent use.
type Filter struct {
	cfg    Config
	conn   *grpc.ClientConn
	client rlqspb.RateLimitQuotaServiceClient
	ctx    context.Context
	cancel context.CancelFunc
	out    chan *rlqspb.RateLimitQuotaUsageReports
	done   chan struct{}

	mu        sync.Mutex
	f         *envoyfilter.Filter
	sent      int
	dropped   int
	streams   int
	responses int
	unknown   int
}

// New starts a Filter: the stream is opened by the first report, as Envoy
// opens it on the first matched request.
func New(cfg Config) (*Filter, error) {
	if cfg.Addr == "" {
		return nil, errors.New("rlqstest: no server address")
	}
	if cfg.ReportInterval <= 0 {
		cfg.ReportInterval = DefaultReportInterval
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Window <= 0 {
		cfg.Window = time.Second
	}
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, cfg.DialOptions...)
	conn, err := grpc.NewClient(cfg.Addr, opts...)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &Filter{
		cfg: cfg, conn: conn, client: rlqspb.NewRateLimitQuotaServiceClient(conn),
		ctx: ctx, cancel: cancel,
		out: make(chan *rlqspb.RateLimitQuotaUsageReports, 1024), done: make(chan struct{}),
		f: envoyfilter.New(envoyfilter.Config{NoAssignment: cfg.NoAssignment, Expired: cfg.Expired,
			DeferFirstReport: cfg.DeferFirstReport, Window: cfg.Window}),
	}
	go f.loop()
	return f, nil
}

// Close stops reporting and closes the connection.
func (f *Filter) Close() error {
	f.cancel()
	<-f.done
	return f.conn.Close()
}

func key(id map[string]string) string { return envoyfilter.Key(id) }

// Decide decides one request matched into the bucket id, as the filter does,
// and counts it.
func (f *Filter) Decide(id map[string]string) bool {
	f.mu.Lock()
	d := f.f.Decide(id, f.cfg.Now())
	var first *rlqspb.RateLimitQuotaUsageReports
	if d.First != nil {
		first = f.report(d.First)
	}
	f.mu.Unlock()
	if first != nil {
		// A request never waits for the service: if the sender is that far
		// behind, the report is dropped.
		select {
		case f.out <- first:
		default:
			f.count(&f.dropped)
		}
	}
	return d.Allowed
}

// report is the usage report of us.
func (f *Filter) report(us []envoyfilter.Usage) *rlqspb.RateLimitQuotaUsageReports {
	r := &rlqspb.RateLimitQuotaUsageReports{Domain: f.cfg.Domain}
	for _, u := range us {
		r.BucketQuotaUsages = append(r.BucketQuotaUsages, &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:           &rlqspb.BucketId{Bucket: u.ID},
			TimeElapsed:        durationpb.New(u.Elapsed),
			NumRequestsAllowed: u.Allowed,
			NumRequestsDenied:  u.Denied,
		})
	}
	return r
}

// stream is one StreamRateLimitQuotas call; done closes when it breaks.
type stream struct {
	s    rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient
	done chan struct{}
}

func (f *Filter) loop() {
	defer close(f.done)
	ticks := f.cfg.Ticks
	if ticks == nil {
		t := time.NewTicker(f.cfg.ReportInterval)
		defer t.Stop()
		ticks = t.C
	}
	var cur *stream
	for {
		var r *rlqspb.RateLimitQuotaUsageReports
		select {
		case <-f.ctx.Done():
			return
		case <-ticks:
			f.mu.Lock()
			if us := f.f.Report(f.cfg.Now()); us != nil {
				r = f.report(us)
			}
			f.mu.Unlock()
		case r = <-f.out:
		}
		if r != nil {
			cur = f.send(cur, r)
		}
	}
}

// send sends a report on the stream, opening one if there is none or it
// broke; a report that cannot be sent is dropped, as Envoy drops it.
func (f *Filter) send(cur *stream, r *rlqspb.RateLimitQuotaUsageReports) *stream {
	if cur != nil {
		select {
		case <-cur.done:
			cur = nil
		default:
		}
	}
	if cur == nil {
		s, err := f.client.StreamRateLimitQuotas(f.ctx)
		if err != nil {
			f.count(&f.dropped)
			return nil
		}
		cur = &stream{s: s, done: make(chan struct{})}
		f.count(&f.streams)
		if f.cfg.OnStream != nil {
			f.cfg.OnStream(true)
		}
		go f.receive(cur)
	}
	// Counted before it goes, so that a peer that has the report sees it
	// counted; taken back if Send fails.
	f.count(&f.sent)
	if err := cur.s.Send(r); err != nil {
		f.mu.Lock()
		f.sent--
		f.dropped++
		f.mu.Unlock()
		return nil
	}
	return cur
}

func (f *Filter) count(n *int) {
	f.mu.Lock()
	*n++
	f.mu.Unlock()
}

func (f *Filter) receive(st *stream) {
	for {
		resp, err := st.s.Recv()
		if err != nil {
			close(st.done)
			if f.cfg.OnStream != nil && f.ctx.Err() == nil {
				f.cfg.OnStream(false)
			}
			return
		}
		f.apply(resp)
		if f.cfg.OnResponse != nil {
			f.cfg.OnResponse(resp)
		}
	}
}

// apply applies a response's bucket actions in order.
func (f *Filter) apply(resp *rlqspb.RateLimitQuotaResponse) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.responses++
	now := f.cfg.Now()
	for _, a := range resp.GetBucketAction() {
		id := a.GetBucketId().GetBucket()
		if a.GetAbandonAction() == nil && a.GetQuotaAssignmentAction() == nil {
			// Neither action: nothing to apply to a bucket it knows.
			if _, ok := f.f.Stats(id, now); !ok || len(id) == 0 {
				f.unknown++
			}
			continue
		}
		if f.f.Apply(action(a), now).Unknown {
			f.unknown++
		}
	}
}

// action is a response's bucket action as the filter's decisions take it.
func action(a *rlqspb.RateLimitQuotaResponse_BucketAction) envoyfilter.Action {
	qa := a.GetQuotaAssignmentAction()
	return envoyfilter.NewAction(a.GetBucketId().GetBucket(), a.GetAbandonAction() != nil, qa != nil, qa.GetRateLimitStrategy(), qa.GetAssignmentTimeToLive())
}

// Stats is the bucket's counts and assignment; ok is false if the filter does
// not track the bucket (never seen, or abandoned).
func (f *Filter) Stats(id map[string]string) (s BucketStats, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.f.Stats(id, f.cfg.Now())
}

// Windows is the bucket's counts per window, oldest first; all buckets' if id
// is nil.
func (f *Filter) Windows(id map[string]string) []Window {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.f.Windows(id)
}

// ClientStats are the filter's stream figures.
type ClientStats struct {
	ReportsSent, ReportsDropped, Streams, Responses, UnknownBuckets int
}

// Client is the filter's stream figures.
func (f *Filter) Client() ClientStats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return ClientStats{f.sent, f.dropped, f.streams, f.responses, f.unknown}
}

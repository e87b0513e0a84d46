package rlqstest

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// peer is a real RLQS server for the tests: it hands every report to the
// test and sends what the test scripts on the stream.
type peer struct {
	rlqspb.UnimplementedRateLimitQuotaServiceServer
	reports chan *rlqspb.RateLimitQuotaUsageReports
	streams chan *peerStream
}

type peerStream struct {
	send chan *rlqspb.RateLimitQuotaResponse
	kill chan struct{}
}

func (p *peer) StreamRateLimitQuotas(s rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	ps := &peerStream{send: make(chan *rlqspb.RateLimitQuotaResponse, 16), kill: make(chan struct{})}
	p.streams <- ps
	errc := make(chan error, 1)
	go func() {
		for {
			r, err := s.Recv()
			if err != nil {
				errc <- err
				return
			}
			p.reports <- r
		}
	}()
	for {
		select {
		case r := <-ps.send:
			if err := s.Send(r); err != nil {
				return err
			}
		case <-ps.kill:
			return status.Error(codes.Unavailable, "killed by the test")
		case err := <-errc:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// rig is one peer and one Filter on a fake clock with test-driven reports.
type rig struct {
	t       *testing.T
	peer    *peer
	f       *Filter
	clock   *clock
	ticks   chan time.Time
	applied chan *rlqspb.RateLimitQuotaResponse
	broken  chan struct{}
}

func newRig(t *testing.T, cfg Config) *rig {
	t.Helper()
	p := &peer{reports: make(chan *rlqspb.RateLimitQuotaUsageReports, 1024), streams: make(chan *peerStream, 16)}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	rlqspb.RegisterRateLimitQuotaServiceServer(srv, p)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	r := &rig{t: t, peer: p, clock: &clock{now: time.Unix(1_000_000, 0)}}
	return r.another(lis.Addr().String(), cfg)
}

// another is one more simulated Envoy on the same peer and clock.
func (r *rig) another(addr string, cfg Config) *rig {
	r.t.Helper()
	n := &rig{t: r.t, peer: r.peer, clock: r.clock,
		ticks: make(chan time.Time), applied: make(chan *rlqspb.RateLimitQuotaResponse, 16),
		broken: make(chan struct{}, 16)}
	cfg.Addr, cfg.Domain, cfg.Now = addr, "test", r.clock.Now
	if cfg.ReportInterval == 0 {
		cfg.Ticks = n.ticks // reports when the test ticks
	}
	cfg.OnResponse = func(resp *rlqspb.RateLimitQuotaResponse) { n.applied <- resp }
	cfg.OnStream = func(up bool) {
		if !up {
			n.broken <- struct{}{}
		}
	}
	f, err := New(cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { f.Close() })
	n.f = f
	return n
}

func wait[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s within 10s", what)
		panic("unreachable")
	}
}

func (r *rig) report() *rlqspb.RateLimitQuotaUsageReports {
	r.t.Helper()
	return wait(r.t, r.peer.reports, "report")
}

// tick sends a periodic report and returns it as the peer received it.
func (r *rig) tick() *rlqspb.RateLimitQuotaUsageReports {
	r.t.Helper()
	r.ticks <- r.clock.Now()
	return r.report()
}

// respond sends actions on the stream and waits until the filter applied them.
func (r *rig) respond(ps *peerStream, actions ...*rlqspb.RateLimitQuotaResponse_BucketAction) {
	r.t.Helper()
	ps.send <- &rlqspb.RateLimitQuotaResponse{BucketAction: actions}
	wait(r.t, r.applied, "response applied")
}

func (r *rig) decide(id map[string]string, n int) (allowed int) {
	for range n {
		if r.f.Decide(id) {
			allowed++
		}
	}
	return allowed
}

// subscribe sends the bucket's first request, checks its immediate report and
// returns the stream it came on.
func (r *rig) subscribe(id map[string]string) *peerStream {
	r.t.Helper()
	r.f.Decide(id)
	rep := r.report()
	if len(rep.BucketQuotaUsages) != 1 || rep.BucketQuotaUsages[0].TimeElapsed.AsDuration() != 0 {
		r.t.Fatalf("immediate report: %v", rep)
	}
	return wait(r.t, r.peer.streams, "stream")
}

func assign(id map[string]string, s *typev3.RateLimitStrategy, ttl *durationpb.Duration) *rlqspb.RateLimitQuotaResponse_BucketAction {
	return &rlqspb.RateLimitQuotaResponse_BucketAction{
		BucketId: &rlqspb.BucketId{Bucket: id},
		BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: ttl, RateLimitStrategy: s}}}
}

func abandon(id map[string]string) *rlqspb.RateLimitQuotaResponse_BucketAction {
	return &rlqspb.RateLimitQuotaResponse_BucketAction{
		BucketId:     &rlqspb.BucketId{Bucket: id},
		BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction{}}}
}

func blanketRule(allow bool) *typev3.RateLimitStrategy {
	r := typev3.RateLimitStrategy_DENY_ALL
	if allow {
		r = typev3.RateLimitStrategy_ALLOW_ALL
	}
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: r}}
}

func perUnit(n uint64, unit typev3.RateLimitUnit) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_RequestsPerTimeUnit_{
		RequestsPerTimeUnit: &typev3.RateLimitStrategy_RequestsPerTimeUnit{RequestsPerTimeUnit: n, TimeUnit: unit}}}
}

func tokenBucketRule(max, perFill uint32, interval time.Duration) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens: max, TokensPerFill: wrapperspb.UInt32(perFill), FillInterval: durationpb.New(interval)}}}
}

// usage is a report's usage of one bucket (nil if absent).
func usage(rep *rlqspb.RateLimitQuotaUsageReports, id map[string]string) *rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage {
	for _, u := range rep.BucketQuotaUsages {
		if key(u.BucketId.GetBucket()) == key(id) {
			return u
		}
	}
	return nil
}

func checkUsage(t *testing.T, rep *rlqspb.RateLimitQuotaUsageReports, id map[string]string, allowed, denied uint64, elapsed time.Duration) {
	t.Helper()
	u := usage(rep, id)
	if u == nil {
		t.Fatalf("report has no usage of %v: %v", id, rep)
	}
	if u.NumRequestsAllowed != allowed || u.NumRequestsDenied != denied || u.TimeElapsed.AsDuration() != elapsed {
		t.Fatalf("usage of %v: allowed %d denied %d elapsed %v, want %d %d %v",
			id, u.NumRequestsAllowed, u.NumRequestsDenied, u.TimeElapsed.AsDuration(), allowed, denied, elapsed)
	}
}

var bucketA = map[string]string{"name": "a", "env": "prod"}

func TestFirstRequestIsReportedAtOnceAndDecidedByNoAssignment(t *testing.T) {
	r := newRig(t, Config{NoAssignment: blanketRule(false)})
	if r.f.Decide(bucketA) {
		t.Fatal("no_assignment_behavior DENY_ALL admitted the first request")
	}
	rep := r.report()
	if rep.Domain != "test" || len(rep.BucketQuotaUsages) != 1 {
		t.Fatalf("immediate report: %v", rep)
	}
	checkUsage(t, rep, bucketA, 0, 1, 0)
	if s, _ := r.f.Stats(bucketA); s.State != NoAssignment || s.Total.Denied != 1 {
		t.Fatalf("stats %+v", s)
	}
	// The key order of a bucket id does not matter.
	if r.f.Decide(map[string]string{"env": "prod", "name": "a"}) {
		t.Fatal("admitted")
	}
	if len(r.peer.reports) != 0 {
		t.Fatal("a second request of the bucket was reported at once")
	}
}

func TestReportsCarryExactCountsAndElapsedTime(t *testing.T) {
	r := newRig(t, Config{})
	b := map[string]string{"name": "b"}
	r.subscribe(bucketA)
	r.clock.advance(2 * time.Second)
	r.decide(bucketA, 3)
	r.f.Decide(b)
	checkUsage(t, r.report(), b, 1, 0, 0)
	r.clock.advance(time.Second)
	rep := r.tick()
	checkUsage(t, rep, bucketA, 3, 0, 3*time.Second)
	checkUsage(t, rep, b, 0, 0, time.Second)

	r.clock.advance(1500 * time.Millisecond)
	r.decide(b, 7)
	rep = r.tick()
	checkUsage(t, rep, bucketA, 0, 0, 1500*time.Millisecond)
	checkUsage(t, rep, b, 7, 0, 1500*time.Millisecond)
	if c := r.f.Client(); c.ReportsSent != 4 || c.Streams != 1 {
		t.Fatalf("client %+v", c)
	}
}

func TestRequestsPerTimeUnitAdmitsExactlyNPerUnit(t *testing.T) {
	r := newRig(t, Config{})
	ps := r.subscribe(bucketA)
	r.respond(ps, assign(bucketA, perUnit(5, typev3.RateLimitUnit_SECOND), nil))
	for i := range 3 {
		if got := r.decide(bucketA, 8); got != 5 {
			t.Fatalf("second %d: admitted %d of 8, want 5", i, got)
		}
		r.clock.advance(time.Second)
	}
	ws := r.f.Windows(bucketA)
	// The first window also has the first request, decided before the assignment.
	want := []Counts{{Allowed: 6, Denied: 3}, {Allowed: 5, Denied: 3}, {Allowed: 5, Denied: 3}}
	if len(ws) != len(want) {
		t.Fatalf("windows %+v", ws)
	}
	for i, w := range ws {
		if w.Counts != want[i] {
			t.Fatalf("window %d: %+v, want %+v", i, w.Counts, want[i])
		}
	}
	if all := r.f.Windows(nil); len(all) != len(ws) || all[2] != ws[2] || !all[0].Start.Equal(r.clock.Now().Add(-3*time.Second)) {
		t.Fatalf("all buckets' windows %+v", all)
	}
	s, _ := r.f.Stats(bucketA)
	if s.State != Active || s.Total != (Counts{Allowed: 16, Denied: 9}) || !s.Expires.IsZero() {
		t.Fatalf("stats %+v", s)
	}
}

func TestTokenBucketAdmitsBurstThenFillRate(t *testing.T) {
	r := newRig(t, Config{})
	ps := r.subscribe(bucketA)
	r.respond(ps, assign(bucketA, tokenBucketRule(4, 2, time.Second), nil))
	if got := r.decide(bucketA, 10); got != 4 {
		t.Fatalf("burst: admitted %d, want 4", got)
	}
	r.clock.advance(500 * time.Millisecond) // one token
	if got := r.decide(bucketA, 3); got != 1 {
		t.Fatalf("after 0.5s: admitted %d, want 1", got)
	}
	for i := range 3 {
		r.clock.advance(time.Second) // two tokens
		if got := r.decide(bucketA, 5); got != 2 {
			t.Fatalf("second %d: admitted %d, want 2", i, got)
		}
	}
	r.clock.advance(time.Hour) // full again, not more
	if got := r.decide(bucketA, 10); got != 4 {
		t.Fatalf("after an hour: admitted %d, want 4", got)
	}
	// The same assignment again extends it and keeps the bucket's tokens.
	r.respond(ps, assign(bucketA, tokenBucketRule(4, 2, time.Second), nil))
	if r.f.Decide(bucketA) {
		t.Fatal("a repeated assignment refilled the bucket")
	}
}

func TestExpiredAssignment(t *testing.T) {
	ttl := durationpb.New(10 * time.Second)
	t.Run("no behaviour: back to no assignment", func(t *testing.T) {
		r := newRig(t, Config{})
		ps := r.subscribe(bucketA)
		r.respond(ps, assign(bucketA, blanketRule(false), ttl))
		r.clock.advance(10*time.Second - time.Nanosecond)
		if r.f.Decide(bucketA) {
			t.Fatal("admitted before expiry")
		}
		r.clock.advance(time.Nanosecond)
		if !r.f.Decide(bucketA) {
			t.Fatal("denied after expiry: not back to allow-all")
		}
		if s, _ := r.f.Stats(bucketA); s.State != NoAssignment {
			t.Fatalf("state %s", s.State)
		}
	})
	t.Run("fallback_rate_limit", func(t *testing.T) {
		r := newRig(t, Config{Expired: &ExpiredBehavior{Fallback: perUnit(2, typev3.RateLimitUnit_SECOND)}})
		ps := r.subscribe(bucketA)
		r.respond(ps, assign(bucketA, blanketRule(false), ttl))
		r.clock.advance(10 * time.Second)
		if got := r.decide(bucketA, 5); got != 2 {
			t.Fatalf("expired: admitted %d, want the fallback's 2", got)
		}
		if s, _ := r.f.Stats(bucketA); s.State != Expired {
			t.Fatalf("state %s", s.State)
		}
		// A new assignment ends the expired state.
		r.respond(ps, assign(bucketA, blanketRule(false), ttl))
		if r.f.Decide(bucketA) {
			t.Fatal("admitted under a fresh DENY_ALL")
		}
	})
	t.Run("reuse_last_assignment", func(t *testing.T) {
		r := newRig(t, Config{Expired: &ExpiredBehavior{ReuseLast: true}})
		ps := r.subscribe(bucketA)
		r.respond(ps, assign(bucketA, tokenBucketRule(3, 1, time.Hour), ttl))
		r.decide(bucketA, 2)
		r.clock.advance(10 * time.Second)
		if got := r.decide(bucketA, 5); got != 1 {
			t.Fatalf("expired: admitted %d, want the last token", got)
		}
	})
	t.Run("timeout abandons", func(t *testing.T) {
		r := newRig(t, Config{NoAssignment: blanketRule(false),
			Expired: &ExpiredBehavior{Fallback: blanketRule(true), Timeout: 5 * time.Second}})
		ps := r.subscribe(bucketA)
		r.respond(ps, assign(bucketA, blanketRule(false), ttl))
		r.clock.advance(14 * time.Second)
		if !r.f.Decide(bucketA) {
			t.Fatal("denied in the expired state with an ALLOW_ALL fallback")
		}
		r.clock.advance(time.Second)
		if r.f.Decide(bucketA) {
			t.Fatal("admitted after the timeout: not a new bucket under DENY_ALL")
		}
		checkUsage(t, r.report(), bucketA, 0, 1, 0)
	})
	t.Run("zero ttl expires at once", func(t *testing.T) {
		r := newRig(t, Config{Expired: &ExpiredBehavior{Fallback: blanketRule(false)}})
		ps := r.subscribe(bucketA)
		r.respond(ps, assign(bucketA, blanketRule(true), durationpb.New(0)))
		if r.f.Decide(bucketA) {
			t.Fatal("a zero TTL assignment was applied")
		}
	})
}

func TestAbandonDropsTheBucket(t *testing.T) {
	r := newRig(t, Config{})
	ps := r.subscribe(bucketA)
	r.respond(ps, assign(bucketA, blanketRule(false), nil))
	if r.f.Decide(bucketA) {
		t.Fatal("admitted under DENY_ALL")
	}
	r.respond(ps, abandon(bucketA), abandon(map[string]string{"name": "unknown"}))
	if _, ok := r.f.Stats(bucketA); ok {
		t.Fatal("the bucket is still tracked after abandon")
	}
	if c := r.f.Client(); c.UnknownBuckets != 1 {
		t.Fatalf("client %+v", c)
	}
	// The next request starts over: no assignment, reported at once.
	if !r.f.Decide(bucketA) {
		t.Fatal("denied after abandon")
	}
	checkUsage(t, r.report(), bucketA, 1, 0, 0)
}

func TestBrokenStreamReconnectsAndReportsResume(t *testing.T) {
	r := newRig(t, Config{})
	ps := r.subscribe(bucketA)
	close(ps.kill)
	wait(t, r.broken, "broken stream")
	r.clock.advance(time.Second)
	r.decide(bucketA, 4)
	checkUsage(t, r.tick(), bucketA, 4, 0, time.Second)
	ps2 := wait(t, r.peer.streams, "second stream")
	r.respond(ps2, assign(bucketA, blanketRule(false), nil))
	if r.f.Decide(bucketA) {
		t.Fatal("an assignment on the new stream was not applied")
	}
	if c := r.f.Client(); c.Streams != 2 || c.ReportsSent != 2 {
		t.Fatalf("client %+v", c)
	}
}

func TestConcurrentDecisions(t *testing.T) {
	r := newRig(t, Config{})
	ps := r.subscribe(bucketA)
	r.respond(ps, assign(bucketA, tokenBucketRule(100, 1, time.Hour), nil))
	const goroutines, each = 8, 500
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := map[string]string{"name": "a", "env": "prod"}
			other := map[string]string{"name": "other", "g": string(rune('0' + g))}
			n := 0
			for range each {
				if r.f.Decide(id) {
					n++
				}
				r.f.Decide(other)
			}
			mu.Lock()
			admitted += n
			mu.Unlock()
		}()
	}
	// Reports go out while the goroutines decide.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	allowed, denied := uint64(1), uint64(0) // the first request, reported by subscribe
	count := func(rep *rlqspb.RateLimitQuotaUsageReports) {
		if u := usage(rep, bucketA); u != nil {
			allowed += u.NumRequestsAllowed
			denied += u.NumRequestsDenied
		}
	}
	// At most 100 ticks while deciding: the peer holds 1024 reports unread,
	// and past that gRPC's flow control would stop the sender, and the tick
	// after the loop with it.
	for ticks := 0; ticks >= 0; {
		var tick chan time.Time
		if ticks < 100 {
			tick = r.ticks
		}
		select {
		case <-done:
			ticks = -1
		case tick <- r.clock.Now():
			ticks++
		}
	}
	r.ticks <- r.clock.Now()
	for allowed+denied < 1+goroutines*each {
		count(r.report())
	}
	if admitted != 100 || allowed != 101 || denied != goroutines*each-100 {
		t.Fatalf("admitted %d; reported allowed %d denied %d", admitted, allowed, denied)
	}
	if s, _ := r.f.Stats(bucketA); s.Total != (Counts{Allowed: 101, Denied: goroutines*each - 100}) {
		t.Fatalf("stats %+v", s)
	}
}

func TestReportsOnTheTimer(t *testing.T) {
	r := newRig(t, Config{ReportInterval: 20 * time.Millisecond})
	r.subscribe(bucketA)
	r.decide(bucketA, 3)
	var allowed uint64
	for allowed < 3 {
		if u := usage(r.report(), bucketA); u != nil {
			allowed += u.NumRequestsAllowed
		}
	}
	// The timer keeps reporting the bucket, idle or not.
	if u := usage(r.report(), bucketA); u == nil || u.NumRequestsAllowed != 0 {
		t.Fatalf("idle report: %v", u)
	}
}

func TestFirstRequestIsDeniedOnlyByBlanketDenyAll(t *testing.T) {
	r := newRig(t, Config{NoAssignment: perUnit(1, typev3.RateLimitUnit_SECOND)})
	// As filter.cc: the first request is admitted without touching the
	// fallback; later ones take the fallback's one per second.
	if got := r.decide(bucketA, 3); got != 2 {
		t.Fatalf("admitted %d of the first 3, want 2", got)
	}
	checkUsage(t, r.report(), bucketA, 1, 0, 0)
}

func TestDeferFirstReport(t *testing.T) {
	r := newRig(t, Config{DeferFirstReport: true})
	r.f.Decide(bucketA)
	r.clock.advance(time.Second)
	r.f.Decide(bucketA)
	// The tick's report is the first the peer sees.
	checkUsage(t, r.tick(), bucketA, 2, 0, time.Second)
}

func TestSeveralEnvoysOnOneServer(t *testing.T) {
	first := newRig(t, Config{})
	envoys := []*rig{first}
	for range 2 {
		envoys = append(envoys, first.another(first.f.cfg.Addr, Config{}))
	}
	// Each Envoy has its own stream and its own assignment for the same bucket.
	for i, e := range envoys {
		ps := e.subscribe(bucketA)
		e.respond(ps, assign(bucketA, tokenBucketRule(uint32(i+1), 1, time.Hour), nil))
	}
	for i, e := range envoys {
		if got := e.decide(bucketA, 10); got != i+1 {
			t.Fatalf("envoy %d admitted %d, want its own %d", i, got, i+1)
		}
		checkUsage(t, e.tick(), bucketA, uint64(i+1), uint64(9-i), 0)
	}
}

package main

// End-to-end tests of the Rate Limit Quota Service (issue 35's "Done when"): the real binary
// serving envoy.service.rate_limit_quota.v3 to ten imitations of Envoy's rate_limit_quota filter
// (internal/rlqstest) in this process, under paced load. Every bound is checked from what the
// Envoys applied (the assignments each received, bracketed in time: when its message came off the
// stream and when the filter had applied it), never from a timed assertion: the worldwide
// admissions of each 1 s window against L·W/P plus the burst of every token bucket an Envoy held
// or built in it, and at every instant the sum of the assignments' rates against L/P.
// Re-convergence after a move of the demand is counted in report intervals, measured from the
// reports the Envoys sent.

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/allot"
	"github.com/sluicehq/sluice/gateway"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/rlqstest"
)

// The bucket all Envoys share: L per P, its Envoys' token buckets holding B in all.
const (
	rlqsL        = 1000
	rlqsB        = 100
	rlqsP        = time.Second
	rlqsN        = 10
	rlqsInterval = 250 * time.Millisecond
	rlqsTTL      = 750 * time.Millisecond
	rlqsMargin   = 250 * time.Millisecond // min(1 s, report_interval)
	rlqsW        = time.Second            // the harness's window
)

var rlqsAPI = map[string]string{"name": "api"}

// rlqsGroups are the three groups of Envoys (4, 3, 3) and the demand's skews: 70/20/10 of 2·L,
// then 10/20/70.
var (
	rlqsGroupOf = [rlqsN]int{0, 0, 0, 0, 1, 1, 1, 2, 2, 2}
	rlqsSize    = [3]int{4, 3, 3}
	rlqsSkewA   = [3]float64{0.7, 0.2, 0.1}
	rlqsSkewB   = [3]float64{0.1, 0.2, 0.7}
)

// rlqsDemand is Envoy i's demand (per second) under a skew: its group's part of 2·L, split evenly.
func rlqsDemand(skew [3]float64, i int) int64 {
	g := rlqsGroupOf[i]
	return int64(2*rlqsL*skew[g]/float64(rlqsSize[g]) + 0.5)
}

// rlqsConfig is sluice serving only rls.quota on rlsAddr (a fixed address, so that a restart
// takes the same port) with store.
// rlqsConfigFree is rlqsConfig on a free address drawn at each start attempt (another process
// may take a drawn port first: startSluice then starts again), written to *addr.
func rlqsConfigFree(t *testing.T, addr *string, store string, ttl time.Duration) configFunc {
	return func(listen, admin string) string {
		a, err := freeAddr()
		if err != nil {
			t.Fatal(err)
		}
		*addr = a
		return rlqsConfig(a, store, ttl)(listen, admin)
	}
}

func rlqsConfig(rlsAddr, store string, ttl time.Duration) configFunc {
	return func(listen, admin string) string {
		return fmt.Sprintf(`listen: ""
admin_listen: %s
%s
rls:
  listen: %s
  quota:
    report_interval: %s
    assignment_ttl: %s
    buckets:
      - {name: api, match: {name: api}, limit: %d, period: 1s, burst: %d}
`, admin, store, rlsAddr, rlqsInterval, ttl, rlqsL, rlqsB)
	}
}

// rlqsApplied is one assignment an Envoy applied, between lo (its message off the stream) and hi
// (the filter had applied it).
type rlqsApplied struct {
	lo, hi time.Time
	s      *typev3.RateLimitStrategy
	ttl    time.Duration
	other  string    // an action other than an assignment (abandon)
	stream time.Time // when the stream it came on was opened (which instance sent it)
}

// rlqsTick is one report: the filter's timer fired between lo and hi (its report is built after
// lo, covering from the previous one's build).
type rlqsTick struct{ lo, hi time.Time }

// rlqsEnvoy is one simulated Envoy, its load and its record.
type rlqsEnvoy struct {
	i      int
	f      *rlqstest.Filter
	target atomic.Pointer[string] // the sluice instance it dials
	rate   atomic.Int64           // its demand, requests per second

	mu               sync.Mutex
	recv, recvStream time.Time // the last response off a stream, and when that stream opened
	applied          []rlqsApplied
	ticks            []rlqsTick
	firstLo, firstHi time.Time  // its first request, decided with no assignment
	firstOK          bool       // and admitted (not with a DENY_ALL no_assignment_behavior)
	stalls           []rlqsTick // spans in which the load fell behind its pace and dropped requests
}

func (e *rlqsEnvoy) snapshot() ([]rlqsApplied, []rlqsTick) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]rlqsApplied(nil), e.applied...), append([]rlqsTick(nil), e.ticks...)
}

// recvStream notes when each response came off the stream (before the filter applies it).
type recvStream struct {
	grpc.ClientStream
	e      *rlqsEnvoy
	opened time.Time
}

func (s *recvStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err == nil {
		now := time.Now()
		s.e.mu.Lock()
		s.e.recv, s.e.recvStream = now, s.opened
		s.e.mu.Unlock()
	}
	return err
}

// rlqsFleet is the ten Envoys and their load.
type rlqsFleet struct {
	t        *testing.T
	envoys   []*rlqsEnvoy
	expired  *rlqstest.ExpiredBehavior
	stop     chan struct{}
	wg       sync.WaitGroup
	start    time.Time
	fallback float64 // the expired fallback's rate per second (0: none)
	fbMax    int64
}

// startFleet starts the Envoys, Envoy i dialling addr(i), with their reports and their load
// (skew's demand).
func startFleet(t *testing.T, addr func(i int) string, expired *rlqstest.ExpiredBehavior, skew [3]float64) *rlqsFleet {
	fl := &rlqsFleet{t: t, expired: expired, stop: make(chan struct{}), start: time.Now()}
	if expired != nil && expired.Fallback.GetTokenBucket() != nil {
		tb := expired.Fallback.GetTokenBucket()
		fl.fallback = float64(tb.GetTokensPerFill().GetValue()) / tb.GetFillInterval().AsDuration().Seconds()
		fl.fbMax = int64(tb.GetMaxTokens())
	}
	denyAll := &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}}
	for i := range rlqsN {
		e := &rlqsEnvoy{i: i}
		a := addr(i)
		e.target.Store(&a)
		e.rate.Store(rlqsDemand(skew, i))
		ticks := make(chan time.Time)
		f, err := rlqstest.New(rlqstest.Config{
			Addr: a, Domain: "e2e", Ticks: ticks, Window: rlqsW,
			NoAssignment: denyAll, Expired: expired,
			OnResponse: func(resp *rlqspb.RateLimitQuotaResponse) {
				now := time.Now()
				e.mu.Lock()
				defer e.mu.Unlock()
				for _, act := range resp.GetBucketAction() {
					if act.GetBucketId().GetBucket()["name"] != "api" {
						continue
					}
					ap := rlqsApplied{lo: e.recv, hi: now, stream: e.recvStream}
					if qa := act.GetQuotaAssignmentAction(); qa != nil {
						ap.s, ap.ttl = qa.GetRateLimitStrategy(), qa.GetAssignmentTimeToLive().AsDuration()
					} else {
						ap.other = "abandon"
					}
					e.applied = append(e.applied, ap)
				}
			},
			DialOptions: []grpc.DialOption{
				grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
					var d net.Dialer
					return d.DialContext(ctx, "tcp", *e.target.Load())
				}),
				grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: rlqsInterval}, MinConnectTimeout: 2 * time.Second}),
				grpc.WithStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
					opened := time.Now()
					cs, err := streamer(ctx, desc, cc, method, opts...)
					if err != nil {
						return nil, err
					}
					return &recvStream{cs, e, opened}, nil
				}),
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		e.f = f
		fl.envoys = append(fl.envoys, e)
		fl.wg.Add(2)
		go fl.report(e, ticks)
		go fl.load(e)
	}
	t.Cleanup(fl.close)
	return fl
}

// report is an Envoy's reporting timer, at a random phase.
func (fl *rlqsFleet) report(e *rlqsEnvoy, ticks chan<- time.Time) {
	defer fl.wg.Done()
	select {
	case <-time.After(time.Duration(rand.Int64N(int64(rlqsInterval)))):
	case <-fl.stop:
		return
	}
	tk := time.NewTicker(rlqsInterval)
	defer tk.Stop()
	for {
		select {
		case <-fl.stop:
			return
		case <-tk.C:
		}
		lo := time.Now()
		select {
		case ticks <- lo:
		case <-fl.stop:
			return
		}
		hi := time.Now()
		e.mu.Lock()
		e.ticks = append(e.ticks, rlqsTick{lo, hi})
		e.mu.Unlock()
	}
}

// load drives Decide at the Envoy's rate, paced every few milliseconds; a lag of more than 100 ms
// is dropped (the demand falls on a slow machine rather than coming in bursts) and noted: a lag of
// up to 100 ms is made up by a burst the Envoys' token buckets (B/L of a period) absorb.
func (fl *rlqsFleet) load(e *rlqsEnvoy) {
	defer fl.wg.Done()
	id := map[string]string{"name": "api"}
	tk := time.NewTicker(4 * time.Millisecond)
	defer tk.Stop()
	last := time.Now()
	owed := 0.0
	first := true
	for {
		select {
		case <-fl.stop:
			return
		case now := <-tk.C:
			r := float64(e.rate.Load())
			owed += r * now.Sub(last).Seconds()
			if limit := r*float64(rlqsB)/rlqsL + 1; owed > limit {
				owed = limit
				e.mu.Lock()
				e.stalls = append(e.stalls, rlqsTick{last, now})
				e.mu.Unlock()
			}
			last = now
			for ; owed >= 1; owed-- {
				if first {
					lo := time.Now()
					ok := e.f.Decide(id)
					hi := time.Now()
					e.mu.Lock()
					e.firstLo, e.firstHi, e.firstOK = lo, hi, ok
					e.mu.Unlock()
					first = false
					continue
				}
				e.f.Decide(id)
			}
		}
	}
}

func (fl *rlqsFleet) close() {
	select {
	case <-fl.stop:
		return
	default:
	}
	close(fl.stop)
	fl.wg.Wait()
	for _, e := range fl.envoys {
		_ = e.f.Close()
	}
}

// setSkew moves the demand; it returns the instant every Envoy's load runs at the new rates.
func (fl *rlqsFleet) setSkew(skew [3]float64) time.Time {
	for i, e := range fl.envoys {
		e.rate.Store(rlqsDemand(skew, i))
	}
	return time.Now()
}

// rlqsWait polls cond until it holds; the deadline only guards against a hang.
func rlqsWait(t *testing.T, what string, deadline time.Duration, cond func() bool) {
	t.Helper()
	end := time.Now().Add(deadline)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("not within %v (a guard, not a bound): %s", deadline, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// states are the Envoys' states of bucket api.
func (fl *rlqsFleet) states() []rlqstest.State {
	var out []rlqstest.State
	for _, e := range fl.envoys {
		st, _ := e.f.Stats(rlqsAPI)
		out = append(out, st.State)
	}
	return out
}

func allStates(sts []rlqstest.State, want rlqstest.State) bool {
	for _, s := range sts {
		if s != want {
			return false
		}
	}
	return true
}

// rate is a strategy's token bucket rate (per second) and size; 0s for a blanket rule.
func rlqsRate(s *typev3.RateLimitStrategy) (float64, int64) {
	tb := s.GetTokenBucket()
	if tb == nil {
		return 0, 0
	}
	return float64(tb.GetTokensPerFill().GetValue()) / tb.GetFillInterval().AsDuration().Seconds(), int64(tb.GetMaxTokens())
}

// rlqsSeg is one limiter an Envoy held, over [lo, hi] (at least: lo is before it was built and hi
// after it ended): an assignment's token bucket (rebuilt when the strategy changes or the
// assignment had expired) or the expired fallback's.
type rlqsSeg struct {
	envoy    int
	lo, hi   time.Time
	rate     float64
	max      int64
	fallback bool
}

// segments rebuilds every limiter each Envoy held until end from the assignments it applied,
// erring towards more buckets and longer holds wherever the instants are uncertain: an assignment
// applied when the previous one may have expired counts as a new bucket; an assignment's end is
// its latest possible expiry, and the expired fallback starts at the earliest.
func (fl *rlqsFleet) segments(end time.Time) []rlqsSeg {
	var segs []rlqsSeg
	for _, e := range fl.envoys {
		applied, _ := e.snapshot()
		var cur *rlqsSeg
		var curS *typev3.RateLimitStrategy
		var expLo, expHi time.Time
		closeCur := func(at time.Time) {
			if cur == nil {
				return
			}
			cur.hi = at
			if expHi.Before(at) {
				cur.hi = expHi
			}
			segs = append(segs, *cur)
			if expLo.Before(at) && fl.fallback > 0 {
				segs = append(segs, rlqsSeg{envoy: e.i, lo: expLo, hi: at, rate: fl.fallback, max: fl.fbMax, fallback: true})
			}
			cur = nil
		}
		for _, a := range applied {
			if a.other != "" {
				closeCur(a.hi)
				continue
			}
			if cur == nil || !proto.Equal(a.s, curS) || !a.hi.Before(expLo) {
				closeCur(a.hi)
				r, m := rlqsRate(a.s)
				cur = &rlqsSeg{envoy: e.i, lo: a.lo, rate: r, max: m}
			}
			curS, expLo, expHi = a.s, a.lo.Add(a.ttl), a.hi.Add(a.ttl)
		}
		closeCur(end)
	}
	return segs
}

// maxRates is the largest sum over Envoys of the rate each held (the larger where two of its
// limiters overlap in the uncertainty of a change) at any instant in [from, to]; with fallback,
// the expired fallbacks count too.
func maxRates(segs []rlqsSeg, from, to time.Time, fallback bool) (float64, time.Time) {
	points := []time.Time{from, to}
	for _, s := range segs {
		for _, p := range []time.Time{s.lo, s.hi} {
			if !p.Before(from) && !p.After(to) {
				points = append(points, p)
			}
		}
	}
	best, at := 0.0, time.Time{}
	for _, p := range points {
		per := map[int]float64{}
		for _, s := range segs {
			if (s.fallback && !fallback) || p.Before(s.lo) || p.After(s.hi) {
				continue
			}
			per[s.envoy] = max(per[s.envoy], s.rate)
		}
		sum := 0.0
		for _, r := range per {
			sum += r
		}
		if sum > best {
			best, at = sum, p
		}
	}
	return best, at
}

// rlqsWindow is one window's worldwide counts and its bound's burst part.
type rlqsWindow struct {
	start            time.Time
	allowed, denied  uint64
	bursts, firsts   int64
	assignments      int // limiters held or built in it
	fallbacksInvolve bool
	lagged           bool    // the load fell behind its pace in it (this process was held up)
	assigned         float64 // ∫ Σ assignment rates over it (approximately: overlaps count twice)
}

// windows sums the Envoys' counts per window and, for each, Σ max_tokens of every limiter held at
// its start or built in it and the requests admitted with no assignment in it: only a bucket's
// first, and not with no_assignment_behavior DENY_ALL, which the tests set (the harness, as
// Envoy's filter.cc, denies even the first then).
func (fl *rlqsFleet) windows(segs []rlqsSeg) []rlqsWindow {
	by := map[time.Time]*rlqsWindow{}
	for _, e := range fl.envoys {
		for _, w := range e.f.Windows(nil) {
			x := by[w.Start]
			if x == nil {
				x = &rlqsWindow{start: w.Start}
				by[w.Start] = x
			}
			x.allowed += w.Allowed
			x.denied += w.Denied
		}
	}
	var out []rlqsWindow
	for _, x := range by {
		end := x.start.Add(rlqsW)
		for _, s := range segs {
			if s.lo.Before(end) && !s.hi.Before(x.start) {
				if !s.fallback {
					lo, hi := s.lo, s.hi
					if lo.Before(x.start) {
						lo = x.start
					}
					if hi.After(end) {
						hi = end
					}
					x.assigned += s.rate * hi.Sub(lo).Seconds()
				}
				x.bursts += s.max
				x.assignments++
				x.fallbacksInvolve = x.fallbacksInvolve || s.fallback
			}
		}
		for _, e := range fl.envoys {
			e.mu.Lock()
			if e.firstOK && e.firstLo.Before(end) && !e.firstHi.Before(x.start) {
				x.firsts++
			}
			for _, st := range e.stalls {
				x.lagged = x.lagged || (st.lo.Before(end) && !st.hi.Before(x.start))
			}
			e.mu.Unlock()
		}
		out = append(out, *x)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].start.Before(out[j].start) })
	return out
}

// paced counts the whole windows since from in which the offered demand was ≥ L and the load kept
// its pace: a phase lasts until it has enough of them to judge the 95%.
func (fl *rlqsFleet) paced(from time.Time) int {
	n, now := 0, time.Now()
	for _, w := range fl.windows(nil) {
		if !w.start.Before(from) && !w.start.Add(rlqsW).After(now) && !w.lagged && w.allowed+w.denied >= rlqsL {
			n++
		}
	}
	return n
}

// checkWindows asserts each whole window in [from, to) admits at most limit·W/P + its bursts and
// first requests, and returns them.
func (fl *rlqsFleet) checkWindows(t *testing.T, ws []rlqsWindow, from, to time.Time, limit float64, phase string) []rlqsWindow {
	t.Helper()
	var in []rlqsWindow
	var lines []string
	for _, w := range ws {
		if w.start.Before(from) || w.start.Add(rlqsW).After(to) {
			continue
		}
		in = append(in, w)
		bound := limit*rlqsW.Seconds()/rlqsP.Seconds() + float64(w.bursts+w.firsts)
		lag := ""
		if w.lagged {
			lag = "L"
		}
		lines = append(lines, fmt.Sprintf("%s %d/%d(≤%.0f,a%.0f)%s", w.start.Format("05"), w.allowed, w.allowed+w.denied, bound, w.assigned, lag))
		if float64(w.allowed) > bound {
			t.Errorf("%s: window %s admitted %d > %.0f = %.0f·W/P + Σ max_tokens %d (%d limiters) + first requests %d",
				phase, w.start.Format(time.StampMilli), w.allowed, bound, limit, w.bursts, w.assignments, w.firsts)
		}
	}
	t.Logf("%s windows (second admitted/offered(≤bound,a ∫ assigned rates), L: the load lagged): %s", phase, strings.Join(lines, " "))
	return in
}

// logGroups logs each group's admitted and offered per second over the whole windows in
// [from, to), beside its fair share: where the worldwide total falls short of L, the group whose
// Envoys admit less than their share is the one whose token buckets lose tokens.
func (fl *rlqsFleet) logGroups(t *testing.T, from, to time.Time, skew [3]float64, phase string) {
	t.Helper()
	targets := fairTargets(skew)
	var admitted, offered [3]uint64
	var share [3]int64
	n := 0
	for i, e := range fl.envoys {
		g := rlqsGroupOf[i]
		share[g] += targets[i]
		for _, w := range e.f.Windows(nil) {
			if w.Start.Before(from) || w.Start.Add(rlqsW).After(to) {
				continue
			}
			if i == 0 {
				n++
			}
			admitted[g] += w.Allowed
			offered[g] += w.Allowed + w.Denied
		}
	}
	if n == 0 {
		return
	}
	var parts []string
	for g := range 3 {
		parts = append(parts, fmt.Sprintf("group %d (%d Envoys): admitted %.0f/s of %.0f/s offered, fair share %d/s", g, rlqsSize[g], float64(admitted[g])/float64(n), float64(offered[g])/float64(n), share[g]))
	}
	t.Logf("%s, per group over %d windows: %s", phase, n, strings.Join(parts, "; "))
}

// checkFull asserts ≥ 95% of L admitted in every window of ws whose offered demand was ≥ L and
// kept its pace (a stall of the load longer than the Envoys' bursts cover loses their tokens), and
// that there were at least n such windows.
func checkFull(t *testing.T, ws []rlqsWindow, n int, phase string) {
	t.Helper()
	full, lagged := 0, 0
	for _, w := range ws {
		if w.lagged {
			lagged++
		}
		if w.allowed+w.denied < rlqsL || w.lagged {
			continue // the load lagged: not a window where the demand exceeded the limit all along
		}
		full++
		if float64(w.allowed) < 0.95*rlqsL {
			t.Errorf("%s: window %s admitted %d of %d offered: < 95%% of L=%d", phase, w.start.Format(time.StampMilli), w.allowed, w.allowed+w.denied, rlqsL)
		}
	}
	if full < n {
		t.Errorf("%s: %d windows with demand ≥ L at its pace (%d lagged); want at least %d (the load generation lagged too much to judge)", phase, full, lagged, n)
	}
}

// checkRates asserts at every instant of [from, to] Σ the assignments' rates ≤ L/P.
func checkRates(t *testing.T, segs []rlqsSeg, from, to time.Time, phase string) {
	t.Helper()
	r, at := maxRates(segs, from, to, false)
	t.Logf("%s: max Σ assignment rates %.1f/s (at %s)", phase, r, at.Format(time.StampMilli))
	if r > float64(rlqsL)/rlqsP.Seconds()+1e-6 {
		t.Errorf("%s: Σ active assignment rates %.1f/s > L/P = %d/s at %s", phase, r, rlqsL, at.Format(time.StampMilli))
	}
}

// rlqsStats is the rlqs part of the instances' /v1/stats: each Envoy's want and share.
func rlqsStats(t *testing.T, ps ...*sluiceProc) (wants, shares []int64, ok bool) {
	for _, p := range ps {
		r, err := tryGet(p.admin, "/v1/stats")
		if err != nil {
			return nil, nil, false
		}
		var st gateway.Stats
		if err := json.Unmarshal(r.body, &st); err != nil || st.RLQS == nil {
			return nil, nil, false
		}
		for _, b := range st.RLQS.Buckets {
			if b.Rule != "api" {
				continue
			}
			for _, e := range b.Envoys {
				wants, shares = append(wants, e.Want), append(shares, e.Share)
			}
		}
	}
	return wants, shares, true
}

// fairTargets is each Envoy's fair share of L under skew's demand.
func fairTargets(skew [3]float64) []int64 {
	want := make([]int64, rlqsN)
	for i := range want {
		want[i] = rlqsDemand(skew, i)
	}
	return allot.FairShare(rlqsL, want)
}

// near: a share or rate within 15% + 10 of its target (the demand each report measures is a
// count over a quarter second).
func near(got float64, target int64) bool {
	d := got - float64(target)
	return d <= 0.15*float64(target)+10 && -d <= 0.15*float64(target)+10
}

// sharesAt reports whether the ledger's shares (sorted) are the targets (sorted).
func sharesAt(shares []int64, targets []int64) bool {
	if len(shares) != len(targets) {
		return false
	}
	s := append([]int64(nil), shares...)
	g := append([]int64(nil), targets...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	sort.Slice(g, func(i, j int) bool { return g[i] < g[j] })
	for i := range s {
		if !near(float64(s[i]), g[i]) {
			return false
		}
	}
	return true
}

// assignedAt reports whether every Envoy enforces an active assignment at its target.
func (fl *rlqsFleet) assignedAt(targets []int64) bool {
	for i, e := range fl.envoys {
		st, _ := e.f.Stats(rlqsAPI)
		r, _ := rlqsRate(st.Assignment)
		if st.State != rlqstest.Active || !near(r, targets[i]) {
			return false
		}
	}
	return true
}

// afterTicks is the instant every Envoy had sent k reports whose timer fired after t (k ≥ 1), or
// zero if one has not yet.
func (fl *rlqsFleet) afterTicks(t time.Time, k int) time.Time {
	var last time.Time
	for _, e := range fl.envoys {
		_, ticks := e.snapshot()
		n := 0
		var at time.Time
		for _, tk := range ticks {
			if tk.lo.Before(t) {
				continue
			}
			if n++; n == k {
				at = tk.hi
				break
			}
		}
		if at.IsZero() {
			return time.Time{}
		}
		if at.After(last) {
			last = at
		}
	}
	return last
}

// converge measures the re-convergence after the demand moved at moved (to skew): T1 is when
// every Envoy has reported one full interval of the moved demand (its second report after the
// move: the first covers some of the old); the ledger's shares must reach the new fair split by
// the time every Envoy has sent two more reports (two report intervals), the assignments the
// Envoys enforce by 2 + margin/interval + ½ report intervals, counted the same way. The instants
// are bracketed by the polls of the stats and of the Envoys; the check takes the earliest instant
// the condition may have held, and the log shows both.
func (fl *rlqsFleet) converge(t *testing.T, moved time.Time, skew [3]float64, ps ...*sluiceProc) {
	t.Helper()
	targets := fairTargets(skew)
	var sharesLo, sharesHi, assignLo, assignHi time.Time
	prevShares, prevAssign := time.Now(), time.Now()
	end := time.Now().Add(30 * time.Second)
	for sharesHi.IsZero() || assignHi.IsZero() || fl.afterTicks(moved, 2+4).IsZero() {
		if time.Now().After(end) {
			t.Fatalf("re-convergence after the move: shares %v assignments %v (a 30 s guard, not a bound)", sharesHi, assignHi)
		}
		start := time.Now()
		if sharesHi.IsZero() {
			if _, shares, ok := rlqsStats(t, ps...); ok && sharesAt(shares, targets) {
				sharesLo, sharesHi = prevShares, time.Now()
			}
			prevShares = start
		}
		start = time.Now()
		if assignHi.IsZero() {
			if fl.assignedAt(targets) {
				assignLo, assignHi = prevAssign, time.Now()
			}
			prevAssign = start
		}
		time.Sleep(10 * time.Millisecond)
	}
	t1 := fl.afterTicks(moved, 2)
	in := func(x time.Time) float64 { return float64(x.Sub(t1)) / float64(rlqsInterval) }
	r2 := fl.afterTicks(t1, 2)
	r3, r4 := fl.afterTicks(t1, 3), fl.afterTicks(t1, 4)
	assignBound := r3.Add(r4.Sub(r3) / 2) // 2 + 1 (margin = one interval here) + ½
	fromMove := float64(t1.Sub(moved)) / float64(rlqsInterval)
	t.Logf("re-convergence after the move, in report intervals of %v: T1 (every Envoy has reported a full interval of the moved demand) %.2f after the move; "+
		"the ledger's shares at the fair split %v %.2f..%.2f after T1 (%.2f..%.2f after the move); the assignments the Envoys enforce %.2f..%.2f after T1 (%.2f..%.2f after the move); "+
		"bounds: shares by every Envoy's 2nd report after T1 (%.2f), assignments by 2 + margin + ½ (%.2f)",
		rlqsInterval, fromMove, targets, in(sharesLo), in(sharesHi), in(sharesLo)+fromMove, in(sharesHi)+fromMove,
		in(assignLo), in(assignHi), in(assignLo)+fromMove, in(assignHi)+fromMove, in(r2), in(assignBound))
	if sharesLo.After(r2) {
		t.Errorf("the ledger's shares reached the new fair split %.2f report intervals after T1 (at the earliest); want within 2 (every Envoy's second report after T1 was at %.2f)", in(sharesLo), in(r2))
	}
	if assignLo.After(assignBound) {
		t.Errorf("the Envoys' assignments reached the new fair split %.2f report intervals after T1 (at the earliest); want within 2 + margin + ½ = %.2f", in(assignLo), in(assignBound))
	}
}

// rlqsFallback is the expired_assignment_behavior of the memory tests: the safe share S = L/N per
// period, B/N tokens.
func rlqsFallback() *rlqstest.ExpiredBehavior {
	return &rlqstest.ExpiredBehavior{Fallback: &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens: rlqsB / rlqsN, TokensPerFill: wrapperspb.UInt32(rlqsL / rlqsN), FillInterval: durationpb.New(rlqsP)}}}}
}

// freshSince reports whether every Envoy applied an assignment received after t.
func (fl *rlqsFleet) freshSince(t time.Time) bool {
	for _, e := range fl.envoys {
		applied, _ := e.snapshot()
		if len(applied) == 0 || applied[len(applied)-1].lo.Before(t) {
			return false
		}
	}
	return true
}

// checkRestart asserts no Envoy applied an assignment of the new instance (on a stream opened
// after killed: the old one's last answers may still be on their way) received before the end of
// its learning mode (its ledger's state begins after restarted, and it hands out nothing new for
// the lease and margin), and that each applied one after.
func (fl *rlqsFleet) checkRestart(t *testing.T, killed, restarted time.Time, ttl time.Duration) {
	t.Helper()
	learnt := restarted.Add(ttl + rlqsMargin)
	for _, e := range fl.envoys {
		applied, _ := e.snapshot()
		var during, after int
		var first time.Time
		for _, a := range applied {
			if a.other != "" {
				t.Errorf("envoy %d: an %s", e.i, a.other)
			}
			switch {
			case a.stream.After(killed) && a.lo.Before(learnt):
				during++
			case a.stream.After(killed):
				if after++; after == 1 {
					first = a.lo
				}
			}
		}
		if during > 0 || after == 0 {
			t.Errorf("envoy %d: %d assignments from the new instance received before the end of its learning mode (%v after the restart began), %d after", e.i, during, ttl+rlqsMargin, after)
		}
		if after > 0 {
			st, _ := e.f.Stats(rlqsAPI)
			r, m := rlqsRate(st.Assignment)
			t.Logf("envoy %d: first assignment %.2fs after the restart began; %+v; holds %.0f/s, max_tokens %d", e.i, first.Sub(restarted).Seconds(), e.f.Client(), r, m)
		}
	}
}

// TestRLQSE2EMemory: ten Envoys on one sluice (memory store), demand 70/20/10 of 2·L then
// 10/20/70; sluice killed under load (every Envoy keeps its assignment until its time to live,
// then its expired fallback), then restarted on the same port once every assignment expired
// (learning mode: no assignment for the lease and margin, then fresh ones). Issue 35's "Done
// when" items a to e; TestRLQSE2EMemoryRestart restarts while the Envoys still hold theirs.
func TestRLQSE2EMemory(t *testing.T) {
	var rlsAddr string
	dir := t.TempDir()
	p := startSluice(t, dir, "sluice.yaml", rlqsConfigFree(t, &rlsAddr, "store: {type: memory}", rlqsTTL))
	cfg := rlqsConfig(rlsAddr, "store: {type: memory}", rlqsTTL) // (the restart's: the same port)
	fl := startFleet(t, func(int) string { return rlsAddr }, rlqsFallback(), rlqsSkewA)
	safe := max(rlqsL, rlqsN*fl.fallback*rlqsP.Seconds()) // max(L, N·S) per P

	// a, b: the first skew, converged.
	rlqsWait(t, "every Envoy enforces its fair share of 70/20/10", 20*time.Second, func() bool { return fl.assignedAt(fairTargets(rlqsSkewA)) })
	convergedA := time.Now()
	rlqsWait(t, "four windows of 70/20/10 at pace", 40*time.Second, func() bool { return fl.paced(convergedA.Add(rlqsW)) >= 4 })
	// c: the move, and its re-convergence counted in report intervals.
	moved := fl.setSkew(rlqsSkewB)
	fl.converge(t, moved, rlqsSkewB, p)
	convergedB := time.Now()
	rlqsWait(t, "four windows of 10/20/70 at pace", 40*time.Second, func() bool { return fl.paced(convergedB.Add(rlqsW)) >= 4 })

	// d: SIGKILL under load: every Envoy goes Active → Expired.
	if sts := fl.states(); !allStates(sts, rlqstest.Active) {
		t.Fatalf("before the kill: states %v; want all active", sts)
	}
	killed := time.Now()
	_ = p.cmd.Process.Kill()
	<-p.done
	rlqsWait(t, "every Envoy's assignment expired", 20*time.Second, func() bool { return allStates(fl.states(), rlqstest.Expired) })
	allExpired := time.Now()
	rlqsWait(t, "two windows on the fallback", 20*time.Second, func() bool { return time.Since(allExpired) > 3*rlqsW })

	// e: restarted on the same port: learning mode, then fresh assignments.
	restarted := time.Now()
	startSluice(t, dir, "sluice2.yaml", cfg)
	rlqsWait(t, "every Envoy enforces a fresh assignment after the restart", 30*time.Second, func() bool {
		return allStates(fl.states(), rlqstest.Active) && fl.freshSince(restarted)
	})
	activeAgain := time.Now()
	rlqsWait(t, "three windows after the restart", 20*time.Second, func() bool { return time.Since(activeAgain) > 4*rlqsW })
	end := time.Now()
	fl.close()

	segs := fl.segments(end)
	ws := fl.windows(segs)
	checkRates(t, segs, fl.start, end, "the whole run")
	fbRate, fbAt := maxRates(segs, killed, end, true)
	t.Logf("kill to end: max Σ rates of assignments and expired fallbacks %.1f/s at %s (max(L, N·S) = %.0f)", fbRate, fbAt.Format(time.StampMilli), safe)
	full := fl.checkWindows(t, ws, convergedA.Add(rlqsW), moved, rlqsL, "70/20/10")
	fl.logGroups(t, convergedA.Add(rlqsW), moved, rlqsSkewA, "70/20/10")
	checkFull(t, full, 4, "70/20/10")
	full = fl.checkWindows(t, ws, convergedB.Add(rlqsW), killed, rlqsL, "10/20/70")
	fl.logGroups(t, convergedB.Add(rlqsW), killed, rlqsSkewB, "10/20/70")
	checkFull(t, full, 4, "10/20/70")
	fl.checkWindows(t, ws, fl.start, killed, rlqsL, "start to the kill")
	fl.checkWindows(t, ws, killed.Add(-rlqsW), end, safe, "the kill's window to the end")
	fl.checkRestart(t, killed, restarted, rlqsTTL)
	t.Logf("timeline: converged %s, moved %.2fs later, killed %.2fs later, all expired %.2fs after the kill, restarted %.2fs after, all active %.2fs after the restart",
		convergedA.Format(time.StampMilli), moved.Sub(convergedA).Seconds(), killed.Sub(moved).Seconds(), allExpired.Sub(killed).Seconds(), restarted.Sub(allExpired).Seconds(), activeAgain.Sub(restarted).Seconds())
}

// TestRLQSE2EMemoryRestart: sluice (memory store) killed and restarted at once on the same port
// while the Envoys still hold their assignments (a time to live of 3 s): the new instance's
// ledger knows nothing of them, so it is in learning mode for the lease and margin and pushes
// nothing new; at every instant Σ active assignment rates ≤ L/P.
func TestRLQSE2EMemoryRestart(t *testing.T) {
	const ttl = 3 * time.Second
	var rlsAddr string
	dir := t.TempDir()
	p := startSluice(t, dir, "sluice.yaml", rlqsConfigFree(t, &rlsAddr, "store: {type: memory}", ttl))
	cfg := rlqsConfig(rlsAddr, "store: {type: memory}", ttl) // (the restart's: the same port)
	fl := startFleet(t, func(int) string { return rlsAddr }, rlqsFallback(), rlqsSkewB)
	safe := max(rlqsL, rlqsN*fl.fallback*rlqsP.Seconds())
	rlqsWait(t, "every Envoy enforces its fair share of 10/20/70", 30*time.Second, func() bool { return fl.assignedAt(fairTargets(rlqsSkewB)) })
	converged := time.Now()
	rlqsWait(t, "two windows of 10/20/70 at pace", 40*time.Second, func() bool { return fl.paced(converged.Add(rlqsW)) >= 2 })
	if sts := fl.states(); !allStates(sts, rlqstest.Active) {
		t.Fatalf("before the kill: states %v; want all active", sts)
	}
	killed := time.Now()
	_ = p.cmd.Process.Kill()
	<-p.done
	restarted := time.Now()
	startSluice(t, dir, "sluice2.yaml", cfg)
	ready := time.Now()
	holding := 0
	for _, s := range fl.states() {
		if s == rlqstest.Active {
			holding++
		}
	}
	// The point of the test is Envoys holding assignments when the new instance answers; on a
	// machine so slow that the restart outlasts the time to live, the bound is still checked.
	t.Logf("restart took %.2fs; %d of %d Envoys still held their assignment when it was ready", ready.Sub(killed).Seconds(), holding, rlqsN)
	rlqsWait(t, "every Envoy enforces a fresh assignment after the restart's learning mode", 30*time.Second, func() bool {
		return fl.freshSince(restarted.Add(ttl+rlqsMargin)) && fl.assignedAt(fairTargets(rlqsSkewB))
	})
	activeAgain := time.Now()
	rlqsWait(t, "two windows after the restart", 20*time.Second, func() bool { return time.Since(activeAgain) > 3*rlqsW })
	end := time.Now()
	fl.close()

	segs := fl.segments(end)
	ws := fl.windows(segs)
	checkRates(t, segs, fl.start, end, "the whole run")
	fbRate, fbAt := maxRates(segs, killed, end, true)
	t.Logf("kill to end: max Σ rates of assignments and expired fallbacks %.1f/s at %s (max(L, N·S) = %.0f)", fbRate, fbAt.Format(time.StampMilli), safe)
	full := fl.checkWindows(t, ws, converged.Add(rlqsW), killed, rlqsL, "10/20/70")
	checkFull(t, full, 2, "10/20/70")
	fl.checkWindows(t, ws, fl.start, killed, rlqsL, "start to the kill")
	fl.checkWindows(t, ws, killed.Add(-rlqsW), end, safe, "the kill's window to the end")
	fl.checkRestart(t, killed, restarted, ttl)
	t.Logf("timeline: killed %s, ready again %.2fs later, every Envoy active again %.2fs after the restart began", killed.Format(time.StampMilli), ready.Sub(killed).Seconds(), activeAgain.Sub(restarted).Seconds())
}

// TestRLQSE2ERedis: two sluice instances on one redis-server, five Envoys on each; the same
// skews, bounds and re-convergence; then one instance killed, its Envoys reconnecting to the
// other (the shares their old streams held come back once their leases end).
func TestRLQSE2ERedis(t *testing.T) {
	rs := redistest.Start(t)
	store := "store: {type: redis, addrs: [" + rs.Addr + "]}"
	var addrs [2]string
	var ps [2]*sluiceProc
	for k := range ps {
		ps[k] = startSluice(t, t.TempDir(), "sluice.yaml", rlqsConfigFree(t, &addrs[k], store, rlqsTTL))
	}
	// Envoys alternate between the instances, so that each group is on both.
	fl := startFleet(t, func(i int) string { return addrs[i%2] }, nil, rlqsSkewA)

	rlqsWait(t, "every Envoy enforces its fair share of 70/20/10", 20*time.Second, func() bool { return fl.assignedAt(fairTargets(rlqsSkewA)) })
	convergedA := time.Now()
	rlqsWait(t, "four windows of 70/20/10 at pace", 40*time.Second, func() bool { return fl.paced(convergedA.Add(rlqsW)) >= 4 })
	moved := fl.setSkew(rlqsSkewB)
	fl.converge(t, moved, rlqsSkewB, ps[0], ps[1])
	convergedB := time.Now()
	rlqsWait(t, "four windows of 10/20/70 at pace", 40*time.Second, func() bool { return fl.paced(convergedB.Add(rlqsW)) >= 4 })

	// Instance 1 killed: its Envoys dial instance 0 from now on.
	killed := time.Now()
	for _, e := range fl.envoys {
		a := addrs[0]
		e.target.Store(&a)
	}
	_ = ps[1].cmd.Process.Kill()
	<-ps[1].done
	rlqsWait(t, "every Envoy on the surviving instance enforces its fair share again", 30*time.Second, func() bool {
		_, shares, ok := rlqsStats(t, ps[0])
		return ok && len(shares) == rlqsN && fl.assignedAt(fairTargets(rlqsSkewB))
	})
	recovered := time.Now()
	rlqsWait(t, "two windows at pace after the recovery", 40*time.Second, func() bool { return fl.paced(recovered.Add(rlqsW)) >= 2 })
	end := time.Now()
	fl.close()

	segs := fl.segments(end)
	ws := fl.windows(segs)
	checkRates(t, segs, fl.start, end, "two instances, and one killed")
	full := fl.checkWindows(t, ws, convergedA.Add(rlqsW), moved, rlqsL, "70/20/10")
	fl.logGroups(t, convergedA.Add(rlqsW), moved, rlqsSkewA, "70/20/10")
	checkFull(t, full, 4, "70/20/10")
	full = fl.checkWindows(t, ws, convergedB.Add(rlqsW), killed, rlqsL, "10/20/70")
	fl.logGroups(t, convergedB.Add(rlqsW), killed, rlqsSkewB, "10/20/70")
	checkFull(t, full, 4, "10/20/70")
	fl.checkWindows(t, ws, fl.start, end, rlqsL, "whole run")
	full = fl.checkWindows(t, ws, recovered.Add(rlqsW), end, rlqsL, "after the recovery")
	checkFull(t, full, 2, "after the recovery")
	t.Logf("instance killed: every Envoy at its fair share on the other %.2f report intervals later", float64(recovered.Sub(killed))/float64(rlqsInterval))
	for _, e := range fl.envoys {
		c := e.f.Client()
		st, _ := e.f.Stats(rlqsAPI)
		r, m := rlqsRate(st.Assignment)
		t.Logf("envoy %d: %+v; holds %.0f/s, max_tokens %d", e.i, c, r, m)
		if e.i%2 == 1 && c.Streams < 2 {
			t.Errorf("envoy %d (on the killed instance) opened %d streams; want a second one, to the other instance", e.i, c.Streams)
		}
		applied, _ := e.snapshot()
		for _, a := range applied {
			if a.other != "" {
				t.Errorf("envoy %d: an %s", e.i, a.other)
			}
		}
	}
}

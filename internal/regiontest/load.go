package regiontest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Outcome is a target's answer to one request.
type Outcome struct {
	Admitted bool
	Window   int64 // admitted: the window (its index, or any exact name of it) it counted in
}

// Target decides one request of a region: its n-th.
type Target interface {
	Do(ctx context.Context, region, n int) (Outcome, error)
}

// Client is the HTTP client of the load: keep-alive, bounded.
var Client = &http.Client{
	Timeout:   10 * time.Second,
	Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second},
}

// Sluice is the harness as a Target: region r's n-th request goes to its instance n mod
// Instances (so each region's demand alternates between its instances).
func (h *Harness) Sluice() Target { return sluiceTarget{h} }

type sluiceTarget struct{ h *Harness }

var resetRE = regexp.MustCompile(`"` + Policy + `";r=\d+;t=(\d+)`)

func (s sluiceTarget) Do(ctx context.Context, region, n int) (Outcome, error) {
	in := s.h.Instances[region][n%len(s.h.Instances[region])]
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, in.Proxy+"/"+RegionName(region), nil)
	if err != nil {
		return Outcome{}, err
	}
	sent := time.Now()
	resp, err := Client.Do(req)
	if err != nil {
		return Outcome{}, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	got := time.Now()
	switch resp.StatusCode {
	case http.StatusTooManyRequests:
		return Outcome{}, nil
	case http.StatusOK:
	default:
		return Outcome{}, fmt.Errorf("%s: %s", in.Proxy, resp.Status)
	}
	m := resetRE.FindStringSubmatch(resp.Header.Get("RateLimit"))
	if m == nil {
		return Outcome{}, fmt.Errorf("%s: admitted without the policy's RateLimit (%q)", in.Proxy, resp.Header.Get("RateLimit"))
	}
	t, _ := strconv.ParseInt(m[1], 10, 64)
	w, err := WindowOf(sent, got, time.Duration(t)*time.Second, s.h.Opts.Period)
	return Outcome{Admitted: true, Window: w}, err
}

// ErrAmbiguous: a request took too long for its window to be known from its answer.
var ErrAmbiguous = errors.New("regiontest: the window of an admission is ambiguous (the request took a period less a second or longer)")

// WindowOf is the fixed window (index: start / period, epoch-aligned) in which a request sent at
// sent and answered at got, whose RateLimit said t (ResetAfter rounded up to whole seconds), was
// decided. The decision was made at some d in [sent, got] and its window ends at d + ResetAfter,
// with ResetAfter in (t − 1 s, t]: so the end is a multiple of period in (sent + t − 1 s, got + t],
// one only while got − sent < period − 1 s. Exact, on the one clock of loopback (the regions'
// Redis servers and the load share the machine's).
func WindowOf(sent, got time.Time, t, period time.Duration) (int64, error) {
	p := period.Microseconds()
	lo := sent.Add(t - time.Second).UnixMicro() // exclusive
	hi := got.Add(t).UnixMicro()                // inclusive
	end := (lo/p + 1) * p
	if end > hi || end+p <= hi {
		return 0, fmt.Errorf("%w: sent %v, answered %v later, t=%v", ErrAmbiguous, sent.Format(time.StampMicro), got.Sub(sent), t)
	}
	return end/p - 1, nil
}

// Window is the index of the fixed window of period holding t.
func Window(t time.Time, period time.Duration) int64 {
	return t.UnixMicro() / period.Microseconds()
}

// Load sends each region's demand to a Target: Rate requests a second in all, split by the
// current shares; it counts admissions per window and region, and each request's time.
type Load struct {
	target  Target
	rate    float64
	regions int
	shares  atomic.Pointer[[]float64]
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	mu        sync.Mutex
	admitted  map[int64][]int64 // window → admissions per region
	total     int64             // admissions counted
	requests  int64
	late      int64           // schedules started again (demand not sent)
	latencies []time.Duration // every request's, through the target
	direct    []time.Duration // the direct calls to the upstream
	errs      []error
}

// Workers is the number of senders per region (each paced on its own schedule).
const Workers = 4

// StartLoad starts the load on target at rate requests a second, split between the regions by
// shares (which need not add up to one), and, if upstream is not "", direct calls to its
// /direct at 10 a second, the latency baseline. Stop stops it.
func StartLoad(target Target, rate float64, shares []float64, upstream string) *Load {
	ctx, cancel := context.WithCancel(context.Background())
	l := &Load{target: target, rate: rate, regions: len(shares), cancel: cancel, admitted: map[int64][]int64{}}
	l.SetShares(shares)
	for r := range l.regions {
		var n atomic.Int64
		for w := range Workers {
			l.wg.Go(func() { l.send(ctx, r, w, &n) })
		}
	}
	if upstream != "" {
		l.wg.Go(func() { l.baseline(ctx, upstream) })
	}
	return l
}

// SetShares moves the demand.
func (l *Load) SetShares(shares []float64) {
	s := slices.Clone(shares)
	l.shares.Store(&s)
}

// send is one of region r's senders: it paces its requests on a schedule of its own (worker w
// starts w/Workers of an interval late), sending at once when behind, and starting the
// schedule again when more than 100 ms behind (a stalled machine does not make a burst).
func (l *Load) send(ctx context.Context, r, w int, n *atomic.Int64) {
	interval := func() time.Duration {
		s := *l.shares.Load()
		var sum float64
		for _, x := range s {
			sum += x
		}
		rate := l.rate * s[r] / sum / Workers
		if rate <= 0 {
			return 100 * time.Millisecond
		}
		return time.Duration(float64(time.Second) / rate)
	}
	next := time.Now().Add(interval() * time.Duration(w) / Workers)
	for {
		d := time.Until(next)
		if d < -100*time.Millisecond {
			l.mu.Lock()
			l.late++
			l.mu.Unlock()
			next, d = time.Now(), 0
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(d): // pacing
		}
		next = next.Add(interval())
		if (*l.shares.Load())[r] <= 0 {
			continue
		}
		start := time.Now()
		// Not cancelled by Stop: a request sent is counted, admitted or not.
		out, err := l.target.Do(context.WithoutCancel(ctx), r, int(n.Add(1)))
		took := time.Since(start)
		l.mu.Lock()
		l.requests++
		l.latencies = append(l.latencies, took)
		if err != nil {
			l.errs = append(l.errs, err)
		} else if out.Admitted {
			c := l.admitted[out.Window]
			if c == nil {
				c = make([]int64, l.regions)
				l.admitted[out.Window] = c
			}
			c[r]++
			l.total++
		}
		l.mu.Unlock()
	}
}

// baseline calls the upstream directly, 10 a second.
func (l *Load) baseline(ctx context.Context, upstream string) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, upstream+"/direct", nil)
		start := time.Now()
		resp, err := Client.Do(req)
		if err != nil {
			continue
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		l.mu.Lock()
		l.direct = append(l.direct, time.Since(start))
		l.mu.Unlock()
	}
}

// Stop stops the load and waits for the requests in flight.
func (l *Load) Stop() {
	l.cancel()
	l.wg.Wait()
}

// Result is what a load saw.
type Result struct {
	Admitted  map[int64][]int64 // window → admissions per region
	Total     int64             // admissions
	Requests  int64
	Late      int64           // times a sender was more than 100 ms behind its schedule and dropped the backlog
	Latencies []time.Duration // sorted
	Direct    []time.Duration // sorted
	Errors    []error
}

// Result returns what the load saw so far.
func (l *Load) Result() Result {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := Result{Admitted: map[int64][]int64{}, Total: l.total, Requests: l.requests, Late: l.late,
		Latencies: slices.Clone(l.latencies), Direct: slices.Clone(l.direct), Errors: slices.Clone(l.errs)}
	for w, c := range l.admitted {
		r.Admitted[w] = slices.Clone(c)
	}
	slices.Sort(r.Latencies)
	slices.Sort(r.Direct)
	return r
}

// World is the admissions of window w, all regions together.
func (r Result) World(w int64) int64 {
	var s int64
	for _, x := range r.Admitted[w] {
		s += x
	}
	return s
}

// Windows are the windows with admissions, in order.
func (r Result) Windows() []int64 {
	ws := make([]int64, 0, len(r.Admitted))
	for w := range r.Admitted {
		ws = append(ws, w)
	}
	slices.Sort(ws)
	return ws
}

// Quantile is the q-quantile of sorted durations (0 if none).
func Quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q * float64(len(sorted)-1))
	return sorted[i]
}

// Added is the time the target adds to a request at quantile q: the quantile of the requests
// through it less the direct calls' median (a direct call's own tail, 10 a second, is too few
// samples to subtract; never below 0).
func (r Result) Added(q float64) time.Duration {
	return max(0, Quantile(r.Latencies, q)-Quantile(r.Direct, 0.5))
}

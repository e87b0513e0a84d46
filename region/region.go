// Package region runs a region's side of the policies with global: true (issue 34; docs/design.md,
// "Limits across regions: the ledger"): for each, every refresh interval, it reports this
// region's demand and use to the ledger on the global Redis and takes its allotment, in the
// background; the decision layer asks it for the allotment to enforce (decision.Global), which is
// the last grant's until its lease ends, the floor before any grant, the safe share once a lease
// ran out without a refresh. A request never waits for the ledger.
package region

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/allot"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/decision"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

// Refresher keeps this region's allotments of the global policies. It is safe for concurrent
// use; its Allotment and Decided (decision.Global) do not allocate.
type Refresher struct {
	store  *redisstore.Store // the global Redis
	region config.Region
	log    *slog.Logger
	now    func() time.Time

	policies atomic.Pointer[map[string]*policy] // by configured name; replaced whole by Configure
	mu       sync.Mutex                         // orders Configure and the refreshes
	wake     chan struct{}
	stop     chan struct{}
	done     chan struct{}
	started  atomic.Bool

	// The pool on the region's own Redis (UsePool): nil for an instance alone in its region.
	regional *redisstore.Store
	id       string
}

// policy is one global policy's state in this region.
type policy struct {
	name   string
	p      sluice.Policy // as configured: its Limit is the worldwide limit L
	ledger *redisstore.Ledger
	pool   *redisstore.Pool // nil: not pooled

	enforced atomic.Pointer[enforced] // what Allotment answers from

	// Counted by Decided since the last refresh.
	admitted, refused atomic.Int64
	useMu             sync.Mutex
	used              int64     // the largest use of any key seen in the current window (its state on this region's Redis)
	usedUntil         time.Time // when that use stops counting (this instance's clock)

	// The refresh loop's own (under Refresher.mu).
	last     redisstore.Grant
	sentAt   time.Time     // when the last refresh was sent
	offset   time.Duration // the ledger's clock minus this one's, at the last refresh (at most late by its round trip)
	lastErr  error
	errorAt  time.Time
	lastView atomic.Pointer[Stats]
	leading  bool      // this instance held the pool's lock at the last refresh
	takenAt  time.Time // when it last took the pooled counts (while leading)
	version  int64     // the pooled grant's version last read
	demand   []demandSample
}

// enforced is a grant as Allotment reads it.
type enforced struct {
	grant redisstore.Grant
	// trusted, if not zero, is when a pooled grant read from the region's Redis stops being
	// trusted: its read's send time plus the follow window (a refresher confirms a shrink only
	// a follow window after publishing it). Past it the instance runs on the safe share.
	trusted time.Time
}

// Stats is one global policy as this region sees it, for /v1/stats and the metrics.
type Stats = decision.GlobalStats

// New returns the Refresher of cfg's region (cfg.Region must be set) on the global Redis store,
// for cfg's global policies. Start runs it.
func New(store *redisstore.Store, cfg *config.Config, log *slog.Logger) (*Refresher, error) {
	if cfg.Region == nil {
		return nil, errors.New("region: the configuration has no region section")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Refresher{store: store, region: *cfg.Region, log: log, now: time.Now,
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	if err := r.Configure(cfg); err != nil {
		return nil, err
	}
	return r, nil
}

// Configure takes cfg's global policies (a reload): a policy kept with the same limit, period
// and algorithm keeps its grant and counts; a new or changed one starts on the floor. The region
// section itself is not changed (that takes a restart).
func (r *Refresher) Configure(cfg *config.Config) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := map[string]*policy{}
	if m := r.policies.Load(); m != nil {
		old = *m
	}
	next := map[string]*policy{}
	for _, p := range cfg.Policies {
		if !p.Global {
			continue
		}
		if o, ok := old[p.Name]; ok && o.p.Limit == p.Limit && o.p.Period == p.Period && o.p.Algorithm == p.Algorithm && o.p.Burst == p.Burst {
			next[p.Name] = o
			continue
		}
		l, err := r.store.Ledger(p.Name, r.options(p.Policy))
		if err != nil {
			return fmt.Errorf("region %s: policy %s: %w", r.region.Name, p.Name, err)
		}
		np := &policy{name: p.Name, p: p.Policy, ledger: l}
		if r.regional != nil {
			if np.pool, err = r.regional.Pool(p.Name); err != nil {
				return fmt.Errorf("region %s: policy %s: %w", r.region.Name, p.Name, err)
			}
		}
		np.enforced.Store(&enforced{})
		next[p.Name] = np
	}
	r.policies.Store(&next)
	return nil
}

// options are the ledger's options for global policy p.
func (r *Refresher) options(p sluice.Policy) redisstore.LedgerOptions {
	n := int64(r.region.Regions)
	floor := min(int64(math.Floor(r.region.Floor*float64(p.Limit))), p.Limit/n)
	hold := r.region.Hold
	if hold == 0 {
		hold = redisstore.LedgerHold(p.Algorithm, p.Period, p.Limit, p.Burst)
	}
	alg := allot.Fair
	if r.region.Algorithm == "proportional" {
		alg = allot.Proportional
	}
	return redisstore.LedgerOptions{Limit: p.Limit, Regions: r.region.Regions, Floor: floor,
		Safe: int64(math.Floor(r.region.SafeShare * float64(p.Limit))), Lease: r.region.Lease, Algorithm: alg, Hold: hold}
}

// Allotment is decision.Global's: what this region enforces now of the global policy.
func (r *Refresher) Allotment(name string) (int64, bool) {
	m := r.policies.Load()
	if m == nil {
		return 0, false
	}
	p, ok := (*m)[name]
	if !ok {
		return 0, false
	}
	a, _ := p.enforce(r.now())
	return a, true
}

// enforce is what p's region enforces at now: Ledger.Enforce of the grant, or the safe share once
// a pooled grant is no longer trusted (not read from the region's Redis for a follow window).
func (p *policy) enforce(now time.Time) (int64, bool) {
	e := p.enforced.Load()
	if !e.trusted.IsZero() && !now.Before(e.trusted) {
		return p.ledger.Options().Safe, true
	}
	return p.ledger.Enforce(e.grant, now)
}

// Decided is decision.Global's: it counts a decision of the global policy for the next refresh.
func (r *Refresher) Decided(name string, admitted bool, d *sluice.Decision) {
	m := r.policies.Load()
	if m == nil {
		return
	}
	p, ok := (*m)[name]
	if !ok {
		return
	}
	if admitted {
		p.admitted.Add(1)
	} else if !d.Allowed {
		p.refused.Add(1)
	}
	if d.Limit <= 0 || d.Source != sluice.FromStore {
		return
	}
	// The key's use now, from its state on this region's Redis: what the decision says is not
	// remaining of its capacity, counted until the key's state is whole again.
	used, now := d.Limit-d.Remaining, r.now()
	if p.p.Algorithm == sluice.TokenBucket && d.Limit > 0 {
		used = int64(math.Ceil(float64(used) * float64(p.p.Limit) / float64(p.p.Capacity())))
	}
	until := now.Add(d.ResetAfter)
	p.useMu.Lock()
	if !now.Before(p.usedUntil) || (p.p.Algorithm == sluice.FixedWindow && until.Sub(p.usedUntil) > p.p.Period/2) {
		// (A fixed window's decision in a later window: the earlier window has ended on the
		// store's clock, for every key — the windows are the epoch's — so its use no longer
		// counts. Kept with max, it counted a whole window more, and again at every boundary
		// the next window's first decision came back before the earlier's end by this clock.)
		p.used, p.usedUntil = used, until
	} else {
		p.used, p.usedUntil = max(p.used, used), later(p.usedUntil, until)
	}
	p.useMu.Unlock()
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Start runs the refreshes in the background: the first at once, then every refresh interval,
// until Close.
func (r *Refresher) Start() {
	if r.started.Swap(true) {
		return
	}
	go r.loop()
}

// Close stops the refreshes and waits for the one under way.
func (r *Refresher) Close() {
	if !r.started.Load() {
		return
	}
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	<-r.done
}

func (r *Refresher) loop() {
	defer close(r.done)
	t := time.NewTicker(r.region.Refresh)
	defer t.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-r.stop; cancel() }()
	for {
		r.RefreshAll(ctx)
		select {
		case <-r.stop:
			return
		case <-t.C:
		case <-r.wake:
		}
	}
}

// RefreshAll refreshes every global policy once, now (the loop calls it every interval).
func (r *Refresher) RefreshAll(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.policies.Load()
	if m == nil {
		return
	}
	for _, p := range *m {
		if p.pool != nil {
			r.refreshPooled(ctx, p)
		} else {
			r.refresh(ctx, p)
		}
	}
}

// refresh is one policy's refresh: report, take the grant (confirming a smaller one at once).
func (r *Refresher) refresh(ctx context.Context, p *policy) {
	now := r.now()
	interval := r.region.Refresh
	if !p.sentAt.IsZero() {
		interval = now.Sub(p.sentAt)
	}
	admitted, refused := p.admitted.Swap(0), p.refused.Swap(0)
	rep := redisstore.Report{Want: redisstore.Demand(admitted, refused, interval, p.p.Period), Admitted: admitted, Refused: refused}
	p.useMu.Lock()
	if now.Before(p.usedUntil) {
		rep.Used, rep.UsedUntil = min(p.used, p.p.Limit), p.usedUntil.Add(p.offset)
	}
	p.useMu.Unlock()
	last := p.enforced.Load().grant
	if _, safe := p.ledger.Enforce(last, now); !last.LocalExpires.IsZero() && !safe {
		rep.Holds, rep.HoldsExpires = last.Allotment, last.Expires
	}
	sent := r.now()
	g, err := p.ledger.Refresh(ctx, r.region.Name, rep)
	if err == nil && g.Confirm {
		// The region enforces the smaller allotment from now, and says so at its next refresh
		// (soon: a quarter interval), not at once: a decision under the larger allotment may
		// still be in flight, and its use must be counted before the difference is free.
		r.wakeAfter(r.region.Refresh / 4)
	}
	if err != nil {
		if p.lastErr == nil || now.Sub(p.errorAt) > time.Minute {
			r.log.Warn("region: the ledger could not be refreshed; the last grant holds until its lease ends, then the safe share",
				"region", r.region.Name, "policy", p.name, "error", err.Error())
			p.errorAt = now
		}
		p.lastErr = err
		// The counts are not lost: the next refresh reports them.
		p.admitted.Add(admitted)
		p.refused.Add(refused)
	} else {
		if p.lastErr != nil {
			r.log.Info("region: the ledger answers again", "region", r.region.Name, "policy", p.name)
		}
		p.lastErr = nil
		p.sentAt, p.offset = sent, g.Now.Sub(sent)
		p.enforced.Store(&enforced{grant: g})
	}
	var world int64
	if err == nil {
		// What every region wants, for the diagnosis: a limit short of worldwide demand.
		if v, rerr := p.ledger.Read(ctx); rerr == nil {
			for _, x := range v.Regions {
				if x.Live {
					world += x.Want
				}
			}
		}
	} else if v := p.lastView.Load(); v != nil {
		world = v.WorldWant
	}
	a, safe := p.ledger.Enforce(p.enforced.Load().grant, r.now())
	g = p.enforced.Load().grant
	s := Stats{Policy: p.name, Limit: p.p.Limit, Allotment: a, Want: rep.Want, WorldWant: world, Admitted: admitted, Refused: refused, Used: rep.Used,
		Lease: g.LocalExpires, Safe: safe, Floor: g.LocalExpires.IsZero(), Learning: g.Learning}
	if p.lastErr != nil {
		s.Error = p.lastErr.Error()
	}
	p.lastView.Store(&s)
}

// wakeAfter runs the refreshes once more after d.
func (r *Refresher) wakeAfter(d time.Duration) {
	time.AfterFunc(d, func() {
		select {
		case r.wake <- struct{}{}:
		default:
		}
	})
}

// Stats returns every global policy's state in this region, sorted by name.
func (r *Refresher) Stats() []Stats {
	m := r.policies.Load()
	if m == nil {
		return nil
	}
	out := make([]Stats, 0, len(*m))
	for _, p := range *m {
		var s Stats
		if v := p.lastView.Load(); v != nil {
			s = *v
		}
		s.Policy, s.Limit = p.name, p.p.Limit
		g := p.enforced.Load().grant
		s.Allotment, s.Safe = p.enforce(r.now())
		s.Refresher = p.pool != nil && s.Refresher
		s.Lease, s.Floor, s.Learning = g.LocalExpires, g.LocalExpires.IsZero(), g.Learning
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b Stats) int { return strings.Compare(a.Policy, b.Policy) })
	return out
}

// Name is the region's name.
func (r *Refresher) Name() string { return r.region.Name }

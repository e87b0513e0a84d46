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
	"github.com/sluicehq/sluice/ledger"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

// Ledger is one global policy's ledger as the refresher uses it: store/redis's, on the global
// Redis (New), or ledger.Memory, the simulator's (NewOn).
type Ledger = ledger.Ledger

// Ledgers returns the ledger of the global policy named policy with opts.
type Ledgers = ledger.Ledgers

// Clock is the refresher's time: sluice serve's is the system's (New); the simulator's a virtual
// one (NewOn), on which the refresher's timers run too.
type Clock interface {
	Now() time.Time
	// AfterFunc runs f once after d.
	AfterFunc(d time.Duration, f func())
}

type systemClock struct{}

func (systemClock) Now() time.Time                      { return time.Now() }
func (systemClock) AfterFunc(d time.Duration, f func()) { time.AfterFunc(d, f) }

// Refresher keeps this region's allotments of the global policies. It is safe for concurrent
// use; its Allotment and Decided (decision.Global) do not allocate.
type Refresher struct {
	ledgers Ledgers // on the global Redis
	region  config.Region
	log     *slog.Logger
	clock   Clock
	now     func() time.Time // clock.Now

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
	ledger Ledger
	pool   *redisstore.Pool // nil: not pooled

	enforced atomic.Pointer[enforced] // what Allotment answers from

	// Counted by Decided since the last refresh.
	admitted, refused atomic.Int64
	useMu             sync.Mutex
	used              int64     // the largest use of any key seen in the current window (its state on this region's Redis)
	usedUntil         time.Time // when that use stops counting (this instance's clock)
	usedAt            time.Time // when it was last updated (a bucket's use drains from then to usedUntil)

	// The refresh loop's own (under Refresher.mu).
	last     ledger.Grant
	sentAt   time.Time     // when the last refresh was sent
	offset   time.Duration // the ledger's clock minus this one's, at the last refresh (at most late by its round trip)
	lastErr  error
	errorAt  time.Time
	lastView atomic.Pointer[Stats]
	leading  bool      // this instance held the pool's lock at the last refresh
	takenAt  time.Time // when it last took the pooled counts (while leading)
	version  int64     // the pooled grant's version last read
	demand   []demandSample
	took     time.Duration // how long the last pooled refresh took, from the take to the publish
}

// enforced is a grant as Allotment reads it.
type enforced struct {
	grant ledger.Grant
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
	return NewOn(func(policy string, opts ledger.Options) (Ledger, error) { return store.Ledger(policy, opts) }, cfg, systemClock{}, log)
}

// NewOn is New on the ledgers and the clock given: the simulator's runs its regions on a virtual
// clock with ledger.Memory, and drives each refresh's phases itself (Send, Exchange.Call,
// Receive) rather than Start.
func NewOn(ledgers Ledgers, cfg *config.Config, clock Clock, log *slog.Logger) (*Refresher, error) {
	if cfg.Region == nil {
		return nil, errors.New("region: the configuration has no region section")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Refresher{ledgers: ledgers, region: *cfg.Region, log: log, clock: clock, now: clock.Now,
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
		l, err := r.ledgers(p.Name, r.options(p.Policy))
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
func (r *Refresher) options(p sluice.Policy) ledger.Options {
	n := int64(r.region.Regions)
	floor := min(int64(math.Floor(r.region.Floor*float64(p.Limit))), p.Limit/n)
	hold := r.region.Hold
	if hold == 0 {
		hold = ledger.Hold(p.Algorithm, p.Period, p.Limit, p.Burst)
	}
	alg := allot.Fair
	if r.region.Algorithm == "proportional" {
		alg = allot.Proportional
	}
	return ledger.Options{Limit: p.Limit, Regions: r.region.Regions, Floor: floor,
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

// enforce is what p's region enforces at now: ledger.Enforce of the grant, or the safe share once
// a pooled grant is no longer trusted (not read from the region's Redis for a follow window).
func (p *policy) enforce(now time.Time) (int64, bool) {
	e := p.enforced.Load()
	if !e.trusted.IsZero() && !now.Before(e.trusted) {
		return p.ledger.Options().Safe, true
	}
	return ledger.Enforce(p.ledger.Options(), e.grant, now)
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
	switch {
	case !now.Before(p.usedUntil) || (p.p.Algorithm == sluice.FixedWindow && until.Sub(p.usedUntil) > p.p.Period/2):
		// (A fixed window's decision in a later window: the earlier window has ended on the
		// store's clock, for every key — the windows are the epoch's — so its use no longer
		// counts. Kept with max, it counted a whole window more, and again at every boundary
		// the next window's first decision came back before the earlier's end by this clock.)
		p.used, p.usedUntil = used, until
	case p.p.Algorithm == sluice.TokenBucket:
		// A bucket's units in use drain as it refills, to none when it is full: the use seen
		// before counts for what is left of it now (at most its part of the time to full), not
		// whole until the later full time of a key decided since, which under steady traffic
		// would keep the largest use ever seen, and the quota it holds, for good.
		left := float64(p.usedUntil.Sub(now)) / float64(p.usedUntil.Sub(p.usedAt))
		p.used, p.usedUntil = max(int64(math.Ceil(float64(p.used)*left)), used), later(p.usedUntil, until)
	default:
		p.used, p.usedUntil = max(p.used, used), later(p.usedUntil, until)
	}
	p.usedAt = now
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

// Close stops the refreshes and waits for the one under way. A pooled instance then pushes the
// counts it has not pushed and gives its region's lock back if it holds it, so that another
// instance refreshes for the region at its next refresh, not a lock's TTL later.
func (r *Refresher) Close() {
	if r.started.Load() {
		select {
		case <-r.stop:
		default:
			close(r.stop)
		}
		<-r.done
	}
	r.leave()
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

// refresh is one policy's refresh: report, take the grant (confirming a smaller one at once),
// its three phases at once.
func (r *Refresher) refresh(ctx context.Context, p *policy) {
	x := r.send(p)
	x.Call(ctx)
	r.receive(x)
}

// An Exchange is one policy's refresh in flight, in its three phases: the region builds its
// report and sends it (Send), the ledger applies it (Call), the grant reaches the region
// (Receive). serve runs them one after the other; the simulator at the times a latency to the
// ledger gives them, on its virtual clock.
type Exchange struct {
	p                 *policy
	region            string
	rep               ledger.Report
	sent              time.Time // the region's clock when it sent the report
	admitted, refused int64
	// Call's: the grant or the error, and what every live region wants with every region's
	// record (read: the ledger was read).
	g       ledger.Grant
	err     error
	world   int64
	regions []decision.LedgerRegion
	read    bool
	// Fail, if set before Call, is the error Call answers instead of calling the ledger (the
	// simulator's cut link).
	Fail error
}

// Policy is the global policy the exchange refreshes; Report its report.
func (x *Exchange) Policy() string        { return x.p.name }
func (x *Exchange) Report() ledger.Report { return x.rep }

// Lose makes the exchange's answer err: the ledger applied the report, but its grant never
// reached the region (the simulator's link, cut on the way back).
func (x *Exchange) Lose(err error) {
	x.g, x.err, x.world, x.regions, x.read = ledger.Grant{}, err, 0, nil, false
}

// Grant is the ledger's answer to Call, or its error.
func (x *Exchange) Grant() (ledger.Grant, error) { return x.g, x.err }

// Send begins a refresh of the global policy named name (nil if none is configured): the report
// of its counts since the last refresh sent, and what it holds, at the refresher's clock's now.
func (r *Refresher) Send(name string) *Exchange {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.policies.Load()
	if m == nil || (*m)[name] == nil {
		return nil
	}
	return r.send((*m)[name])
}

func (r *Refresher) send(p *policy) *Exchange {
	now := r.now()
	interval := r.region.Refresh
	if !p.sentAt.IsZero() {
		interval = now.Sub(p.sentAt)
	}
	admitted, refused := p.admitted.Swap(0), p.refused.Swap(0)
	rep := ledger.Report{Want: p.want(admitted+refused, interval), Admitted: admitted, Refused: refused}
	p.useMu.Lock()
	if now.Before(p.usedUntil) {
		rep.Used, rep.UsedUntil = min(p.used, p.p.Limit), p.usedUntil.Add(p.offset)
	}
	p.useMu.Unlock()
	last := p.enforced.Load().grant
	if _, safe := ledger.Enforce(p.ledger.Options(), last, now); !last.LocalExpires.IsZero() && !safe {
		rep.Holds, rep.HoldsExpires = last.Allotment, last.Expires
	}
	return &Exchange{p: p, region: r.region.Name, rep: rep, sent: r.now(), admitted: admitted, refused: refused}
}

// Call is the ledger's phase: the refresh, and a read of what every region wants.
func (x *Exchange) Call(ctx context.Context) {
	if x.Fail != nil {
		x.err = x.Fail
		return
	}
	x.g, x.err = x.p.ledger.Refresh(ctx, x.region, x.rep)
	if x.err != nil {
		return
	}
	// The lease on the region's clock: from the report's send time, whenever the ledger took it.
	x.g.LocalExpires = x.sent.Add(x.p.ledger.Options().Lease)
	x.world, x.regions, x.read = readWorld(ctx, x.p.ledger)
}

// Receive ends the refresh x at the refresher's clock's now: the grant is enforced from now on
// (a smaller one confirmed a quarter interval later), or the failure logged and the counts kept
// for the next refresh.
func (r *Refresher) Receive(x *Exchange) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.receive(x)
}

func (r *Refresher) receive(x *Exchange) {
	p, now, g, err := x.p, r.now(), x.g, x.err
	if err == nil && g.Confirm {
		// The region enforces the smaller allotment from now, and says so at its next refresh
		// (soon: a quarter interval), not at once: a decision under the larger allotment may
		// still be in flight, and its use must be counted before the difference is free.
		r.wakeAfter(r.region.Refresh / 4)
	}
	world, regions := x.world, x.regions
	if err != nil || !x.read {
		world, regions = p.lastWorld()
	}
	if err != nil {
		if p.lastErr == nil || now.Sub(p.errorAt) > time.Minute {
			r.log.Warn("region: the ledger could not be refreshed; the last grant holds until its lease ends, then the safe share",
				"region", r.region.Name, "policy", p.name, "error", err.Error())
			p.errorAt = now
		}
		p.lastErr = err
		// The counts are not lost: the next refresh reports them.
		p.admitted.Add(x.admitted)
		p.refused.Add(x.refused)
	} else {
		if p.lastErr != nil {
			r.log.Info("region: the ledger answers again", "region", r.region.Name, "policy", p.name)
		}
		p.lastErr = nil
		p.sentAt, p.offset = x.sent, g.Now.Sub(x.sent)
		p.enforced.Store(&enforced{grant: g})
	}
	a, safe := ledger.Enforce(p.ledger.Options(), p.enforced.Load().grant, now)
	g = p.enforced.Load().grant
	s := Stats{Policy: p.name, Limit: p.p.Limit, Allotment: a, Want: x.rep.Want, WorldWant: world, Admitted: x.admitted, Refused: x.refused, Used: x.rep.Used,
		Lease: g.LocalExpires, Safe: safe, Floor: g.LocalExpires.IsZero(), Learning: g.Learning, Ledger: regions}
	if p.lastErr != nil {
		s.Error = p.lastErr.Error()
	}
	p.lastView.Store(&s)
}

// readWorld reads l for what every live region wants together (the diagnosis: a limit short of
// worldwide demand) and every region's record (the stats, the operator page), sorted by name;
// ok is false if the read failed.
func readWorld(ctx context.Context, l Ledger) (want int64, regions []decision.LedgerRegion, ok bool) {
	v, err := l.Read(ctx)
	if err != nil {
		return 0, nil, false
	}
	regions = make([]decision.LedgerRegion, 0, len(v.Regions))
	for _, x := range v.Regions {
		if x.Live {
			want += x.Want
		}
		regions = append(regions, decision.LedgerRegion{Region: x.Region, Want: x.Want, Allotment: x.Allotment,
			Used: x.Used, Holding: x.Holding, Expires: x.Expires, Live: x.Live})
	}
	slices.SortFunc(regions, func(a, b decision.LedgerRegion) int { return strings.Compare(a.Region, b.Region) })
	return want, regions, true
}

// world is readWorld of p's ledger if read, else (or if the read fails) the last refresh's.
func (p *policy) world(ctx context.Context, read bool) (int64, []decision.LedgerRegion) {
	if read {
		if want, regions, ok := readWorld(ctx, p.ledger); ok {
			return want, regions
		}
	}
	return p.lastWorld()
}

// lastWorld is the worldwide want and the regions' records of the last refresh.
func (p *policy) lastWorld() (int64, []decision.LedgerRegion) {
	if v := p.lastView.Load(); v != nil {
		return v.WorldWant, v.Ledger
	}
	return 0, nil
}

// wakeAfter runs the refreshes once more after d (Wake, on the refresher's clock).
func (r *Refresher) wakeAfter(d time.Duration) {
	r.clock.AfterFunc(d, r.Wake)
}

// Wake asks the loop for a refresh now (a confirmation's); none if one is already asked for.
func (r *Refresher) Wake() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Woken takes a Wake not yet taken, for a caller that runs the refreshes itself instead of Start
// (the simulator, after each of its clock's AfterFunc): true if a refresh is asked for.
func (r *Refresher) Woken() bool {
	select {
	case <-r.wake:
		return true
	default:
		return false
	}
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

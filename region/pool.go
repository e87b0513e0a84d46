package region

// Several instances in a region (docs/design.md, "Several instances in a region"): they share
// the region's Redis, so its counters, and must enforce one allotment together. On that Redis
// (store/redis Pool) they elect one refresher per global policy — a lock with a TTL of
// lockRefreshes refresh intervals, renewed at each refresh; another instance takes it once it
// lapses — and every instance adds its demand into the pool, which the refresher takes and
// reports as the region's. The refresher publishes each grant there; every instance (the
// refresher too) reads it each refresh and enforces it through Ledger.Enforce, its lease ending
// by the instance's own clock. A smaller grant is confirmed to the ledger only a follow window
// and 1.5 refreshes after it was published (shrinkFor): an instance that read the larger one
// before trusts it at most a follow window after its read was sent, then runs on the safe share;
// and in the 1.5 refreshes every instance pushes the use it admitted under the larger one.

import (
	"context"
	"errors"
	"time"

	"github.com/sluicehq/sluice/ledger"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

const (
	// lockRefreshes is the pool's lock TTL in refresh intervals: the refresher renews it at each
	// refresh; it lapses after that many missed, and another instance takes over.
	lockRefreshes = 3
	// followRefreshes is the follow window in refresh intervals: how long an instance trusts a
	// pooled grant after the read that returned it was sent, and how long after publishing a
	// smaller grant the refresher waits to confirm it (every instance reads once a refresh).
	followRefreshes = 2
	// demandRefreshes is how many refreshes (a pooled region's: takes of its counts) the want is
	// measured over.
	demandRefreshes = 4
)

// leave is Close's end for a pooled instance: its last counts pushed, its locks given back.
// Bounded by the regional store's timeout per call; a failure leaves the lock to lapse.
func (r *Refresher) leave() {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.policies.Load()
	if m == nil || r.regional == nil {
		return
	}
	ctx := context.Background()
	for _, p := range *m {
		if p.pool == nil {
			continue
		}
		admitted, refused := p.admitted.Swap(0), p.refused.Swap(0)
		if admitted+refused > 0 {
			if err := p.pool.Push(ctx, admitted, refused, 0, 0, 2*lockRefreshes*r.region.Refresh); err != nil {
				r.log.Warn("region: the last counts could not be pooled", "region", r.region.Name, "policy", p.name, "error", err.Error())
			}
		}
		if !p.leading {
			continue
		}
		if _, err := p.pool.Release(ctx, r.id); err != nil {
			r.log.Warn("region: the region's lock could not be given back; it lapses", "region", r.region.Name, "policy", p.name, "error", err.Error())
		} else {
			r.log.Info("region: this instance stops refreshing for its region", "region", r.region.Name, "policy", p.name, "instance", r.id)
		}
		p.leading = false
	}
}

// demandSample is one refresh's decisions (a pooled region's: one take's) and the interval they
// came in.
type demandSample struct {
	n        int64
	interval time.Duration
}

// want is the policy's demand, per period, measured over its last demandRefreshes samples, this
// one (n decisions in interval) the last. One interval alone is too short a measure: its count is
// a few requests at a modest rate, and a shrink's confirmation comes a quarter interval after the
// refresh before it; a want that swings with them (seen: 28, 75, 28, ... for a steady 40 a
// second) shrinks and grows the allotment at every refresh, and each shrink holds the larger
// allotment until confirmed, so that quota sits unused. (A pooled region's instances push their
// counts each on its own tick, so one take may hold two pushes of an instance, the next none.)
func (p *policy) want(n int64, interval time.Duration) int64 {
	if len(p.demand) == demandRefreshes {
		p.demand = append(p.demand[:0], p.demand[1:]...)
	}
	p.demand = append(p.demand, demandSample{n, interval})
	var sum int64
	var span time.Duration
	for _, d := range p.demand {
		sum, span = sum+d.n, span+d.interval
	}
	return ledger.Demand(sum, 0, span, p.p.Period)
}

// UsePool pools this instance with the others of its region on the region's own Redis (the
// store its decisions count on), id naming it there (unique per instance, e.g. the fleet
// registry's). Call it before Start; the policies configured keep their grants.
func (r *Refresher) UsePool(regional *redisstore.Store, id string) error {
	if regional == nil || id == "" {
		return errors.New("region: UsePool needs the region's Redis store and an instance id")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.regional, r.id = regional, id
	if m := r.policies.Load(); m != nil {
		for name, p := range *m {
			pool, err := regional.Pool(name)
			if err != nil {
				return err
			}
			p.pool = pool
		}
	}
	return nil
}

// follow is the follow window: followRefreshes refresh intervals.
func (r *Refresher) follow() time.Duration { return followRefreshes * r.region.Refresh }

// shrinkFor is how long a shrink stays in flight: the follow window, after which no instance
// admits under the larger allotment, and one and a half refreshes more, in which every instance
// pushes the use it admitted under it (each pushes once a refresh).
func (r *Refresher) shrinkFor() time.Duration { return r.follow() + 3*r.region.Refresh/2 }

// refreshPooled is one pooled refresh of p: add this instance's counts to the pool; take or
// renew the lock, and if held, refresh the ledger for the region and publish the grant; read
// the published grant and enforce it.
func (r *Refresher) refreshPooled(ctx context.Context, p *policy) {
	now := r.now()
	admitted, refused := p.admitted.Swap(0), p.refused.Swap(0)
	var used int64
	var usedFor time.Duration
	p.useMu.Lock()
	if now.Before(p.usedUntil) {
		used, usedFor = min(p.used, p.p.Limit), p.usedUntil.Sub(now)
	}
	p.useMu.Unlock()
	lockTTL := lockRefreshes * r.region.Refresh
	err := p.pool.Push(ctx, admitted, refused, used, usedFor, 2*lockTTL)
	var rep ledger.Report
	if err != nil {
		p.admitted.Add(admitted)
		p.refused.Add(refused)
		// Its lock not renewed, it refreshes for the region no more.
		p.leading, p.takenAt = false, time.Time{}
	} else {
		var lead bool
		lead, err = p.pool.Lead(ctx, r.id, lockTTL)
		if err != nil {
			p.leading, p.takenAt = false, time.Time{}
		} else {
			if lead != p.leading {
				r.log.Info("region: the refresher of this region's global policy", "region", r.region.Name, "policy", p.name, "instance", r.id, "refresher", lead)
			}
			if !lead {
				p.takenAt = time.Time{}
			}
			p.leading = lead
			if lead {
				rep, err = r.lead(ctx, p)
			}
		}
		// Every instance, the refresher too, enforces what is published.
		sent := r.now()
		g, ok, rerr := p.pool.Read(ctx)
		if rerr == nil {
			e := &enforced{trusted: sent.Add(r.follow())}
			if ok {
				e.grant = ledger.Grant{Allotment: g.Allotment, Expires: g.Expires, LocalExpires: sent.Add(g.TTL), Learning: g.Learning, Epoch: g.Epoch}
				p.version = g.Version
			} else if old := p.enforced.Load().grant; !old.LocalExpires.IsZero() {
				e.grant = old // its lease has ended: the safe share, until a grant is published
			}
			p.enforced.Store(e)
		} else if err == nil {
			err = rerr
		}
	}
	if err != nil {
		if p.lastErr == nil || now.Sub(p.errorAt) > time.Minute {
			r.log.Warn("region: the pooled refresh failed; the grant read last holds for a follow window and until its lease ends, then the safe share",
				"region", r.region.Name, "policy", p.name, "error", err.Error())
			p.errorAt = now
		}
	} else if p.lastErr != nil {
		r.log.Info("region: the pooled refresh works again", "region", r.region.Name, "policy", p.name)
	}
	p.lastErr = err
	if !p.leading {
		rep.Want = 0
	}
	world, ledger := p.world(ctx, err == nil)
	a, safe := p.enforce(r.now())
	g := p.enforced.Load().grant
	s := Stats{Policy: p.name, Limit: p.p.Limit, Allotment: a, Want: rep.Want, WorldWant: world, Admitted: admitted, Refused: refused, Used: used,
		RefreshTook: p.took, LockTTL: lockTTL, Slow: p.leading && p.took > lockTTL/2,
		RefreshTookMs: float64(p.took) / float64(time.Millisecond), LockTTLMs: float64(lockTTL) / float64(time.Millisecond),
		Lease: g.LocalExpires, Safe: safe, Floor: g.LocalExpires.IsZero() && !safe, Learning: g.Learning, Refresher: p.leading, Version: p.version, Ledger: ledger}
	if err != nil {
		s.Error = err.Error()
	}
	p.lastView.Store(&s)
}

// lead is the refresher's part: it takes the pooled counts and reports them to the ledger as
// the region's, holding what any instance may still enforce (the published grant, or a larger
// one in flight), and publishes the grant. It returns the report.
func (r *Refresher) lead(ctx context.Context, p *policy) (ledger.Report, error) {
	now := r.now()
	c, ok, err := p.pool.Take(ctx, r.id, 2*lockRefreshes*r.region.Refresh)
	took := r.now()
	if err != nil || !ok {
		p.leading = ok
		return ledger.Report{}, err
	}
	// The counts came in since the last take, this instance's or, after a takeover, the previous
	// refresher's (Span, the pool's clock): measured over one interval of this one's instead, a
	// new refresher's first want was two to four times the region's demand.
	interval := c.Span
	switch {
	case interval > 0:
	case !p.takenAt.IsZero():
		interval = now.Sub(p.takenAt)
	default:
		interval = r.region.Refresh
	}
	if p.takenAt.IsZero() {
		p.demand = p.demand[:0]
	}
	p.takenAt = now
	rep := ledger.Report{Want: p.want(c.Admitted+c.Refused, interval), Admitted: c.Admitted, Refused: c.Refused}
	if c.Used > 0 && c.UsedFor > 0 {
		// Counted from the take's answer: no earlier than the pool's clock had it.
		rep.Used, rep.UsedUntil = min(c.Used, p.p.Limit), took.Add(c.UsedFor).Add(p.offset)
	}
	if c.HasGrant {
		rep.Holds, rep.HoldsExpires = c.Grant.Allotment, c.Grant.Expires
		if c.ShrinkFrom > rep.Holds {
			// An instance may still enforce the larger allotment: not confirmed yet.
			rep.Holds = c.ShrinkFrom
			if c.ShrinkExpires.After(rep.HoldsExpires) {
				rep.HoldsExpires = c.ShrinkExpires
			}
		}
	}
	sent := r.now()
	g, err := p.ledger.Refresh(ctx, r.region.Name, rep)
	if err != nil {
		// The counts are not lost: back into the pool for the next refresh.
		if perr := p.pool.Push(ctx, c.Admitted, c.Refused, 0, 0, 2*lockRefreshes*r.region.Refresh); perr != nil {
			r.log.Warn("region: the pooled counts could not be put back", "region", r.region.Name, "policy", p.name, "error", perr.Error())
		}
		return rep, err
	}
	p.sentAt, p.offset = sent, g.Now.Sub(sent)
	// The key lives for the lease left, less half a refresh: a reader's lease (its send time plus
	// the key's TTL) then ends before this one's even if the publish took that long to arrive.
	ttl := g.LocalExpires.Sub(r.now()) - r.region.Refresh/2
	if ttl >= time.Millisecond {
		// A shrink in flight is of the grant published now (the shrink kept in the pool since
		// has its own time): were it of rep.Holds, each refresh in the window would extend it.
		var from int64
		if c.HasGrant {
			from = c.Grant.Allotment
		}
		_, ok, err = p.pool.Publish(ctx, r.id, redisstore.PoolGrant{Allotment: g.Allotment, Learning: g.Learning, Expires: g.Expires, Epoch: g.Epoch},
			ttl, from, c.Grant.Expires, r.shrinkFor())
		if err != nil {
			return rep, err
		}
		p.took = r.now().Sub(now)
		if !ok {
			p.leading = false
		} else if g.Confirm {
			// Confirm the shrink once every instance has read it and pushed its use: a refresh then.
			r.wakeAfter(r.shrinkFor() + r.region.Refresh/4)
		}
	}
	return rep, nil
}

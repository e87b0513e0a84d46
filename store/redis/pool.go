package redis

// The region's pool of a global policy (issue 34; docs/design.md, "Several instances in a
// region"): the instances of one region share its Redis and its counters, so they enforce one
// allotment together. On that regional Redis, per global policy, four keys in one slot:
//
//	<prefix>{<prefix>region:<policy>}:lock    string: the id of the instance that refreshes the ledger for the region, with a TTL it renews
//	<prefix>{<prefix>region:<policy>}:demand  hash: admitted, refused (added by every instance), used, until (µs, this Redis's clock)
//	<prefix>{<prefix>region:<policy>}:grant   string: "version allotment learning expires_µs epoch", expiring when its lease ends
//	<prefix>{<prefix>region:<policy>}:shrink  string: "from from_expires_µs until_µs" for each shrink in flight: a larger allotment some instance may still enforce, until then (each its own time)
//
// Every call is one script (pool.lua); take and publish are fenced: only the lock's holder may.

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

//go:embed pool.lua
var poolLua string

var poolScript = rueidis.NewLuaScript(poolLua)

// Pool is one global policy's pool on a region's Redis. Its methods are safe for concurrent use.
type Pool struct {
	s                           *Store
	policy                      string
	lock, demand, grant, shrink string
}

// Pool returns the pool of the global policy named policy on the store's Redis.
func (s *Store) Pool(policy string) (*Pool, error) {
	if err := checkLedgerName("policy", policy); err != nil {
		return nil, err
	}
	tag := s.prefix + "{" + s.prefix + "region:" + policy + "}:"
	return &Pool{s: s, policy: policy, lock: tag + "lock", demand: tag + "demand", grant: tag + "grant", shrink: tag + "shrink"}, nil
}

// Keys returns the pool's keys: the lock, the demand, the grant and the shrink.
func (p *Pool) Keys() []string { return []string{p.lock, p.demand, p.grant, p.shrink} }

// PoolGrant is a grant as the region's refresher publishes it for every instance.
type PoolGrant struct {
	Version   int64 // set by Publish: each publication the next
	Allotment int64
	Learning  bool
	Expires   time.Time // the lease's end on the ledger's clock
	Epoch     string
	// TTL is how long the grant had to live when it was read (its key's PTTL, so the reader's
	// lease ends at its send time plus TTL: no later than the refresher's).
	TTL time.Duration
}

// PoolCounts is what Take returns: the region's pooled demand since the last take, and the
// published grant with the shrink in flight.
type PoolCounts struct {
	Admitted, Refused int64
	Used              int64
	UsedFor           time.Duration // how much longer Used counts, as of the take (this Redis's clock)
	// Span is the time since the last take (this Redis's clock), which the counts came in: 0 if
	// not known (no take within the keep before).
	Span          time.Duration
	Grant         PoolGrant
	HasGrant      bool  // a grant is published and its lease has not ended
	ShrinkFrom    int64 // 0: no shrink in flight
	ShrinkExpires time.Time
}

func (p *Pool) exec(ctx context.Context, args ...string) (rueidis.RedisResult, error) {
	c, err := p.s.connected()
	if err != nil {
		return rueidis.RedisResult{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, p.s.timeout)
	defer cancel()
	res := poolScript.Exec(ctx, c.client, []string{p.lock, p.demand, p.grant, p.shrink}, args)
	if err := res.Error(); err != nil {
		return res, unavailable(err)
	}
	return res, nil
}

// Push adds this instance's counts into the pool: admitted and refused decisions, and its use
// (counted for usedFor from now), which the pool keeps as the largest live one. keep is how long
// the pool keeps counts no refresher takes.
func (p *Pool) Push(ctx context.Context, admitted, refused, used int64, usedFor, keep time.Duration) error {
	_, err := p.exec(ctx, "push", "", itoa(admitted), itoa(refused), itoa(used), itoa(max(usedFor, 0).Microseconds()), itoa(max(keep.Milliseconds(), 1)))
	return err
}

// Lead takes the lock, or renews it if id holds it, for ttl: true if id is the region's
// refresher now.
func (p *Pool) Lead(ctx context.Context, id string, ttl time.Duration) (bool, error) {
	res, err := p.exec(ctx, "lead", id, itoa(max(ttl.Milliseconds(), 1)))
	if err != nil {
		return false, err
	}
	vals, err := res.AsIntSlice()
	if err != nil || len(vals) != 2 {
		return false, fmt.Errorf("redis store: pool %s: lead answered %v (%v)", p.policy, vals, err)
	}
	return vals[0] == 1, nil
}

// Release gives the lock back if id holds it (an instance that stops cleanly), so that another
// instance takes it at its next refresh instead of after the lock's TTL: true if it held it.
func (p *Pool) Release(ctx context.Context, id string) (bool, error) {
	res, err := p.exec(ctx, "release", id)
	if err != nil {
		return false, err
	}
	n, err := res.AsInt64()
	if err != nil {
		return false, fmt.Errorf("redis store: pool %s: release answered %v", p.policy, err)
	}
	return n == 1, nil
}

// Take reads and resets the pooled demand, with the published grant: ok is false if id does not
// hold the lock (then nothing is reset). The take's time is kept for keep, so that the next
// take, by this instance or another that took the lock over, has its counts' Span.
func (p *Pool) Take(ctx context.Context, id string, keep time.Duration) (PoolCounts, bool, error) {
	res, err := p.exec(ctx, "take", id, itoa(max(keep.Milliseconds(), 1)))
	if err != nil {
		return PoolCounts{}, false, err
	}
	vals, err := res.ToArray()
	if err != nil || len(vals) == 0 {
		return PoolCounts{}, false, fmt.Errorf("redis store: pool %s: take answered %d values (%v)", p.policy, len(vals), err)
	}
	if n, _ := vals[0].AsInt64(); n != 1 {
		return PoolCounts{}, false, nil
	}
	if len(vals) != 9 {
		return PoolCounts{}, false, fmt.Errorf("redis store: pool %s: take answered %d values", p.policy, len(vals))
	}
	var n [5]int64
	for i := 1; i < 5; i++ {
		n[i], _ = vals[i].AsInt64()
	}
	span, _ := vals[8].AsInt64()
	c := PoolCounts{Admitted: n[1], Refused: n[2], Used: n[3], UsedFor: time.Duration(n[4]) * time.Microsecond, Span: time.Duration(span) * time.Microsecond}
	if s, err := vals[5].ToString(); err == nil {
		pttl, _ := vals[6].AsInt64()
		if c.Grant, err = parsePoolGrant(s, pttl); err != nil {
			return PoolCounts{}, false, fmt.Errorf("redis store: pool %s: %w", p.policy, err)
		}
		c.HasGrant = pttl > 0
	}
	if s, err := vals[7].ToString(); err == nil {
		f := strings.Fields(s)
		if len(f) == 2 {
			c.ShrinkFrom, _ = strconv.ParseInt(f[0], 10, 64)
			e, _ := strconv.ParseInt(f[1], 10, 64)
			c.ShrinkExpires = time.UnixMicro(e).UTC()
		}
	}
	return c, true, nil
}

// Publish publishes g for every instance of the region, its key expiring after ttl (the lease
// left), if id holds the lock (else ok is false). A shrink (from > g.Allotment: the allotment
// instances may still enforce, its lease ending at fromExpires) is kept in flight for shrinkFor,
// the time every instance needs to read the new grant: until then a refresher reports it held.
func (p *Pool) Publish(ctx context.Context, id string, g PoolGrant, ttl time.Duration, from int64, fromExpires time.Time, shrinkFor time.Duration) (int64, bool, error) {
	if ttl < time.Millisecond {
		return 0, false, fmt.Errorf("redis store: pool %s: a grant of ttl %v", p.policy, ttl)
	}
	learning := "0"
	if g.Learning {
		learning = "1"
	}
	epoch := g.Epoch
	if epoch == "" {
		epoch = "-"
	}
	if from <= g.Allotment {
		from = 0
	}
	value := itoa(g.Allotment) + " " + learning + " " + itoa(unixMicros(g.Expires)) + " " + epoch
	res, err := p.exec(ctx, "publish", id, value, itoa(ttl.Milliseconds()), itoa(from), itoa(unixMicros(fromExpires)), itoa(max(shrinkFor.Milliseconds(), 1)))
	if err != nil {
		return 0, false, err
	}
	v, err := res.AsInt64()
	if err != nil {
		return 0, false, fmt.Errorf("redis store: pool %s: publish: %w", p.policy, err)
	}
	return v, v > 0, nil
}

// Read returns the published grant (ok false: none, or its lease ended).
func (p *Pool) Read(ctx context.Context) (PoolGrant, bool, error) {
	res, err := p.exec(ctx, "read")
	if err != nil {
		return PoolGrant{}, false, err
	}
	vals, err := res.ToArray()
	if err != nil || len(vals) != 2 {
		return PoolGrant{}, false, fmt.Errorf("redis store: pool %s: read answered %d values (%v)", p.policy, len(vals), err)
	}
	s, err := vals[0].ToString()
	if err != nil {
		return PoolGrant{}, false, nil // no grant
	}
	pttl, _ := vals[1].AsInt64()
	g, err := parsePoolGrant(s, pttl)
	if err != nil {
		return PoolGrant{}, false, fmt.Errorf("redis store: pool %s: %w", p.policy, err)
	}
	return g, pttl > 0, nil
}

func parsePoolGrant(s string, pttl int64) (PoolGrant, error) {
	f := strings.Fields(s)
	if len(f) != 5 {
		return PoolGrant{}, fmt.Errorf("grant %q", s)
	}
	var n [4]int64
	for i := range 4 {
		var err error
		if n[i], err = strconv.ParseInt(f[i], 10, 64); err != nil {
			return PoolGrant{}, fmt.Errorf("grant %q", s)
		}
	}
	epoch := f[4]
	if epoch == "-" {
		epoch = ""
	}
	return PoolGrant{Version: n[0], Allotment: n[1], Learning: n[2] == 1, Expires: time.UnixMicro(n[3]).UTC(), Epoch: epoch,
		TTL: time.Duration(max(pttl, 0)) * time.Millisecond}, nil
}

package redis

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/keyhash"
)

// negativeCache remembers refusals so that an instance answers a client retrying a refused key
// in a tight loop without asking Redis.
//
// This is exact, not an approximation: a refusal of cost c with RetryAfter r means that every
// request of cost ≥ c on that key and policy is refused until r has passed, whatever other
// traffic does meanwhile (other traffic only consumes quota; see sluice.Decision). The cache
// measures r from the moment the request was sent, which is no later than the moment Redis
// decided, so it never refuses a request that Redis would approve; its RetryAfter may only be
// shorter than Redis's by the round trip, which sends the client back to Redis a moment early,
// where it is refused again exactly. A larger cost is refused too, but its wait may be longer
// than the remembered one, so the cache answers only the same cost and leaves larger ones to
// Redis: what it answers is what Redis would.
//
// A cached answer's ResetAfter is the refusal's, less the time since (the state's reset time does
// not move while nothing is approved); its Remaining is the refusal's, which refills may have
// raised since. An approval through this instance forgets the key's entry; approvals through
// other instances only lower Remaining and delay the reset further.
//
// The one thing that makes a refusal wrong before its RetryAfter is quota coming back: a
// settlement that refunds, on any instance (and the store's own give-backs of decisions answered
// unavailable, which are such settlements). The settle script publishes the refunded state key on
// the prefix's channel (Store.channel), atomically with the refund; every store subscribes to it
// (listen) and forgets the key. A refusal whose reply crosses such a message is not remembered:
// each shard counts the invalidations of its keys (gen), and a refusal is remembered only if none
// came between its request's sending and its reply. The cache answers only while it is known to
// hear the channel (live), and is cleared whenever it may not have. Entries are keyed by the state
// key, which is what the channel carries.
//
// All this holds under the policy the refusal was decided under. A reload may change a policy's
// numbers and keep its name (which is what the entries are keyed by, with the client's key), so
// each entry also holds the policy's fingerprint, and a lookup under another one misses and drops
// the entry: the new policy's decision is Redis's, from the first request.
type negativeCache struct {
	hasher keyhash.Hasher // picks a key's shard, with a key random per process
	shards [64]negShard
	max    int         // entries per shard
	live   atomic.Bool // subscribed to the refunds' channel: the cache may answer
}

type negShard struct {
	mu  sync.Mutex
	m   map[string]negEntry // guarded by mu
	gen atomic.Uint64       // counts the invalidations of the shard's keys (and clears)
}

type negEntry struct {
	until int64 // local µs: refused before then
	sent  int64 // local µs: when the refused request was sent
	cost  int64 // the refused cost; only requests of this cost are answered
	fp    fingerprint
	d     sluice.Decision
}

// fingerprint is what of a policy its decisions depend on: all of it but the name.
type fingerprint struct {
	alg          sluice.Algorithm
	limit, burst int64
	period       time.Duration
	calendar     algorithm.Calendar // and its zone: a reload from one to another is another policy
	location     *time.Location
}

func fingerprintOf(p *sluice.Policy) fingerprint {
	return fingerprint{alg: p.Algorithm, limit: p.Limit, burst: p.Burst, period: p.Period, calendar: p.Calendar, location: p.Location}
}

func newNegativeCache(size int) *negativeCache {
	c := &negativeCache{max: max(1, size/64), hasher: keyhash.New()}
	for i := range c.shards {
		c.shards[i].m = map[string]negEntry{}
	}
	return c
}

func (c *negativeCache) shard(key string) *negShard {
	return &c.shards[c.hasher.String(key)%uint64(len(c.shards))]
}

// lookup returns the cached refusal of key under the policy fp for cost at now, if there is one.
// An entry of another policy (changed by a reload) is dropped.
func (c *negativeCache) lookup(key string, fp fingerprint, cost, now int64) (sluice.Decision, bool) {
	if !c.live.Load() {
		return sluice.Decision{}, false // not subscribed: a refund elsewhere would go unheard
	}
	sh := c.shard(key)
	sh.mu.Lock()
	e, ok := sh.m[key]
	if ok && (now >= e.until || e.fp != fp) {
		delete(sh.m, key)
		ok = false
	}
	sh.mu.Unlock()
	if !ok || cost != e.cost {
		return sluice.Decision{}, false
	}
	d := e.d
	d.Source = sluice.FromCache
	d.RetryAfter = time.Duration(e.until-now) * time.Microsecond
	d.ResetAfter = max(0, d.ResetAfter-time.Duration(now-e.sent)*time.Microsecond)
	d.At += now - e.sent // Redis's instant now, as far as this instance's clock tells (a refusal settles nothing)
	return d, true
}

// forget drops key's cached refusal, if any, and makes a refusal of key decided before it
// (whose reply may still be on its way) one that is not remembered.
func (c *negativeCache) forget(key string) {
	sh := c.shard(key)
	sh.mu.Lock()
	delete(sh.m, key)
	sh.gen.Add(1)
	sh.mu.Unlock()
}

// generation is what remember takes for a decision of key sent now: a refusal is remembered
// only if nothing invalidated key (or cleared the cache) between its sending and its reply.
func (c *negativeCache) generation(key string) uint64 {
	return c.shard(key).gen.Load()
}

// setLive turns the cache on (subscribed) or off; off, it is cleared, and answers nothing.
func (c *negativeCache) setLive(live bool) {
	c.live.Store(live)
	if live {
		return
	}
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		clear(sh.m)
		sh.gen.Add(1)
		sh.mu.Unlock()
	}
}

// remember records a refusal decided under the policy fp for a request sent at sent, when the
// key's generation was gen.
func (c *negativeCache) remember(key string, fp fingerprint, cost, sent int64, gen uint64, d sluice.Decision) {
	if d.RetryAfter <= 0 {
		return // Never (the cost can never fit) is answered before Redis anyway
	}
	if d.RetryAfter == 1<<63-1 || d.ResetAfter == 1<<63-1 {
		return // time.Duration's most (292 years) may be a saturated longer wait: aged, it would be a guess
	}
	until := sent + int64(d.RetryAfter/time.Microsecond)
	if !c.live.Load() {
		return
	}
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.gen.Load() != gen {
		return // invalidated since the request was sent: the refusal may be stale already
	}
	if len(sh.m) >= c.max {
		// Full: drop the expired among a sample (O(1), map ranges start at random); if none,
		// forget this refusal: client input never grows memory without bound, and Redis still
		// answers.
		n := 0
		for k, e := range sh.m {
			if e.until <= sent {
				delete(sh.m, k)
			}
			if n++; n == 16 {
				break
			}
		}
		if len(sh.m) >= c.max {
			return
		}
	}
	sh.m[key] = negEntry{until: until, sent: sent, cost: cost, fp: fp, d: d}
}

// channel is where the store's settlements publish the state keys whose quota they gave back,
// and where every store on the Redis listens: prefix + "refunds".
func (s *Store) channel() string { return s.prefix + "refunds" }

// listen keeps the negative cache subscribed to the refunds' channel until c stops: every key
// published there is forgotten. The subscription has a connection of its own (one that rueidis
// does not re-subscribe behind the store's back, so that a gap is seen). The cache answers only
// while the subscription is known to be live — from the moment a probe this store published on
// the channel came back through it — and is cleared and off whenever it is not (before, and from
// a disconnect until the next probe comes back), so it never answers from a state a refund
// elsewhere changed unheard. first is closed when the cache is first live (or listening ends).
func (s *Store) listen(c *conn, first chan<- struct{}) {
	defer c.listening.Done()
	var once sync.Once
	defer once.Do(func() { close(first) })
	ch := s.channel()
	probe := "probe " + strconv.FormatUint(rand.Uint64(), 16) // (never a key: keys start with the prefix)
	wait := connectFirstRetry
	warned := false
	for {
		dc, release := c.client.Dedicate()
		ended := dc.SetPubSubHooks(rueidis.PubSubHooks{OnMessage: func(m rueidis.PubSubMessage) {
			if m.Message == probe {
				if !s.refused.live.Swap(true) {
					once.Do(func() { close(first) })
				}
				return
			}
			s.refused.forget(m.Message)
		}})
		ctx, cancel := context.WithTimeout(s.ctx, max(s.timeout, time.Second))
		err := dc.Do(ctx, dc.B().Subscribe().Channel(ch).Build()).Error()
		cancel()
		if re, ok := rueidis.IsRedisErr(err); ok && !warned {
			warned = true
			s.log.Warn("Redis refuses the store's subscription to its refunds' channel (the ACL user needs +subscribe +publish and &<prefix>*): the negative cache stays off, every refusal is Redis's",
				"channel", ch, "error", re.Error())
		}
		if err == nil {
			ctx, cancel := context.WithCancel(s.ctx)
			var probing sync.WaitGroup
			probing.Go(func() { // publish the probe until it comes back (or the subscription ends)
				every := 50 * time.Millisecond
				for !s.refused.live.Load() {
					pctx, pcancel := context.WithTimeout(ctx, max(s.timeout, 100*time.Millisecond))
					_ = c.client.Do(pctx, c.client.B().Publish().Channel(ch).Message(probe).Build()).Error()
					pcancel()
					t := time.NewTimer(every)
					select {
					case <-ctx.Done():
						t.Stop()
						return
					case <-t.C:
					}
					every = min(2*every, connectMaxRetry) // (a PUBLISH refused, e.g. by the ACL, is not hammered)
				}
			})
			select {
			case <-ended: // (the connection broke)
			case <-c.stop:
			}
			cancel()
			probing.Wait()
			if s.refused.live.Load() {
				wait = connectFirstRetry
			}
		}
		s.refused.setLive(false) // unsubscribed: refunds go unheard
		dc.Close()
		release()
		t := time.NewTimer(wait)
		select {
		case <-c.stop:
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(2*wait, connectMaxRetry)
	}
}

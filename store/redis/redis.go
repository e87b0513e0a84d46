// Package redis is sluice's shared store: every gateway instance decides on the same state in
// Redis, so a client's quota is one quota however many instances it reaches.
//
// Each decision is one atomic Lua script (EVALSHA, re-sent as EVAL after NOSCRIPT, e.g. after a
// restart or a failover) that reads Redis's own clock (TIME), so the instances' clocks never
// matter, and that implements exactly the transitions of package algorithm. There is no
// read-then-write from the gateway. Concurrent decisions share a few connections through
// rueidis's automatic pipelining.
//
// Keys: one hash per client and policy, hash-tagged by client — prefix + "{customer-42}:orders-api"
// — so that all of a client's limits share a Redis Cluster slot and can be decided together
// (DecideAll); the sliding log keeps its entries in a list beside it (…":log"). Every key has a
// TTL equal to the time until its state is as if never seen, so idle clients leave nothing.
//
// Lua numbers are doubles, exact below 2^53; the scripts compute beyond that on exact integers of
// their own (lua/common.lua), so the store takes every valid policy, as the memory store does.
package redis

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
)

// Defaults.
const (
	DefaultPrefix            = "rate-limit:"
	DefaultTimeout           = 50 * time.Millisecond
	DefaultNegativeCacheSize = 1 << 16
	DefaultMaxBatch          = 16
	// virtualClockSlack is added to TTLs when a test clock decides time: Redis expires keys on
	// its own real clock, which a virtual clock does not move.
	virtualClockSlack = time.Hour
)

// Options configures a Store. Either Addrs or URL.
type Options struct {
	Addrs    []string // one address: a single server; several: a Redis Cluster (seed nodes)
	URL      string   // instead of Addrs: redis://[user:password@]host:port[/db], rediss:// for TLS
	Username string   // ACL user
	Password string
	TLS      *tls.Config // TLS settings (CA, client certificate); with a rediss:// URL, replaces its default

	Prefix  string        // key prefix; default DefaultPrefix
	Timeout time.Duration // bound on every store call; default DefaultTimeout
	// Clock, if set, supplies now instead of Redis TIME: for running real Redis on virtual time
	// in tests. Production leaves it nil. The scripts take times within 2^60 µs (36,000 years)
	// of the epoch and answer an error for any other.
	Clock sluice.Clock
	// NegativeCacheSize bounds the refusals remembered per instance (default
	// DefaultNegativeCacheSize; negative disables the cache).
	NegativeCacheSize int
	// MaxBatch is the most decisions sent in one script call when several wait at once
	// (default DefaultMaxBatch; 1 sends one script per decision). On a Redis Cluster, those
	// waiting together are sent as one call per hash slot among them (a script's keys must
	// share a slot; all of one client's do), pipelined together.
	MaxBatch int
}

// Store is the Redis store. Create it with New; Close it when done.
type Store struct {
	client  rueidis.Client
	prefix  string
	timeout time.Duration
	clock   sluice.Clock
	slack   string // ttl_slack argument, µs
	single  [6]*rueidis.Lua
	multi   *rueidis.Lua
	refused *negativeCache // nil: disabled
	batch   *batcher       // nil: one script per decision

	calls, cacheHits atomic.Uint64
}

// New connects to Redis (a first PING must succeed within the timeout) and returns the store.
func New(opts Options) (*Store, error) {
	var co rueidis.ClientOption
	if opts.URL != "" {
		if len(opts.Addrs) > 0 {
			return nil, errors.New("redis store: give Addrs or URL, not both")
		}
		var err error
		if co, err = rueidis.ParseURL(opts.URL); err != nil {
			return nil, fmt.Errorf("redis store: URL: %w", err)
		}
	} else {
		if len(opts.Addrs) == 0 {
			return nil, errors.New("redis store: no address (set Addrs, e.g. [127.0.0.1:6379], or URL)")
		}
		co.InitAddress = opts.Addrs
	}
	if opts.TLS != nil {
		co.TLSConfig = opts.TLS
	}
	if opts.Username != "" {
		co.Username = opts.Username
	}
	if opts.Password != "" {
		co.Password = opts.Password
	}
	co.DisableCache = true // no client-side caching: every decision is a script
	s := &Store{prefix: opts.Prefix, timeout: opts.Timeout, clock: opts.Clock, slack: "0"}
	if s.prefix == "" {
		s.prefix = DefaultPrefix
	}
	if s.timeout <= 0 {
		s.timeout = DefaultTimeout
	}
	co.Dialer.Timeout = max(s.timeout, 100*time.Millisecond)
	co.ConnWriteTimeout = max(s.timeout, 100*time.Millisecond)
	if s.clock != nil {
		s.slack = strconv.FormatInt(int64(virtualClockSlack/time.Microsecond), 10)
	}
	if size := opts.NegativeCacheSize; size >= 0 {
		if size == 0 {
			size = DefaultNegativeCacheSize
		}
		s.refused = newNegativeCache(size)
	}
	client, err := rueidis.NewClient(co)
	if err != nil {
		return nil, fmt.Errorf("%w: redis store: connecting to %v: %w", sluice.ErrStoreUnavailable, co.InitAddress, err)
	}
	s.client = client
	for _, a := range algorithm.Algorithms {
		s.single[a] = rueidis.NewLuaScript(singleScript(a))
	}
	s.multi = rueidis.NewLuaScript(multiScript())
	if maxBatch := opts.MaxBatch; maxBatch != 1 {
		if maxBatch <= 0 {
			maxBatch = DefaultMaxBatch
		}
		ctx, cancel := context.WithTimeout(context.Background(), max(s.timeout, time.Second))
		info, err := client.Do(ctx, client.B().Info().Section("cluster").Build()).ToString()
		cancel()
		// Batch only where INFO says whether this is a cluster; a user that may not run INFO
		// gets one script per decision, which is right everywhere.
		if err == nil && (strings.Contains(info, "cluster_enabled:0") || strings.Contains(info, "cluster_enabled:1")) {
			s.batch = newBatcher(s, maxBatch, strings.Contains(info, "cluster_enabled:1"))
		}
	}
	return s, nil
}

// Close stops the store's workers and closes the connections.
func (s *Store) Close() {
	if s.batch != nil {
		s.batch.close()
	}
	s.client.Close()
}

// Stats are counters of one Store instance.
type Stats struct {
	Calls     uint64 // scripts run in Redis
	CacheHits uint64 // refusals answered from the negative cache, without Redis
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats { return Stats{Calls: s.calls.Load(), CacheHits: s.cacheHits.Load()} }

// keys returns the state hash's key and the sliding log's list key of key under policy.
func (s *Store) keys(key, policy string) (string, string) {
	k := s.prefix + "{" + key + "}:" + policy
	return k, k + ":log"
}

// now returns the argument that tells a script the time: empty for Redis TIME.
func (s *Store) now() string {
	if s.clock == nil {
		return ""
	}
	return strconv.FormatInt(s.clock.Now().UnixMicro(), 10)
}

// localNow is this instance's time for the negative cache: the test clock if set, else the
// monotonic clock (never compared with Redis's).
func (s *Store) localNow() int64 {
	if s.clock != nil {
		return s.clock.Now().UnixMicro()
	}
	return int64(time.Since(processStart) / time.Microsecond)
}

var processStart = time.Now()

// check runs the checks that need no Redis: the core's policy and cost rules, nothing more (the
// scripts compute exactly whatever the core accepts). CheckCost leaves out one bound of
// Policy.Validate, a bucket's refill time below 2^53 µs, which the scripts check too: a policy
// beyond it is the caller's error, answered here, not an error of Redis's.
func (s *Store) check(p *sluice.Policy, cost int64, d *sluice.Decision) error {
	if err := algorithm.CheckCost(p, cost, d); err != nil {
		return err
	}
	if err := p.Validate(); err != nil {
		*d = algorithm.MakeDecision(false, 0, 0, -1, 0, 0)
		return err
	}
	return nil
}

// Decide implements sluice.Store.
func (s *Store) Decide(ctx context.Context, key string, p sluice.Policy, cost int64) (sluice.Decision, error) {
	var d sluice.Decision
	if err := s.check(&p, cost, &d); err != nil {
		return d, err
	}
	cacheKey := p.Name + "\x00" + key
	sent := s.localNow()
	if s.refused != nil {
		if d, ok := s.refused.lookup(cacheKey, cost, sent); ok {
			s.cacheHits.Add(1)
			return d, nil
		}
	}
	hash, log := s.keys(key, p.Name)
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	args := [5]string{strconv.Itoa(int(p.Algorithm)), strconv.FormatInt(p.Limit, 10), strconv.FormatInt(p.PeriodMicros(), 10),
		strconv.FormatInt(p.Burst, 10), strconv.FormatInt(cost, 10)}
	var reply []int64
	var err error
	if s.batch != nil {
		c := s.batch.newCall(p.Algorithm, hash, log, args)
		if err = s.batch.decide(ctx, c); err != nil {
			return sluice.Decision{Limit: p.Capacity()}, err
		}
		reply = c.reply[:]
	} else {
		s.calls.Add(1)
		reply, err = s.execSingle(ctx, p.Algorithm, [2]string{hash, log}, args).AsIntSlice()
		if err != nil {
			return sluice.Decision{Limit: p.Capacity()}, unavailable(err)
		}
	}
	if len(reply) != 6 {
		return sluice.Decision{Limit: p.Capacity()}, fmt.Errorf("%w: redis store: script replied %d numbers, want 6", sluice.ErrStoreUnavailable, len(reply))
	}
	d = algorithm.MakeDecision(reply[0] == 1, reply[1], reply[2], reply[3], reply[4], reply[5])
	if s.refused != nil {
		if d.Allowed {
			if cost > 0 {
				s.refused.forget(cacheKey) // the state moved: a cached refusal's numbers are stale
			}
		} else {
			s.refused.remember(cacheKey, cost, sent, d)
		}
	}
	return d, nil
}

// execSingle runs a's single script on the keys with args (single.lua's ARGV[1..5]).
func (s *Store) execSingle(ctx context.Context, a sluice.Algorithm, keys [2]string, args [5]string) rueidis.RedisResult {
	return s.single[a].Exec(ctx, s.client, keys[:], append(args[:], s.now(), s.slack))
}

// DecideAll implements sluice.Store with one script: every limit's key shares the client's hash
// tag, so one atomic call in one slot decides them all.
func (s *Store) DecideAll(ctx context.Context, key string, limits []sluice.Limit, out []sluice.Decision) (bool, error) {
	if len(out) != len(limits) {
		return false, fmt.Errorf("redis store: DecideAll: %d decisions for %d limits", len(out), len(limits))
	}
	if len(limits) == 1 {
		// One limit is one decision: Decide's path, with the negative cache and batching (the
		// gateway asks DecideAll for every request, most of which have one policy).
		d, err := s.Decide(ctx, key, limits[0].Policy, limits[0].Cost)
		out[0] = d
		return err == nil && d.Allowed, err
	}
	keys := make([]string, 0, 2*len(limits))
	args := make([]string, 0, 3+5*len(limits))
	args = append(args, strconv.Itoa(len(limits)), s.now(), s.slack)
	for i := range limits {
		l := &limits[i]
		if err := s.check(&l.Policy, l.Cost, &out[i]); err != nil {
			return false, err
		}
		hash, log := s.keys(key, l.Policy.Name)
		keys = append(keys, hash, log)
		args = append(args, strconv.Itoa(int(l.Policy.Algorithm)), strconv.FormatInt(l.Policy.Limit, 10),
			strconv.FormatInt(l.Policy.PeriodMicros(), 10), strconv.FormatInt(l.Policy.Burst, 10), strconv.FormatInt(l.Cost, 10))
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	s.calls.Add(1)
	reply, err := s.multi.Exec(ctx, s.client, keys, args).AsIntSlice()
	if err != nil {
		return false, unavailable(err)
	}
	if len(reply) != 6*len(limits) {
		return false, fmt.Errorf("%w: redis store: script replied %d numbers, want %d", sluice.ErrStoreUnavailable, len(reply), 6*len(limits))
	}
	all := true
	for i := range limits {
		r := reply[6*i : 6*i+6]
		out[i] = algorithm.MakeDecision(r[0] == 1, r[1], r[2], r[3], r[4], r[5])
		all = all && out[i].Allowed
	}
	return all, nil
}

func unavailable(err error) error {
	return fmt.Errorf("%w: redis store: %v", sluice.ErrStoreUnavailable, err)
}

var _ sluice.Store = (*Store)(nil)

// Ping reports whether Redis answers within the store's timeout (readiness checks).
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.client.Do(ctx, s.client.B().Ping().Build()).Error(); err != nil {
		return unavailable(err)
	}
	return nil
}

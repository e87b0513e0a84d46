// Package redis is sluice's shared store: every gateway instance decides on the same state in
// Redis, so a client's quota is one quota however many instances it reaches.
//
// Each decision is one atomic Lua script — on Redis ≥ 7.0 a function of the store's library
// (FCALL, funcs.go), else EVALSHA, re-sent as EVAL after NOSCRIPT, e.g. after a restart or a
// failover — that reads Redis's own clock (TIME), so the instances' clocks never
// matter, and that implements exactly the transitions of package algorithm. There is no
// read-then-write from the gateway. Concurrent decisions share a few connections through
// rueidis's automatic pipelining. A call the store gave up on (its timeout passed) decides
// nothing, even if it still reaches a Redis that hung: each carries its deadline (deadline.go).
//
// Keys: one key per client and policy, hash-tagged by client — prefix + "{customer-42}:orders-api"
// — so that all of a client's limits share a Redis Cluster slot and can be decided together
// (DecideAll; limits under several keys may lie in several slots, see sluice.Store.DecideAll
// for what a cluster then keeps). The state is one string (…":v2", written by one SET … PX),
// except for the sliding log, whose whole state is one list (…":log": a header, then the
// entries); lua/common.lua says how a rolling upgrade from the old format (a hash) shares Redis. A state is never split
// over keys, so losing a key (eviction, DEL) only ever gives its client quota back. Every key
// has a TTL equal to the time until its state is as if never seen, so idle clients leave nothing.
//
// Lua numbers are doubles, exact below 2^53; the scripts compute beyond that on exact integers of
// their own (lua/common.lua), so the store takes every valid policy, as the memory store does.
package redis

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
)

// ACLRules are the Redis ACL rules of the user the store connects as (Options.Username), for the
// default prefix — exactly what the store needs, and what the documentation quotes:
//
//	ACL SETUSER sluice on >PASSWORD <ACLRules>
//
// With another Prefix, change ~rate-limit:* and &rate-limit:* to it. The rules grant: SELECT for a URL's database
// and PING for readiness checks (logging in, HELLO with AUTH, needs no grant; the client
// library's CLIENT SETINFO may fail); the decisions as functions of the store's library (FCALL,
// and FUNCTION LOAD when a node does not have it yet: funcs.go), and as scripts (EVALSHA, and
// EVAL when Redis does not have them yet: the instance registry's script, and every decision on
// a server without Functions), and the commands they run on the prefix's keys; TIME, with which the store
// reads Redis's clock (deadlines); and, on a Redis Cluster, the slot map (CLUSTER SLOTS, or
// SHARDS from Redis 8) and ASKING for redirections while slots move; the sorted-set commands
// of the instance registry's script (fleet.lua) and of concurrency limits (concurrency.go,
// ZSCORE too), and the registry's hash of the instances' counts (HSET, HDEL, HMGET); WAIT, for replicas_ack; and ROLE, with which the
// client checks that the server Sentinel names is the primary (and the store counts the replicas
// replicas_ack waits for); PUBLISH and SUBSCRIBE on the prefix's channel, where settlements that
// give quota back name their keys for every instance's negative cache (negcache.go). Nothing
// else: no other keys or channels, no FLUSHALL, no CONFIG.
const ACLRules = "resetkeys ~rate-limit:* resetchannels &rate-limit:* -@all +select +ping +time +publish +subscribe " +
	"+fcall +function|load +evalsha +eval +get +set +exists +hmget +del +pexpire +rpush +lrange +lset +ltrim +llen +zadd +zrem +zremrangebyscore +zcard +zrange +zscore +hset +hdel +cluster|slots +cluster|shards +asking" +
	" +wait +role"

// Defaults.
const (
	DefaultPrefix            = "rate-limit:"
	DefaultTimeout           = 50 * time.Millisecond
	DefaultSlowTimeout       = 500 * time.Millisecond
	DefaultNegativeCacheSize = 1 << 16
	DefaultMaxBatch          = 16
	// virtualClockSlack is added to TTLs when a test clock decides time: Redis expires keys on
	// its own real clock, which a virtual clock does not move.
	virtualClockSlack = time.Hour
)

// Options configures a Store. One of Addrs, URL or Sentinel.
type Options struct {
	Addrs    []string // one address: a single server; several: nodes of one Redis Cluster, from which the client discovers the rest
	URL      string   // instead of Addrs: redis://[user:password@]host:port[/db], rediss:// for TLS
	Username string   // ACL user
	Password string
	TLS      *tls.Config // TLS settings (CA, client certificate); with a rediss:// URL, replaces its default
	// Sentinel, instead of Addrs or URL: the primary is the one Redis Sentinel names, and the
	// store follows its failovers (sentinel.go). Username, Password and TLS are the primary's.
	Sentinel *Sentinel
	// ReplicasAck, if > 0, confirms every decision that consumed quota with WAIT on that many
	// replicas before answering it: one that fewer acknowledged within ReplicasAckTimeout fails
	// with ErrStoreUnavailable, so the failure mode decides, and its charge is given back; a
	// settlement fails with ErrUnconfirmed (applied). wait.go says what this guarantees.
	ReplicasAck int
	// ReplicasAckTimeout bounds the WAIT (default Timeout; whole milliseconds, rounded up). A
	// consuming call is then bounded by SlowTimeout + ReplicasAckTimeout.
	ReplicasAckTimeout time.Duration

	// Prefix starts every key of the store (default DefaultPrefix, "rate-limit:"). A prefix that
	// does not end in ':' gets one: "ctr" names the keys "ctr:{client}:policy…" and
	// "ctr:instances", never "ctr{client}…" glued to the names after it.
	Prefix string
	// Timeout (default DefaultTimeout) is how long a decision waits for its reply once Redis has
	// been found down (below), until Redis answers anything again; and the bound of settlements
	// and of a lease's release and renewal.
	Timeout time.Duration
	// SlowTimeout (default DefaultSlowTimeout, and never below Timeout) bounds every decision
	// while Redis is not known to be down; each script carries its bound as its deadline on
	// Redis's clock. A call that ends without a reply is Redis down (ErrStoreUnavailable, which a
	// Limiter's breaker counts) only if Redis answered nothing at all since it was sent; else it
	// was slow — sluice.ErrStoreSlow beside ErrStoreUnavailable, which the breaker does not count
	// (life.go). Equal to Timeout, every call waits Timeout and no longer.
	SlowTimeout time.Duration
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
	// Logger, if set, is told when Redis did not answer at New and when the store connects
	// later (or Redis refuses it meanwhile), and when Redis does not take the store's function
	// library, so that the store runs the scripts (funcs.go). Nil: nothing is logged.
	Logger *slog.Logger

	scripts bool // tests: run the scripts (EVALSHA) even where Redis has Functions
}

// Store is the Redis store. Create it with New; Close it when done.
type Store struct {
	co       rueidis.ClientOption
	prefix   string
	timeout  time.Duration // Options.Timeout (T)
	slow     time.Duration // Options.SlowTimeout (S ≥ T)
	clock    sluice.Clock
	slack    string // ttl_slack argument, µs
	maxBatch int    // 1: one script per decision
	log      *slog.Logger
	scripts  bool     // Options.scripts
	secrets  []string // the options' credentials, never to be quoted (secrets.go)
	single   [6]*program
	multi    *program
	batch    *program
	settle   *program
	refused  *negativeCache // nil: disabled
	acks     *acks          // nil: ReplicasAck off

	calSingle [4]*program // the calendar single scripts, by algorithm (calendar.go)

	conn    atomic.Pointer[conn]  // nil until connected
	lastErr atomic.Pointer[error] // why the last attempt to connect failed
	ctx     context.Context       // ended by Close: stops connecting
	cancel  context.CancelFunc
	done    chan struct{} // closed when connecting in the background ends; nil if it never ran
	closed  sync.Once

	calls, cacheHits atomic.Uint64

	bg        sync.WaitGroup // what runs on beyond a call: late replies, give-backs (exec.go)
	refunding chan struct{}  // bounds the give-backs in flight

	betweenPhases func() // tests: run between the checks and the commits of acrossSlots

	instanceClock func() time.Time // tests: the instance's clock that calendar windows are passed around (calendar.go)
}

// conn is a store's connection to Redis, made once Redis answered.
type conn struct {
	client    rueidis.Client
	cluster   bool
	functions bool           // calls go to the library's functions (FCALL); false: the scripts (funcs.go)
	batch     *batcher       // nil: one script per decision
	offsets   *offsets       // Redis's clock, for deadlines; nil with Options.Clock
	lives     []slotLife     // whether Redis answers, by slot (life.go)
	stop      chan struct{}  // ends refresh and listen
	refreshed chan struct{}  // closed when refresh has ended; nil if it never ran
	listening sync.WaitGroup // listen (negcache.go)
}

// Backoff between the attempts to connect in the background.
var (
	connectFirstRetry = 250 * time.Millisecond
	connectMaxRetry   = 5 * time.Second
)

// New returns a store on Redis. It connects at once if Redis answers; if Redis does not (nothing
// listens, or it does not reply within the timeout) New still returns the store, which connects
// in the background, retrying with backoff: until then every decision and Ping fails with an
// error wrapping sluice.ErrStoreUnavailable, so a Limiter's failure mode decides, and from then
// on decisions go to Redis. A program therefore starts, and limits, during a Redis outage.
//
// New fails at once on what retrying cannot mend: bad options (no address, both Addrs and URL, a
// malformed URL or address) and a Redis that answers but refuses the connection (a wrong
// password, an ACL user without TIME, a certificate the TLS config does not trust); that error
// wraps sluice.ErrStoreUnavailable too.
func New(opts Options) (*Store, error) {
	s, err := open(opts)
	if err != nil {
		return nil, redact(err, credentials(&opts)) // (secrets.go)
	}
	return s, nil
}

// open is New, whose errors may still quote a credential.
func open(opts Options) (*Store, error) {
	var co rueidis.ClientOption
	if opts.Sentinel != nil {
		if err := sentinelOption(&co, &opts); err != nil {
			return nil, err
		}
	} else if opts.URL != "" {
		if len(opts.Addrs) > 0 {
			return nil, errors.New("redis store: give Addrs or URL, not both")
		}
		var err error
		if co, err = rueidis.ParseURL(opts.URL); err != nil {
			return nil, fmt.Errorf("redis store: URL: %w", err)
		}
		if err := checkAddrs("URL", co.InitAddress); err != nil {
			return nil, err
		}
	} else {
		if len(opts.Addrs) == 0 {
			return nil, errors.New("redis store: no address (set Addrs, e.g. [127.0.0.1:6379], or URL)")
		}
		if err := checkAddrs("Addrs", opts.Addrs); err != nil {
			return nil, err
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
	s := &Store{prefix: opts.Prefix, timeout: opts.Timeout, clock: opts.Clock, slack: "0", maxBatch: opts.MaxBatch, log: opts.Logger, scripts: opts.scripts,
		secrets: credentials(&opts), refunding: make(chan struct{}, maxRefunding)}
	if s.prefix == "" {
		s.prefix = DefaultPrefix
	} else if !strings.HasSuffix(s.prefix, ":") {
		s.prefix += ":" // (Options.Prefix: keys are prefix + name, never glued to it)
	}
	if s.timeout <= 0 {
		s.timeout = DefaultTimeout
	}
	if s.slow = opts.SlowTimeout; s.slow <= 0 {
		s.slow = DefaultSlowTimeout
	}
	s.slow = max(s.slow, s.timeout)
	if s.maxBatch <= 0 {
		s.maxBatch = DefaultMaxBatch
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	// (A connection's bounds — its handshake's, and the keep-alive PING's that rueidis closes it
	// after — are the longest a call waits for a Redis that is alive (life.go): a busy machine
	// must not fail connections, and the calls on them, that it would not fail calls for.)
	co.Dialer.Timeout = max(s.slow, 100*time.Millisecond)
	co.ConnWriteTimeout = max(s.slow, 100*time.Millisecond)
	if opts.Sentinel != nil {
		co.Sentinel.Dialer.Timeout = co.Dialer.Timeout
	}
	if opts.ReplicasAck != 0 || opts.ReplicasAckTimeout != 0 {
		var err error
		if s.acks, err = newAcks(opts.ReplicasAck, opts.ReplicasAckTimeout, s.timeout); err != nil {
			return nil, err
		}
	}
	if s.acks != nil {
		co.ConnWriteTimeout = max(s.slow+s.acks.timeout, 100*time.Millisecond)
	}
	s.co = co
	if s.clock != nil {
		s.slack = strconv.FormatInt(int64(virtualClockSlack/time.Microsecond), 10)
	}
	if size := opts.NegativeCacheSize; size >= 0 {
		if size == 0 {
			size = DefaultNegativeCacheSize
		}
		s.refused = newNegativeCache(size)
	}
	for _, a := range algorithm.Algorithms {
		s.single[a] = newProgram(singleScript(a), "single_"+strconv.Itoa(int(a)))
	}
	for _, a := range calendarAlgorithms {
		s.calSingle[a] = newProgram(calendarSingleScript(), "single_cal_"+strconv.Itoa(int(a)))
	}
	s.multi = newProgram(multiScript(), "multi")
	s.batch = newProgram(batchScript(), "batch")
	s.settle = newProgram(settleScript(), "settle")
	s.ctx, s.cancel = context.WithCancel(context.Background())
	c, err := s.connect()
	if err == nil {
		s.conn.Store(c)
		return s, nil
	}
	err = fmt.Errorf("%w: redis store: connecting to %s: %w", sluice.ErrStoreUnavailable, s.where(), err)
	reachable := !unreachable(err)
	err = redact(err, s.secrets)
	if reachable {
		s.cancel()
		return nil, err
	}
	s.lastErr.Store(&err)
	s.log.Warn("Redis does not answer; serving anyway, the failure mode decides until it does (connecting in the background)", "error", err.Error())
	s.done = make(chan struct{})
	go s.connectLater()
	return s, nil
}

// checkAddrs refuses addresses that are not host:port with a port number.
func checkAddrs(field string, addrs []string) error {
	for i, a := range addrs {
		_, port, err := net.SplitHostPort(a)
		if err == nil {
			if n, perr := strconv.ParseUint(port, 10, 16); perr != nil || n == 0 {
				err = fmt.Errorf("port %q is not a number in 1..65535", port)
			}
		}
		if err != nil {
			if field == "URL" {
				return fmt.Errorf("redis store: URL: address %q: %w", a, err)
			}
			return fmt.Errorf("redis store: %s[%d] %q: want host:port: %w", field, i, a, err)
		}
	}
	return nil
}

// unreachable reports whether err says Redis did not answer (nothing listens, or no reply in
// time): worth waiting for, unlike a Redis that answers and refuses.
func unreachable(err error) bool {
	var netErr net.Error // (context.DeadlineExceeded is one too)
	return errors.As(err, &netErr)
}

// connect makes one attempt to connect: the client (which authenticates and learns whether
// Redis is a cluster), then a first reading of the nodes' clocks.
func (s *Store) connect() (*conn, error) {
	client, err := rueidis.NewClient(s.co)
	if err != nil {
		return nil, err
	}
	c := &conn{client: client, cluster: client.Mode() == rueidis.ClientModeCluster, stop: make(chan struct{})}
	c.lives = newLife(c.cluster)
	if s.clock == nil {
		c.offsets = newOffsets(c.cluster)
		if err := c.offsets.measure(s.ctx, client, max(s.timeout, time.Second), monoMicros); err != nil {
			client.Close()
			return nil, fmt.Errorf("reading Redis's clock (TIME): %w", err)
		}
		c.refreshed = make(chan struct{})
		go c.refresh(c.stop, max(s.slow, 100*time.Millisecond)) // (a TIME that times out may break the connection it shares with decisions)
	}
	if !s.scripts {
		ctx, cancel := context.WithTimeout(s.ctx, max(s.timeout, time.Second))
		c.functions, err = useFunctions(ctx, client, s.log)
		cancel()
		if err != nil {
			c.close()
			return nil, fmt.Errorf("loading the store's function library (FUNCTION LOAD): %w", err)
		}
	}
	if s.maxBatch != 1 {
		c.batch = newBatcher(s, c, s.maxBatch, c.cluster)
	}
	if s.refused != nil {
		first := make(chan struct{})
		c.listening.Add(1)
		go s.listen(c, first)
		t := time.NewTimer(max(s.timeout, time.Second)) // (the cache is off until then: decisions go to Redis)
		select {
		case <-first:
		case <-t.C:
		}
		t.Stop()
	}
	if s.acks != nil {
		s.acks.checkReplicas(s.ctx, client, max(s.timeout, time.Second), s.log)
	}
	return c, nil
}

// connectLater retries connecting, with backoff, until it succeeds or the store is closed.
func (s *Store) connectLater() {
	defer close(s.done)
	wait := connectFirstRetry
	for {
		t := time.NewTimer(wait)
		select {
		case <-s.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		c, err := s.connect()
		if err == nil {
			if s.ctx.Err() != nil { // closed meanwhile
				c.close()
				return
			}
			s.conn.Store(c)
			s.log.Info("Redis answers; decisions go to it")
			return
		}
		err = fmt.Errorf("%w: redis store: connecting to %s: %w", sluice.ErrStoreUnavailable, s.where(), err)
		reachable := !unreachable(err)
		err = redact(err, s.secrets)
		s.lastErr.Store(&err)
		if reachable { // it answers, and refuses: say so, and keep trying
			s.log.Error("Redis answers but refuses the connection; the failure mode decides", "error", err.Error())
		}
		wait = min(2*wait, connectMaxRetry)
	}
}

// primary is the address of the server the store sends to, outside a cluster ("" on a cluster):
// with Sentinel, the primary it follows now.
func (c *conn) primary() string {
	if c.cluster {
		return ""
	}
	for addr := range c.client.Nodes() {
		return addr
	}
	return ""
}

// connected returns the connection, or the error to answer with until there is one.
func (s *Store) connected() (*conn, error) {
	if c := s.conn.Load(); c != nil {
		return c, nil
	}
	if err := s.lastErr.Load(); err != nil {
		return nil, fmt.Errorf("%w: redis store: not connected (Redis has not answered since the store was created; the last attempt: %v)",
			sluice.ErrStoreUnavailable, *err)
	}
	return nil, fmt.Errorf("%w: redis store: not connected", sluice.ErrStoreUnavailable)
}

// Close stops connecting (if the store still is), stops the store's workers and closes the
// connections. It may be called at any time, more than once, and on a nil *Store.
func (s *Store) Close() {
	if s == nil {
		return
	}
	s.closed.Do(func() {
		s.cancel()
		if s.done != nil {
			<-s.done
		}
		c := s.conn.Load()
		if c != nil && c.batch != nil {
			c.batch.close() // (its workers give back what their abandoned calls consumed)
		}
		s.bg.Wait() // late replies end within their bound, give-backs within theirs
		if c != nil {
			c.close()
		}
	})
}

func (c *conn) close() {
	close(c.stop)
	c.listening.Wait()
	if c.refreshed != nil {
		<-c.refreshed
	}
	if c.batch != nil {
		c.batch.close() // (again after Close: a no-op)
	}
	c.client.Close()
}

// Stats are counters of one Store instance.
type Stats struct {
	Calls     uint64 // scripts run in Redis
	CacheHits uint64 // refusals answered from the negative cache, without Redis
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats { return Stats{Calls: s.calls.Load(), CacheHits: s.cacheHits.Load()} }

// keys returns the state string's key and the sliding log's list key of key under policy (a
// state uses one of them: the scripts' KEYS[1] and KEYS[2]). The state string is named :v2
// after its format; the old format's hash, at the name without it, is read only to take over
// its state (lua/common.lua, THE OLD FORMAT).
func (s *Store) keys(key, policy string) (string, string) {
	k := s.prefix + "{" + key + "}:" + policy
	return k + stateSuffix, k + ":log"
}

// stateKey is the first of keys: the state string's key, which also names the key's entry in
// the negative cache and its invalidations (negcache.go).
func (s *Store) stateKey(key, policy string) string {
	return s.prefix + "{" + key + "}:" + policy + stateSuffix
}

// stateSuffix ends the name of a state string (format 2: one string written by SET … PX).
const stateSuffix = ":v2"

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
	if p.Algorithm == sluice.Concurrency {
		return s.decideConc(ctx, key, p, cost)
	}
	hash := s.stateKey(key, p.Name)
	fp := fingerprintOf(&p)
	sent := s.localNow()
	var gen uint64
	if s.refused != nil {
		if d, ok := s.refused.lookup(hash, fp, cost, sent); ok {
			s.cacheHits.Add(1)
			return d, nil
		}
		gen = s.refused.generation(hash)
	}
	c, err := s.connected()
	if err != nil {
		return sluice.Decision{Limit: p.Capacity()}, err
	}
	// The call's deadline: the caller's, or the store's bound if sooner (what a context with that
	// timeout would have; the batcher's callers wait for it without one: batcher.wait).
	asked := time.Now()
	deadline := asked.Add(s.hardTimeout(cost > 0))
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	deadline = s.deadline(c, c.slot(hash), asked, deadline, s.callTimeout(cost > 0)) // (T if Redis is known down: life.go)
	var inst int64
	period := ""
	if p.Calendar != algorithm.NoCalendar {
		inst = s.instanceNow()
		if period, err = calendarArg(&p, inst); err != nil {
			return sluice.Decision{Limit: p.Capacity()}, err
		}
	} else {
		period = strconv.FormatInt(p.PeriodMicros(), 10)
	}
	args := [5]string{strconv.Itoa(int(p.Algorithm)), strconv.FormatInt(p.Limit, 10), period,
		strconv.FormatInt(p.Burst, 10), strconv.FormatInt(cost, 10)}
	call := newCall(key, &p, cost, hash, hash[:len(hash)-len(stateSuffix)]+":log", args, inst, asked, deadline)
	if c.batch != nil {
		err = c.batch.decide(ctx, call)
	} else {
		r := call.request(s, deadline, false)
		var reply []int64
		dctx, cancel := context.WithDeadline(ctx, deadline)
		if reply, err = s.run(dctx, c, &r, call); err == nil {
			copy(call.reply[:], reply)
		}
		cancel()
	}
	if err != nil {
		return sluice.Decision{Limit: p.Capacity()}, err
	}
	d = decisionOf(call.reply[:6], call.reply[6])
	s.noteDecision(hash, fp, cost, sent, gen, &d)
	return d, nil
}

// noteDecision keeps the negative cache exact after a decision of the state key hash under the
// policy fp at cost, whose request was sent at sent (the cache's generation for the key then:
// gen): a refusal is remembered, an approval that consumed forgets a refusal (its numbers are
// stale).
func (s *Store) noteDecision(hash string, fp fingerprint, cost, sent int64, gen uint64, d *sluice.Decision) {
	if s.refused == nil {
		return
	}
	if !d.Allowed {
		s.refused.remember(hash, fp, cost, sent, gen, *d)
	} else if cost > 0 {
		s.refused.forget(hash)
	}
}

// slot is the key's hash slot on a cluster, 0 on a single server (the offsets' index).
func (c *conn) slot(key string) uint16 {
	if !c.cluster {
		return 0
	}
	return slot(key)
}

// DecideAll implements sluice.Store with one script when it can: on a single server, and on a
// cluster when every limit's key lies in one slot (those of one client always do). Limits under
// keys in several slots of a cluster are decided across them (acrossSlots).
func (s *Store) DecideAll(ctx context.Context, key string, limits []sluice.Limit, out []sluice.Decision) (bool, error) {
	if len(out) != len(limits) {
		return false, fmt.Errorf("redis store: DecideAll: %d decisions for %d limits", len(out), len(limits))
	}
	if len(limits) == 1 && limits[0].Policy.Algorithm != sluice.Concurrency && (limits[0].Policy.Algorithm != sluice.LeakyBucket || limits[0].MaxDelay == 0) {
		// One limit is one decision: Decide's path, with the negative cache and batching (the
		// gateway asks DecideAll for every request, most of which have one policy). A leaky
		// bucket with a bound on its hold goes to the multi script, which takes the bound.
		d, err := s.Decide(ctx, limits[0].EffectiveKey(key), limits[0].Policy, limits[0].Cost)
		out[0] = d
		return err == nil && (d.Allowed || limits[0].DryRun), err
	}
	keys := make([]string, 0, 2*len(limits))
	for i := range limits {
		l := &limits[i]
		if err := s.check(&l.Policy, l.Cost, &out[i]); err != nil {
			return false, err
		}
		hash, log := s.keys(l.EffectiveKey(key), l.Policy.Name)
		keys = append(keys, hash, log)
	}
	c, err := s.connected()
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.hardTimeout(true)) // (each call waits less if Redis answers nothing: await)
	defer cancel()
	m := multiCall{s: s, c: c, now: s.now(), key: key, limits: limits, keys: keys, out: out}
	for i := range limits {
		if limits[i].Policy.Calendar != algorithm.NoCalendar {
			m.inst, m.calendar = s.instanceNow(), true
			break
		}
	}
	if c.cluster {
		if groups := slotGroups(limits, keys); len(groups) > 1 {
			return m.acrossSlots(ctx, groups)
		}
	}
	return m.exec(ctx, nil, false)
}

// multiCall is one DecideAll on the multi script: the call's key, its limits, their keys in
// Redis (two per limit, as the script takes them), the time argument of all its calls, and the
// decisions it fills.
type multiCall struct {
	s      *Store
	c      *conn
	now    string
	key    string
	limits []sluice.Limit
	keys   []string
	out    []sluice.Decision

	calendar bool  // some limit has a calendar: its windows are passed around inst (calendar.go)
	inst     int64 // the instance's time, µs, if calendar
}

// exec decides the limits at the indices in which (nil: all of them; on a cluster they must
// share a slot) with one call through the executor — the multi script, or the conc script if
// they include concurrency limits (concurrency.go) —, fills their decisions, and reports
// whether every enforced one allowed. check: decide without writing (the scripts' 'check').
func (m *multiCall) exec(ctx context.Context, which []int, check bool) (bool, error) {
	j := &multiJob{m: m, check: check}
	each := func(i int) error {
		l := &m.limits[i]
		if l.Policy.Algorithm != sluice.Concurrency {
			j.rate = append(j.rate, i)
			return nil
		}
		if l.Lease == 0 && l.Cost > 0 {
			m.out[i] = algorithm.MakeDecision(false, l.Policy.Limit, 0, -1, 0, 0)
			return fmt.Errorf("%w: policy %q: the limit has no Lease", sluice.ErrNoLease, l.Policy.Name)
		}
		j.conc = append(j.conc, i)
		return nil
	}
	if which == nil {
		for i := range m.limits {
			if err := each(i); err != nil {
				return false, err
			}
		}
	} else {
		for _, i := range which {
			if err := each(i); err != nil {
				return false, err
			}
		}
	}
	keys := make([]string, 0, 2*len(j.rate)+len(j.conc))
	for _, i := range j.rate {
		keys = append(keys, m.keys[2*i], m.keys[2*i+1])
	}
	p := m.s.multi
	if len(j.conc) > 0 {
		p = concProgram
		for _, i := range j.conc {
			keys = append(keys, m.s.slotsKey(m.limits[i].EffectiveKey(m.key), m.limits[i].Policy.Name))
		}
	}
	j.order = append(j.rate[:len(j.rate):len(j.rate)], j.conc...)
	consumes := false
	for _, i := range j.order {
		consumes = consumes || (m.limits[i].Cost > 0 && !check)
	}
	deadline, _ := ctx.Deadline()
	n := len(j.order)
	r := request{p: p, keys: keys, want: 6*n + 1, calendar: m.calendar, inst: m.inst, consumes: consumes, decides: true, by: deadline}
	reply, err := m.s.run(ctx, m.c, &r, j)
	if err != nil {
		return false, err
	}
	all := true
	for k, i := range j.order {
		m.out[i] = decisionOf(reply[6*k:6*k+6], reply[6*n])
		if m.limits[i].Policy.Algorithm == sluice.Concurrency {
			m.out[i].At = 0 // (a slot is released, not settled)
		}
		all = all && (m.out[i].Allowed || m.limits[i].DryRun)
	}
	if all && !check && m.s.refused != nil {
		for _, i := range j.rate { // written: a cached refusal's numbers are stale (as after Decide's approvals)
			if m.out[i].Allowed && m.limits[i].Cost > 0 {
				m.s.refused.forget(m.keys[2*i])
			}
		}
	}
	return all, nil
}

// multiJob is the executor's job for one call of the multi or conc script: the limits at rate
// (rate limits) and conc (concurrency limits), whose decisions the reply gives in order.
type multiJob struct {
	m          *multiCall
	rate, conc []int
	order      []int // rate, then conc
	check      bool
	argv       []string
}

// arguments implements job: multi.lua's ARGV, or conc.lua's if there are concurrency limits.
func (j *multiJob) arguments(f *frame) ([]string, error) {
	m := j.m
	bit := func(b bool) string {
		if b {
			return "1"
		}
		return "0"
	}
	j.argv = append(j.argv[:0], strconv.Itoa(len(j.rate)), m.now, m.s.slack)
	for _, i := range j.rate {
		l := &m.limits[i]
		period, err := periodArg(&l.Policy, f.inst) // a calendar's windows (calendar.go)
		if err != nil {
			return nil, err
		}
		j.argv = append(j.argv, strconv.Itoa(int(l.Policy.Algorithm)), strconv.FormatInt(l.Policy.Limit, 10),
			period, strconv.FormatInt(l.Policy.Burst, 10), strconv.FormatInt(l.Cost, 10),
			strconv.FormatInt(l.MaxDelayMicros(), 10), bit(l.DryRun))
	}
	if len(j.conc) > 0 {
		j.argv = append(j.argv, strconv.Itoa(len(j.conc)))
		for _, i := range j.conc {
			l := &m.limits[i]
			j.argv = append(j.argv, strconv.FormatInt(l.Policy.Limit, 10), strconv.FormatInt(l.Policy.PeriodMicros(), 10),
				strconv.FormatInt(l.Cost, 10), bit(l.DryRun), leaseArg(l.Lease))
		}
	}
	if j.check {
		j.argv = append(j.argv, "check")
	}
	return append(j.argv, f.deadline(f.by)), nil
}

// consumed: the scripts write only if every enforced limit allows; then those that allowed.
func (j *multiJob) consumed(reply []int64) bool {
	if j.check {
		return false
	}
	wrote := false
	for k, i := range j.order {
		if len(reply) < 6*k+1 {
			return false
		}
		l := &j.m.limits[i]
		if reply[6*k] != 1 && !l.DryRun {
			return false
		}
		wrote = wrote || (reply[6*k] == 1 && l.Cost > 0)
	}
	return wrote
}

func (j *multiJob) giveBack(reply []int64) []refund {
	var rs []refund
	for k, i := range j.order {
		if l := &j.m.limits[i]; reply[6*k] == 1 && l.Cost > 0 {
			rs = append(rs, refund{key: l.EffectiveKey(j.m.key), p: l.Policy, at: reply[len(reply)-1], cost: l.Cost, lease: l.Lease})
		}
	}
	return rs
}

// slotGroup is the limits of a DecideAll whose keys lie in one slot of a cluster.
type slotGroup struct {
	slot     uint16
	limits   []int // indices into the call's limits
	enforced bool  // some limit of the group is not DryRun
}

// slotGroups returns the limits grouped by their keys' slot, in the order of their first limits.
func slotGroups(limits []sluice.Limit, keys []string) []slotGroup {
	var groups []slotGroup
next:
	for i := range limits {
		sl := slot(keys[2*i])
		for g := range groups {
			if groups[g].slot == sl {
				groups[g].limits = append(groups[g].limits, i)
				groups[g].enforced = groups[g].enforced || !limits[i].DryRun
				continue next
			}
		}
		groups = append(groups, slotGroup{slot: sl, limits: []int{i}, enforced: !limits[i].DryRun})
	}
	return groups
}

// acrossSlots decides limits whose keys lie in several slots of a cluster. One script cannot
// touch several slots, so this is not one atomic step; it is as close as two phases get:
//
//  1. If more than one slot holds enforced limits, every slot's limits are decided without
//     writing (a check per slot, in parallel). A refusal there is the answer, and nothing has
//     been written anywhere.
//  2. The slots with enforced limits are committed one after another, the one with the least
//     quota left after the check first (where a concurrent request is likeliest to have taken
//     the rest meanwhile). Each commit decides its limits again, atomically in its slot, and
//     writes only if all of them still allow; the first that refuses ends the call, refused,
//     and nothing after it is written. Then the slots of dry-run limits only (which refuse
//     nothing) are committed, in parallel.
//
// So no limit ever approves beyond itself, and a request refused by the state it found consumes
// nothing. What is not atomic: a commit that refuses because a concurrent request spent its
// slot's quota after the check leaves the slots committed before it consumed, though the
// request is refused; and a commit call that fails (a timeout, a node lost) fails the call with
// ErrStoreUnavailable, leaving the slots committed before it consumed (a call that reached Redis
// after its deadline wrote nothing). Each slot's limits are decided at one instant of its node's
// clock; the decisions filled are the commits' where they ran, else the checks'.
func (m *multiCall) acrossSlots(ctx context.Context, groups []slotGroup) (bool, error) {
	var every, enforced, dry []*slotGroup
	for g := range groups {
		every = append(every, &groups[g])
		if groups[g].enforced {
			enforced = append(enforced, &groups[g])
		} else {
			dry = append(dry, &groups[g])
		}
	}
	if len(enforced) > 1 {
		if all, err := m.parallel(ctx, every, true); err != nil || !all {
			return false, err
		}
		// The least quota left first: the least Remaining among a group's enforced limits.
		headroom := func(g *slotGroup) int64 {
			least := int64(1<<63 - 1)
			for _, i := range g.limits {
				if !m.limits[i].DryRun {
					least = min(least, m.out[i].Remaining)
				}
			}
			return least
		}
		slices.SortStableFunc(enforced, func(a, b *slotGroup) int { return cmp.Compare(headroom(a), headroom(b)) })
		if m.s.betweenPhases != nil {
			m.s.betweenPhases()
		}
	}
	for _, g := range enforced {
		all, err := m.exec(ctx, g.limits, false)
		if err != nil {
			return false, err
		}
		if !all {
			if len(enforced) == 1 && len(dry) > 0 {
				// No check ran: the dry-run limits' decisions, writing nothing.
				if _, err := m.parallel(ctx, dry, true); err != nil {
					return false, err
				}
			}
			return false, nil
		}
	}
	if len(dry) == 0 {
		return true, nil
	}
	_, err := m.parallel(ctx, dry, false)
	return err == nil, err
}

// parallel runs the multi script on each of groups at once, and reports whether every enforced
// limit allowed; the error is the first failed group's.
func (m *multiCall) parallel(ctx context.Context, groups []*slotGroup, check bool) (bool, error) {
	if len(groups) == 1 {
		return m.exec(ctx, groups[0].limits, check)
	}
	alls, errs := make([]bool, len(groups)), make([]error, len(groups))
	var wg sync.WaitGroup
	for g := range groups {
		wg.Go(func() { alls[g], errs[g] = m.exec(ctx, groups[g].limits, check) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return false, err
		}
	}
	return !slices.Contains(alls, false), nil
}

// multiArgs is how many arguments multi.lua takes per limit: alg, limit, period, burst, cost,
// max_delay (µs; -1: no bound) and dry_run (0/1).
const multiArgs = 7

func unavailable(err error) error {
	return fmt.Errorf("%w: redis store: %v", sluice.ErrStoreUnavailable, err)
}

var _ sluice.Store = (*Store)(nil)

// Ping reports whether Redis answers within the store's SlowTimeout (readiness checks): a PING
// that timed out sooner could break the connection it shares with decisions on a busy machine.
func (s *Store) Ping(ctx context.Context) error {
	c, err := s.connected()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.slow)
	defer cancel()
	if err := c.client.Do(ctx, c.client.B().Ping().Build()).Error(); err != nil {
		return unavailable(err)
	}
	return nil
}

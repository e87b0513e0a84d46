package redis

// The instance registry: each gateway instance on one Redis heartbeats into its fleet's sorted
// set (prefix + "instances" for the default fleet, prefix + "fleet:<name>:instances" for another:
// FleetOptions.Name), so that every instance knows how many of its fleet share the Redis — and
// so, while Redis is down, which share of each policy it may decide on alone (sluice.WithFleetFallback:
// 1/n of the limit, n the fleet's size, Fleet.Size). Each heartbeat also carries the instance's
// approvals per client (FleetOptions.Counts) into a hash beside the set, and reads every listed
// instance's back: each instance's share of a client's approvals, which shows instances that do
// not count together (the diagnosis's separate_counters).
//
// THE FLEET'S SIZE ONLY SHRINKS ONCE THE REGISTRY IS WHOLE. A registry that has just begun — a
// Redis restarted empty, a failover to a replica that had not got it — counts only the instances
// that have heartbeat into it so far: the first sees itself alone. Were that count the size, the
// instances' shares would add up to more than the policy (two instances, the first to heartbeat
// after a restart taking all of it, the other half: 1.5 times the limit if Redis fails again
// then; with k instances up to Σ 1/i). So a count above the size is taken at once (the share
// shrinks: always safe), and one below it only once the registry has been kept by this Redis,
// without a break, for a whole TTL (the script says since when: fleet.lua's KEYS[3]): by then
// every live instance has heartbeat into it, so the count misses only instances that are gone.
// An instance that left cleanly, or died a TTL ago, on a registry that is whole, is dropped at
// the next heartbeat; after a Redis restart, the size waits a TTL to shrink.

import (
	"cmp"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

//go:embed fleet.lua
var fleetLua string

// Defaults of the registry.
const (
	DefaultFleetName     = "default"
	DefaultFleetInterval = 2 * time.Second  // between heartbeats
	DefaultFleetTTL      = 10 * time.Second // an instance not heard from for this long is gone
	// FleetListed is how many live instances a heartbeat lists (the most recently heard from
	// first); the count is of all of them.
	FleetListed = 64
	// MaxFleetID bounds an instance id's length.
	MaxFleetID = 128
	// MaxFleetCounts is how many counts (client and policy) one heartbeat carries at most: those
	// with the most approvals (then by name); the others are dropped and counted as dropped.
	MaxFleetCounts = 64
)

// FleetOptions configures an instance's entry in the registry.
type FleetOptions struct {
	// Name names the fleet: the instances that count each other, each fleet in a registry of its
	// own on the Redis (two gateways sharing a Redis but not a configuration are two fleets, and
	// neither counts the other's instances). 1 to MaxFleetID of A-Z, a-z, 0-9, '.', '_' and '-'.
	// Default (and DefaultFleetName): the registry's keys of before fleets had names, prefix +
	// "instances"; any other name's is prefix + "fleet:" + Name + ":instances".
	Name string
	// ID names this instance in the registry (and on the operator page): 1 to MaxFleetID
	// printable ASCII characters, no spaces. Default: hostname-pid-random, unique per process.
	// Never put a secret in it: every instance, and anyone reading Redis, sees it.
	ID string
	// Interval between heartbeats; default DefaultFleetInterval.
	Interval time.Duration
	// TTL after which an instance not heard from is gone; default DefaultFleetTTL. It must be
	// more than Interval (twice is the least sensible: one lost heartbeat must not drop an
	// instance). Every instance removes the members it finds expired by its own TTL, so a fleet's
	// instances should share one TTL.
	TTL time.Duration
	// Counts, if set, is called at every heartbeat for what it carries: this instance's
	// approvals (MaxFleetCounts at most; a count whose client or policy is not 1 to MaxFleetID
	// printable ASCII characters without spaces is dropped). It runs on the heartbeat's goroutine
	// and must be quick. Never put a secret in a name: every instance, and anyone reading Redis,
	// sees them.
	Counts func() []FleetCount
	// LogShare: the count is the local fallback's share (sluice.WithFleetFallback), which the
	// log then says, 1/n, with each new count.
	LogShare bool
}

// FleetCount is one instance's approvals of one client under one policy, in the policy's
// windows (epoch-aligned, of its period, by the instance's clock), as of a heartbeat.
type FleetCount struct {
	Client, Policy string
	Period         time.Duration // the policy's period (≥ 1 µs)
	// Window is the number of the window the heartbeat fell in: unix µs / period.
	Window int64
	// Current and Previous are the cost approved in Window and in Window-1.
	Current, Previous int64
	// Allowed is the most one shared counter approves in one window of this policy, as the
	// instance's configuration has it (0: not known).
	Allowed int64
}

// FleetInstance is one live instance as the registry lists it.
type FleetInstance struct {
	ID       string
	LastSeen time.Time // its last heartbeat, by Redis's clock (the store's Clock if set)
	// Counts is what its last heartbeat carried (FleetOptions.Counts; none if it sent none, or
	// runs a version that sends none), and Dropped how many counts it left out over the cap.
	Counts  []FleetCount
	Dropped int
}

// FleetView is the registry as this instance last read it.
type FleetView struct {
	Self      string          // this instance's id
	Count     int             // live instances at the last heartbeat that reached Redis; 0 if none has
	Size      int             // the fleet's size (Fleet.Size) after that heartbeat: Count, or more while the registry is not whole
	Since     time.Time       // when Redis's registry began (empty) as that heartbeat read it; zero if not known
	Instances []FleetInstance // up to FleetListed of them, the most recently heard from first
	At        time.Time       // when that heartbeat was answered (Redis's clock); zero if none has
	Err       string          // why the last heartbeat failed; "" if it reached Redis
}

// Fleet is this instance's entry in the registry. Create it with Store.Fleet, run its heartbeats
// with Start (or call Beat yourself), and Close it before the store.
type Fleet struct {
	s             *Store
	name, id, key string
	shares        string // the hash of the instances' counts; "" if none can share the registry's slot
	since         string // when the registry began (fleet.lua's KEYS[3]); "" with shares
	interval, ttl time.Duration
	script        *rueidis.Lua
	counts        func() []FleetCount
	logShare      bool

	count atomic.Int64 // the fleet's size (adopt); 0: no heartbeat has reached Redis yet
	view  atomic.Pointer[FleetView]

	stop      chan struct{}
	done      chan struct{} // closed when the heartbeats have ended; nil if Start never ran
	startOnce sync.Once
	closeOnce sync.Once
}

// Fleet returns this instance's entry in the registry of the store's Redis, under the store's
// prefix. It sends nothing until Start or Beat. The registry is bounded: every heartbeat removes
// the instances not heard from for a TTL, and the set itself expires a TTL after the last one.
func (s *Store) Fleet(opts FleetOptions) (*Fleet, error) {
	if opts.Interval == 0 {
		opts.Interval = DefaultFleetInterval
	}
	if opts.TTL == 0 {
		opts.TTL = DefaultFleetTTL
	}
	if opts.Interval < 0 || opts.TTL <= opts.Interval {
		return nil, fmt.Errorf("redis store: fleet: TTL %v must be more than the heartbeat interval %v (and both > 0)", opts.TTL, opts.Interval)
	}
	if opts.ID == "" {
		opts.ID = defaultFleetID()
	} else if err := checkFleetID(opts.ID); err != nil {
		return nil, err
	}
	key, err := fleetKey(s.prefix, opts.Name)
	if err != nil {
		return nil, err
	}
	f := &Fleet{s: s, name: cmp.Or(opts.Name, DefaultFleetName), id: opts.ID, key: key, interval: opts.Interval, ttl: opts.TTL,
		script: rueidis.NewLuaScript(fleetLua), stop: make(chan struct{}), counts: opts.Counts, logShare: opts.LogShare}
	f.shares = sharesKey(s.prefix, f.key, ":shares")
	f.since = sharesKey(s.prefix, f.key, ":since")
	f.view.Store(&FleetView{Self: f.id})
	return f, nil
}

// fleetKey is the registry's key of the fleet name under prefix: the default name's is that of
// before fleets had names (prefix + "instances"), so that a rolling upgrade of one fleet does not
// split it; another's holds the name between "fleet:" and ":instances". A name cannot hold a ':',
// so no two names' keys (nor the keys beside them, which end in :shares or :since) are one.
func fleetKey(prefix, name string) (string, error) {
	if name == "" || name == DefaultFleetName {
		return prefix + "instances", nil
	}
	if len(name) > MaxFleetID {
		return "", fmt.Errorf("redis store: fleet: name of %d bytes; at most %d", len(name), MaxFleetID)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return "", fmt.Errorf("redis store: fleet: name %q: byte %d is not one of A-Z, a-z, 0-9, '.', '_' and '-'", name, i)
		}
	}
	return prefix + "fleet:" + name + ":instances", nil
}

// sharesKey is the name of a key beside the registry, ending in suffix (":shares", the hash of the
// instances' counts; ":since", when the registry began): under the prefix (so that the ACL's key
// pattern grants it), in the registry's slot (one script touches them all, on a Redis Cluster
// too) — the registry's own hash tag if its name has one, else the registry's whole name as the
// tag: rate-limit:{rate-limit:instances}:shares. ("" for a prefix with a '}' and no hash tag,
// whose registry no such name shares a slot with: the heartbeats then carry no counts, and do not
// know when the registry began, so a lower count is taken at once.) State keys end in :v2, :log
// or :slots, so no client's key is such a name.
func sharesKey(prefix, registry, suffix string) string {
	for _, k := range []string{registry + suffix, prefix + "{" + registry + "}" + suffix} {
		if slot(k) == slot(registry) {
			return k
		}
	}
	return ""
}

// checkFleetID refuses an id that is empty, too long, or not printable ASCII without spaces.
func checkFleetID(id string) error {
	if len(id) > MaxFleetID {
		return fmt.Errorf("redis store: fleet: instance id of %d bytes; at most %d", len(id), MaxFleetID)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("redis store: fleet: instance id %q: byte %d is not printable ASCII (spaces neither)", id, i)
		}
	}
	return nil
}

// defaultFleetID is hostname-pid-random: the pid and host tell an operator which process it is,
// the random part keeps two processes that share both (containers) apart.
func defaultFleetID() string {
	host, err := os.Hostname()
	if err != nil || checkFleetID(host) != nil || host == "" {
		host = "sluice"
	}
	var r [4]byte
	_, _ = rand.Read(r[:])
	id := fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(r[:]))
	if len(id) > MaxFleetID {
		id = id[len(id)-MaxFleetID:]
	}
	return id
}

// ID is this instance's id in the registry.
func (f *Fleet) ID() string { return f.id }

// Name is the fleet's name (FleetOptions.Name, DefaultFleetName if it had none).
func (f *Fleet) Name() string { return f.name }

// Size is the number of instances sharing the Redis, as the local fallback's share takes it
// (sluice.WithFleetFallback: 1/Size): the live count of the heartbeats that reached it, which
// grows at once and shrinks only once the registry is whole (see THE FLEET'S SIZE above), and 1
// until one has (an instance that never saw Redis cannot know of others). It is one atomic load:
// sluice.WithFleetFallback calls it for every decision of the fallback.
func (f *Fleet) Size() int { return int(max(1, f.count.Load())) }

// adopt takes n, the live count of a heartbeat, as the fleet's size if it may: a larger one at
// once, a smaller one only if the registry has been kept whole for a TTL (age: how long Redis has
// kept it without a break; known: whether the script could say). It returns the size.
func (f *Fleet) adopt(n int64, age time.Duration, known bool) int64 {
	for {
		cur := f.count.Load()
		if n < cur && known && age < f.ttl {
			return cur // the registry may not hold every live instance yet
		}
		if f.count.CompareAndSwap(cur, n) {
			return n
		}
	}
}

// View returns the registry as this instance last read it.
func (f *Fleet) View() FleetView {
	v := *f.view.Load()
	v.Instances = append([]FleetInstance(nil), v.Instances...)
	return v
}

// Start runs the heartbeats in the background, the first at once, then every interval, until
// Close. While Redis does not answer they fail and the last count seen stays. Calling it more
// than once does nothing more.
func (f *Fleet) Start() {
	f.startOnce.Do(func() {
		f.done = make(chan struct{})
		go f.run()
	})
}

func (f *Fleet) run() {
	defer close(f.done)
	t := time.NewTicker(f.interval)
	defer t.Stop()
	failing := false
	for {
		last := f.count.Load()
		ctx, cancel := context.WithTimeout(context.Background(), f.beatTimeout())
		err := f.Beat(ctx)
		cancel()
		switch {
		case err != nil && !failing:
			f.s.log.Warn("fleet: a heartbeat failed (Redis down, or an ACL without the registry's commands); no decision depends on it, and the last count seen stays",
				"fleet", f.name, "instance", f.id, "instances", f.Size(), "error", err.Error())
		case err == nil && (failing || f.count.Load() != last):
			n := f.count.Load()
			args := []any{"fleet", f.name, "instance", f.id, "instances", n}
			if f.logShare {
				args = append(args, "local_share", "1/"+strconv.FormatInt(n, 10))
			}
			f.s.log.Info("fleet: live instances of this fleet on this Redis", args...)
		}
		failing = err != nil
		select {
		case <-f.stop:
			return
		case <-t.C:
		}
	}
}

// beatTimeout bounds one heartbeat: not the decisions' tight timeout (a slow heartbeat harms
// nothing), but within the interval.
func (f *Fleet) beatTimeout() time.Duration { return min(f.interval, max(f.s.timeout, time.Second)) }

// Beat sends one heartbeat: it registers (or refreshes) this instance with its counts, removes
// the instances not heard from for a TTL (and their counts), and reads the live count and
// instances with theirs. A failure (Redis down) leaves the last count seen, and says why in View.
func (f *Fleet) Beat(ctx context.Context) error { return f.call(ctx, "beat") }

// Close stops the heartbeats and removes this instance from the registry (if Redis answers
// within a second), so that the others count one fewer at once instead of a TTL later. Close it
// before the store. It may be called more than once.
func (f *Fleet) Close() {
	f.closeOnce.Do(func() {
		close(f.stop)
		if f.done != nil {
			<-f.done
		}
		ctx, cancel := context.WithTimeout(context.Background(), f.beatTimeout())
		defer cancel()
		_ = f.call(ctx, "leave")
	})
}

func (f *Fleet) call(ctx context.Context, op string) error {
	err := f.exec(ctx, op)
	if err != nil {
		v := *f.view.Load()
		v.Err = err.Error()
		f.view.Store(&v)
	}
	return err
}

func (f *Fleet) exec(ctx context.Context, op string) error {
	c, err := f.s.connected()
	if err != nil {
		return err
	}
	report := ""
	if op == "beat" && f.counts != nil {
		report = encodeCounts(f.counts())
	}
	args := []string{f.id, strconv.FormatInt(int64(f.ttl/time.Microsecond), 10), f.s.now(), op,
		strconv.Itoa(FleetListed), f.s.slack, report}
	keys := []string{f.key}
	if f.shares != "" && f.since != "" {
		keys = append(keys, f.shares, f.since)
	}
	reply, err := f.script.Exec(ctx, c.client, keys, args).ToArray()
	if err != nil {
		return unavailable(err)
	}
	if len(reply) != 5 {
		return fmt.Errorf("redis store: fleet script replied %d values, want 5", len(reply))
	}
	reports, _ := reply[3].ToArray() // (an empty array without counts)
	nowStr, err1 := reply[0].ToString()
	n, err2 := reply[1].AsInt64()
	listed, err3 := reply[2].AsStrSlice()
	now, err4 := strconv.ParseInt(nowStr, 10, 64)
	if err := errors.Join(err1, err2, err3, err4); err != nil || len(listed)%2 != 0 {
		return fmt.Errorf("redis store: fleet script's reply: %v", err)
	}
	v := &FleetView{Self: f.id, Count: int(n), At: time.UnixMicro(now).UTC()}
	began, err := reply[4].ToString()
	known := err == nil && began != "" // (else: a prefix without the key)
	if known {
		us, err := strconv.ParseInt(began, 10, 64)
		if err != nil {
			return fmt.Errorf("redis store: fleet: began %q: %v", began, err)
		}
		v.Since = time.UnixMicro(us).UTC()
	}
	for i := 0; i < len(listed); i += 2 {
		us, err := strconv.ParseFloat(listed[i+1], 64)
		if err != nil {
			return fmt.Errorf("redis store: fleet: score %q: %v", listed[i+1], err)
		}
		in := FleetInstance{ID: listed[i], LastSeen: time.UnixMicro(int64(us)).UTC()}
		if j := i / 2; j < len(reports) {
			if r, err := reports[j].ToString(); err == nil { // (nil: it sent none)
				in.Counts, in.Dropped = decodeCounts(r)
			}
		}
		v.Instances = append(v.Instances, in)
	}
	v.Size = int(max(1, f.count.Load()))
	if op == "beat" { // (a leave's count no longer includes this instance, which still serves)
		v.Size = int(max(1, f.adopt(n, time.UnixMicro(now).Sub(v.Since), known)))
	}
	f.view.Store(v)
	return nil
}

// A report is "v1 <dropped>" and then one line per count: "<client> <policy> <period µs>
// <window> <current> <previous> <allowed>". Names are printable ASCII without spaces.
const countsVersion = "v1"

// encodeCounts is the report of counts: the MaxFleetCounts with the most approvals (then by
// client and policy), those with a name that cannot be written or with nothing approved left
// out; "" if nothing is left to say.
func encodeCounts(counts []FleetCount) string {
	kept := make([]FleetCount, 0, len(counts))
	dropped := 0
	for _, c := range counts {
		switch {
		case c.Current <= 0 && c.Previous <= 0:
		case checkFleetID(c.Client) != nil || checkFleetID(c.Policy) != nil || c.Client == "" || c.Policy == "" ||
			c.Period < time.Microsecond || c.Current < 0 || c.Previous < 0 || c.Allowed < 0:
			dropped++
		default:
			kept = append(kept, c)
		}
	}
	slices.SortFunc(kept, func(a, b FleetCount) int {
		if d := cmp.Compare(b.Current+b.Previous, a.Current+a.Previous); d != 0 {
			return d
		}
		return cmp.Or(cmp.Compare(a.Client, b.Client), cmp.Compare(a.Policy, b.Policy))
	})
	if len(kept) > MaxFleetCounts {
		dropped += len(kept) - MaxFleetCounts
		kept = kept[:MaxFleetCounts]
	}
	if len(kept) == 0 && dropped == 0 {
		return "" // (nothing to carry: the instance's field goes)
	}
	var b strings.Builder
	b.WriteString(countsVersion + " " + strconv.Itoa(dropped))
	for _, c := range kept {
		fmt.Fprintf(&b, "\n%s %s %d %d %d %d %d", c.Client, c.Policy, c.Period.Microseconds(), c.Window, c.Current, c.Previous, c.Allowed)
	}
	return b.String()
}

// decodeCounts reads a report; what it cannot read (another version's) it leaves out.
func decodeCounts(r string) ([]FleetCount, int) {
	lines := strings.Split(r, "\n")
	head := strings.Fields(lines[0])
	if len(head) != 2 || head[0] != countsVersion {
		return nil, 0
	}
	dropped, _ := strconv.Atoi(head[1])
	var out []FleetCount
	for _, l := range lines[1:min(len(lines), MaxFleetCounts+1)] {
		f := strings.Fields(l)
		if len(f) != 7 {
			continue
		}
		var n [5]int64
		ok := true
		for i := range n {
			var err error
			n[i], err = strconv.ParseInt(f[2+i], 10, 64)
			ok = ok && err == nil && (i == 1 || n[i] >= 0)
		}
		if !ok || n[0] <= 0 {
			continue
		}
		out = append(out, FleetCount{Client: f[0], Policy: f[1], Period: time.Duration(n[0]) * time.Microsecond, Window: n[1],
			Current: n[2], Previous: n[3], Allowed: n[4]})
	}
	return out, dropped
}

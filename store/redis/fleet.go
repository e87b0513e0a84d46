package redis

// The instance registry: each gateway instance on one Redis heartbeats into one sorted set
// (prefix + "instances"), so that every instance knows how many share the Redis — and so, while
// Redis is down, which share of each policy it may decide on alone (sluice.WithFleetFallback:
// 1/n of the limit, n the last live count seen).

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

//go:embed fleet.lua
var fleetLua string

// Defaults of the registry.
const (
	DefaultFleetInterval = 2 * time.Second  // between heartbeats
	DefaultFleetTTL      = 10 * time.Second // an instance not heard from for this long is gone
	// FleetListed is how many live instances a heartbeat lists (the most recently heard from
	// first); the count is of all of them.
	FleetListed = 64
	// MaxFleetID bounds an instance id's length.
	MaxFleetID = 128
)

// FleetOptions configures an instance's entry in the registry.
type FleetOptions struct {
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
}

// FleetInstance is one live instance as the registry lists it.
type FleetInstance struct {
	ID       string
	LastSeen time.Time // its last heartbeat, by Redis's clock (the store's Clock if set)
}

// FleetView is the registry as this instance last read it.
type FleetView struct {
	Self      string          // this instance's id
	Count     int             // live instances at the last heartbeat that reached Redis; 0 if none has
	Instances []FleetInstance // up to FleetListed of them, the most recently heard from first
	At        time.Time       // when that heartbeat was answered (Redis's clock); zero if none has
	Err       string          // why the last heartbeat failed; "" if it reached Redis
}

// Fleet is this instance's entry in the registry. Create it with Store.Fleet, run its heartbeats
// with Start (or call Beat yourself), and Close it before the store.
type Fleet struct {
	s             *Store
	id, key       string
	interval, ttl time.Duration
	script        *rueidis.Lua

	count atomic.Int64 // the last live count seen; 0: none yet
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
	f := &Fleet{s: s, id: opts.ID, key: s.prefix + "instances", interval: opts.Interval, ttl: opts.TTL,
		script: rueidis.NewLuaScript(fleetLua), stop: make(chan struct{})}
	f.view.Store(&FleetView{Self: f.id})
	return f, nil
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

// Size is the number of instances sharing the Redis: the live count of the last heartbeat that
// reached it, and 1 until one has (an instance that never saw Redis cannot know of others). It
// is one atomic load: sluice.WithFleetFallback calls it for every decision of the fallback.
func (f *Fleet) Size() int { return int(max(1, f.count.Load())) }

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
			f.s.log.Warn("fleet: a heartbeat failed (Redis down, or an ACL without the registry's commands); the local fallback keeps the last count seen",
				"instance", f.id, "instances", f.Size(), "error", err.Error())
		case err == nil && (failing || f.count.Load() != last):
			n := f.count.Load()
			f.s.log.Info("fleet: live instances on this Redis", "instance", f.id, "instances", n, "local_share", "1/"+strconv.FormatInt(n, 10))
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

// Beat sends one heartbeat: it registers (or refreshes) this instance, removes the instances not
// heard from for a TTL, and reads the live count and instances. A failure (Redis down) leaves
// the last count seen, and says why in View.
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
	args := []string{f.id, strconv.FormatInt(int64(f.ttl/time.Microsecond), 10), f.s.now(), op,
		strconv.Itoa(FleetListed), f.s.slack}
	reply, err := f.script.Exec(ctx, c.client, []string{f.key}, args).ToArray()
	if err != nil {
		return unavailable(err)
	}
	if len(reply) != 3 {
		return fmt.Errorf("redis store: fleet script replied %d values, want 3", len(reply))
	}
	nowStr, err1 := reply[0].ToString()
	n, err2 := reply[1].AsInt64()
	listed, err3 := reply[2].AsStrSlice()
	now, err4 := strconv.ParseInt(nowStr, 10, 64)
	if err := errors.Join(err1, err2, err3, err4); err != nil || len(listed)%2 != 0 {
		return fmt.Errorf("redis store: fleet script's reply: %v", err)
	}
	v := &FleetView{Self: f.id, Count: int(n), At: time.UnixMicro(now).UTC()}
	for i := 0; i < len(listed); i += 2 {
		us, err := strconv.ParseFloat(listed[i+1], 64)
		if err != nil {
			return fmt.Errorf("redis store: fleet: score %q: %v", listed[i+1], err)
		}
		v.Instances = append(v.Instances, FleetInstance{ID: listed[i], LastSeen: time.UnixMicro(int64(us)).UTC()})
	}
	if op == "beat" { // (a leave's count no longer includes this instance, which still serves)
		f.count.Store(n)
	}
	f.view.Store(v)
	return nil
}

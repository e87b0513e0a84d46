package redis

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithm"
)

// TestLuaDeadline: a script that runs after its deadline (µs of Redis TIME) decides nothing and
// writes nothing — single, multi, and each decision of a batch on its own — and says so with an
// error carrying Redis's time; before it, the script decides as without one. The deadline is
// always on Redis's clock, also when the caller passes now.
func TestLuaDeadline(t *testing.T) {
	e := newLuaEnv(t)
	ctx := context.Background()
	redisNow := func() int64 {
		ts, err := e.c.Do(ctx, e.c.B().Time().Build()).AsStrSlice()
		if err != nil {
			t.Fatal(err)
		}
		us, err := parseTime(ts)
		if err != nil {
			t.Fatal(err)
		}
		return us
	}
	exists := func(keys ...string) int64 {
		n, err := e.c.Do(ctx, e.c.B().Exists().Key(keys...).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	fw := luaPolicy(algorithm.FixedWindow, 5, 60_000_000, 0)
	single := func(key, now, deadline string) ([]int64, error) {
		args := append(luaArgs(&fw, 1), now, "0", deadline)
		return e.single[fw.Algorithm].Exec(ctx, e.c, []string{key, key + ":log"}, args).AsIntSlice()
	}

	// Past: an error naming Redis's time, nothing written.
	for _, now := range []string{"", "1800000000000000"} {
		before := redisNow()
		_, err := single("rate-limit:{late}:p", now, i64(before-1))
		after := redisNow()
		got, ok := deadlinePassed(err)
		if !ok || !strings.Contains(err.Error(), "sluice: deadline passed") || got < before || got > after {
			t.Fatalf("single, now %q, deadline passed: %v (time %d); want the deadline error with Redis TIME in [%d, %d]", now, err, got, before, after)
		}
		if n := exists("rate-limit:{late}:p", "rate-limit:{late}:p:log"); n != 0 {
			t.Fatalf("single after its deadline wrote %d keys", n)
		}
	}
	// Future: decided, the reply's time is Redis TIME.
	before := redisNow()
	got, err := single("rate-limit:{early}:p", "", i64(before+10_000_000))
	after := redisNow()
	if err != nil || len(got) != 7 || !slices.Equal(got[:3], []int64{1, 5, 4}) || got[6] < before || got[6] > after {
		t.Fatalf("single before its deadline: %v %v; want approved, time in [%d, %d]", got, err, before, after)
	}

	// Multi: the call's deadline is its last argument.
	keys := []string{"rate-limit:{multi-late}:a", "rate-limit:{multi-late}:a:log", "rate-limit:{multi-late}:b", "rate-limit:{multi-late}:b:log"}
	args := append(append(append([]string{"2", "", "0"}, luaMultiArgs(&fw, 1)...), luaMultiArgs(&fw, 1)...), i64(redisNow()-1))
	if _, ok := deadlinePassed(e.multi.Exec(ctx, e.c, keys, args).Error()); !ok {
		t.Fatal("multi after its deadline: no deadline error")
	}
	if n := exists(keys...); n != 0 {
		t.Fatalf("multi after its deadline wrote %d keys", n)
	}
	args[len(args)-1] = i64(redisNow() + 10_000_000)
	if got, err := e.multi.Exec(ctx, e.c, keys, args).AsIntSlice(); err != nil || len(got) != 13 || got[0] != 1 || got[6] != 1 {
		t.Fatalf("multi before its deadline: %v %v", got, err)
	}

	// Batch: three decisions on one key, the second late: it is skipped, the others decided in
	// order as if it were not there.
	batch := evalScript(batchScript())
	k := "rate-limit:{batch-late}:p"
	now := redisNow()
	bargs := []string{"3", "", "0"}
	var bkeys []string
	for range 3 {
		bkeys = append(bkeys, k, k+":log")
		bargs = append(bargs, luaArgs(&fw, 1)...)
	}
	bargs = append(bargs, i64(now+10_000_000), i64(now-1), "")
	got, err = batch(ctx, e, bkeys, bargs)
	if err != nil || len(got) != 19 {
		t.Fatalf("batch: %v %v", got, err)
	}
	if !slices.Equal(got[0:3], []int64{1, 5, 4}) || !slices.Equal(got[6:12], []int64{-1, 0, 0, 0, 0, 0}) || !slices.Equal(got[12:15], []int64{1, 5, 3}) {
		t.Fatalf("batch with the second decision late: %v; want approved (4 left), skipped, approved (3 left)", got)
	}
	if got[18] < now {
		t.Fatalf("batch's time %d, before Redis TIME %d", got[18], now)
	}
	// A wrong count of arguments is refused.
	if err := e.c.Do(ctx, e.c.B().Eval().Script(batchScript()).Numkeys(2).Key(k, k+":log").Arg(append([]string{"1", "", "0"}, luaArgs(&fw, 1)...)...).Build()).Error(); err == nil || !strings.Contains(err.Error(), "3+6n") {
		t.Fatalf("batch without its deadlines: %v", err)
	}
}

// evalScript returns a function that runs script on e's client (EVAL).
func evalScript(script string) func(context.Context, *luaEnv, []string, []string) ([]int64, error) {
	return func(ctx context.Context, e *luaEnv, keys, args []string) ([]int64, error) {
		return e.c.Do(ctx, e.c.B().Eval().Script(script).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()).AsIntSlice()
	}
}

// TestOffsetEstimate: the estimate of Redis's clock minus ours, from replies and from the floor.
func TestOffsetEstimate(t *testing.T) {
	const w = windowMicros
	margin := int64(deadlineMargin / time.Microsecond)
	o := newOffsets(true)
	if _, ok := o.estimate(7, 10*w); ok {
		t.Fatal("an estimate before any sample")
	}
	// Replies: the largest bound of the current and the previous window.
	o.learn(7, 1_000_500, 10*w+100) // bound 1_000_500 - (10w+100)
	o.learn(7, 1_000_900, 10*w+300) // a tighter one
	o.learn(7, 1_000_600, 10*w+400)
	b := int64(1_000_900 - (10*w + 300))
	if est, ok := o.estimate(7, 10*w+500); !ok || est != b-margin {
		t.Fatalf("estimate %d %v; want the largest bound %d less the margin", est, ok, b-margin)
	}
	if _, ok := o.estimate(8, 10*w+500); ok {
		t.Fatal("another slot got slot 7's estimate (each node has its own clock)")
	}
	if est, ok := o.estimate(7, 11*w+5); !ok || est != b-margin {
		t.Fatalf("in the next window: %d %v; want the previous window's bound still", est, ok)
	}
	o.learn(7, 2_000_000, 11*w+10) // a lower bound (a slow reply) in the next window
	b2 := int64(2_000_000 - (11*w + 10))
	if est, _ := o.estimate(7, 11*w+20); est != max(b, b2)-margin {
		t.Fatalf("two windows: %d; want %d", est, max(b, b2)-margin)
	}
	if est, _ := o.estimate(7, 12*w+20); est != b2-margin {
		t.Fatalf("a window later: %d; want only the last window's bound %d", est, b2-margin)
	}
	if _, ok := o.estimate(7, 13*w+20); ok {
		t.Fatal("samples older than two windows still count (a clock stepped backward would stay unsafe)")
	}
	// The floor counts everywhere, less the drift since it was measured.
	o.floor.Store(500)
	o.floorAt.Store(20 * w)
	if est, ok := o.estimate(9, 20*w); !ok || est != 500-margin {
		t.Fatalf("floor: %d %v", est, ok)
	}
	if est, _ := o.estimate(9, 30*w); est != 500-drift(10*w)-margin || drift(10*w) != 10*w*maxDriftPPM/1_000_000 {
		t.Fatalf("floor 10 windows later: %d; want %d", est, 500-drift(10*w)-margin)
	}
	if drift(1) != 1 || drift(0) != 0 || drift(-5) != 0 {
		t.Fatal("drift rounds up, never below 0")
	}
}

// TestOffsetEstimateIsConservative: on a real Redis, the store's estimate never exceeds Redis TIME
// minus the local time at which a TIME request was sent (an upper bound of the true offset): a
// deadline it sends is never later, on Redis's clock, than the moment its caller gives up. And it
// is close (within a few ms on loopback): deadlines are not cut short.
func TestOffsetEstimateIsConservative(t *testing.T) {
	e := newLuaEnv(t)
	s, err := New(Options{Addrs: []string{e.srv.Addr}, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := s.conn.Load()
	ctx := context.Background()
	p := luaPolicy(algorithm.TokenBucket, 1000, 1_000_000, 0)
	for i := range 200 {
		if _, err := s.Decide(ctx, "offset-"+strconv.Itoa(i%7), p, 1); err != nil {
			t.Fatal(err)
		}
		sent := monoMicros()
		ts, err := e.c.Do(ctx, e.c.B().Time().Build()).AsStrSlice()
		if err != nil {
			t.Fatal(err)
		}
		redis, _ := parseTime(ts)
		upper := redis - sent
		est, ok := c.offsets.estimate(0, monoMicros())
		if !ok || est > upper {
			t.Fatalf("estimate %d above the upper bound %d of the offset (by %dµs): a deadline could pass after the caller gave up", est, upper, est-upper)
		}
		if upper-est > 20_000 {
			t.Fatalf("estimate %dµs below the upper bound: deadlines are cut short", upper-est)
		}
	}
}

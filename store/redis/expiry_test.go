package redis_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/store/redis"
)

// onePerAlgorithm returns a policy of each algorithm with the given numbers (the buckets'
// capacity, like the windows' limit, is limit).
func onePerAlgorithm(prefix string, limit int64, period time.Duration) []sluice.Policy {
	var ps []sluice.Policy
	for _, a := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingLog, sluice.SlidingWindow, sluice.TokenBucket, sluice.LeakyBucket} {
		p := sluice.Policy{Name: prefix + "-" + a.String(), Algorithm: a, Limit: limit, Period: period}
		switch a {
		case sluice.TokenBucket:
			p.Burst = limit
		case sluice.LeakyBucket:
			p.Burst = limit - 1 // one served now, limit-1 queued
		}
		ps = append(ps, p)
	}
	return ps
}

// clientKeys returns every Redis key of a client (its hash tag), sorted.
func clientKeys(t *testing.T, srv *redistest.Server, key string) []string {
	t.Helper()
	return sortedCopy(strings.Fields(mustDo(t, srv, "KEYS", "*{"+key+"}*")))
}

// TestKeysExpireWhenIdle: for every algorithm (and for DecideAll), an approval leaves keys that
// all carry a TTL no longer than the approval's ResetAfter, and after a period of idleness
// (twice for the sliding window, plus slack) the client has no key left — and a peek then finds
// it as if never seen. No key is ever without a TTL (PTTL -1).
func TestKeysExpireWhenIdle(t *testing.T) {
	srv := redistest.Start(t)
	st := openStore(t, srv, redis.Options{})
	const period = 200 * time.Millisecond

	// check waits for the client's keys to expire, after approvals sent at sent whose last said
	// reset. want is each key with its own approval's ResetAfter: a key may be gone already only
	// if that much time has passed since sent (a fixed window's key ends with its window, which a
	// slow machine may reach before the keys are listed), never sooner.
	check := func(t *testing.T, key string, sent time.Time, want map[string]time.Duration, reset time.Duration, peek func() error) {
		written := time.Now()
		keys := clientKeys(t, srv, key)
		for k, r := range want {
			if !slices.Contains(keys, k) && time.Since(sent) < r {
				t.Fatalf("keys %q: %s is gone %v after the approval sent, before its ResetAfter %v", keys, k, time.Since(sent), r)
			}
		}
		for _, k := range keys {
			if _, ok := want[k]; !ok {
				t.Fatalf("keys %q: %s is not one of the client's %v", keys, k, want)
			}
		}
		resetMS := (reset + time.Millisecond - 1) / time.Millisecond
		for _, k := range keys {
			// 0 or -2: the key is in its last millisecond, or expired since it was listed, which a
			// fixed window's key does when its window ends in those few milliseconds (reset is
			// the longest of the approvals').
			if pttl := mustInt(t, srv, "PTTL", k); pttl == -1 || pttl > int64(resetMS) {
				t.Fatalf("%s: PTTL %dms right after an approval whose ResetAfter is %v; want at most %d (or gone)", k, pttl, reset, resetMS)
			}
		}
		// Every key keeps a TTL until it is gone: PTTL never -1 (no TTL). (While polling, a PTTL
		// of 0 is allowed: Redis reports 0 for a key in its last millisecond. Right after the
		// approvals, above, it must be positive.)
		deadline := written.Add(2*period + 500*time.Millisecond)
		for _, k := range keys {
			if !pollUntil(deadline, func() bool {
				pttl := mustInt(t, srv, "PTTL", k)
				if pttl == -1 {
					t.Fatalf("%s has no TTL", k)
				}
				return pttl == -2
			}) {
				t.Fatalf("%s still exists %v after the last approval (ResetAfter %v)", k, time.Since(written), reset)
			}
		}
		if err := peek(); err != nil {
			t.Fatal(err)
		}
		if keys := clientKeys(t, srv, key); len(keys) != 0 {
			t.Fatalf("a peek after expiry created %q", keys)
		}
	}

	for _, p := range onePerAlgorithm("idle", 5, period) {
		t.Run(p.Algorithm.String(), func(t *testing.T) {
			t.Parallel()
			key := "idle-" + p.Algorithm.String()
			var last sluice.Decision
			sent := time.Now()
			for i := range 3 {
				d, err := st.Decide(bg, key, p, 1)
				if err != nil || !d.Allowed || d.ResetAfter <= 0 {
					t.Fatalf("request %d: %+v %v", i, d, err)
				}
				last = d
			}
			k := stateKey(key, p.Name)
			if p.Algorithm == sluice.SlidingLog {
				k = hashKey(key, p.Name) + ":log" // its whole state, one list
			}
			check(t, key, sent, map[string]time.Duration{k: last.ResetAfter}, last.ResetAfter, func() error {
				d, err := st.Decide(bg, key, p, 0)
				if err == nil && (!d.Allowed || d.Remaining != p.Capacity() || d.ResetAfter != 0) {
					err = fmt.Errorf("a peek after expiry: %+v; want a fresh state", d)
				}
				return err
			})
		})
	}
	t.Run("decide-all", func(t *testing.T) {
		t.Parallel()
		ps := onePerAlgorithm("idle-all", 5, period)
		limits := make([]sluice.Limit, len(ps))
		for i, p := range ps {
			limits[i] = sluice.Limit{Policy: p, Cost: 2}
		}
		out := make([]sluice.Decision, len(limits))
		sent := time.Now()
		if ok, err := st.DecideAll(bg, "idle-all", limits, out); err != nil || !ok {
			t.Fatalf("DecideAll: %v %v %+v", ok, err, out)
		}
		want := map[string]time.Duration{}
		var reset time.Duration
		for i, p := range ps {
			k := stateKey("idle-all", p.Name)
			if p.Algorithm == sluice.SlidingLog {
				k = hashKey("idle-all", p.Name) + ":log"
			}
			want[k] = out[i].ResetAfter
			reset = max(reset, out[i].ResetAfter)
		}
		check(t, "idle-all", sent, want, reset, func() error {
			for i := range limits {
				limits[i].Cost = 0
			}
			ok, err := st.DecideAll(bg, "idle-all", limits, out)
			for i, d := range out {
				if err == nil && (!ok || d.Remaining != ps[i].Capacity() || d.ResetAfter != 0) {
					err = fmt.Errorf("a peek after expiry: %+v; want fresh states", out)
				}
			}
			return err
		})
	})
}

func sortedCopy(s []string) []string {
	c := slices.Clone(s)
	slices.Sort(c)
	return c
}

// TestRefusalWritesNothing: for every algorithm, a refusal decided by Redis (no negative cache),
// and a peek, leave the client's keys exactly as they were — the same fields, the same log — and
// do not extend their TTL: a client that keeps retrying while refused expires as soon as one
// that went away.
func TestRefusalWritesNothing(t *testing.T) {
	srv := redistest.Start(t)
	for _, p := range onePerAlgorithm("refused", 2, time.Second) {
		t.Run(p.Algorithm.String(), func(t *testing.T) {
			t.Parallel()
			st := openStore(t, srv, redis.Options{NegativeCacheSize: -1}) // its own Stats
			key := "refused-" + p.Algorithm.String()
			if p.Algorithm == sluice.FixedWindow {
				// The window's keys expire at its end, on Redis's clock (this machine's): start
				// early in a window, so that the test's second or so ends inside it. (Without this
				// it failed when the approvals fell in a window's last ~30 ms.)
				if left := p.Period - time.Duration(time.Now().UnixNano())%p.Period; left < 800*time.Millisecond {
					time.Sleep(left + 5*time.Millisecond) // wall-clock alignment is the subject, not synchronisation
				}
			}
			for i := range p.Capacity() {
				if d, err := st.Decide(bg, key, p, 1); err != nil || !d.Allowed {
					t.Fatalf("request %d: %+v %v", i, d, err)
				}
			}
			keys := clientKeys(t, srv, key)
			if len(keys) != 1 {
				t.Fatalf("keys %q after two approvals; want the state's one key", keys)
			}
			contents := func() string {
				var b strings.Builder
				for _, k := range keys {
					typ := mustDo(t, srv, "TYPE", k)
					switch typ {
					case "hash":
						fields := strings.Split(mustDo(t, srv, "HGETALL", k), "\n")
						pairs := make([]string, 0, len(fields)/2)
						for i := 0; i+1 < len(fields); i += 2 {
							pairs = append(pairs, fields[i]+"="+fields[i+1])
						}
						fmt.Fprintf(&b, "%s: %v\n", k, sortedCopy(pairs))
					case "list":
						fmt.Fprintf(&b, "%s: %q\n", k, mustDo(t, srv, "LRANGE", k, "0", "-1"))
					case "string":
						fmt.Fprintf(&b, "%s: %q\n", k, mustDo(t, srv, "GET", k))
					default:
						fmt.Fprintf(&b, "%s: %s\n", k, typ)
					}
				}
				return b.String()
			}
			before := contents()
			// Let some of the TTL run out, so that an extension would show.
			ttls := make([]int64, len(keys))
			for i, k := range keys {
				ttls[i] = mustInt(t, srv, "PTTL", k)
				if ttls[i] <= 0 {
					t.Fatalf("%s: PTTL %d", k, ttls[i])
				}
				ttl0 := ttls[i]
				if !pollUntil(time.Now().Add(time.Second), func() bool {
					ttls[i] = mustInt(t, srv, "PTTL", k)
					return ttls[i] <= ttl0-30
				}) {
					t.Fatalf("%s: PTTL did not run down", k)
				}
			}
			calls := st.Stats().Calls
			d, err := st.Decide(bg, key, p, 1)
			if err != nil || d.Allowed {
				t.Fatalf("third request: %+v %v; want refused", d, err)
			}
			if _, err := st.Decide(bg, key, p, 0); err != nil {
				t.Fatal(err)
			}
			if n := st.Stats().Calls - calls; n != 2 {
				t.Fatalf("%d calls to Redis for a refusal and a peek; want 2 (no cache)", n)
			}
			for i, k := range keys {
				if pttl := mustInt(t, srv, "PTTL", k); pttl > ttls[i] || pttl <= 0 {
					t.Fatalf("%s: PTTL %dms after the refusal and the peek, %dms before; want no extension", k, pttl, ttls[i])
				}
			}
			if after := contents(); after != before {
				t.Fatalf("a refusal and a peek changed the state:\nbefore:\n%safter:\n%s", before, after)
			}
		})
	}
}

// TestPeekCreatesNothing: a peek (cost 0) on a never-seen client, by Decide or DecideAll, under
// every algorithm, reports a fresh state and writes no key at all.
func TestPeekCreatesNothing(t *testing.T) {
	srv := redistest.Start(t)
	st := openStore(t, srv, redis.Options{})
	ps := onePerAlgorithm("peek", 3, time.Minute)
	limits := make([]sluice.Limit, len(ps))
	for i, p := range ps {
		d, err := st.Decide(bg, "never-seen", p, 0)
		if err != nil || !d.Allowed || d.Remaining != p.Capacity() || d.ResetAfter != 0 || d.RetryAfter != 0 || d.Delay != 0 {
			t.Fatalf("%v: a peek on a never-seen key: %+v %v; want a fresh state", p.Algorithm, d, err)
		}
		limits[i] = sluice.Limit{Policy: p}
	}
	out := make([]sluice.Decision, len(limits))
	if ok, err := st.DecideAll(bg, "never-seen-all", limits, out); err != nil || !ok {
		t.Fatalf("DecideAll peek: %v %v %+v", ok, err, out)
	}
	if n := mustInt(t, srv, "DBSIZE"); n != 0 {
		t.Fatalf("peeks created %d keys: %q", n, mustDo(t, srv, "KEYS", "*"))
	}
	// The check has teeth: one approval does create a key, one per state.
	for i, p := range ps {
		if d, err := st.Decide(bg, "seen", p, 1); err != nil || !d.Allowed {
			t.Fatalf("%v: %+v %v", p.Algorithm, d, err)
		}
		if n := mustInt(t, srv, "DBSIZE"); n != int64(i+1) {
			t.Fatalf("%v: %d approvals under %d policies left %d keys, want %d", p.Algorithm, i+1, i+1, n, i+1)
		}
	}
}

package redis_test

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

// slowLogEntries is the length of the sliding log, every entry expired, that makes a settlement's
// script run for a while (it reads and drops them one by one: about 100 ms on an idle machine):
// far longer than slowSettleTimeout.
const (
	slowLogEntries    = 200_000
	slowSettleTimeout = 40 * time.Millisecond
)

// TestSettleOnceReplyLost: a settlement whose script ran but whose reply came after the store
// stopped waiting (ErrStoreUnavailable) is retried with the same id, and the retry changes
// nothing: the extra charge counts once. Its script is made slow by a long sliding log (the store
// waits 40 ms; the script drops 200,000 expired entries), so it starts in time and ends late; an
// attempt that did not start in time (a loaded machine) wrote nothing and is tried again with a
// new settlement until one ran. Another id is another settlement, applied. On a single server and
// on a Redis Cluster, with a key and a prefix that hold braces (the id's record must hash with
// the key's state).
func TestSettleOnceReplyLost(t *testing.T) {
	t.Run("server", func(t *testing.T) {
		srv := redistest.Start(t)
		settleOnceReplyLost(t, []string{srv.Addr}, func(args ...string) (string, error) { return srv.Do(args...) })
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.StartCluster(t, 3)
		settleOnceReplyLost(t, c.Addrs(), func(args ...string) (string, error) { return onOwner(c, args...) })
	})
}

// onOwner runs a command of one key (args[1]) on the cluster's master that holds its slot.
func onOwner(c *redistest.Cluster, args ...string) (string, error) {
	var err error
	for _, s := range c.Servers {
		var r string
		if r, err = s.Do(args...); err == nil || !strings.Contains(err.Error(), "MOVED") {
			return r, err
		}
	}
	return "", err
}

func settleOnceReplyLost(t *testing.T, addrs []string, do func(args ...string) (string, error)) {
	const prefix = "once{p:"
	slow := newStore(t, redisstore.Options{Addrs: addrs, Prefix: prefix, Timeout: slowSettleTimeout, NegativeCacheSize: -1})
	patient := newStore(t, redisstore.Options{Addrs: addrs, Prefix: prefix, NegativeCacheSize: -1})
	p := sluice.Policy{Name: "log", Algorithm: sluice.SlidingLog, Limit: 1 << 30, Period: 1000 * time.Hour}
	entries := slowLogEntries
	for try := 0; ; try++ {
		if try == 20 {
			t.Fatal("no slow settlement ran in 20 tries: each was refused at its deadline")
		}
		key := fmt.Sprintf("k{%d}x", try)
		d, err := patient.Decide(bg, key, p, 1)
		if err != nil || !d.Allowed {
			t.Fatalf("decide: %+v %v", d, err)
		}
		logKey := prefix + "{" + key + "}:log:log"
		head, entry := lindex(t, do, logKey, 0), lindex(t, do, logKey, 1)
		// Entries of two periods back, expired: the settlement's extra charge reads and drops
		// them all, one by one (the one the decision wrote is the last, its count dropped).
		at, _, _ := strings.Cut(entry, ":")
		ts, _ := strconv.ParseInt(at, 10, 64)
		old := strconv.FormatInt(ts-2*p.PeriodMicros(), 10) + ":1"
		if _, err := do("LSET", logKey, "1", old); err != nil {
			t.Fatal(err)
		}
		fillLog(t, do, logKey, head, old, entries)
		id := fmt.Sprintf("%032x", try+1)
		err = slow.SettleOnce(bg, key, p, d.At, 1, 8, id, time.Minute)
		if err == nil && entries < 8*slowLogEntries {
			t.Logf("try %d: a settlement of %d entries answered within %v (a fast machine); a longer log", try, entries, slowSettleTimeout)
			entries *= 2
			continue
		}
		if err == nil {
			t.Fatalf("a settlement of %d entries answered within %v", entries, slowSettleTimeout)
		}
		if !errors.Is(err, sluice.ErrStoreUnavailable) {
			t.Fatal(err)
		}
		idKey := prefix + "{" + key + "}:settled:" + id
		// (The script may still be running: Redis answers this after it.)
		if r, _ := do("EXISTS", idKey); r != "1" {
			t.Logf("try %d: the script did not run before its deadline; again", try)
			if got := logSum(t, do, logKey); got != int64(entries) {
				t.Fatalf("a settlement refused at its deadline changed the log: %d, want %d", got, entries)
			}
			continue
		}
		const want = 7 // the extra 7, once (every entry before it expired)
		if got := logSum(t, do, logKey); got != want {
			t.Fatalf("after the slow settlement: %d counted, want %d", got, want)
		}
		// The record lasts at least keep (a minute) plus the store's bound on a call.
		if ttl, _ := do("PTTL", idKey); !ttlAtLeast(ttl, time.Minute) {
			t.Fatalf("the id's record has PTTL %s ms, want at least a minute", ttl)
		}
		// The retry, with the same id: it answers (nothing to do) and changes nothing.
		if err := patient.SettleOnce(bg, key, p, d.At, 1, 8, id, time.Minute); err != nil {
			t.Fatal(err)
		}
		if got := logSum(t, do, logKey); got != want {
			t.Fatalf("the retry applied the settlement again: %d counted, want %d", got, want)
		}
		// Another settlement (another id) of the same charge is applied.
		if err := patient.SettleOnce(bg, key, p, d.At, 1, 8, fmt.Sprintf("%032x", 1000+try), time.Minute); err != nil {
			t.Fatal(err)
		}
		if got := logSum(t, do, logKey); got != want+7 {
			t.Fatalf("another id: %d counted, want %d", got, want+7)
		}
		return
	}
}

// TestSettleOnceHungRedis: a settlement sent to a Redis that hangs (SIGSTOP) fails with
// ErrStoreUnavailable, and runs after its deadline when Redis resumes: it writes nothing, neither
// the change nor its id. Its retry with the same id is applied, once: a second retry changes
// nothing, and neither does the first attempt's script, which ran late.
func TestSettleOnceHungRedis(t *testing.T) {
	srv := redistest.Start(t)
	st := newStore(t, redisstore.Options{Addrs: []string{srv.Addr}, Timeout: 200 * time.Millisecond, NegativeCacheSize: -1})
	p := sluice.Policy{Name: "t", Algorithm: sluice.FixedWindow, Limit: 1000, Period: 1000 * time.Hour}
	d, err := st.Decide(bg, "c", p, 100)
	if err != nil {
		t.Fatal(err)
	}
	const id = "0123456789abcdef0123456789abcdef"
	srv.Stop()
	err = st.SettleOnce(bg, "c", p, d.At, 100, 400, id, time.Minute)
	srv.Cont()
	if !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Fatalf("settling while Redis hangs: %v, want ErrStoreUnavailable", err)
	}
	if pk, err := st.Decide(bg, "c", p, 0); err != nil || pk.Remaining != 900 {
		t.Fatalf("after the attempt given up on: %+v %v, want remaining 900 (nothing written)", pk, err)
	}
	if n := mustInt(t, srv, "EXISTS", "rate-limit:{c}:settled:"+id); n != 0 {
		t.Fatal("the attempt given up on wrote its id")
	}
	for range 2 {
		if err := st.SettleOnce(bg, "c", p, d.At, 100, 400, id, time.Minute); err != nil {
			t.Fatal(err)
		}
		if pk, err := st.Decide(bg, "c", p, 0); err != nil || pk.Remaining != 600 {
			t.Fatalf("after the retry: %+v %v, want remaining 600 (300 more, once)", pk, err)
		}
	}
	// A bad id is the caller's error, with nothing sent.
	calls := st.Stats().Calls
	if err := st.SettleOnce(bg, "c", p, d.At, 100, 400, "", time.Minute); err == nil || errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Fatalf("an empty id: %v", err)
	}
	if st.Stats().Calls != calls {
		t.Fatal("a bad id reached Redis")
	}
}

func lindex(t *testing.T, do func(...string) (string, error), key string, i int) string {
	t.Helper()
	r, err := do("LINDEX", key, strconv.Itoa(i))
	if err != nil || r == "" {
		t.Fatalf("LINDEX %s %d: %q %v", key, i, r, err)
	}
	return r
}

// fillLog makes the sliding log at key hold n entries like entry (cost 1 each), its header head
// counting them.
func fillLog(t *testing.T, do func(...string) (string, error), key, head, entry string, n int) {
	t.Helper()
	const batch = 10_000
	for done := 1; done < n; {
		k := min(batch, n-done)
		args := make([]string, 0, k+2)
		args = append(args, "RPUSH", key)
		for range k {
			args = append(args, entry)
		}
		if _, err := do(args...); err != nil {
			t.Fatal(err)
		}
		done += k
	}
	i := strings.LastIndexByte(head, ':')
	if _, err := do("LSET", key, "0", head[:i+1]+strconv.Itoa(n)); err != nil {
		t.Fatal(err)
	}
}

// logSum is the count the sliding log's header holds.
func logSum(t *testing.T, do func(...string) (string, error), key string) int64 {
	t.Helper()
	head := lindex(t, do, key, 0)
	n, err := strconv.ParseInt(head[strings.LastIndexByte(head, ':')+1:], 10, 64)
	if err != nil {
		t.Fatalf("log header %q: %v", head, err)
	}
	return n
}

func ttlAtLeast(pttl string, d time.Duration) bool {
	n, err := strconv.ParseInt(pttl, 10, 64)
	return err == nil && n >= d.Milliseconds()-1000 // (a second for the test's own time)
}

// TestSettlementsLandOnRedis: sluice.Settlements on a guarded Redis store (its breaker opening
// after one failure): a settlement made while Redis hangs is pending, retried through the
// breaker, and lands once Redis answers again, applied once: the next decision sees the full
// usage charged, and nothing was lost.
func TestSettlementsLandOnRedis(t *testing.T) {
	srv := redistest.Start(t)
	st := newStore(t, redisstore.Options{Addrs: []string{srv.Addr}, Timeout: 100 * time.Millisecond, NegativeCacheSize: -1})
	guarded, err := sluice.Guard(st, sluice.WithBreaker(1, 20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	s := sluice.NewSettlements(guarded, sluice.SettlementOptions{Backoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	defer s.Close(bg)
	p := sluice.Policy{Name: "tokens", Algorithm: sluice.FixedWindow, Limit: 5000, Period: 1000 * time.Hour}
	d, err := guarded.Decide(bg, "c", p, 1000)
	if err != nil || !d.Allowed {
		t.Fatalf("decide: %+v %v", d, err)
	}
	srv.Stop()
	err = s.Settle(bg, "c", p, d, 1000, 4750)
	if !errors.Is(err, sluice.ErrSettlementPending) {
		srv.Cont()
		t.Fatalf("settling while Redis hangs: %v, want pending", err)
	}
	if s.Stats().Pending != 1 {
		srv.Cont()
		t.Fatalf("stats %+v: want 1 pending", s.Stats())
	}
	srv.Cont()
	if !pollUntil(time.Now().Add(20*time.Second), func() bool { return s.Stats().Pending == 0 }) {
		t.Fatalf("the settlement never landed: %+v", s.Stats())
	}
	if got := s.Stats(); got.Landed != 1 || got.Lost() != 0 {
		t.Fatalf("stats %+v: want 1 landed, none lost", got)
	}
	if pk, err := st.Decide(bg, "c", p, 0); err != nil || pk.Remaining != 250 {
		t.Fatalf("after it landed: %+v %v, want remaining 250 (4,750 charged, once)", pk, err)
	}
}

package redis_test

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/store/redis"
)

// Every state is one Redis key, so that losing a key (eviction under maxmemory-policy
// allkeys-lru, an operator's DEL) loses a whole state: the client starts afresh, with its quota
// back, and is never left with part of a state that takes quota away (a sliding log's count
// without the entries whose expiry would give it back).

// TestLostKeyGivesQuotaBack: for every algorithm, a client filled to its limit whose key is
// deleted is as if never seen — a peek finds a fresh state and the next request is decided on
// one — and every policy's state is exactly one key.
func TestLostKeyGivesQuotaBack(t *testing.T) {
	srv := redistest.Start(t)
	t0 := int64(1_800_000_000_000_000)
	clock := sluice.NewManualClock(time.UnixMicro(t0))
	st := openStore(t, srv, redis.Options{Clock: clock, NegativeCacheSize: -1, Timeout: 5 * time.Second})
	for _, p := range onePerAlgorithm("lost", 5, time.Hour) {
		t.Run(p.Algorithm.String(), func(t *testing.T) {
			// fill makes requests of cost 1 a second apart on key until one is refused, and
			// returns the client's keys and the instant of the refusal.
			fill := func(key string) ([]string, int64) {
				now := t0
				for i := int64(0); ; i++ {
					now = t0 + i*1_000_000
					clock.Set(time.UnixMicro(now))
					d, err := st.Decide(bg, key, p, 1)
					if err != nil {
						t.Fatalf("%s request %d: %v", key, i, err)
					}
					if !d.Allowed {
						break
					}
					if i > p.Capacity() {
						t.Fatalf("%s: %d approvals of a capacity of %d", key, i+1, p.Capacity())
					}
				}
				return clientKeys(t, srv, key), now
			}
			keys, _ := fill("lost-" + p.Algorithm.String())
			for j := range keys {
				key := fmt.Sprintf("lost-%v-%d", p.Algorithm, j)
				ks, now := fill(key)
				mustDo(t, srv, "DEL", ks[j])
				var fresh algorithm.State
				want, _ := algorithm.Decide(&p, &fresh, now, 0)
				got, err := st.Decide(bg, key, p, 0)
				if err != nil || got != want {
					t.Fatalf("a full client whose key %s was deleted: a peek gave %+v %v; want a fresh state %+v (its quota back)", ks[j], got, err, want)
				}
				want, _ = algorithm.Decide(&p, &fresh, now, 1)
				if got, err = st.Decide(bg, key, p, 1); err != nil || got != want {
					t.Fatalf("a full client whose key %s was deleted: a request gave %+v %v; want %+v as on a fresh state", ks[j], got, err, want)
				}
			}
			want := stateKey("lost-"+p.Algorithm.String(), p.Name)
			if p.Algorithm == sluice.SlidingLog {
				want = hashKey("lost-"+p.Algorithm.String(), p.Name) + ":log"
			}
			if len(keys) != 1 || keys[0] != want {
				t.Fatalf("the state is kept in %q; want one key, %s", keys, want)
			}
		})
	}
}

// TestEvictionOnlyGivesQuotaBack runs thousands of clients of every algorithm on a Redis whose
// maxmemory is too small for their states, under maxmemory-policy allkeys-lru, so that Redis
// evicts states while they are in use. Whatever it evicts, each client's decisions must be
// exactly those of the core on the client's requests with its state lost (reset to never seen)
// at zero or more instants between them: loss only ever gives quota back. For the sliding log it
// also checks the consequence directly: the store's Remaining is never below the core's on the
// client's true history (every approval the store made), and it refuses only what that history
// refuses.
//
// The negative cache is off: it answers refusals from this instance's memory of earlier ones,
// which an eviction in Redis does not reach (that is the cache's own contract, tested with it).
func TestEvictionOnlyGivesQuotaBack(t *testing.T) {
	srv := redistest.Start(t, "--maxmemory-policy", "allkeys-lru", "--maxmemory", "64mb")
	t0 := int64(1_800_000_000_000_000)
	clock := sluice.NewManualClock(time.UnixMicro(t0))
	st := newStore(t, redis.Options{Addrs: []string{srv.Addr}, Clock: clock, NegativeCacheSize: -1})

	const clients, rounds, workers = 1200, 12, 6
	type step struct {
		at, cost int64
		d        sluice.Decision
	}
	type client struct {
		key   string
		p     sluice.Policy
		r     *rand.Rand
		steps []step
	}
	cs := make([]*client, clients)
	for i := range cs {
		a := algorithm.Algorithms[i%len(algorithm.Algorithms)]
		p := sluice.Policy{Name: "evict-" + a.String(), Algorithm: a, Limit: 6, Period: time.Minute}
		switch a {
		case sluice.SlidingLog:
			p.Limit = 12 // longer lists
		case sluice.TokenBucket:
			p.Burst = 8
		case sluice.LeakyBucket:
			p.Burst = 5
		}
		cs[i] = &client{key: fmt.Sprintf("evict-%d", i), p: p, r: rand.New(rand.NewPCG(uint64(i), 7))}
	}
	// Load the scripts and measure the memory Redis uses without states.
	for _, c := range cs[:len(algorithm.Algorithms)] {
		if _, err := st.Decide(bg, "warm-up", c.p, 0); err != nil {
			t.Fatal(err)
		}
	}
	usedMemory := func() int64 {
		n, err := strconv.ParseInt(infoField(t, srv, "memory", "used_memory"), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	empty := usedMemory()

	for round := 0; round < rounds; round++ {
		now := t0 + int64(round)*7_000_000
		clock.Set(time.UnixMicro(now))
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < clients; i += workers {
					c := cs[i]
					if i%3 != 0 && c.r.IntN(3) != 0 {
						continue // a third of the clients are busy, the rest come now and then: LRU keeps the busy
					}
					for n := 1 + c.r.IntN(3); n > 0; n-- {
						cost := c.r.Int64N(3)
						d, err := st.Decide(bg, c.key, c.p, cost)
						if err != nil {
							t.Errorf("%s round %d: %v", c.key, round, err)
							return
						}
						c.steps = append(c.steps, step{at: now, cost: cost, d: d})
					}
				}
			}()
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		if round == 2 {
			// Leave room for three quarters of what the states take now (they grow further: a
			// log for a whole period, 60 s), measured rather than guessed, so that from now on
			// Redis evicts some of them, as on any server and build, while other clients keep theirs.
			used := usedMemory()
			mustDo(t, srv, "CONFIG", "SET", "maxmemory", strconv.FormatInt(empty+(used-empty)*3/4, 10))
			t.Logf("used %d of which states %d", used, used-empty)
		}
	}
	evicted, _ := strconv.ParseInt(infoField(t, srv, "stats", "evicted_keys"), 10, 64)
	if evicted < clients/4 {
		t.Fatalf("Redis evicted %d keys; the test needs many more (raise clients or lower maxmemory)", evicted)
	}

	lostSeen := 0
	for _, c := range cs {
		var history strings.Builder
		// The states the client may have now, one per instant its state was last lost at
		// (cut, -1: never): those of the candidates whose decisions so far were the store's.
		type candidate struct {
			cut int
			s   algorithm.State
		}
		cands := []candidate{{cut: -1}}
		var approved []algorithm.LogEntry // the true history
		for i, s := range c.steps {
			fmt.Fprintf(&history, "  %d: now %d cost %d: %+v\n", i, s.at, s.cost, s.d)
			if i > 0 {
				cands = append(cands, candidate{cut: i})
			}
			kept := cands[:0]
			for _, cd := range cands {
				if d, err := algorithm.Decide(&c.p, &cd.s, s.at, s.cost); err == nil && d == s.d {
					kept = append(kept, cd)
				}
			}
			cands = kept
			if len(cands) == 0 {
				t.Fatalf("%s (%v %d/%v): decision %d is the core's on no history with losses; decisions:\n%s",
					c.key, c.p.Algorithm, c.p.Limit, c.p.Period, i, &history)
			}
			if c.p.Algorithm == sluice.SlidingLog {
				var sum int64
				for _, e := range approved {
					if e.At > s.at-c.p.PeriodMicros() {
						sum += e.Cost
					}
				}
				if s.d.Allowed {
					sum += s.cost
				}
				if s.d.Remaining < c.p.Limit-sum || (!s.d.Allowed && sum+s.cost <= c.p.Limit) {
					t.Fatalf("%s: decision %d is stricter than the core's on the true history (%d of %d in the window); decisions:\n%s",
						c.key, i, sum, c.p.Limit, &history)
				}
			}
			if s.d.Allowed && s.cost > 0 {
				approved = append(approved, algorithm.LogEntry{At: s.at, Cost: s.cost})
			}
		}
		if cands[0].cut != -1 {
			lostSeen++
		}
	}
	if lostSeen == 0 {
		t.Fatalf("Redis evicted %d keys, but no client's decisions show a lost state: the test shows nothing", evicted)
	}
	t.Logf("%d clients, %d keys evicted, %d clients' decisions show a lost state", clients, evicted, lostSeen)
}

package memory

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// checkTables verifies every shard's open-addressing table: each client is reachable from its
// home without meeting an empty place, the counts agree, and no table is over three quarters full.
func checkTables(t *testing.T, s *Store) (keys map[string]bool) {
	t.Helper()
	keys = map[string]bool{}
	for si := range s.shards {
		sh := &s.shards[si]
		table := sh.tableLocked()
		mask := len(table) - 1
		clients, slots := 0, 0
		for i := range table {
			c, h := table[i].c.Load(), table[i].hash.Load()
			if c == nil {
				continue
			}
			clients++
			slots += 1 + len(c.others())
			if c.dead {
				t.Fatalf("shard %d: %q at %d is marked dead", si, c.key, i)
			}
			for j := home(h, mask); j != i; j = (j + 1) & mask {
				if table[j].c.Load() == nil {
					t.Fatalf("shard %d: %q at %d is cut off from its home %d by the empty place %d", si, c.key, i, home(h, mask), j)
				}
			}
			if keys[c.key] {
				t.Fatalf("%q is held twice", c.key)
			}
			keys[c.key] = true
			if sh.find(h, c.key) != c {
				t.Fatalf("find(%q) does not return its client", c.key)
			}
		}
		if clients != sh.clients || slots != sh.slots {
			t.Fatalf("shard %d counts %d clients and %d slots; its table holds %d and %d", si, sh.clients, sh.slots, clients, slots)
		}
		if clients*4 > len(table)*3 {
			t.Fatalf("shard %d: %d clients in a table of %d", si, clients, len(table))
		}
	}
	return keys
}

// Random decisions, sweeps and evictions on few shards whose hashes share few bits (so that
// probes run long and wrap around the table's end) keep the tables consistent, and hold
// exactly the keys whose state is not yet as if never seen.
func TestTableUnderChurn(t *testing.T) {
	for _, tc := range []struct {
		hashMask uint64
		maxKeys  int // 0: never reached
	}{{^uint64(0), 0}, {0x0000_000F_0000_0003, 0}, {0, 0}, {^uint64(0), 4 * 40}, {0x0000_000F_0000_0003, 4 * 40}} {
		hashMask := tc.hashMask
		t.Run(fmt.Sprintf("hashMask=%#x/maxKeys=%d", hashMask, tc.maxKeys), func(t *testing.T) {
			clock := sluice.NewManualClock(time.UnixMicro(0))
			s := New(WithClock(clock), WithShards(4), WithMaxKeys(tc.maxKeys), WithSweepInterval(time.Hour))
			s.hashMask = hashMask
			rng := rand.New(rand.NewPCG(1, uint64(hashMask)))
			ctx := context.Background()
			policies := []sluice.Policy{
				{Name: "a", Algorithm: sluice.FixedWindow, Limit: 3, Period: time.Second},
				{Name: "b", Algorithm: sluice.TokenBucket, Limit: 2, Period: 3 * time.Second},
			}
			expires := map[string]int64{} // key|policy → µs when its state is as if never seen
			now := int64(0)
			for step := 0; step < 20_000; step++ {
				now += rng.Int64N(20_000)
				clock.Set(time.UnixMicro(now))
				key := fmt.Sprint("client-", rng.IntN(300))
				p := policies[rng.IntN(len(policies))]
				d, err := s.Decide(ctx, key, p, 1)
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed {
					expires[key+"|"+p.Name] = now + int64(d.ResetAfter/time.Microsecond)
				}
				if rng.IntN(500) == 0 {
					s.Sweep()
					held := checkTables(t, s)
					live := map[string]bool{}
					for kp, e := range expires {
						if e > now {
							live[kp[:len(kp)-2]] = true
						}
					}
					for k := range live {
						if !held[k] && tc.maxKeys == 0 {
							t.Fatalf("step %d: %q is active but not held", step, k)
						}
					}
					for k := range held {
						if !live[k] {
							t.Fatalf("step %d: %q is held after a sweep, though idle", step, k)
						}
					}
				}
			}
			checkTables(t, s)
			if (s.Evictions() == 0) != (tc.maxKeys == 0) {
				t.Errorf("%d evictions with a bound of %d keys", s.Evictions(), tc.maxKeys)
			}
			clock.Set(time.UnixMicro(now + int64(time.Hour/time.Microsecond)))
			s.Sweep()
			if n := s.Len(); n != 0 {
				t.Fatalf("Len after an idle hour = %d", n)
			}
			for i := range s.shards {
				if table := s.shards[i].tableLocked(); table != nil {
					t.Fatalf("shard %d keeps a table of %d places with no client", i, len(table))
				}
			}
		})
	}
}

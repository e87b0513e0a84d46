package redis_test

import (
	"cmp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/redis"
)

// TestFleetNames: on one Redis, fleet "api" (two instances), fleet "llm" (one) and the default
// fleet (two: one without a name, as before fleets had names, one named "default") each heartbeat
// in the background, every instance from a store of its own as a process would. Each sees only
// its own fleet: api 2, llm 1, default 2 — not 5 — and lists only its members. The default
// fleet's registry is the key of before names (rate-limit:instances), the others' hold their
// name. With Redis killed, a limiter failing to local on each fleet's size decides on its own
// share: exactly floor(31/2) = 15 on api, all 31 on llm.
func TestFleetNames(t *testing.T) {
	srv := redistest.Start(t)
	type member struct{ fleet, id string }
	members := []member{{"api", "api-1"}, {"api", "api-2"}, {"llm", "llm-1"}, {"", "old-1"}, {"default", "old-2"}}
	fleets := make(map[string]*redis.Fleet)
	for _, m := range members {
		f, err := fleetStore(t, srv, redis.Options{}).Fleet(redis.FleetOptions{Name: m.fleet, ID: m.id, Interval: 20 * time.Millisecond, TTL: 5 * time.Second})
		if err != nil {
			t.Fatalf("Fleet(%q, %q): %v", m.fleet, m.id, err)
		}
		t.Cleanup(f.Close)
		fleets[m.id] = f
	}
	var wg sync.WaitGroup // all start at once: their heartbeats race on the one Redis
	for _, f := range fleets {
		wg.Go(f.Start)
	}
	wg.Wait()

	want := map[string][]string{"api": {"api-1", "api-2"}, "llm": {"llm-1"}, "default": {"old-1", "old-2"}, "": {"old-1", "old-2"}}
	deadline := time.Now().Add(15 * time.Second)
	waitView := func(id string, done func(redis.FleetView) bool) redis.FleetView {
		t.Helper()
		v := fleets[id].View()
		for ; !done(v); v = fleets[id].View() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %+v; the heartbeats did not come within 15 s", id, v)
			}
			time.Sleep(5 * time.Millisecond)
		}
		return v
	}
	seen := map[string]time.Time{}
	for _, m := range members {
		seen[m.id] = waitView(m.id, func(v redis.FleetView) bool { return v.Count >= len(want[m.fleet]) }).At
	}
	// Every instance is registered now: a heartbeat after this one counts all that share the Redis.
	for _, m := range members {
		v := waitView(m.id, func(v redis.FleetView) bool { return v.At.After(seen[m.id]) })
		got := strings.Fields(ids(v))
		slices.Sort(got)
		if f := fleets[m.id]; v.Count != len(want[m.fleet]) || !slices.Equal(got, want[m.fleet]) || f.Size() != len(want[m.fleet]) || v.Err != "" {
			t.Errorf("%s of fleet %q: %d live, size %d, members %v; want %d, %v", m.id, m.fleet, v.Count, f.Size(), got, len(want[m.fleet]), want[m.fleet])
		}
		if wantName := cmp.Or(m.fleet, "default"); fleets[m.id].Name() != wantName {
			t.Errorf("%s: Name %q; want %q", m.id, fleets[m.id].Name(), wantName)
		}
	}
	for key, n := range map[string]int64{"rate-limit:instances": 2, "rate-limit:fleet:api:instances": 2, "rate-limit:fleet:llm:instances": 1} {
		if got := mustInt(t, srv, "ZCARD", key); got != n {
			t.Errorf("ZCARD %s = %d; want %d", key, got, n)
		}
	}

	// The local fallback's share, each fleet's own.
	local := func() sluice.Store {
		return memory.New(memory.WithClock(sluice.NewManualClock(time.Unix(1_700_000_000, 0))))
	}
	policy := sluice.Policy{Name: "fleet-names", Algorithm: sluice.FixedWindow, Limit: 31, Period: time.Hour}
	limiters := map[string]*sluice.Limiter{}
	for _, id := range []string{"api-1", "llm-1"} {
		lim, err := sluice.NewLimiter(fleetStore(t, srv, redis.Options{}), policy, sluice.WithFleetFallback(local(), fleets[id].Size))
		if err != nil {
			t.Fatal(err)
		}
		limiters[id] = lim
	}
	srv.Kill()
	for id, wantN := range map[string]int{"api-1": 15, "llm-1": 31} {
		n := 0
		for range 40 {
			d, err := limiters[id].Allow(bg, "partner")
			if err != nil || d.Fallback != sluice.FallbackLocal {
				t.Fatalf("%s with Redis down: %+v %v; want a local decision", id, d, err)
			}
			if d.Allowed {
				n++
			}
		}
		if n != wantN {
			t.Errorf("%s with Redis down: %d of 40 approved locally; want %d (its fleet's share of 31)", id, n, wantN)
		}
	}
}

// TestFleetNameOptions: a fleet name outside A-Z, a-z, 0-9, '.', '_' and '-' (a ':' would let
// one name's registry be another's), or too long, is refused, naming it.
func TestFleetNameOptions(t *testing.T) {
	srv := redistest.Start(t)
	st := fleetStore(t, srv, redis.Options{})
	for _, c := range []struct{ name, want string }{
		{"api:shares", `name "api:shares": byte 3`},
		{"api gw", `name "api gw": byte 3`},
		{"{api}", `name "{api}": byte 0`},
		{strings.Repeat("f", redis.MaxFleetID+1), "name of 129 bytes; at most 128"},
	} {
		if _, err := st.Fleet(redis.FleetOptions{Name: c.name}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Fleet(Name %q): %v; want an error saying %q", c.name, err, c.want)
		}
	}
}

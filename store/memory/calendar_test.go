package memory_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store/memory"
	_ "time/tzdata" // the zones, also where there is no /usr/share/zoneinfo
)

func zone(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// calRow is one request at an explicit instant of the store's virtual clock, and its answer.
// Remaining and ResetAfter are checked where set (≥ 0).
type calRow struct {
	at        time.Time
	cost      int64
	allowed   bool
	retry     time.Duration
	remaining int64
	reset     time.Duration
}

// runCalendarRows decides rows on key k of a memory store whose clock is set to each row's
// instant, by Decide and, on a second store, by DecideAll, and checks both.
func runCalendarRows(t *testing.T, p sluice.Policy, rows []calRow) {
	t.Helper()
	ctx := context.Background()
	clock := sluice.NewManualClock(rows[0].at)
	one, all := memory.New(memory.WithClock(clock)), memory.New(memory.WithClock(clock))
	for i, r := range rows {
		clock.Set(r.at)
		d1, err := one.Decide(ctx, "k", p, r.cost)
		if err != nil {
			t.Fatalf("row %d (%v): %v", i, r.at, err)
		}
		var out [1]sluice.Decision
		if _, err := all.DecideAll(ctx, "k", []sluice.Limit{{Policy: p, Cost: r.cost}}, out[:]); err != nil {
			t.Fatalf("row %d (%v): DecideAll: %v", i, r.at, err)
		}
		for _, d := range []sluice.Decision{d1, out[0]} {
			if d.Allowed != r.allowed || d.RetryAfter != r.retry || (r.remaining >= 0 && d.Remaining != r.remaining) || (r.reset >= 0 && d.ResetAfter != r.reset) {
				t.Fatalf("row %d (%v, cost %d): %+v\nwant allowed %v, retry %v, remaining %d, reset %v", i, r.at, r.cost, d, r.allowed, r.retry, r.remaining, r.reset)
			}
		}
	}
}

// Step tables on the memory store at explicit instants across real calendar edges.
func TestCalendarSteps(t *testing.T) {
	berlin := zone(t, "Europe/Berlin")
	b := func(y int, m time.Month, d, hh, mm int) time.Time { return time.Date(y, m, d, hh, mm, 0, 0, berlin) }
	const h = time.Hour
	t.Run("fixed-window day, Berlin 2026-03-29 (23 hours)", func(t *testing.T) {
		runCalendarRows(t, sluice.Policy{Name: "daily", Algorithm: sluice.FixedWindow, Limit: 2, Calendar: sluice.Day, Location: berlin}, []calRow{
			{b(2026, 3, 28, 23, 59), 2, true, 0, 0, time.Minute},
			{b(2026, 3, 29, 0, 0), 2, true, 0, 0, 23 * h},
			{b(2026, 3, 29, 3, 0), 1, false, 21 * h, 0, 21 * h}, // 02:00 did not happen
			{b(2026, 3, 30, 0, 0).Add(-time.Microsecond), 1, false, time.Microsecond, 0, time.Microsecond},
			{b(2026, 3, 30, 0, 0), 1, true, 0, 1, 24 * h},
		})
	})
	t.Run("fixed-window day, Berlin 2026-10-25 (25 hours)", func(t *testing.T) {
		runCalendarRows(t, sluice.Policy{Name: "daily", Algorithm: sluice.FixedWindow, Limit: 1, Calendar: sluice.Day, Location: berlin}, []calRow{
			{b(2026, 10, 25, 0, 0), 1, true, 0, 0, 25 * h},
			{b(2026, 10, 25, 0, 0).Add(3 * h), 1, false, 22 * h, 0, 22 * h}, // 02:00 CET, the second one
			{b(2026, 10, 26, 0, 0), 1, true, 0, 0, 24 * h},
		})
	})
	t.Run("sliding-window day into the 25-hour day", func(t *testing.T) {
		runCalendarRows(t, sluice.Policy{Name: "daily", Algorithm: sluice.SlidingWindow, Limit: 10, Calendar: sluice.Day, Location: berlin}, []calRow{
			{b(2026, 10, 24, 12, 0), 10, true, 0, 0, 12*h + 25*h},
			{b(2026, 10, 24, 12, 0), 1, false, 12*h + 150*time.Minute, 0, 37 * h}, // e = 2.5h of 25h
			{b(2026, 10, 25, 11, 30), 0, true, 0, 5, 12*h + 30*time.Minute},       // 12.5h of 25h: half
		})
	})
	t.Run("month, leap day 2028-02-29", func(t *testing.T) {
		runCalendarRows(t, sluice.Policy{Name: "monthly", Algorithm: sluice.FixedWindow, Limit: 3, Calendar: sluice.Month}, []calRow{
			{time.Date(2028, 2, 29, 12, 0, 0, 0, time.UTC), 3, true, 0, 0, 12 * h},
			{time.Date(2028, 2, 29, 23, 0, 0, 0, time.UTC), 1, false, h, 0, h},
			{time.Date(2028, 3, 1, 0, 0, 0, 0, time.UTC), 1, true, 0, 2, 31 * 24 * h},
		})
	})
	t.Run("year, the end of December", func(t *testing.T) {
		runCalendarRows(t, sluice.Policy{Name: "yearly", Algorithm: sluice.SlidingWindow, Limit: 365, Calendar: sluice.Year, Location: berlin}, []calRow{
			{b(2026, 12, 31, 23, 59), 365, true, 0, 0, time.Minute + 365*24*h},
			{b(2027, 1, 1, 0, 0), 1, false, 24 * h, 0, 365 * 24 * h}, // 365·(365d - e) ≤ 364·365d: e = 1 day
			{b(2027, 1, 2, 0, 0), 1, true, 0, 0, -1},
		})
	})
	t.Run("week, ISO week 53 (2026-12-28 to 2027-01-04)", func(t *testing.T) {
		runCalendarRows(t, sluice.Policy{Name: "weekly", Algorithm: sluice.FixedWindow, Limit: 1, Calendar: sluice.Week, Location: berlin}, []calRow{
			{b(2026, 12, 28, 0, 0), 1, true, 0, 0, 7 * 24 * h},
			{b(2027, 1, 1, 0, 0), 1, false, 3 * 24 * h, 0, 3 * 24 * h},
			{b(2027, 1, 4, 0, 0), 1, true, 0, 0, 7 * 24 * h},
		})
	})
}

// The memory store on a virtual clock decides calendar policies as the core does (which is
// checked against its model in package algorithm), over several keys, by Decide and by DecideAll
// of a day and a month policy at once (all or nothing), at random instants near real edges.
func TestCalendarAgainstCore(t *testing.T) {
	origins := []time.Time{
		time.Date(2026, 3, 28, 20, 0, 0, 0, time.UTC), time.Date(2026, 10, 24, 20, 0, 0, 0, time.UTC),
		time.Date(2028, 2, 28, 12, 0, 0, 0, time.UTC), time.Date(2026, 12, 27, 12, 0, 0, 0, time.UTC),
	}
	for _, z := range []string{"Europe/Berlin", "America/New_York", "UTC", "Australia/Lord_Howe"} {
		loc := zone(t, z)
		for _, alg := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindow} {
			for oi, origin := range origins {
				t.Run(fmt.Sprintf("%v/%s/%d", alg, z, oi), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(oi), uint64(alg)))
					day := sluice.Policy{Name: "d", Algorithm: alg, Limit: 7, Calendar: sluice.Day, Location: loc}
					month := sluice.Policy{Name: "m", Algorithm: alg, Limit: 40, Calendar: sluice.Month, Location: loc}
					week := sluice.Policy{Name: "w", Algorithm: alg, Limit: 15, Calendar: sluice.Week, Location: loc}
					clock := sluice.NewManualClock(origin)
					st := memory.New(memory.WithClock(clock), memory.WithSweepInterval(time.Microsecond))
					ref := map[string]*algorithm.State{}
					state := func(name, key string) *algorithm.State {
						if ref[name+"/"+key] == nil {
							ref[name+"/"+key] = new(algorithm.State)
						}
						return ref[name+"/"+key]
					}
					now := origin
					for i := range 400 {
						switch x := rng.IntN(10); {
						case x < 4:
							now = now.Add(time.Duration(rng.Int64N(int64(3 * time.Hour))))
						case x < 6:
							_, _, end := day.WindowOf(now.UnixMicro())
							now = time.UnixMicro(end + rng.Int64N(3) - 1)
						case x < 7:
							now = now.Add(time.Duration(rng.Int64N(int64(2 * time.Minute))))
						}
						clock.Set(now)
						at := now.UnixMicro()
						key := fmt.Sprint("k", rng.IntN(3))
						cost := rng.Int64N(4)
						if rng.IntN(2) == 0 {
							want, _ := algorithm.Decide(&week, state("w", key), at, cost)
							got, err := st.Decide(context.Background(), key, week, cost)
							if err != nil || got != want {
								t.Fatalf("step %d at %v: Decide %+v, %v; the core says %+v", i, now.In(loc), got, err, want)
							}
							continue
						}
						// All or nothing: decide each on a copy, consume only if both approve.
						sd, sm := *state("d", key), *state("m", key)
						wd, _ := algorithm.Decide(&day, &sd, at, cost)
						wm, _ := algorithm.Decide(&month, &sm, at, cost)
						if wd.Allowed && wm.Allowed {
							*state("d", key), *state("m", key) = sd, sm
						}
						var out [2]sluice.Decision
						ok, err := st.DecideAll(context.Background(), key, []sluice.Limit{{Policy: day, Cost: cost}, {Policy: month, Cost: cost}}, out[:])
						if err != nil || ok != (wd.Allowed && wm.Allowed) || out[0] != wd || out[1] != wm {
							t.Fatalf("step %d at %v: DecideAll %v %+v, %v; the core says %+v", i, now.In(loc), ok, out, err, [2]sluice.Decision{wd, wm})
						}
					}
				})
			}
		}
	}
}

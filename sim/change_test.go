package sim

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// A change applies from its instant on, as a reload would: a fixed window of 5 a second raised
// to 8 at 2s lets 5, 5, then 8, 8 of 10 a second through, and raised in the middle of a window it
// keeps the window's count; a token bucket's burst raised at 2s gains the extra tokens only (the
// spent ones carry over), and so does its limit.
func TestChangesApplyFromTheirInstant(t *testing.T) {
	reqs, err := ParseTraffic("10/s for 4s")
	if err != nil {
		t.Fatal(err)
	}
	perSecond := func(p sluice.Policy, changes ...string) [4]int64 {
		t.Helper()
		o := Options{}
		for _, c := range changes {
			ch, err := ParseChange(c)
			if err != nil {
				t.Fatal(err)
			}
			o.Changes = append(o.Changes, ch)
		}
		res, err := o.Run(p, reqs)
		if err != nil {
			t.Fatal(err)
		}
		var n [4]int64
		for _, r := range res.Rows {
			if r.Allowed {
				n[r.TMicros/1_000_000]++
			}
		}
		return n
	}
	fixed := sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 5, Period: time.Second}
	if got, want := perSecond(fixed, "t=2s,limit=8"), [4]int64{5, 5, 8, 8}; got != want {
		t.Errorf("fixed-window 5/s, limit 8 from 2s: allowed per second %v, want %v", got, want)
	}
	// At 2.5s the window has counted 5 (2.0s to 2.4s): 3 more under 8, not 8.
	if got, want := perSecond(fixed, "t=2.5s,limit=8"), [4]int64{5, 5, 8, 8}; got != want {
		t.Errorf("fixed-window 5/s, limit 8 from 2.5s: allowed per second %v, want %v", got, want)
	}
	if got, want := perSecond(fixed), [4]int64{5, 5, 5, 5}; got != want {
		t.Errorf("fixed-window 5/s unchanged: allowed per second %v, want %v", got, want)
	}
	// 10/s against 5/s with a bucket of 5: 5 + the refills (every 200 ms) in the first second,
	// then one request in two. Burst 10 from 2s: 5 more tokens, no more.
	bucket := sluice.Policy{Algorithm: sluice.TokenBucket, Limit: 5, Period: time.Second}
	plain := perSecond(bucket)
	raised := perSecond(bucket, "t=2s,burst=10")
	if raised[0] != plain[0] || raised[1] != plain[1] || raised[2]+raised[3] != plain[2]+plain[3]+5 {
		t.Errorf("token-bucket burst 5 → 10 at 2s: allowed per second %v, without the change %v: want 5 more after 2s", raised, plain)
	}
	// A new limit keeps the use: at 2s 4 units are in use (the last approval, at 1.8s, emptied
	// the bucket), so under 20 the bucket has 16 left, refilled 20 a second: every request after
	// 2s passes. Lowered to 2 instead, the 4 drain at 2 a second until one fits in the bucket of
	// 2, at 3.5s: nothing passes in the third second, one in the fourth.
	if got := perSecond(bucket, "t=2s,limit=20"); got[2] != 10 || got[3] != 10 {
		t.Errorf("token-bucket limit 20 from 2s: allowed per second %v, want every request after 2s", got)
	}
	if got := perSecond(bucket, "t=2s,limit=2"); got[2] != 0 || got[3] != 1 {
		t.Errorf("token-bucket limit 2 from 2s: allowed per second %v, want none in the third second, one in the fourth", got)
	}
}

func TestParseChange(t *testing.T) {
	for _, text := range []string{"t=30s,limit=20", "t=1.5s,burst=0", "t=0s,limit=3,burst=7"} {
		c, err := ParseChange(text)
		if err != nil {
			t.Fatalf("ParseChange(%q): %v", text, err)
		}
		if c.String() != text {
			t.Errorf("ParseChange(%q).String() = %q", text, c.String())
		}
	}
	for text, want := range map[string]string{
		"t=30s":                  "want t=D and limit=N or burst=N",
		"limit=3":                "want t=D",
		"t=1s,limit=0":           "limit=0: must be > 0",
		"t=1s,burst=-1":          "burst=-1: must be ≥ 0",
		"t=-1s,limit=3":          "t=-1s: must be a whole number of µs",
		"t=soon,limit=3":         "t=soon: time: invalid duration",
		"t=1s,rate=3":            `unknown "rate"`,
		"t=1s,limit=3,limit=4":   "each once",
		"t=1s,limit=three":       "limit=three: ",
		"t=1ns,limit=3":          "t=1ns: must be a whole number of µs",
		"t=1s;limit=3":           "t=1s;limit=3",
		"":                       "want t=D",
		"t=1s,limit=3,burst=2,x": "each once",
	} {
		if _, err := ParseChange(text); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseChange(%q) = %v, want an error containing %q", text, err, want)
		}
	}
}

// Changes out of time order, one that makes an invalid policy, and changes on a fleet are
// errors that say so.
func TestChangesErrors(t *testing.T) {
	p := sluice.Policy{Algorithm: sluice.TokenBucket, Limit: 5, Period: time.Second}
	reqs := []Request{{TMicros: 0, Key: DefaultKey, Cost: 1}}
	for want, o := range map[string]Options{
		"must be in time order": {Changes: []Change{{TMicros: 2, Limit: 3}, {TMicros: 1, Limit: 4}}},
		"over 285 years":        {Changes: []Change{{TMicros: 1, Burst: 1 << 50, SetBurst: true}}},
		"not to a fleet":        {Changes: []Change{{TMicros: 1, Limit: 3}}, Fleet: &Fleet{Instances: 2}},
	} {
		if _, err := o.Run(p, reqs); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%+v: %v, want an error containing %q", o, err, want)
		}
	}
}

// A change takes effect at its own instant, not at the next call after it: a leaky bucket whose
// limit rises from 5 to 9 a second at 1.2s, between two requests of 12 a second (1.1667s and
// 1.25s), decides the same whether or not something peeks at 1.2s (as the browser page does at
// every time slice), and differs from the change made at the next request, 1.25s (its queue
// drains at the new rate from 1.2s, not from 1.25s).
func TestChangeAppliesAtItsInstant(t *testing.T) {
	reqs, err := ParseTraffic("12/s for 5.2s")
	if err != nil {
		t.Fatal(err)
	}
	p := sluice.Policy{Algorithm: sluice.LeakyBucket, Limit: 5, Period: time.Second, Burst: 10}
	run := func(change string, peekAt int64) Summary {
		t.Helper()
		c, err := ParseChange(change)
		if err != nil {
			t.Fatal(err)
		}
		s, err := Options{Changes: []Change{c}}.NewSession(p, 1)
		if err != nil {
			t.Fatal(err)
		}
		var sum Summary
		peeked := false
		for _, rq := range reqs {
			if !peeked && peekAt >= 0 && rq.TMicros > peekAt {
				if _, err := s.Peek(peekAt, rq.Key); err != nil {
					t.Fatal(err)
				}
				peeked = true
			}
			row, err := s.Decide(rq)
			if err != nil {
				t.Fatal(err)
			}
			sum.Add(row)
		}
		return sum
	}
	plain, peeked := run("t=1.2s,limit=9", -1), run("t=1.2s,limit=9", 1_200_000)
	if plain != peeked {
		t.Errorf("a peek at the change's instant changed the run:\n without %+v\n with    %+v", plain, peeked)
	}
	if later := run("t=1.25s,limit=9", -1); later.TotalDelayMicros == plain.TotalDelayMicros {
		t.Errorf("the change at 1.2s delays as much in all as at 1.25s (%d µs): it took effect at the next request", later.TotalDelayMicros)
	}
}

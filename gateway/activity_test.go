package gateway

import (
	"testing"
	"time"
)

// Rates average the last whole seconds; a slot a lap old does not count; limited means refused
// within the rate span or still inside the last Retry-After.
func TestActivityRates(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	a := &activity{started: t0.Add(-time.Hour)}
	for s := 0; s < 10; s++ { // 5 allowed and 1 refused a second for 10 s
		now := t0.Add(time.Duration(s) * time.Second)
		for i := 0; i < 5; i++ {
			a.record("p", outcomeAllowed, now, time.Time{})
		}
		a.record("p", outcomeRefused, now, now.Add(2*time.Second))
	}
	a.record("q", outcomeDelayed, t0, time.Time{})
	at := func(d time.Duration) map[string]ClientStats {
		got, span := a.snapshot(t0.Add(d))
		if span != rateSpan {
			t.Fatalf("span %d", span)
		}
		m := map[string]ClientStats{}
		for _, c := range got {
			m[c.Client] = c
		}
		return m
	}
	m := at(10 * time.Second)
	if p := m["p"]; p.AllowedRate != 5 || p.RefusedRate != 1 || p.Allowed != 50 || p.Refused != 10 || !p.Limited {
		t.Fatalf("p after 10 s: %+v", p)
	}
	if q := m["q"]; q.DelayedRate != 0.1 || q.Limited {
		t.Fatalf("q: %+v", q)
	}
	// 15 s on: half the span has no traffic; p's last refusal is 6 s old.
	if p := at(15 * time.Second)["p"]; p.AllowedRate != 2.5 || !p.Limited {
		t.Fatalf("p after 15 s: %+v", p)
	}
	// A lap later the ring's slots hold old seconds: no rate, no longer limited, totals kept.
	if p := at(rateWindow*time.Second + 5*time.Second)["p"]; p.AllowedRate != 0 || p.Limited || p.Allowed != 50 {
		t.Fatalf("p a lap later: %+v", p)
	}
	// A new second in a reused slot starts from zero.
	now := t0.Add(rateWindow * time.Second)
	a.record("p", outcomeAllowed, now, time.Time{})
	if p := at(rateWindow*time.Second + time.Second)["p"]; p.AllowedRate != 0.1 {
		t.Fatalf("p after the slot was reused: %+v", p)
	}
}

package shed

import (
	"testing"
	"time"
)

// A virtual clock: every test below chooses each request's latency and the time it ends.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

var params = Params{MinLimit: 4, MaxLimit: 64, Window: 100 * time.Millisecond, BaselineWindow: 10 * time.Second,
	Tolerance: 2, Slack: 5 * time.Millisecond}

// window runs one window of the virtual clock from *now: n requests of priority p go in flight at
// once (those admitted), and each answers after latency; the window then closes. It returns how
// many were admitted.
func window(l *Limiter, now *time.Time, n int, p Priority, latency time.Duration) int {
	admitted := 0
	for range n {
		if l.Acquire(p, *now) {
			admitted++
		}
	}
	end := now.Add(max(latency, params.Window))
	for i := range admitted { // the last one's answer closes the window
		at := end
		if i < admitted-1 {
			at = end.Add(-time.Nanosecond)
		}
		l.Release(latency, true, at)
	}
	*now = end
	return admitted
}

func TestHealthyAdmitsEverything(t *testing.T) {
	l := New(params)
	now := t0
	for i := range 200 {
		lat := 10*time.Millisecond + time.Duration(i%7)*time.Millisecond // jitter within 2× + slack
		if got := window(l, &now, 32, Low, lat); got != 32 {
			t.Fatalf("window %d: %d of 32 low-priority requests admitted by a healthy upstream", i, got)
		}
	}
	if s := l.State(); s.Limit != 64 || s.Shed != [Priorities]uint64{} || s.InFlight != 0 {
		t.Fatalf("healthy: %+v", s)
	}
}

func TestShareRule(t *testing.T) {
	l := New(Params{MinLimit: 1, MaxLimit: 10, Window: time.Second, BaselineWindow: time.Minute, Tolerance: 2})
	// limit 10: low while in flight < 5, normal while < 7, high while < 10.
	for i, want := range []struct {
		p  Priority
		ok bool
	}{{Low, true}, {Low, true}, {Low, true}, {Low, true}, {Low, true}, {Low, false}, {Normal, true}, {Normal, true}, {Normal, false},
		{High, true}, {High, true}, {High, true}, {High, false}, {Low, false}} {
		if got := l.Acquire(want.p, t0); got != want.ok {
			t.Fatalf("request %d (%v) with %d in flight: admitted %v", i, want.p, l.State().InFlight, got)
		}
	}
	if s := l.State(); s.InFlight != 10 || s.Shed != [Priorities]uint64{Low: 2, Normal: 1, High: 1} || s.Admitted != [Priorities]uint64{5, 2, 3} {
		t.Fatalf("%+v", s)
	}
	// The smallest limit still admits one of each priority.
	l = New(Params{MinLimit: 1, MaxLimit: 1, Window: time.Second, Tolerance: 2})
	if !l.Acquire(Low, t0) || l.Acquire(High, t0) {
		t.Fatal("limit 1: the first request of any priority goes in, the second waits")
	}
}

// TestSlowedThenRecovered: the upstream's latency goes from 10ms to 100ms: each window halves the
// limit (the gradient's floor, 0.5) down to MinLimit, in flight never above it, low priority shed
// while high is served; latency back at 10ms, the limit climbs back to MaxLimit, by its square
// root per busy window.
func TestSlowedThenRecovered(t *testing.T) {
	l := New(params)
	now := t0
	for range 5 {
		window(l, &now, 40, Normal, 10*time.Millisecond)
	}
	want := []int{32, 16, 8, 4, 4, 4}
	for i, w := range want {
		window(l, &now, 40, Normal, 100*time.Millisecond)
		if s := l.State(); s.Limit != w || s.Baseline != 10*time.Millisecond || s.Latency != 100*time.Millisecond {
			t.Fatalf("slowed window %d: %+v, want limit %d", i, s, w)
		}
	}
	// At the bottom: a low request is admitted only below 2 in flight, a high one below 4.
	if got := window(l, &now, 10, Low, 100*time.Millisecond); got != 2 {
		t.Fatalf("low admitted at limit 4: %d", got)
	}
	lows := 0
	for range 2 {
		if l.Acquire(Low, now) {
			lows++
		}
	}
	highs := 0
	for range 4 {
		if l.Acquire(High, now) {
			highs++
		}
	}
	if lows != 2 || highs != 2 || l.State().InFlight != 4 {
		t.Fatalf("in flight: %d lows then %d highs admitted, %d in flight (limit 4)", lows, highs, l.State().InFlight)
	}
	for i := range 4 { // the last answer closes the window
		at := now.Add(100 * time.Millisecond)
		if i < 3 {
			at = at.Add(-time.Nanosecond)
		}
		l.Release(100*time.Millisecond, true, at)
	}
	now = now.Add(100 * time.Millisecond)
	// Recovered: limit 4 → 6 → 8.4 → 11.3 → ... → 64, each busy window.
	prev := l.State().Limit
	for i := 0; prev < 64; i++ {
		if i > 20 {
			t.Fatalf("the limit did not climb back: %+v", l.State())
		}
		window(l, &now, 64, High, 10*time.Millisecond)
		s := l.State()
		if s.Limit <= prev {
			t.Fatalf("recovering window %d: limit %d after %d", i, s.Limit, prev)
		}
		prev = s.Limit
	}
	if got := window(l, &now, 32, Low, 10*time.Millisecond); got != 32 {
		t.Fatalf("recovered: %d of 32 admitted", got)
	}
}

// TestIdleDoesNotGrow: a window that used less than half the limit leaves it where it is.
func TestIdleDoesNotGrow(t *testing.T) {
	l := New(params)
	now := t0
	window(l, &now, 64, High, 10*time.Millisecond)
	window(l, &now, 64, High, 100*time.Millisecond) // 64 → 32
	for range 10 {
		window(l, &now, 15, High, 10*time.Millisecond) // 15 < 32/2
	}
	if s := l.State(); s.Limit != 32 {
		t.Fatalf("idle windows moved the limit: %+v", s)
	}
	window(l, &now, 16, High, 10*time.Millisecond)
	if s := l.State(); s.Limit != 37 { // 32 + √32
		t.Fatalf("a busy window: %+v", s)
	}
}

// TestBaselineFollowsAPermanentChange: the baseline is the lowest window mean of the last
// BaselineWindow, so an upstream that stays slower becomes the new normal once the fast windows
// are that far back, and the limit climbs again.
func TestBaselineFollowsAPermanentChange(t *testing.T) {
	p := params
	p.BaselineWindow = time.Second
	l := New(p)
	now := t0
	window(l, &now, 40, High, 10*time.Millisecond)
	for range 5 {
		window(l, &now, 40, High, 100*time.Millisecond)
	}
	if s := l.State(); s.Limit != 4 {
		t.Fatalf("%+v", s)
	}
	for range 10 {
		window(l, &now, 64, High, 100*time.Millisecond)
	}
	if s := l.State(); s.Baseline != 100*time.Millisecond || s.Limit <= 4 {
		t.Fatalf("a second of slowness later: %+v", s)
	}
}

// TestUnansweredNotMeasured: a request the upstream did not answer gives its slot back and
// changes nothing else.
func TestUnansweredNotMeasured(t *testing.T) {
	l := New(params)
	for range 10 {
		l.Acquire(High, t0)
	}
	for range 10 {
		l.Release(time.Hour, false, t0.Add(time.Hour))
	}
	if s := l.State(); s.Limit != 64 || s.InFlight != 0 || s.Latency != 0 {
		t.Fatalf("%+v", s)
	}
}

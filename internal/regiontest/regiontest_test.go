package regiontest

import (
	"errors"
	"testing"
	"time"
)

// TestWindowOf: an admission's window from its send and answer times and its RateLimit t (the
// rest of the window rounded up to whole seconds), at the boundaries of the rounding.
func TestWindowOf(t *testing.T) {
	p := 3 * time.Second
	w := time.Unix(300, 0) // a window's start: index 100
	at := func(d time.Duration) time.Time { return w.Add(d) }
	for _, c := range []struct {
		sent, got time.Duration
		t         time.Duration
		want      int64
	}{
		{0, 10 * time.Millisecond, 3 * time.Second, 100},                         // decided at its start
		{2990 * time.Millisecond, 3010 * time.Millisecond, time.Second, 100},     // decided at 2.995 s: 5 ms left, t=1
		{2990 * time.Millisecond, 3010 * time.Millisecond, 3 * time.Second, 101}, // decided at 3.001 s in the next: t=3
		{1500 * time.Millisecond, 1500 * time.Millisecond, 2 * time.Second, 100}, // 1.5 s left: t=2
		{-5 * time.Millisecond, 5 * time.Millisecond, 3 * time.Second, 100},      // decided at 0 exactly, 3 s left
		{-5 * time.Millisecond, 5 * time.Millisecond, time.Second, 99},           // decided just before 0
		{2 * time.Second, 3500 * time.Millisecond, 1 * time.Second, 100},         // 1.5 s in flight, still one window
		{100 * time.Millisecond, 1900 * time.Millisecond, 3 * time.Second, 100},  // t=3: the end in (2.1 s, 4.9 s]: 3 s
		{100 * time.Millisecond, 1900 * time.Millisecond, 2 * time.Second, 100},  // t=2: in (1.1 s, 3.9 s]: 3 s
		{2900 * time.Millisecond, 4 * time.Second, 3 * time.Second, 101},         // t=3 after the boundary: (4.9 s, 7 s]: 6 s
		{2900 * time.Millisecond, 3100 * time.Millisecond, 1 * time.Second, 100}, // t=1: (2.9 s, 4.1 s]: 3 s
	} {
		got, err := WindowOf(at(c.sent), at(c.got), c.t, p)
		if err != nil || got != c.want {
			t.Errorf("sent %v, answered %v, t=%v: window %d, %v; want %d", c.sent, c.got, c.t, got, err, c.want)
		}
	}
	// 2.5 s in flight with a 3 s period: two window ends fit in (2.5 s, 6 s], the window is not known.
	if _, err := WindowOf(at(500*time.Millisecond), at(3000*time.Millisecond), 3*time.Second, p); !errors.Is(err, ErrAmbiguous) {
		t.Errorf("2.5 s in flight: %v; want ErrAmbiguous", err)
	}
}

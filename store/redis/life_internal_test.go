package redis

import (
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// TestSlowOrDown walks a slot's record of Redis's replies through the rules of life.go on a
// virtual clock (µs): Timeout T = 50 ms, SlowTimeout S = 500 ms.
func TestSlowOrDown(t *testing.T) {
	const ms int64 = 1000
	const T, S = 50 * ms, 500 * ms
	s := &Store{timeout: time.Duration(T) * time.Microsecond, slow: time.Duration(S) * time.Microsecond}
	isSlow := func(err error) bool {
		return errors.Is(err, sluice.ErrStoreUnavailable) && errors.Is(err, sluice.ErrStoreSlow)
	}
	isDown := func(err error) bool {
		return errors.Is(err, sluice.ErrStoreUnavailable) && !errors.Is(err, sluice.ErrStoreSlow)
	}
	at := func(us int64) time.Time { return processStart.Add(time.Duration(us) * time.Microsecond) }
	c := &conn{lives: newLife(false)}
	l := c.life(0)
	// deadline is the bound of a call sent at sent (µs), whose caller would wait S.
	deadline := func(sent int64) int64 { return micros(s.deadline(c, 0, at(sent), at(sent+S), s.timeout)) }

	l.heard.Store(1_000 * ms) // Redis's last reply, at 1 s
	if d := deadline(1_000 * ms); d != 1_000*ms+S {
		t.Fatalf("a call's deadline: %d; want S after its send", d)
	}
	// A call that gets no reply within S while Redis answers others: slow, which the breaker
	// does not count (a busy machine, a slow script).
	l.heard.Store(1_300 * ms)
	if err := s.verdict(l, 1_000*ms, 1_500*ms, true); !isSlow(err) {
		t.Fatalf("no reply in S, Redis answering others: %v; want ErrStoreSlow", err)
	}
	// Redis falls silent after its reply at 1.3 s (frozen). A call sent before that reply ends
	// slow; one sent after it, with no reply at all in its S, is down — once the second look
	// (after silenceRecheck) finds no reply either.
	if err := s.verdict(l, 1_200*ms, 1_700*ms, true); !isSlow(err) {
		t.Fatalf("a call sent before Redis's last reply: %v; want ErrStoreSlow", err)
	}
	if err := s.verdict(l, 1_350*ms, 1_850*ms, true); err != nil {
		t.Fatalf("the first look at a silence S long: %v; want a second look", err)
	}
	if l.isDown() {
		t.Fatal("Redis found down before the second look")
	}
	if err := s.verdict(l, 1_350*ms, 1_860*ms, false); !isDown(err) {
		t.Fatalf("the second look at a silence S long: %v; want Redis down", err)
	}
	// Known down, a call waits T, not S, and is down when it ends without a reply; a settlement
	// that timed out is down too.
	if d := deadline(1_900 * ms); d != 1_900*ms+T {
		t.Fatalf("a call's deadline with Redis known down: %d; want T after its send", d)
	}
	if err := s.verdict(l, 1_900*ms, 1_950*ms, true); !isDown(err) {
		t.Fatalf("a call with Redis known down, at its T: %v; want Redis down", err)
	}
	if err := s.verdict(l, 1_900*ms, 1_950*ms, false); !isDown(err) {
		t.Fatalf("a settlement with Redis known down, at its T: %v; want Redis down", err)
	}
	// Not known down, a settlement that timed out at its T is slow: T is no silence.
	var fresh slotLife
	fresh.down.Store(-1)
	if err := s.verdict(&fresh, 0, T, false); !isSlow(err) {
		t.Fatalf("a settlement's T without a reply: %v; want ErrStoreSlow", err)
	}
	// Any reply ends it: the next call waits S again, and is slow if it ends in a shorter silence.
	l.heard.Store(2_000 * ms)
	if l.isDown() {
		t.Fatal("Redis still known down after a reply")
	}
	if d := deadline(2_010 * ms); d != 2_010*ms+S {
		t.Fatalf("a call's deadline after a reply: %d; want S after its send", d)
	}
	// With S = T (no patience), a call without any reply for T is down.
	s.slow = s.timeout
	if err := s.verdict(&fresh, 0, T, false); !isDown(err) {
		t.Fatalf("S = T, a call silent for T: %v; want Redis down", err)
	}
}

package gateway

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// histStart is the history tests' virtual time: the start of a slot.
var histStart = time.Unix(1_800_000_000, 0)

// The history folds each slot once it has ended: its allowed, refused and delayed over every
// client, and the clients refused the most, most first then by name; a slot still running is
// not folded, nor one folded before; quiet slots are zeros.
func TestHistoryFoldsEndedSlots(t *testing.T) {
	a := &activity{started: histStart}
	h := history{start: slotOf(histStart)}
	// Slot 0: p 3 allowed and 2 refused a second for 10 s; q 1 refused and 1 delayed; r 2 refused.
	for s := 0; s < 10; s++ {
		now := histStart.Add(time.Duration(s) * time.Second)
		for i := 0; i < 3; i++ {
			a.record("p", outcomeAllowed, now, time.Time{})
		}
		a.record("p", outcomeRefused, now, now)
		a.record("p", outcomeRefused, now, now)
	}
	a.record("q", outcomeRefused, histStart.Add(3*time.Second), histStart)
	a.record("q", outcomeDelayed, histStart.Add(4*time.Second), histStart)
	a.record("r", outcomeRefused, histStart.Add(5*time.Second), histStart)
	a.record("r", outcomeRefused, histStart.Add(9*time.Second), histStart)
	// A request of slot 1 (still running at the first fold).
	a.record("p", outcomeAllowed, histStart.Add(10*time.Second), time.Time{})

	if got := h.fold(a, histStart.Add(10*time.Second)); len(got) != 0 {
		t.Fatalf("a fold at the slot's end, before the lag: %+v, want nothing (the slot may still get late decisions)", got)
	}
	got := h.fold(a, histStart.Add(11*time.Second))
	if len(got) != 1 {
		t.Fatalf("folded %d slots, want 1: %+v", len(got), got)
	}
	s := got[0]
	want := []ClientRefused{{"p", 20}, {"r", 2}, {"q", 1}}
	if !s.Start.Equal(histStart) || s.Allowed != 30 || s.Refused != 23 || s.Delayed != 1 || fmt.Sprint(s.TopRefused) != fmt.Sprint(want) {
		t.Fatalf("slot 0: %+v, want 30 allowed, 23 refused, 1 delayed, top %v", s, want)
	}
	if again := h.fold(a, histStart.Add(15*time.Second)); len(again) != 0 {
		t.Fatalf("folded again: %+v", again)
	}
	// Slots 1 and 2 end; slot 1 has p's one request, slot 2 none.
	got = h.fold(a, histStart.Add(31*time.Second))
	if len(got) != 2 || got[0].Allowed != 1 || got[0].Refused != 0 || len(got[0].TopRefused) != 0 || got[1].Allowed+got[1].Refused+got[1].Delayed != 0 {
		t.Fatalf("slots 1 and 2: %+v", got)
	}
	list := h.slots(histStart.Add(31*time.Second), time.Hour)
	if len(list) != 3 || !list[0].Start.Equal(histStart) || !list[2].Start.Equal(histStart.Add(20*time.Second)) {
		t.Fatalf("the hour's slots: %+v, want slots 0 to 2", list)
	}
	if w := h.slots(histStart.Add(31*time.Second), 10*time.Second); len(w) != 1 || !w[0].Start.Equal(histStart.Add(20*time.Second)) {
		t.Fatalf("the last 10 s: %+v, want slot 2", w)
	}
}

// Folded every few seconds for two hours, the ring holds the last hour only: 360 slots, the
// oldest an hour before the last; a fold that comes after the per-second rings forgot a slot
// leaves a gap, not zeros, and one from before the start folds nothing before it.
func TestHistoryHoldsAnHour(t *testing.T) {
	a := &activity{started: histStart}
	h := history{start: slotOf(histStart)}
	if got := h.fold(a, histStart.Add(-time.Hour)); len(got) != 0 {
		t.Fatalf("a fold before the start: %+v", got)
	}
	now := histStart
	for i := 0; i < 2*360*2; i++ { // every 5 s, one request each 5 s
		a.record("p", outcomeAllowed, now, time.Time{})
		now = now.Add(5 * time.Second)
		h.fold(a, now)
	}
	list := h.slots(now, time.Hour)
	if len(list) != historySlots {
		t.Fatalf("%d slots in the hour, want %d", len(list), historySlots)
	}
	for i, s := range list {
		if s.Allowed != 2 {
			t.Fatalf("slot %d (%v): %d allowed, want 2", i, s.Start, s.Allowed)
		}
		if i > 0 && s.Start.Sub(list[i-1].Start) != historyResolution {
			t.Fatalf("slot %d at %v after %v", i, s.Start, list[i-1].Start)
		}
	}
	last := list[len(list)-1].Start
	if age := now.Sub(last); age < historyResolution || age > 2*historyResolution {
		t.Fatalf("the last slot starts %v before now", age)
	}
	if span := last.Sub(list[0].Start); span != time.Hour-historyResolution {
		t.Fatalf("the slots span %v, want an hour", span)
	}
	// Two minutes without a fold: the slots whose seconds the rings no longer hold are left out.
	for i := 0; i < 24; i++ {
		a.record("p", outcomeAllowed, now, time.Time{})
		now = now.Add(5 * time.Second)
	}
	got := h.fold(a, now)
	if len(got) == 0 || len(got) > (rateWindow/10)+1 {
		t.Fatalf("a late fold folded %d slots; want those the rings still hold (at most %d)", len(got), rateWindow/10+1)
	}
	for _, s := range got {
		if s.Allowed != 2 {
			t.Fatalf("a late fold's slot %v: %d allowed, want 2", s.Start, s.Allowed)
		}
	}
	list = h.slots(now, time.Hour)
	if n := len(list); n >= historySlots || n < historySlots-13 {
		t.Fatalf("%d slots in the hour after a gap of two minutes, want fewer than %d (the gap), but no fewer than %d", n, historySlots, historySlots-13)
	}
}

// A slot names at most 5 clients, the most refused, whatever the number of clients: a million
// through the selection the fold uses, 20,000 through a fold, and the fleet's slot of a million
// names read back.
func TestHistoryTopBounded(t *testing.T) {
	var top []ClientRefused
	for i := 0; i < 1_000_000; i++ {
		top = addTop(top, fmt.Sprintf("c%07d", i), uint64(i%1000))
		if len(top) > historyTop {
			t.Fatalf("after %d clients the top holds %d", i+1, len(top))
		}
	}
	want := []ClientRefused{{"c0000999", 999}, {"c0001999", 999}, {"c0002999", 999}, {"c0003999", 999}, {"c0004999", 999}}
	if fmt.Sprint(top) != fmt.Sprint(want) {
		t.Fatalf("top of a million: %v, want %v", top, want)
	}

	a := &activity{started: histStart}
	for i := 0; i < 20_000; i++ {
		a.record(fmt.Sprintf("client-%05d", i), outcomeRefused, histStart.Add(time.Duration(i%10)*time.Second), histStart)
	}
	for i := 0; i < 7; i++ { // a few clients refused more
		for j := 0; j <= i; j++ {
			a.record(fmt.Sprintf("heavy-%d", i), outcomeRefused, histStart, histStart)
		}
	}
	h := history{start: slotOf(histStart)}
	got := h.fold(a, histStart.Add(21*time.Second))
	if len(got) != 2 || got[0].Refused != 20_000+28 {
		t.Fatalf("the fold of 20,000 clients: %d slots, %+v", len(got), got)
	}
	want = []ClientRefused{{"heavy-6", 7}, {"heavy-5", 6}, {"heavy-4", 5}, {"heavy-3", 4}, {"heavy-2", 3}}
	if fmt.Sprint(got[0].TopRefused) != fmt.Sprint(want) {
		t.Fatalf("the most refused of 20,000: %v, want %v", got[0].TopRefused, want)
	}

	fields := map[string]int64{fieldAllowed: 5, fieldRefused: 1_000_000, fieldInstances: 3}
	for i := 0; i < 1_000_000; i++ {
		fields[fmt.Sprintf("%sc%07d", refusedField, i)] = 1 + int64(i%7)
	}
	s := SlotFromFields(180_000_000, fields)
	if len(s.TopRefused) != historyTop || s.TopRefused[0] != (ClientRefused{"c0000006", 7}) || s.Instances != 3 || s.Refused != 1_000_000 {
		t.Fatalf("the fleet's slot of a million names: %d named, %+v", len(s.TopRefused), s.TopRefused)
	}
}

// Writers recording while folds run (under -race): every request of the ended slots is in them,
// once.
func TestHistoryConcurrentWriters(t *testing.T) {
	a := &activity{started: histStart}
	h := history{start: slotOf(histStart)}
	const writers, perSecond = 4, 50
	// Each second's place in the rings is claimed first (the rings' rollover loses a request
	// counted while another claims the second: a view's bound, not the history's).
	for w := 0; w < writers; w++ {
		for s := 0; s < 20; s++ {
			a.record(fmt.Sprint("w", w), outcomeAllowed, histStart.Add(time.Duration(s)*time.Second), time.Time{})
		}
	}
	var wg sync.WaitGroup
	stop, folded := make(chan struct{}), make(chan []HistorySlot, 1)
	go func() { // folds while slots 0 and 1 are written: none may be folded before it ends
		var early []HistorySlot
		for {
			select {
			case <-stop:
				folded <- early
				return
			default:
				early = append(early, h.fold(a, histStart.Add(5*time.Second))...)
			}
		}
	}()
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := 0; s < 20; s++ {
				for i := 0; i < perSecond; i++ {
					out := outcomeAllowed
					if i%5 == 0 {
						out = outcomeRefused
					}
					a.record(fmt.Sprint("w", w), out, histStart.Add(time.Duration(s)*time.Second), histStart)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	if early := <-folded; len(early) != 0 {
		t.Fatalf("a slot folded before it ended: %+v", early)
	}
	got := h.fold(a, histStart.Add(21*time.Second))
	if len(got) != 2 {
		t.Fatalf("%d slots, want 2", len(got))
	}
	for _, s := range got {
		if s.Allowed != writers*10*(1+perSecond*4/5) || s.Refused != writers*10*perSecond/5 || len(s.TopRefused) != writers {
			t.Fatalf("slot %v: %+v, want %d allowed and %d refused", s.Start, s, writers*10*(1+perSecond*4/5), writers*10*perSecond/5)
		}
	}
}

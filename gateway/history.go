package gateway

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// The history: the last hour of this instance's figures, and of its fleet's, in slots of 10 s,
// so that the operator page's chart opens with the hour before it was opened (GET /v1/history).
//
// ONE HOME. The decisions are counted once, in activity (each client's per-second ring, which the
// rates read): the history adds nothing to a decision. A fold, every historyEvery and before each
// read, sums the seconds of each slot that has ended from those rings into one slot of its own
// ring: allowed, refused and delayed of every client together, and the historyTop clients that
// were refused the most in it (by the names the page shows: configured names and "anonymous",
// never a key). The per-second rings keep rateWindow seconds, so a slot is folded while its
// seconds are still in them (a fold that comes later than that finds them gone and leaves the
// slot out: a gap, not zeros).
//
// BOUNDED whatever the clients do: historySlots slots of three counts and at most historyTop
// names each, whatever the number of clients.
//
// THE FLEET. With a fleet history (a Redis store: Store.FleetHistory), each slot this instance
// folds is added to the fleet's slot in the store (every instance's counts summed), and a read
// returns the fleet's slots of the same hour beside this instance's. With the memory store, the
// fleet is this instance: there is no fleet history.

const (
	historyResolution = 10 * time.Second
	historySlots      = 360 // an hour of slots
	historyTop        = 5   // clients named per slot: the most refused
	// historyLag: a slot is folded once it ended this long ago, so that a decision recorded a
	// little after its instant (its time is taken when it is decided) is still in it.
	historyLag = time.Second
	// historyEvery is how often the Server folds (and adds to the fleet's slots) without a read.
	historyEvery = 5 * time.Second
	// historyTimeout bounds a call to the fleet's history in the store.
	historyTimeout = 2 * time.Second
)

// HistorySlot is one slot of 10 s of the history: what was decided in it.
type HistorySlot struct {
	Start   time.Time `json:"t"` // the slot's start; it ends resolution_s later
	Allowed uint64    `json:"allowed"`
	Refused uint64    `json:"refused"`
	Delayed uint64    `json:"delayed"` // allowed after a leaky-bucket hold (not in Allowed)
	// TopRefused is the (at most 5) clients refused the most in the slot, the most first, then
	// by name; none if nobody was refused. A fleet's slot has the most refused of those its
	// instances named.
	TopRefused []ClientRefused `json:"top_refused,omitempty"`
	// Instances is how many instances added their counts to a fleet's slot (0 in this
	// instance's history).
	Instances int `json:"instances,omitempty"`
}

// ClientRefused is a client's refusals in a slot.
type ClientRefused struct {
	Client  string `json:"client"`
	Refused uint64 `json:"refused"`
}

// FleetHistory keeps the fleet's history in the store its instances share: each instance adds
// the slots it folds, and any instance reads the sums. The store's adapter (cmd/sluice) maps a
// slot to integer fields (HistoryFields) and back (SlotFromFields).
type FleetHistory struct {
	// Add adds fields to the fleet's slot number slot (unix seconds / 10).
	Add func(ctx context.Context, slot int64, fields map[string]int64) error
	// Read returns the fleet's slots first to last (inclusive) that hold anything, by number.
	Read func(ctx context.Context, first, last int64) (map[int64]map[string]int64, error)
}

// Fields of a slot in the fleet's history: the counts, the instances that added to it, and a
// client's refusals under refusedField + its name.
const (
	fieldAllowed   = "allowed"
	fieldRefused   = "refused"
	fieldDelayed   = "delayed"
	fieldInstances = "instances"
	refusedField   = "r:"
)

// HistoryFields is what a slot of this instance adds to the fleet's: its counts, one instance,
// and each of its most refused clients' refusals.
func HistoryFields(s HistorySlot) map[string]int64 {
	f := map[string]int64{fieldAllowed: int64(s.Allowed), fieldRefused: int64(s.Refused), fieldDelayed: int64(s.Delayed), fieldInstances: 1}
	for _, c := range s.TopRefused {
		f[refusedField+c.Client] = int64(c.Refused)
	}
	return f
}

// SlotFromFields is the fleet's slot number n from its fields: the counts, and the historyTop
// clients refused the most of those its instances named.
func SlotFromFields(n int64, f map[string]int64) HistorySlot {
	s := HistorySlot{Start: time.Unix(n*int64(historyResolution/time.Second), 0).UTC(), Allowed: uint64(max(0, f[fieldAllowed])),
		Refused: uint64(max(0, f[fieldRefused])), Delayed: uint64(max(0, f[fieldDelayed])), Instances: int(max(0, f[fieldInstances]))}
	for k, v := range f {
		if name, ok := strings.CutPrefix(k, refusedField); ok && v > 0 {
			s.TopRefused = addTop(s.TopRefused, name, uint64(v))
		}
	}
	return s
}

// addTop adds a client's refusals to top, the (at most historyTop) most refused, most first then
// by name: a client with fewer than the least of a full top is left out.
func addTop(top []ClientRefused, name string, refused uint64) []ClientRefused {
	less := func(a, b ClientRefused) bool { // a before b
		return a.Refused > b.Refused || a.Refused == b.Refused && a.Client < b.Client
	}
	c := ClientRefused{Client: name, Refused: refused}
	if len(top) == historyTop && !less(c, top[historyTop-1]) {
		return top
	}
	if len(top) < historyTop {
		top = append(top, c)
	} else {
		top[historyTop-1] = c
	}
	for i := len(top) - 1; i > 0 && less(top[i], top[i-1]); i-- {
		top[i], top[i-1] = top[i-1], top[i]
	}
	return top
}

// history is this instance's ring of slots.
type history struct {
	mu   sync.Mutex
	ring [historySlots]HistorySlot // slot number n at n % historySlots
	held [historySlots]int64       // the number of the slot each place holds; 0: none
	next int64                     // the first slot not folded yet; 0: none folded
	// start is the slot the Server started in (by its clock): none before it is folded.
	start int64
	// unsent are the folded slots not yet in the fleet's history (the store did not take them),
	// oldest first, each sent again at every fold until it lands or is an hour old: at most
	// historySlots. An add sets this instance's counts of its slot, so one sent again after its
	// answer was lost counts once.
	unsent []HistorySlot
}

// toSend returns the slots to add to the fleet's now: those not sent before that are still
// within the hour by now, then added, oldest first; and forgets them until sendFailed gives the
// ones not taken back.
func (h *history) toSend(added []HistorySlot, now time.Time) []HistorySlot {
	h.mu.Lock()
	defer h.mu.Unlock()
	oldest := slotOf(now) - historySlots
	out := slices.DeleteFunc(h.unsent, func(s HistorySlot) bool { return slotOf(s.Start) < oldest })
	out = append(out, added...)
	h.unsent = nil
	return out
}

// sendFailed keeps slots, which the store did not take, to be sent at the next fold.
func (h *history) sendFailed(slots []HistorySlot) {
	if len(slots) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.unsent = append(slices.Clone(slots), h.unsent...)
	slices.SortFunc(h.unsent, func(a, b HistorySlot) int { return a.Start.Compare(b.Start) })
	if n := len(h.unsent); n > historySlots {
		h.unsent = slices.Clone(h.unsent[n-historySlots:])
	}
}

// slotOf is the number of the slot t is in.
func slotOf(t time.Time) int64 { return t.Unix() / int64(historyResolution/time.Second) }

// fold sums the slots of a that have ended by now (historyLag ago) and are not folded yet into
// the ring, and returns them, oldest first. A slot whose seconds the per-second rings no longer
// hold (or from before the start) is left out.
func (h *history) fold(a *activity, now time.Time) []HistorySlot {
	per := int64(historyResolution / time.Second)
	end := slotOf(now.Add(-historyLag)) // slots before it have ended
	sec := now.Unix()
	// The rings hold the seconds after sec - rateWindow: a slot whose first second is one of them.
	h.mu.Lock()
	defer h.mu.Unlock()
	lo := max(h.next, (sec-rateWindow)/per+1, h.start)
	if lo >= end {
		return nil
	}
	clients := a.clients.all()
	out := make([]HistorySlot, 0, end-lo)
	for n := lo; n < end; n++ {
		s := HistorySlot{Start: time.Unix(n*per, 0).UTC()}
		for name, c := range clients {
			var sums [numOutcomes]uint64
			for sec := n * per; sec < (n+1)*per; sec++ {
				p := &c.ring[sec%rateWindow]
				if p.sec.Load() != sec {
					continue
				}
				for i := range sums {
					sums[i] += p.counts[i].Load()
				}
			}
			s.Allowed += sums[outcomeAllowed]
			s.Refused += sums[outcomeRefused]
			s.Delayed += sums[outcomeDelayed]
			if sums[outcomeRefused] > 0 {
				s.TopRefused = addTop(s.TopRefused, name, sums[outcomeRefused])
			}
		}
		i := n % historySlots
		h.ring[i], h.held[i] = s, n
		out = append(out, s)
	}
	h.next = end
	return out
}

// slots returns the slots of the last window before now that the ring holds, oldest first.
func (h *history) slots(now time.Time, window time.Duration) []HistorySlot {
	end := slotOf(now.Add(-historyLag))
	first := end - int64(window/historyResolution)
	h.mu.Lock()
	defer h.mu.Unlock()
	out := []HistorySlot{}
	for n := first; n < end; n++ {
		if i := n % historySlots; h.held[i] == n {
			out = append(out, h.ring[i])
		}
	}
	return out
}

// foldHistory folds what has ended into the history and adds it to the fleet's, with the slots
// the store did not take before. At the first slot the store does not take, the rest wait for the
// next fold: an unreachable store costs a fold one timeout, not one per slot.
func (s *Server) foldHistory(ctx context.Context) {
	now := s.metrics.now()
	added := s.history.fold(s.metrics.activity, now)
	if s.fleetHistory == nil {
		return
	}
	send := s.history.toSend(added, now)
	for i, sl := range send {
		ctx, cancel := context.WithTimeout(ctx, historyTimeout)
		err := s.fleetHistory.Add(ctx, slotOf(sl.Start), HistoryFields(sl))
		cancel()
		if err != nil {
			s.log.Debug("history: slots not added to the fleet's yet (the store did not take them); sent again at the next fold",
				"slots", len(send)-i, "from", sl.Start, "error", err.Error())
			s.history.sendFailed(send[i:])
			return
		}
	}
}

// runHistory folds every historyEvery until stop is closed, then closes done.
func (s *Server) runHistory(stop, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(historyEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			s.foldHistory(context.Background())
		}
	}
}

// HistoryReport is the body of GET /v1/history.
type HistoryReport struct {
	Time              time.Time `json:"time"`
	ResolutionSeconds int       `json:"resolution_s"` // each slot's length
	WindowSeconds     int       `json:"window_s"`     // the time the slots cover, ending at the last slot ended
	// Instance is this instance's slots, oldest first: every slot folded since it started (a
	// slot missing is one not folded in time, or from before the start).
	Instance []HistorySlot `json:"instance"`
	// Fleet is the fleet's slots (every instance's counts summed), oldest first, the slots no
	// instance added to left out; null with the memory store (the fleet is this instance), or
	// if the store could not be read (FleetError says why).
	Fleet      []HistorySlot `json:"fleet"`
	FleetError string        `json:"fleet_error,omitempty"`
}

// historyQuery is what GET /v1/history takes.
var historyQuery = map[string]bool{"window": true}

// historyHandler serves GET /v1/history[?window=D]: the last hour (or window, 10s to 1h) of this
// instance's and its fleet's figures.
func (s *Server) historyHandler(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if unknownQuery(w, q, historyQuery, "window") {
		return
	}
	window := time.Duration(historySlots) * historyResolution
	if v, ok := q["window"]; ok {
		d, err := time.ParseDuration(v[0])
		if len(v) != 1 || err != nil || d < historyResolution || d > window || d%historyResolution != 0 {
			needsProblem(w, http.StatusBadRequest, "window", fmt.Sprintf("%q is not a duration of whole 10s from 10s to 1h (say 1h, 5m or 30s), given once", v[0]))
			return
		}
		window = d
	}
	s.foldHistory(context.WithoutCancel(r.Context())) // (a reader that leaves does not cost the fleet a slot)
	now := s.metrics.now()
	rep := HistoryReport{Time: now.UTC(), ResolutionSeconds: int(historyResolution / time.Second), WindowSeconds: int(window / time.Second),
		Instance: s.history.slots(now, window)}
	if s.fleetHistory != nil {
		end := slotOf(now.Add(-historyLag))
		ctx, cancel := context.WithTimeout(r.Context(), historyTimeout)
		got, err := s.fleetHistory.Read(ctx, end-int64(window/historyResolution), end-1)
		cancel()
		if err != nil {
			rep.FleetError = err.Error()
		} else {
			rep.Fleet = make([]HistorySlot, 0, len(got))
			for n, f := range got {
				rep.Fleet = append(rep.Fleet, SlotFromFields(n, f))
			}
			slices.SortFunc(rep.Fleet, func(a, b HistorySlot) int { return cmp.Compare(a.Start.Unix(), b.Start.Unix()) })
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(rep)
}

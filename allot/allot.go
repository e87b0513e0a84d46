// Package allot splits a capacity among clients by their demand, in whole quota units: the
// allotment algorithms of the ledger of limits across regions (store/redis/ledger.go; docs/design.md,
// "Limits across regions: the ledger"). They are Doorman's FAIR_SHARE and PROPORTIONAL_SHARE
// (github.com/youtube/doorman, doc/algorithms.md and go/server/doorman/algorithm.go) computed for
// all clients at once and in integers; store/redis/ledger.lua computes the same, term for term.
//
// Both take the clients' wants in one order (the ledger's: the regions sorted by name) and return
// each client's gets, with these invariants (property-tested):
//
//   - 0 ≤ gets[i] ≤ min(want[i], capacity), and Σ gets ≤ capacity;
//   - if Σ want ≤ capacity every client gets its want;
//   - otherwise the whole capacity is handed out (Σ gets = capacity), and every client gets at
//     least min(want[i], ⌊capacity/n⌋): its equal share, or all it wants.
//
// FairShare is max-min fair: a client that gets less than it wants gets no less than any other
// client gets, give or take one unit of rounding (gets[i] < want[i] ⇒ gets[i] ≥ gets[j] − 1).
// ProportionalShare gives each client min(want, equal share) and tops up the clients that want
// more in proportion to how much more they want.
//
// A floor (the ledger's: every live region keeps at least F while the capacity allows) is the
// caller's: raise each want to the floor before calling (the ledger does, so an idle region keeps
// F and its next requests never wait for the ledger).
//
// Bounds: capacity and wants are ≥ 0 (a negative one counts as 0); n·capacity must fit an int64
// (the ledger bounds its limit and wants to 2^47 and its regions to 64, so that Lua's doubles
// hold every sum exactly). ProportionalShare takes wants as they are (up to MaxWant): the top-up
// is proportional to them, so Doorman's example reproduces.
package allot

import (
	"math/bits"
	"sort"
)

// MaxWant bounds a want: one above it counts as MaxWant (2^53), so that the sum of up to 1024
// wants fits an int64.
const MaxWant = 1 << 53

// start returns the wants bounded to [0, bound], and gets: a copy of them if they fit capacity
// (fits), else zeros.
func start(capacity, bound int64, want []int64) (w, gets []int64, fits bool) {
	w = make([]int64, len(want))
	var sum int64
	for i, x := range want {
		w[i] = min(max(x, 0), bound)
		sum += w[i]
	}
	gets = make([]int64, len(w))
	if sum <= capacity {
		copy(gets, w)
		return w, gets, true
	}
	return w, gets, false
}

// FairShare hands capacity out in rounds: each round gives every client not yet satisfied an
// equal part, ⌊rem/k⌋ of the remaining capacity rem among the k unsatisfied (no more than it still
// wants); a client that got all it wants drops out, and its unused part goes into the next round.
// When a round's part would be 0, the last rem < k units go one each to the unsatisfied clients
// in their order. Doorman's example (capacity 120; wants 1000, 50, 10) gets 60, 50, 10.
func FairShare(capacity int64, want []int64) []int64 {
	capacity = max(capacity, 0)
	w, gets, fits := start(capacity, capacity, want)
	if fits {
		return gets
	}
	rem := capacity
	for {
		k := int64(0)
		for i := range w {
			if gets[i] < w[i] {
				k++
			}
		}
		if k == 0 || rem == 0 {
			return gets
		}
		part := rem / k
		if part == 0 {
			for i := range w {
				if rem == 0 {
					break
				}
				if gets[i] < w[i] {
					gets[i]++
					rem--
				}
			}
			return gets
		}
		for i := range w {
			if gets[i] < w[i] {
				g := min(part, w[i]-gets[i])
				gets[i] += g
				rem -= g
			}
		}
	}
}

// ProportionalShare gives every client its base, min(want, ⌊capacity/n⌋); the spare capacity
// S = capacity − Σ base goes to the clients wanting more than their base in proportion to the
// excess x_i = want_i − base_i: ⌊x_i·S/X⌋ each (X = Σ x, the product exact in 128 bits), and the
// few units that rounding leaves (fewer than the clients topped up) one each by the largest
// remainder of x_i·S/X, ties to the earlier client. Doorman's example (capacity 120; wants 1000,
// 50, 10) gets 70, 40, 10 (in reals 69.7, 40.3, 10).
func ProportionalShare(capacity int64, want []int64) []int64 {
	capacity = max(capacity, 0)
	w, gets, fits := start(capacity, MaxWant, want)
	if fits {
		return gets
	}
	equal := capacity / int64(len(w))
	spare, excess := capacity, int64(0)
	for i := range w {
		gets[i] = min(w[i], equal)
		spare -= gets[i]
		excess += w[i] - gets[i]
	}
	// excess > spare: Σ want > capacity.
	type rest struct {
		i int
		r uint64
	}
	var rests []rest
	for i := range w {
		x := w[i] - gets[i]
		if x == 0 {
			continue
		}
		hi, lo := bits.Mul64(uint64(x), uint64(spare))
		q, r := bits.Div64(hi, lo, uint64(excess)) // hi < excess: x·spare < excess·2^64
		gets[i] += int64(q)
		rests = append(rests, rest{i, r})
	}
	left := capacity
	for _, g := range gets {
		left -= g
	}
	sort.SliceStable(rests, func(a, b int) bool { return rests[a].r > rests[b].r })
	for _, r := range rests {
		if left == 0 {
			break
		}
		if gets[r.i] < w[r.i] {
			gets[r.i]++
			left--
		}
	}
	return gets
}

// Algorithm names an allotment algorithm.
type Algorithm string

// The algorithms.
const (
	Fair         Algorithm = "fair-share"
	Proportional Algorithm = "proportional-share"
)

// Split runs the algorithm a (Fair for "").
func Split(a Algorithm, capacity int64, want []int64) []int64 {
	if a == Proportional {
		return ProportionalShare(capacity, want)
	}
	return FairShare(capacity, want)
}

package allot

import (
	"math/big"
	"math/rand/v2"
	"slices"
	"testing"
)

// Doorman's examples (youtube/doorman, doc/algorithms.md: capacity 120, wants 1000, 50, 10).
// FAIR_SHARE's is given there: 60, 50, 10. PROPORTIONAL_SHARE's is left blank in the doc; its
// code (go/server/doorman/algorithm.go) gives 40 + 960·30/970 = 69.7, 40 + 10·30/970 = 40.3 and 10,
// which in whole units with the largest remainder is 70, 40, 10.
func TestLedgerDoormanExamples(t *testing.T) {
	want := []int64{1000, 50, 10}
	if got := FairShare(120, want); !slices.Equal(got, []int64{60, 50, 10}) {
		t.Errorf("FairShare(120, %v) = %v; Doorman's doc: 60, 50, 10", want, got)
	}
	if got := ProportionalShare(120, want); !slices.Equal(got, []int64{70, 40, 10}) {
		t.Errorf("ProportionalShare(120, %v) = %v; want 70, 40, 10", want, got)
	}
	// Under capacity, both give every want.
	for _, f := range []func(int64, []int64) []int64{FairShare, ProportionalShare} {
		if got := f(120, []int64{50, 40, 30}); !slices.Equal(got, []int64{50, 40, 30}) {
			t.Errorf("under capacity: %v", got)
		}
	}
	// The ledger's demand moving 70/20/10 -> 10/20/70 over a limit of 60 (fair share).
	if got := FairShare(60, []int64{70, 20, 10}); !slices.Equal(got, []int64{30, 20, 10}) {
		t.Errorf("FairShare(60, 70/20/10) = %v", got)
	}
	if got := FairShare(60, []int64{10, 20, 70}); !slices.Equal(got, []int64{10, 20, 30}) {
		t.Errorf("FairShare(60, 10/20/70) = %v", got)
	}
}

// randomWants returns n wants of a random shape: small, around the equal share, huge, zeros.
func randomWants(r *rand.Rand, n int, capacity int64) []int64 {
	w := make([]int64, n)
	for i := range w {
		switch r.IntN(5) {
		case 0:
			w[i] = 0
		case 1:
			w[i] = r.Int64N(capacity/int64(n) + 2)
		case 2:
			w[i] = r.Int64N(2*capacity + 2)
		case 3:
			w[i] = r.Int64N(1 << 47)
		default:
			w[i] = r.Int64N(10)
		}
	}
	return w
}

func randomCapacity(r *rand.Rand) int64 {
	switch r.IntN(3) {
	case 0:
		return r.Int64N(20)
	case 1:
		return r.Int64N(100000)
	default:
		return r.Int64N(1 << 47)
	}
}

// The invariants of both algorithms on random wants and capacities (package comment).
func TestLedgerShareInvariants(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for iter := range 20000 {
		n := 1 + r.IntN(12)
		if iter%50 == 0 {
			n = 64
		}
		c := randomCapacity(r)
		want := randomWants(r, n, max(c, 1))
		for _, a := range []Algorithm{Fair, Proportional} {
			gets := Split(a, c, want)
			checkCommon(t, a, c, want, gets)
			if a == Fair {
				checkMaxMin(t, c, want, gets)
			} else {
				checkProportional(t, c, want, gets)
			}
		}
	}
}

func checkCommon(t *testing.T, a Algorithm, c int64, want, gets []int64) {
	t.Helper()
	var sum, wsum int64
	equal := c / int64(len(want))
	for i := range want {
		w := min(want[i], c)
		if gets[i] < 0 || gets[i] > w {
			t.Fatalf("%s(%d, %v): gets[%d] = %d, outside [0, %d]", a, c, want, i, gets[i], w)
		}
		if gets[i] < min(w, equal) {
			t.Fatalf("%s(%d, %v): gets[%d] = %d below min(want, equal share %d)", a, c, want, i, gets[i], equal)
		}
		sum += gets[i]
		wsum += w
	}
	if sum > c {
		t.Fatalf("%s(%d, %v): Σ gets = %d over capacity", a, c, want, sum)
	}
	if wsum <= c && sum != wsum {
		t.Fatalf("%s(%d, %v): under capacity, gets %v", a, c, want, gets)
	}
	if wsum > c && sum != c {
		t.Fatalf("%s(%d, %v): Σ gets = %d; not all of the capacity handed out", a, c, want, sum)
	}
}

// checkMaxMin: a client short of its want gets no less than any other, but for one unit.
func checkMaxMin(t *testing.T, c int64, want, gets []int64) {
	t.Helper()
	for i := range want {
		if gets[i] >= min(want[i], c) {
			continue
		}
		for j := range want {
			if gets[i] < gets[j]-1 {
				t.Fatalf("FairShare(%d, %v) = %v: client %d short of its want with %d, client %d has %d", c, want, gets, i, gets[i], j, gets[j])
			}
		}
	}
}

// checkProportional: over capacity, each client's top-up above its base is its excess's share
// of the spare capacity, within one unit (computed here in big rationals).
func checkProportional(t *testing.T, c int64, want, gets []int64) {
	t.Helper()
	n := int64(len(want))
	var wsum int64
	for _, w := range want {
		wsum += w
	}
	if wsum <= c {
		return
	}
	equal := c / n
	spare, excess := c, int64(0)
	base := make([]int64, n)
	for i, w := range want {
		base[i] = min(w, equal)
		spare -= base[i]
		excess += w - base[i]
	}
	for i, w := range want {
		x := w - base[i]
		exact := new(big.Rat).SetFrac(new(big.Int).Mul(big.NewInt(x), big.NewInt(spare)), big.NewInt(excess))
		top := new(big.Rat).SetInt64(gets[i] - base[i])
		diff := new(big.Rat).Sub(top, exact)
		if diff.Cmp(big.NewRat(-1, 1)) <= 0 || diff.Cmp(big.NewRat(1, 1)) >= 0 {
			t.Fatalf("ProportionalShare(%d, %v) = %v: client %d topped up %v, its share is %v", c, want, gets, i, top, exact.FloatString(3))
		}
	}
}

// Fair share is the water level: every unsatisfied client is within one unit of the same level,
// and the satisfied ones are at or below it (the rounds reach the same result as sorting).
func TestLedgerFairShareWaterLevel(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 5000 {
		n := 1 + r.IntN(10)
		c := r.Int64N(1000)
		want := randomWants(r, n, max(c, 1))
		gets := FairShare(c, want)
		var lo, hi int64 = 1 << 62, -1
		for i := range want {
			if gets[i] < min(want[i], c) {
				lo, hi = min(lo, gets[i]), max(hi, gets[i])
			}
		}
		if hi >= 0 && hi-lo > 1 {
			t.Fatalf("FairShare(%d, %v) = %v: unsatisfied from %d to %d", c, want, gets, lo, hi)
		}
	}
}

// Edge cases: no capacity, one client, all zero wants, negative inputs.
func TestLedgerShareEdges(t *testing.T) {
	for _, a := range []Algorithm{Fair, Proportional} {
		if got := Split(a, 0, []int64{5, 5}); !slices.Equal(got, []int64{0, 0}) {
			t.Errorf("%s capacity 0: %v", a, got)
		}
		if got := Split(a, 10, []int64{100}); !slices.Equal(got, []int64{10}) {
			t.Errorf("%s one client: %v", a, got)
		}
		if got := Split(a, 10, []int64{-3, 0}); !slices.Equal(got, []int64{0, 0}) {
			t.Errorf("%s negative wants: %v", a, got)
		}
		if got := Split(a, -5, []int64{3}); !slices.Equal(got, []int64{0}) {
			t.Errorf("%s negative capacity: %v", a, got)
		}
		if got := Split(a, 5, nil); len(got) != 0 {
			t.Errorf("%s no clients: %v", a, got)
		}
	}
}

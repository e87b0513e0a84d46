package algorithm

import (
	"math/rand/v2"
	"testing"
)

// divP's reciprocal path must equal the division it replaces, at the edges too.
func TestDivPMatchesDivision(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	periods := []int64{1, 2, 3, 999, 1000, 1_000_000, 86_400_000_000, 1<<53 - 1, 1 << 53}
	for i := 0; i < 200; i++ {
		periods = append(periods, 1+r.Int64N(1<<53))
	}
	for _, period := range periods {
		var s State
		p := Policy{Algorithm: TokenBucket, Limit: 7, Period: 0}
		s.renew(&p, period)
		xs := []uint64{0, 1, uint64(period - 1), uint64(period), uint64(period + 1), ^uint64(0), ^uint64(0) - 1, 1 << 63}
		for j := 0; j < 500; j++ {
			xs = append(xs, r.Uint64(), r.Uint64()>>r.IntN(64))
		}
		for _, x := range xs {
			wantQ, wantR := u128{0, x}.divmod(period)
			q, rem := s.divP(u128{0, x}, period)
			if q != wantQ || rem != wantR {
				t.Fatalf("divP(%d, %d) = %d r %d, want %d r %d", x, period, q, rem, wantQ, wantR)
			}
		}
	}
}

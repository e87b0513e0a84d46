package sat

import (
	"math"
	"testing"
)

func TestSaturates(t *testing.T) {
	for _, c := range []struct{ got, want int64 }{
		{Add(2, 3), 5},
		{Add(math.MaxInt64, 1), math.MaxInt64},
		{Add(math.MaxInt64-1, 1), math.MaxInt64},
		{Add(1<<62, 1<<62), math.MaxInt64},
		{Mul(6, 7), 42},
		{Mul(0, math.MaxInt64), 0},
		{Mul(1<<31, 1<<31), 1 << 62},
		{Mul(1<<32, 1<<31), math.MaxInt64},
		{Mul(1<<32, 1<<32), math.MaxInt64},
		{Mul(math.MaxInt64, 2), math.MaxInt64},
	} {
		if c.got != c.want {
			t.Errorf("got %d, want %d", c.got, c.want)
		}
	}
}

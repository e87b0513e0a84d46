package algorithm

import "math/bits"

// u128 is an unsigned 128-bit integer. The transitions compare products such as limit·period
// (each factor up to 2^53) exactly; a float64 or an int64 would round or overflow there.
type u128 struct{ hi, lo uint64 }

// mul returns a·b for non-negative a and b.
func mul(a, b int64) u128 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	return u128{hi, lo}
}

func small(a int64) u128 { return u128{0, uint64(a)} }

func (x u128) add(y u128) u128 {
	lo, carry := bits.Add64(x.lo, y.lo, 0)
	hi, _ := bits.Add64(x.hi, y.hi, carry)
	return u128{hi, lo}
}

// sub returns x-y; the caller guarantees x ≥ y.
func (x u128) sub(y u128) u128 {
	lo, borrow := bits.Sub64(x.lo, y.lo, 0)
	hi, _ := bits.Sub64(x.hi, y.hi, borrow)
	return u128{hi, lo}
}

func (x u128) less(y u128) bool { return x.hi < y.hi || (x.hi == y.hi && x.lo < y.lo) }

func (x u128) lessEq(y u128) bool { return !y.less(x) }

const maxInt64 = 1<<63 - 1

// divmod returns floor(x/d) and x mod d for d > 0. A quotient above MaxInt64 saturates to
// MaxInt64 (the remainder is then meaningless); callers only reach that on values that
// Policy.Validate and the cost checks rule out.
func (x u128) divmod(d int64) (q, r int64) {
	if x.hi >= uint64(d) {
		return maxInt64, 0
	}
	uq, ur := bits.Div64(x.hi, x.lo, uint64(d))
	if uq > maxInt64 {
		return maxInt64, 0
	}
	return int64(uq), int64(ur)
}

// divCeil returns ceil(x/d) for d > 0, saturating at MaxInt64.
func (x u128) divCeil(d int64) int64 {
	q, r := x.divmod(d)
	if r != 0 && q < maxInt64 {
		q++
	}
	return q
}

// floorDiv is floor(a/b) for b > 0, also for negative a.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

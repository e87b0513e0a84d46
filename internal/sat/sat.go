// Package sat is arithmetic on counts (≥ 0) that saturates at the largest int64 instead of
// wrapping: costs summed from client input (Envoy's hits, an LLM request's token estimate) must
// never come out small.
package sat

import "math"

// Add is a+b for a, b ≥ 0, at most math.MaxInt64.
func Add(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// Mul is a×b for a, b ≥ 0, at most math.MaxInt64.
func Mul(a, b int64) int64 {
	if a != 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
}

// Package suggest finds the field a misspelt one probably meant, for the "did you mean"
// of configuration errors (sluice's own files and envoyproxy/ratelimit's).
package suggest

import "strings"

// Field returns the field within edit distance 2 of s, or that differs from it only in case, in
// '-' for '_', or in underscores left out ("ratelimit" for "rate_limit"); "" if none does.
func Field(s string, fields []string) string {
	norm := func(s string) string { return strings.ReplaceAll(strings.ToLower(s), "-", "_") }
	best, bestD := "", 3
	for _, f := range fields {
		if norm(f) == norm(s) || strings.ReplaceAll(norm(s), "_", "") == strings.ReplaceAll(f, "_", "") {
			return f
		}
		if d := editDistance(s, f); d < bestD {
			best, bestD = f, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 99
	}
	prev, cur := make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			sub := prev[j-1]
			if a[i-1] != b[j-1] {
				sub++
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, sub)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

package sim

import (
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"time"
)

// NormalizePattern writes a traffic pattern as sluice simulate prints it: its segments with their
// whitespace collapsed, empty ones dropped, joined by "; ". It does not check the segments.
func NormalizePattern(p string) string {
	var segs []string
	for _, s := range strings.Split(p, ";") {
		if s = strings.Join(strings.Fields(s), " "); s != "" {
			segs = append(segs, s)
		}
	}
	return strings.Join(segs, "; ")
}

// ParseTraffic returns the requests of a traffic pattern: segments separated by ";", each
// starting where the previous one ended (the first at 0), with any whitespace around the words:
//
//	R/s for D   R requests a second for D, evenly spaced, the first at the segment's start:
//	            the i-th at start + floor(i·1e6/R) µs, while that is before start + D.
//	            R is a positive decimal with up to 3 decimals (5/s, 0.5/s, 12.125/s).
//	            R/min and R/h are R a minute and an hour (300/min for 5m: the i-th at
//	            floor(i·60e6/R) µs), for rates that are not a whole number of thousandths a second.
//	N in D      N requests evenly spaced over D: the i-th (from 0) at start + floor(i·D/N).
//	N at once   N requests at the segment's start; the segment lasts no time.
//	idle D      no requests for D (a pause between bursts).
//
// D is a Go duration (time.ParseDuration: 10s, 1m30s, 250ms), positive and a whole number of
// microseconds. Every request has key DefaultKey and cost 1. A pattern makes at most
// MaxRequests requests and lasts at most MaxTimeMicros; empty segments (as after a trailing
// ";") are skipped. An error names the segment by its position and says what is wrong.
func ParseTraffic(pattern string) ([]Request, error) {
	var reqs []Request
	var start int64 // µs: where the current segment starts
	segments := 0
	for i, text := range strings.Split(pattern, ";") {
		text = strings.TrimSpace(text)
		if text == "" {
			continue
		}
		segments++
		bad := func(format string, args ...any) error {
			return fmt.Errorf("traffic segment %d %q: %s", i+1, text, fmt.Sprintf(format, args...))
		}
		seg, err := parseSegment(text)
		if err != nil {
			return nil, bad("%v", err)
		}
		if seg.length > MaxTimeMicros-start {
			return nil, bad("the traffic would last past %s (2^53 µs, about 285 years)", FormatDuration(MaxTimeMicros))
		}
		if seg.count > int64(MaxRequests-len(reqs)) {
			return nil, bad("the traffic would have more than %d requests (the most one simulation takes)", MaxRequests)
		}
		if reqs == nil {
			reqs = make([]Request, 0, seg.count)
		}
		for k := range seg.count {
			reqs = append(reqs, Request{TMicros: start + seg.offset(k), Key: DefaultKey, Cost: 1})
		}
		start += seg.length
	}
	if segments == 0 {
		return nil, fmt.Errorf("traffic pattern %q is empty: want segments such as \"5/s for 10s; 40 in 1s; 20 at once; idle 5s\"", pattern)
	}
	return reqs, nil
}

// segment is one parsed segment: count requests over length µs, the k-th at offset(k).
type segment struct {
	count, length int64
	offset        func(k int64) int64
}

// words splits a segment at runs of the ASCII whitespace \t \n \f \r and space (what \s
// matches in a regular expression; the page's WebAssembly leaves the regexp package out).
func words(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ' ' || r == '\t' || r == '\n' || r == '\f' || r == '\r' })
}

// matchForm matches text (trimmed) to a segment's form, as a regular expression's submatches
// would: "R/u for D" gives [text, R, u, D], "N in D" [text, N, D], "N at once" [text, N],
// "idle D" [text, D]; nil if text is not of that form.
func matchForm(text, form string) []string {
	w := words(text)
	switch form {
	case "rate":
		// R (text is trimmed: it starts at once), then "/" with any whitespace around it, the
		// unit, "for" and D.
		i := strings.IndexByte(text, '/')
		if i < 0 {
			return nil
		}
		r, rest := words(text[:i]), words(text[i+1:])
		if len(r) != 1 || len(rest) != 3 || rateUnits[rest[0]] == 0 || rest[1] != "for" {
			return nil
		}
		return []string{text, r[0], rest[0], rest[2]}
	case "in":
		if len(w) == 3 && w[1] == "in" {
			return []string{text, w[0], w[2]}
		}
	case "once":
		if len(w) == 3 && w[1] == "at" && w[2] == "once" {
			return []string{text, w[0]}
		}
	case "idle":
		if len(w) == 2 && w[0] == "idle" {
			return []string{text, w[1]}
		}
	}
	return nil
}

const segmentForms = `want "R/s for D", "N in D", "N at once" or "idle D" (e.g. "5/s for 10s", "40 in 1s", "20 at once", "idle 5s"; a rate may be per minute or hour: "300/min for 5m")`

// rateUnits are the µs of a rate's unit: R/s, R/min, R/h.
var rateUnits = map[string]uint64{"s": 1e6, "min": 60e6, "h": 3600e6}

func parseSegment(text string) (segment, error) {
	if m := matchForm(text, "rate"); m != nil {
		// R = milli/1000 a unit of u µs: the i-th request at floor(i·u·1000/milli) µs, while
		// < D, so count = ceil(D·milli/(u·1000)).
		milli, err := parseThousandths(m[1], 1<<62)
		if err != nil {
			return segment{}, fmt.Errorf("rate %q %v", m[1], err)
		}
		if milli == 0 {
			return segment{}, fmt.Errorf("rate %s/%s must be > 0", m[1], m[2])
		}
		d, err := parseSegmentDuration(m[3])
		if err != nil {
			return segment{}, err
		}
		per := rateUnits[m[2]] * 1000 // ≤ 3.6e12, so per·k fits for k < MaxRequests
		hi, lo := bits.Mul64(uint64(d), uint64(milli))
		if hi >= per {
			return segment{}, fmt.Errorf("the traffic would have more than %d requests (the most one simulation takes)", MaxRequests)
		}
		q, r := bits.Div64(hi, lo, per)
		if r > 0 {
			q++
		}
		if q > MaxRequests {
			return segment{}, fmt.Errorf("%d requests is more than the %d one simulation takes", q, MaxRequests)
		}
		return segment{count: int64(q), length: d, offset: func(k int64) int64 { return k * int64(per) / milli }}, nil
	}
	if m := matchForm(text, "in"); m != nil {
		n, err := parseCount(m[1])
		if err != nil {
			return segment{}, err
		}
		d, err := parseSegmentDuration(m[2])
		if err != nil {
			return segment{}, err
		}
		return segment{count: n, length: d, offset: func(k int64) int64 {
			hi, lo := bits.Mul64(uint64(k), uint64(d))
			q, _ := bits.Div64(hi, lo, uint64(n)) // k < n, so the quotient is < d: no overflow
			return int64(q)
		}}, nil
	}
	if m := matchForm(text, "once"); m != nil {
		n, err := parseCount(m[1])
		if err != nil {
			return segment{}, err
		}
		return segment{count: n, offset: func(int64) int64 { return 0 }}, nil
	}
	if m := matchForm(text, "idle"); m != nil {
		d, err := parseSegmentDuration(m[1])
		if err != nil {
			return segment{}, err
		}
		return segment{length: d, offset: func(int64) int64 { return 0 }}, nil
	}
	return segment{}, fmt.Errorf("%s", segmentForms)
}

// parseCount parses the N of "N in D" and "N at once".
func parseCount(s string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	switch {
	case err != nil && strings.Trim(s, "0123456789") == "":
		return 0, fmt.Errorf("count %s is more than the %d requests one simulation takes", s, MaxRequests)
	case err != nil:
		return 0, fmt.Errorf("count %q is not a whole number", s)
	case n <= 0:
		return 0, fmt.Errorf("count %d must be > 0", n)
	case n > MaxRequests:
		return 0, fmt.Errorf("count %d is more than the %d requests one simulation takes", n, MaxRequests)
	}
	return n, nil
}

// parseSegmentDuration parses a segment's D, in µs.
func parseSegmentDuration(s string) (int64, error) {
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		return 0, fmt.Errorf("duration %q is not a Go duration (want e.g. 10s, 1m30s, 250ms)", s)
	case d <= 0:
		return 0, fmt.Errorf("duration %s must be > 0", s)
	case d%time.Microsecond != 0:
		return 0, fmt.Errorf("duration %s must be a whole number of microseconds", s)
	}
	return int64(d / time.Microsecond), nil
}

// parseThousandths parses a non-negative decimal with up to 3 decimals ("12", "0.5", "1.250")
// from its text, never through a float, as an exact number of thousandths, at most max. Digits
// after the third decimal are accepted only if they are zeros ("1.2000"). The error completes a
// sentence that starts with the quoted input.
func parseThousandths(s string, max int64) (int64, error) {
	whole, frac, dot := strings.Cut(s, ".")
	if whole == "" && frac == "" || dot && frac == "" || !allDigits(whole) || !allDigits(frac) {
		return 0, fmt.Errorf("is not a non-negative decimal number (such as 12 or 0.125)")
	}
	if len(frac) > 3 {
		if strings.Trim(frac[3:], "0") != "" {
			return 0, fmt.Errorf("has more than 3 decimals")
		}
		frac = frac[:3]
	}
	frac += strings.Repeat("0", 3-len(frac))
	whole = strings.TrimLeft(whole, "0")
	tooLarge := fmt.Errorf("is too large (at most %s)", FormatMillis(max))
	if len(whole) > 18 {
		return 0, tooLarge
	}
	w, _ := strconv.ParseInt("0"+whole, 10, 64)
	f, _ := strconv.ParseInt(frac, 10, 64)
	if w > (max-f)/1000 {
		return 0, tooLarge
	}
	return w*1000 + f, nil
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

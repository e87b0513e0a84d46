package client

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// RetryAfter returns how long the Retry-After field of h asks to wait (RFC 9110, section
// 10.2.3), and false when h has none or it is invalid.
//
// The field is either delay-seconds, a non-negative decimal integer ("120"; one too large to
// represent gives the longest time.Duration), or an HTTP-date in any of the three forms
// http.ParseTime accepts. A date is taken relative to h's Date field, when that is a valid
// HTTP-date, and relative to now otherwise: both come from the server's clock, so the client's
// clock does not matter, and since the Date field is rounded down to the second the wait is never
// shorter than the server meant. A date in the past gives 0.
func RetryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if v[0] >= '0' && v[0] <= '9' {
		s, err := strconv.ParseUint(v, 10, 64)
		switch {
		case errors.Is(err, strconv.ErrRange), err == nil && s > uint64(forever/time.Second):
			return forever, true
		case err != nil:
			return 0, false
		}
		return time.Duration(s) * time.Second, true
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	if date, err := http.ParseTime(h.Get("Date")); err == nil {
		now = date
	}
	return max(at.Sub(now), 0), true
}

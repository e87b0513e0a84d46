// Package answer writes what the gateway tells a client about its rate limits: the
// RateLimit-Policy and RateLimit fields of draft-ietf-httpapi-ratelimit-headers-11 (Structured
// Fields, RFC 9651), Retry-After (RFC 9110), optionally the legacy X-RateLimit-* headers, and
// the problem details (RFC 9457) of a refusal.
//
// It formats; it does not decide. The gateway decides, then hands the policies it applied and
// their decisions to Headers and, for a refusal, to QuotaExceeded and WriteProblem:
//
//	answer.Headers(w.Header(), applied, cfg.LegacyHeaders)
//	if refused {
//		answer.WriteProblem(w, answer.QuotaExceeded(id.Client, applied)) // also sets Retry-After
//	}
package answer

import (
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
)

// Applied is one policy that applied to a request, and its decision.
type Applied struct {
	Policy   sluice.Policy
	Decision sluice.Decision
	// Unit is what the policy counts, plural, for the words of an answer: "" is requests; a
	// route in front of an LLM API counts "tokens" or "micro-dollars".
	Unit string
	// Level is whom the policy counts for when not the client itself: the group whose quota it
	// is, as a refusal names it (team "ml", organisation "acme"); "" the client.
	Level string
}

// Field names, as the draft and RFC 9110 spell them. The header map holds them in Go's canonical
// form (http.CanonicalHeaderKey: "Ratelimit-Policy"); field names are case-insensitive.
const (
	FieldRateLimitPolicy = "RateLimit-Policy"
	FieldRateLimit       = "RateLimit"
	FieldRetryAfter      = "Retry-After"
	FieldLegacyLimit     = "X-RateLimit-Limit"
	FieldLegacyRemaining = "X-RateLimit-Remaining"
	FieldLegacyReset     = "X-RateLimit-Reset"
)

// maxSFInteger is the largest Integer a Structured Field can carry (15 digits, RFC 9651,
// section 3.3.1). Limits up to 2^53 can exceed it; they are clamped, which only understates.
const maxSFInteger = 999_999_999_999_999

// Headers adds the rate-limit fields for the decisions of one request to h:
//
//	RateLimit-Policy: "per-second";q=10;w=1, "daily";q=10000;w=86400
//	RateLimit: "per-second";r=7;t=1, "daily";r=9412;t=50511
//
// RateLimit-Policy has one member per policy, in the order given: the policy's name as a String,
// q its limit (the quota, in requests; a request of cost n counts as n), and w its period in
// seconds, rounded up when it is not whole (the draft has no sub-second windows, and rounding up
// understates the rate, which is the safe side). For a calendar policy w is the length of the
// current calendar window (now's, by this process's clock): 86400 on most days, 82800 or 90000
// on a day the clocks change, 2419200 to 2678400 for a month. The draft requires q and allows w;
// sluice always knows its window, so w is always sent — but for a concurrency policy, which counts
// requests in flight, not in a window: it has the draft's quota unit qu="concurrent-requests"
// instead of w (its lease is no window).
//
// RateLimit says where the client stands: r is Decision.Remaining, and t the effective window in
// whole seconds, rounded up:
//   - when every decision allowed, there is one member per policy, and t is Decision.ResetAfter,
//     the time until the policy is back to its full quota (0 for a client it has not seen). The
//     draft's effective window is "the number of seconds within which the client can use no more
//     than the available quota"; for a fixed window that is exactly the rest of the window, and for
//     the algorithms that refill continuously ResetAfter errs long, so that a client spreading r
//     over t goes no faster than the policy — the side the draft asks servers to err on ("it should
//     return either a lower available quota or a higher effective window", section 8.5);
//   - when any decision refused, only the refusing policies are listed, and t is Decision.RetryAfter,
//     when the refused request would be approved. This is the draft's example of a throttled answer
//     (`RateLimit: "default";r=0;t=5` beside a Retry-After of the same moment), and it keeps the
//     draft's rule that "the Retry-After field value SHOULD NOT reference a point in time earlier
//     than the end of the effective window" when Retry-After is RetryAfter(Wait(decisions)): a
//     policy that allowed (a daily quota, say) would end its effective window long after. The draft
//     lets a server omit such members ("The server MAY choose to omit returning the hourly policy
//     ..."); they stay in RateLimit-Policy.
//
// Both fields are added (http.Header.Add), not set: a List may be split over several field lines
// (RFC 9651, section 3.1), so fields that an upstream sent about its own limits are kept. Call
// Headers once per response. Policy names should be printable ASCII (see CheckPolicyName);
// other bytes are percent-encoded. Integers above 999,999,999,999,999 (the most a Structured
// Field can carry) are clamped to it.
//
// With legacy set it also sets X-RateLimit-Limit (Decision.Limit: the most the policy approves at
// once, so that Remaining ≤ Limit), X-RateLimit-Remaining and X-RateLimit-Reset (the same t, in
// seconds from now, not a timestamp) of the most restrictive decision: the refusal with the longest
// wait, or if none refused, the policy with the fewest remaining (the longest reset on a tie).
//
// No decisions, no fields.
func Headers(h http.Header, decisions []Applied, legacy bool) {
	if len(decisions) == 0 {
		return
	}
	var buf [256]byte // one allocation per field: the string
	policy, limit := FieldValues(buf[:0], decisions)
	add(h, keyRateLimitPolicy, string(policy))
	add(h, keyRateLimit, string(limit))
	if legacy {
		l, r, t := LegacyValues(decisions)
		h[keyLegacyLimit] = []string{strconv.FormatInt(l, 10)}
		h[keyLegacyRemaining] = []string{strconv.FormatInt(r, 10)}
		h[keyLegacyReset] = []string{strconv.FormatInt(t, 10)}
	}
}

// FieldValues appends the values of the RateLimit-Policy and RateLimit fields for decisions (see
// Headers) to buf, and returns them: two slices of the grown buffer. It is Headers for an engine
// that does not keep its header fields in an http.Header.
func FieldValues(buf []byte, decisions []Applied) (policy, limit []byte) {
	refused := !allAllowed(decisions)
	b := buf
	for i := range decisions {
		p := &decisions[i].Policy
		if i > 0 {
			b = append(b, ", "...)
		}
		b = appendSFString(b, p.Name)
		b = append(b, ";q="...)
		b = appendSFInteger(b, p.Limit)
		if p.Algorithm == sluice.Concurrency { // requests in flight: a quota unit of its own, and no window
			b = append(b, `;qu="concurrent-requests"`...)
			continue
		}
		b = append(b, ";w="...)
		if p.Calendar != sluice.NoCalendar {
			b = appendSFInteger(b, max(1, Seconds(windowLength(p))))
		} else {
			b = appendSFInteger(b, max(1, Seconds(p.Period)))
		}
	}
	split := len(b)
	for i := range decisions {
		a := &decisions[i]
		if refused && a.Decision.Allowed {
			continue
		}
		if len(b) > split {
			b = append(b, ", "...)
		}
		b = appendSFString(b, a.Policy.Name)
		b = append(b, ";r="...)
		b = appendSFInteger(b, a.Decision.Remaining)
		b = append(b, ";t="...)
		b = appendSFInteger(b, effectiveWindow(a))
	}
	return b[len(buf):split:split], b[split:]
}

// LegacyValues are the X-RateLimit-Limit, -Remaining and -Reset values for decisions (see
// Headers). decisions must not be empty.
func LegacyValues(decisions []Applied) (limit, remaining, reset int64) {
	a := &decisions[mostRestrictive(decisions)]
	limit = a.Decision.Limit
	if limit <= 0 {
		limit = a.Policy.Capacity()
	}
	return limit, max(0, a.Decision.Remaining), effectiveWindow(a)
}

// Legacy field names, as Headers sets them.
const (
	LegacyLimit     = keyLegacyLimit
	LegacyRemaining = keyLegacyRemaining
	LegacyReset     = keyLegacyReset
)

// Canonical header keys, so that Headers indexes the map directly: http.Header.Add would
// canonicalise "RateLimit-Policy" into a new string on every call.
const (
	keyRateLimitPolicy = "Ratelimit-Policy"
	keyRateLimit       = "Ratelimit"
	keyLegacyLimit     = "X-Ratelimit-Limit"
	keyLegacyRemaining = "X-Ratelimit-Remaining"
	keyLegacyReset     = "X-Ratelimit-Reset"
)

// add is http.Header.Add for a canonical key.
func add(h http.Header, key, value string) { h[key] = append(h[key], value) }

// windowLength is the length of p's calendar window holding now.
func windowLength(p *sluice.Policy) time.Duration {
	_, start, end := p.WindowOf(now().UnixMicro())
	return time.Duration(end-start) * time.Microsecond
}

// now is the clock of windowLength; the tests move it.
var now = time.Now

// effectiveWindow is t for one decision, in seconds: RetryAfter for a refusal that can be retried,
// else ResetAfter.
func effectiveWindow(a *Applied) int64 {
	if !a.Decision.Allowed && a.Decision.RetryAfter > 0 {
		return Seconds(a.Decision.RetryAfter)
	}
	return Seconds(a.Decision.ResetAfter)
}

// mostRestrictive returns the index of the decision the legacy headers describe.
func mostRestrictive(ds []Applied) int {
	best := 0
	for i := 1; i < len(ds); i++ {
		a, b := &ds[i].Decision, &ds[best].Decision
		switch {
		case a.Allowed != b.Allowed:
			if !a.Allowed {
				best = i
			}
		case !a.Allowed:
			if longer(a.RetryAfter, b.RetryAfter) {
				best = i
			}
		case a.Remaining < b.Remaining || a.Remaining == b.Remaining && a.ResetAfter > b.ResetAfter:
			best = i
		}
	}
	return best
}

// longer orders waits with Never (negative) as the longest.
func longer(a, b time.Duration) bool {
	switch {
	case b < 0:
		return false
	case a < 0:
		return true
	}
	return a > b
}

func allAllowed(ds []Applied) bool {
	for i := range ds {
		if !ds[i].Decision.Allowed {
			return false
		}
	}
	return true
}

// Wait returns how long a refused request must wait before every policy would approve it: the
// longest RetryAfter of the refusals; 0 if every decision allowed; sluice.Never if a refusal can
// never be approved (its cost exceeds the policy). A refusal consumes nothing from the policies
// that allowed, and waiting only helps them, so after Wait, absent other traffic, all allow.
func Wait(decisions []Applied) time.Duration {
	var wait time.Duration
	for i := range decisions {
		d := &decisions[i].Decision
		if d.Allowed {
			continue
		}
		if d.RetryAfter < 0 {
			return sluice.Never
		}
		wait = max(wait, d.RetryAfter)
	}
	return wait
}

// RetryAfter formats d as a Retry-After value (RFC 9110, section 10.2.3): delay-seconds, whole
// seconds rounded up, and at least 1, since a client told 0 would retry at once and a refused
// request is never approvable sooner than it was refused. d ≤ 0 gives "1".
func RetryAfter(d time.Duration) string {
	return strconv.FormatInt(max(1, Seconds(d)), 10)
}

// Seconds returns d in whole seconds, rounded up; 0 for d ≤ 0.
func Seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}

// appendSFInteger appends an sf-integer, clamped to [0, maxSFInteger]: every integer here is a
// count or a number of seconds.
func appendSFInteger(b []byte, n int64) []byte {
	return strconv.AppendInt(b, min(max(n, 0), maxSFInteger), 10)
}

// appendSFString appends s as an sf-string (RFC 9651, section 3.3.3): printable ASCII, with '"'
// and '\' escaped. Other bytes cannot be carried by a String; they are percent-encoded (lower-case
// hex, as a Display String would), so that the member stays valid.
func appendSFString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c >= 0x20 && c <= 0x7e:
			b = append(b, c)
		default:
			b = append(b, '%', hex[c>>4], hex[c&0xf])
		}
	}
	return append(b, '"')
}

// CheckPolicyName reports whether a policy name can be carried unchanged in the RateLimit fields:
// a Structured Field String holds printable ASCII only. Configurations should check their names
// with it.
func CheckPolicyName(name string) error {
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x20 || c > 0x7e {
			return &nameError{name: name, at: i}
		}
	}
	return nil
}

type nameError struct {
	name string
	at   int
}

func (e *nameError) Error() string {
	return "policy name " + strconv.Quote(e.name) + ": byte " + strconv.Itoa(e.at) +
		" is not printable ASCII, which the RateLimit fields cannot carry; use letters, digits and punctuation"
}

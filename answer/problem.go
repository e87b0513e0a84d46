package answer

import (
	"cmp"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
)

// Problem types.
const (
	// TypeQuotaExceeded is the problem type of draft-ietf-httpapi-ratelimit-headers-11, section 5.1:
	// the request exceeds one or more quota policies (429).
	TypeQuotaExceeded = "https://iana.org/assignments/http-problem-types#quota-exceeded"
	// TypeStoreUnavailable: the limiter could not decide and fails closed (503).
	TypeStoreUnavailable = "https://sluice.dev/problems/store-unavailable"
	// TypeUpstreamUnavailable: the request was allowed but the upstream did not answer (502, 504).
	TypeUpstreamUnavailable = "https://sluice.dev/problems/upstream-unavailable"
	// TypeCostExceedsLimit: the request costs more than a policy ever approves at once (400).
	TypeCostExceedsLimit = "https://sluice.dev/problems/cost-exceeds-limit"
	// TypeBlank is RFC 9457's default type: the problem is just what the status code says.
	TypeBlank = "about:blank"
)

// ContentType is the media type of a problem details body (RFC 9457, section 3).
const ContentType = "application/problem+json"

// Problem is a problem details object (RFC 9457) with the extension members sluice uses. It is
// encoded with the members in the order below; empty optional members are left out.
type Problem struct {
	Type     string // a URI naming the problem type; "" is encoded as TypeBlank
	Title    string // the type's summary, the same for every occurrence
	Status   int    // the HTTP status code
	Detail   string // for a person: what happened to this request, and what to do
	Instance string // optional: a URI naming this occurrence

	// Extension members.
	ViolatedPolicies []string // "violated-policies": the names of the policies that refused (the quota-exceeded type defines it)
	Client           string   // "client": the configured client's name; "" for an anonymous client
	RetryAfter       int64    // "retry-after": seconds to wait, as in the Retry-After field; 0 when there is nothing to wait for
	Field            string   // "field": the request body's field a 400 is about (the clients API: "overrides.gold.limit")

	// RetryAfterMs is the wait in milliseconds (0: RetryAfter's seconds), sent as
	// Retry-After-Ms beside Retry-After in an LLM API's shape.
	RetryAfterMs int64
	// Shape is the body's shape: a problem (the default), or an LLM API's error (llm.go).
	Shape Shape
}

// QuotaExceeded is the 429 problem for a request that one or more policies refused. client is the
// configured client's name, or "" for an anonymous client; decisions are all the policies that
// applied (the ones that allowed are not mentioned). Its RetryAfter is RetryAfter(Wait(decisions)),
// the same as the Retry-After field. For example:
//
//	{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded",
//	 "title":"Quota Exceeded","status":429,
//	 "detail":"client \"partner-a\" exceeded policy \"standard\" (100 requests per 1m); retry after 12 s (the same request sent sooner is refused too)",
//	 "violated-policies":["standard"],"client":"partner-a","retry-after":12}
//
// A policy of a level above the client (Applied.Level) is named with its level: "team \"ml\"
// exceeded its policy \"team-usd\" ($500.00 per month)", after the client's own.
func QuotaExceeded(client string, decisions []Applied) Problem {
	p := Problem{
		Type:   TypeQuotaExceeded,
		Title:  "Quota Exceeded",
		Status: http.StatusTooManyRequests,
		Client: client,
	}
	var refused []*Applied
	for i := range decisions {
		if !decisions[i].Decision.Allowed {
			refused = append(refused, &decisions[i])
			p.ViolatedPolicies = append(p.ViolatedPolicies, decisions[i].Policy.Name)
		}
	}
	var d strings.Builder
	if len(refused) == 0 { // not a refusal; say no more than is known
		d.WriteString(who(client))
		d.WriteString(" exceeded its quota")
	}
	// The client's own policies first, as "client \"k1\" exceeded policy …", then each level
	// above it that refused: "team \"ml\" exceeded its policy …".
	levels := make([]string, 0, 3)
	for _, a := range refused {
		if !slices.Contains(levels, a.Level) {
			levels = append(levels, a.Level)
		}
	}
	slices.SortStableFunc(levels, func(a, b string) int { return cmp.Compare(min(len(a), 1), min(len(b), 1)) })
	for li, level := range levels {
		var at []*Applied
		for _, a := range refused {
			if a.Level == level {
				at = append(at, a)
			}
		}
		if li > 0 {
			d.WriteString(", and ")
		}
		if level == "" {
			d.WriteString(who(client))
			d.WriteString(" exceeded ")
		} else {
			d.WriteString(level)
			d.WriteString(" exceeded its ")
		}
		if len(at) == 1 {
			d.WriteString("policy ")
		} else {
			d.WriteString("policies ")
		}
		for i, a := range at {
			switch {
			case i == 0:
			case i == len(at)-1:
				d.WriteString(" and ")
			default:
				d.WriteString(", ")
			}
			fmt.Fprintf(&d, "%q (%s)", a.Policy.Name, describe(a.Policy, a.Unit))
		}
	}
	if wait := Wait(decisions); wait >= 0 {
		p.RetryAfter = max(1, Seconds(wait))
		p.RetryAfterMs = max(1, wait.Milliseconds())
		if exact(refused) {
			fmt.Fprintf(&d, "; retry after %d s (the same request sent sooner is refused too)", p.RetryAfter)
		} else { // a concurrency slot frees when a request in flight ends: the wait is a hint
			fmt.Fprintf(&d, "; retry after about %d s (a slot frees when one of the client's requests in flight ends)", p.RetryAfter)
		}
	} else {
		d.WriteString("; this request costs more than the policy ever allows at once, so retrying will not help")
	}
	p.Detail = d.String()
	return p
}

// exact reports whether the wait of every refusal is exact (algorithm.IsExact): not a
// concurrency policy's.
func exact(refused []*Applied) bool {
	for _, a := range refused {
		if !algorithm.IsExact(&a.Policy) {
			return false
		}
	}
	return true
}

// StoreUnavailable is the 503 problem for a request that was not forwarded because the limiter's
// store could not decide and the gateway fails closed. retryAfter is when to try again (the
// breaker's cooldown, say); at least 1 s is sent. It is not a quota refusal, and has its own type.
func StoreUnavailable(client string, retryAfter time.Duration) Problem {
	p := Problem{
		Type:       TypeStoreUnavailable,
		Title:      "Rate Limiter Unavailable",
		Status:     http.StatusServiceUnavailable,
		Client:     client,
		RetryAfter: max(1, Seconds(retryAfter)),
	}
	p.Detail = fmt.Sprintf("the rate limiter cannot reach its store, and this gateway does not forward requests it cannot count (fail-closed); the request from %s was not forwarded and used no quota; retry after %d s",
		who(client), p.RetryAfter)
	return p
}

// CostExceedsLimit is the 400 problem for a request whose cost a policy can never approve
// (Decision.RetryAfter is sluice.Never, the error wraps sluice.ErrCostExceedsLimit): retrying
// cannot help, so it is not a 429 and has no retry-after.
func CostExceedsLimit(client string, a Applied, cost int64) Problem {
	return Problem{
		Type:             TypeCostExceedsLimit,
		Title:            "Request Cost Exceeds Quota",
		Status:           http.StatusBadRequest,
		ViolatedPolicies: []string{a.Policy.Name},
		Client:           client,
		Detail: fmt.Sprintf("this request counts as %d %s, but policy %q (%s) never lets %s make more than %d at once, so it can never be approved and retrying will not help; ask the API's operator for a larger quota",
			cost, unitOr(a.Unit), a.Policy.Name, describe(a.Policy, a.Unit), who(client), a.Policy.Capacity()),
	}
}

// UpstreamUnavailable is the problem for an allowed request the upstream did not answer: 504 if
// it was too slow (timeout), else 502.
func UpstreamUnavailable(timeout bool) Problem {
	status := http.StatusBadGateway
	if timeout {
		status = http.StatusGatewayTimeout
	}
	return Problem{Type: TypeUpstreamUnavailable, Title: http.StatusText(status), Status: status,
		Detail: "the upstream did not answer; the request may be retried"}
}

// BadRequest is a plain 400 problem (type about:blank, title as the status code's phrase) with
// detail saying what was wrong.
func BadRequest(detail string) Problem {
	return Problem{Type: TypeBlank, Title: http.StatusText(http.StatusBadRequest), Status: http.StatusBadRequest, Detail: detail}
}

// InvalidCost is the 400 problem for a request whose cost is negative: a cost counts requests, 0
// or more (0 checks without consuming). A plain Bad Request; /v1/check, the gateway and the
// middleware answer it alike.
func InvalidCost(cost int64) Problem {
	return BadRequest(fmt.Sprintf("cost %d is negative; a cost is the number of requests this one counts as, 0 or more (0 checks without consuming)", cost))
}

// who names the client in a detail sentence.
func who(client string) string {
	if client == "" {
		return "this anonymous client (counted by its network address)"
	}
	return "client " + strconv.Quote(client)
}

// describe says what a policy allows: "100 requests per 1m" or "10000 requests per day in
// Europe/Berlin", with the burst of a token bucket and the queue of a leaky bucket.
func describe(p sluice.Policy, units string) string {
	unit := unitOr(units)
	if p.Limit == 1 && units == "" {
		unit = "request"
	}
	if p.Algorithm == sluice.Concurrency {
		return fmt.Sprintf("%d %s in flight at once", p.Limit, unit)
	}
	per := period(p.Period)
	if p.Calendar != sluice.NoCalendar {
		per = p.CalendarIn() // "day in Europe/Berlin"
	}
	s := fmt.Sprintf("%d %s per %s", p.Limit, unit, per)
	if units == "micro-dollars" {
		s = Dollars(p.Limit) + " per " + per
	}
	switch {
	case p.Algorithm == sluice.TokenBucket && p.Capacity() != p.Limit:
		s += fmt.Sprintf(", at most %d at once", p.Capacity())
	case p.Algorithm == sluice.LeakyBucket && p.Burst == 0:
		s += ", evenly spaced, none waiting"
	case p.Algorithm == sluice.LeakyBucket:
		s += fmt.Sprintf(", evenly spaced, with room for %d waiting", p.Burst)
	}
	return s
}

// Dollars writes micro-dollars as dollars: 50000000 is "$50.00", 1050 "$0.00105".
func Dollars(micro int64) string {
	sign := ""
	if micro < 0 {
		sign, micro = "-", -micro
	}
	frac := strings.TrimRight(fmt.Sprintf("%06d", micro%1_000_000), "0")
	for len(frac) < 2 {
		frac += "0"
	}
	return fmt.Sprintf("%s$%d.%s", sign, micro/1_000_000, frac)
}

// unitOr is units, or "requests" for "".
func unitOr(units string) string {
	if units == "" {
		return "requests"
	}
	return units
}

// period formats a duration as a person would write it: 1m, 24h, 1h30m, 500ms.
func period(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// WriteProblem writes p as the response: its status (500 if it has none), Content-Type
// application/problem+json, Cache-Control no-store, and when p.RetryAfter > 0 a Retry-After field
// of the same number of seconds, so that the field and the body cannot disagree.
func WriteProblem(w http.ResponseWriter, p Problem) {
	body := p.AppendJSON(make([]byte, 0, 512))
	h := w.Header()
	status := p.Head(func(name, value string) { h.Set(name, value) })
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	w.Write(body)
}

// Head sets the header fields of p's response (as WriteProblem sends them, but Content-Length)
// with set, and returns its status: for an engine that does not write to an http.ResponseWriter.
func (p Problem) Head(set func(name, value string)) (status int) {
	if p.Shape == ShapeProblem {
		set("Content-Type", ContentType)
	} else {
		set("Content-Type", "application/json")
	}
	set("Cache-Control", "no-store")
	set("X-Content-Type-Options", "nosniff")
	if p.RetryAfter > 0 {
		set(FieldRetryAfter, strconv.FormatInt(p.RetryAfter, 10))
		if p.Shape != ShapeProblem {
			ms := p.RetryAfterMs
			if ms <= 0 {
				ms = p.RetryAfter * 1000
			}
			set(FieldRetryAfterMs, strconv.FormatInt(ms, 10))
		}
	}
	if p.Status < 100 || p.Status > 999 {
		return http.StatusInternalServerError
	}
	return p.Status
}

// MarshalJSON encodes p as AppendJSON does.
func (p Problem) MarshalJSON() ([]byte, error) { return p.AppendJSON(nil), nil }

// AppendJSON appends p's JSON encoding to b. It is written by hand, not by reflection, because a
// refusal should cost less than the request it refuses.
func (p Problem) AppendJSON(b []byte) []byte {
	if p.Shape != ShapeProblem {
		return p.appendLLM(b)
	}
	typ := p.Type
	if typ == "" {
		typ = TypeBlank
	}
	b = append(b, `{"type":`...)
	b = appendJSONString(b, typ)
	if p.Title != "" {
		b = append(b, `,"title":`...)
		b = appendJSONString(b, p.Title)
	}
	if p.Status != 0 {
		b = append(b, `,"status":`...)
		b = strconv.AppendInt(b, int64(p.Status), 10)
	}
	if p.Detail != "" {
		b = append(b, `,"detail":`...)
		b = appendJSONString(b, p.Detail)
	}
	if p.Instance != "" {
		b = append(b, `,"instance":`...)
		b = appendJSONString(b, p.Instance)
	}
	if p.ViolatedPolicies != nil {
		b = append(b, `,"violated-policies":`...)
		b = appendJSONStrings(b, p.ViolatedPolicies)
	}
	if p.Client != "" {
		b = append(b, `,"client":`...)
		b = appendJSONString(b, p.Client)
	}
	if p.RetryAfter > 0 {
		b = append(b, `,"retry-after":`...)
		b = strconv.AppendInt(b, p.RetryAfter, 10)
	}
	if p.Field != "" {
		b = append(b, `,"field":`...)
		b = appendJSONString(b, p.Field)
	}
	return append(b, '}')
}

// appendJSONStrings appends ss as a JSON array of strings.
func appendJSONStrings(b []byte, ss []string) []byte {
	b = append(b, '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, s)
	}
	return append(b, ']')
}

// appendJSONString appends s as a JSON string (RFC 8259) the way encoding/json does: '"', '\' and
// control characters escaped, '<', '>' and '&' escaped so that no HTML sniffing finds markup,
// invalid UTF-8 replaced by U+FFFD, and U+2028/U+2029 escaped for JavaScript consumers.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c == '\n':
				b = append(b, '\\', 'n')
			case c == '\r':
				b = append(b, '\\', 'r')
			case c == '\t':
				b = append(b, '\\', 't')
			case c == '\b':
				b = append(b, '\\', 'b')
			case c == '\f':
				b = append(b, '\\', 'f')
			case c < 0x20 || c == '<' || c == '>' || c == '&':
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
		default:
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}

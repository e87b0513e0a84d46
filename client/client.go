// Package client provides an http.RoundTripper for programs that call a rate-limited API: when the
// server refuses a request with 429 Too Many Requests (or 503 Service Unavailable with a
// Retry-After), the Transport waits as long as the server asked, never less, and sends the
// request again, within the request's context.
//
//	c := client.New(nil) // over http.DefaultTransport
//	resp, err := c.Get("https://api.example.com/orders")
//
// or, to tune it:
//
//	c := &http.Client{Transport: &client.Transport{MaxRetries: 5, MaxWait: 10 * time.Second}}
//
// Retrying a refused request is safe whatever its method: a refused request never reached the
// backend. A request whose body cannot be sent again (a Body without GetBody) is sent once.
// Transport errors (a connection refused or reset) are returned as they are, never retried: such a
// request may have reached the backend.
package client

import (
	"context"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"time"
)

// Defaults for the zero values of Transport's fields.
const (
	DefaultMaxRetries  = 3
	DefaultMaxWait     = 30 * time.Second
	DefaultBackoffBase = 100 * time.Millisecond
	DefaultBackoffCap  = 5 * time.Second
	DefaultJitter      = 0.1
)

// drainLimit bounds how much of a discarded response's body is read so that its connection can
// be reused; a longer body is closed unread, which costs its connection and nothing else.
const drainLimit = 64 << 10

// forever is the longest time.Duration; a Retry-After too large to represent is taken as this.
const forever = time.Duration(math.MaxInt64)

// Backoff is the wait before retrying a response that did not say how long to wait (no valid
// Retry-After): "full jitter", a uniformly random wait in [0, min(Cap, Base·2^n)) before retry
// n+1 (n counts from 0).
type Backoff struct {
	Base time.Duration // ceiling of the first wait; 0: DefaultBackoffBase (100ms)
	Cap  time.Duration // no ceiling exceeds this; 0: DefaultBackoffCap (5s)
}

// Transport is an http.RoundTripper that retries responses Retryable accepts (by default: 429,
// and 503 with a valid Retry-After) after waiting:
//
//   - with a Retry-After (RFC 9110, section 10.2.3; delay-seconds, or an HTTP-date taken relative
//     to the response's Date field when it has a valid one, else to now): at least Retry-After, plus
//     up to Jitter·Retry-After so that clients told the same moment do not all come back at once.
//     An invalid Retry-After counts as absent.
//   - without: Backoff.
//
// A response is returned to the caller as it is, body unread, instead of being retried when:
// MaxRetries retries have been made; the request's body cannot be replayed; Retry-After exceeds
// MaxWait; or waiting as long as told would reach the request context's deadline. No wait is
// longer than MaxWait, and none reaches the deadline: the jitter (or backoff) is drawn from what is
// left. A response that is retried has its body drained (up to 64 KiB) and closed, so its
// connection is reused. When the context ends during a wait, RoundTrip returns the context's
// error and no response.
//
// The zero value is ready to use. A Transport has no mutable state: it is safe for concurrent
// use, as long as Base, Sleep, Retryable and Rand are; it starts no goroutine. Its fields must
// not be changed while it is in use.
type Transport struct {
	// Base sends each attempt; nil: http.DefaultTransport.
	Base http.RoundTripper

	// MaxRetries is how many times one request is sent again after its first attempt;
	// 0: DefaultMaxRetries (3); negative: never.
	MaxRetries int

	// MaxWait is the longest wait: a response whose Retry-After exceeds it is returned to the
	// caller at once, and a backoff or jitter is cut to it. 0: DefaultMaxWait (30s); negative: no
	// bound but the request's context.
	MaxWait time.Duration

	// Backoff is the wait when a retried response has no valid Retry-After.
	Backoff Backoff

	// Jitter is the largest fraction of Retry-After added to it: the wait is uniformly random in
	// [Retry-After, Retry-After·(1+Jitter)). 0: DefaultJitter (10%); negative: none, the wait is
	// exactly Retry-After.
	Jitter float64

	// Sleep waits d, or until ctx ends, in which case it returns an error (the default returns
	// ctx.Err()). nil: a timer. Tests inject a virtual clock here.
	Sleep func(ctx context.Context, d time.Duration) error

	// Retryable reports whether resp is a refusal worth retrying; nil: Refused.
	Retryable func(resp *http.Response) bool

	// Rand returns a uniformly random number in [0, 1), for the jitter and the backoff;
	// nil: math/rand/v2.Float64.
	Rand func() float64
}

// New returns an http.Client whose Transport retries refusals over base (nil:
// http.DefaultTransport) with the defaults described at Transport.
func New(base http.RoundTripper) *http.Client {
	return &http.Client{Transport: &Transport{Base: base}}
}

// Refused is the default Retryable: a 429, or a 503 that carries a valid Retry-After (a 503
// without one may be an outage rather than a refusal, and is not retried).
func Refused(resp *http.Response) bool {
	switch resp.StatusCode {
	case http.StatusTooManyRequests:
		return true
	case http.StatusServiceUnavailable:
		_, ok := RetryAfter(resp.Header, time.Now())
		return ok
	}
	return false
}

// RoundTrip implements http.RoundTripper. It sends req through Base, and again while the
// response is a refusal that may be retried (see Transport). It does not modify req: retries are
// sent as clones, each with a fresh body from req.GetBody.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	retryable := t.Retryable
	if retryable == nil {
		retryable = Refused
	}
	maxRetries := t.MaxRetries
	if maxRetries == 0 {
		maxRetries = DefaultMaxRetries
	}
	ctx := req.Context()
	deadline, _ := ctx.Deadline() // zero: none
	hasBody := req.Body != nil && req.Body != http.NoBody
	replayable := !hasBody || req.GetBody != nil

	attempt := req // the request being sent: req, then clones of it
	for retry := 0; ; retry++ {
		resp, err := base.RoundTrip(attempt)
		if err != nil || retry >= maxRetries || !replayable || !retryable(resp) {
			return resp, err
		}
		wait, ok := t.wait(resp.Header, retry, time.Now(), deadline)
		if !ok {
			return resp, nil
		}
		next := req.Clone(ctx)
		if hasBody {
			body, err := req.GetBody()
			if err != nil { // cannot replay after all: the caller gets the refusal
				return resp, nil
			}
			next.Body = body
		}
		discard(resp)
		if err := t.sleep(ctx, wait); err != nil {
			if hasBody {
				next.Body.Close()
			}
			return nil, err
		}
		attempt = next
	}
}

// CloseIdleConnections closes the idle connections of Base, if it has a CloseIdleConnections
// method (http.Transport does), so that http.Client.CloseIdleConnections reaches them.
func (t *Transport) CloseIdleConnections() {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	if c, ok := base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// wait returns how long to wait before retry number retry+1 (retry counts from 0) of a response
// with header h, received at now, for a request whose context ends at deadline (zero: never); or
// false when the response should go back to the caller instead. It reads no clock: now is an
// argument, so tests give explicit instants.
func (t *Transport) wait(h http.Header, retry int, now, deadline time.Time) (time.Duration, bool) {
	maxWait := t.MaxWait
	if maxWait == 0 {
		maxWait = DefaultMaxWait
	}
	// The wait is drawn from [told, limit): told is the least the server allows.
	var told, limit time.Duration
	if ra, ok := RetryAfter(h, now); ok {
		if maxWait > 0 && ra > maxWait {
			return 0, false
		}
		told, limit = ra, addJitter(ra, t.Jitter)
	} else {
		limit = t.Backoff.ceiling(retry)
	}
	if maxWait > 0 {
		limit = min(limit, maxWait) // ≥ told, since told ≤ maxWait
	}
	if !deadline.IsZero() {
		left := deadline.Sub(now)
		if told >= left { // the retry could not be sent before the deadline
			return 0, false
		}
		limit = min(limit, left)
	}
	return told + t.draw(limit-told), true
}

// draw returns a uniformly random duration in [0, span); 0 when span ≤ 0.
func (t *Transport) draw(span time.Duration) time.Duration {
	if span <= 0 {
		return 0
	}
	r := 0.0
	if t.Rand != nil {
		r = t.Rand()
	} else {
		r = rand.Float64()
	}
	d := time.Duration(r * float64(span)) // NaN, or r outside [0, 1), are clamped below
	if !(d >= 0) {
		return 0
	}
	return min(d, span-1)
}

// addJitter returns the exclusive upper bound of a wait for Retry-After ra: ra·(1+jitter), with
// jitter 0 meaning DefaultJitter and a negative one none; at most forever.
func addJitter(ra time.Duration, jitter float64) time.Duration {
	if jitter == 0 {
		jitter = DefaultJitter
	}
	if !(jitter > 0) {
		return ra
	}
	extra := float64(ra) * jitter
	if extra >= float64(forever-ra) {
		return forever
	}
	return ra + time.Duration(extra)
}

// ceiling returns min(Cap, Base·2^retry), with the defaults for zero fields.
func (b Backoff) ceiling(retry int) time.Duration {
	base, limit := b.Base, b.Cap
	if base <= 0 {
		base = DefaultBackoffBase
	}
	if limit <= 0 {
		limit = DefaultBackoffCap
	}
	c := base
	for i := 0; i < retry && c < limit; i++ {
		if c > limit/2 { // doubling would pass the cap (or overflow)
			return limit
		}
		c *= 2
	}
	return min(c, limit)
}

func (t *Transport) sleep(ctx context.Context, d time.Duration) error {
	if t.Sleep != nil {
		return t.Sleep(ctx, d)
	}
	return sleep(ctx, d)
}

// sleep waits d on a timer, or until ctx ends, and then returns ctx.Err().
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// discard reads up to drainLimit of resp's body and closes it, so that an HTTP/1.1 connection
// goes back to the pool instead of being torn down.
func discard(resp *http.Response) {
	if resp.Body == nil {
		return
	}
	_, _ = io.CopyN(io.Discard, resp.Body, drainLimit)
	resp.Body.Close()
}

package client

import (
	"net/http"
	"testing"
	"time"
)

// t0 is the instant the steps below are at; the Date fields say it too.
var t0 = time.Date(2025, 11, 29, 12, 0, 0, 0, time.UTC)

func header(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

func TestRetryAfter(t *testing.T) {
	date := t0.Format(http.TimeFormat) // "Sat, 29 Nov 2025 12:00:00 GMT"
	steps := []struct {
		name string
		h    http.Header
		now  time.Time
		want time.Duration
		ok   bool
	}{
		{"absent", header(), t0, 0, false},
		{"empty", header("Retry-After", ""), t0, 0, false},
		{"seconds", header("Retry-After", "120"), t0, 120 * time.Second, true},
		{"zero seconds", header("Retry-After", "0"), t0, 0, true},
		{"whitespace around", header("Retry-After", " 3 "), t0, 3 * time.Second, true},
		{"leading zeros", header("Retry-After", "007"), t0, 7 * time.Second, true},
		{"negative", header("Retry-After", "-1"), t0, 0, false},
		{"plus sign", header("Retry-After", "+1"), t0, 0, false},
		{"fraction", header("Retry-After", "1.5"), t0, 0, false},
		{"unit", header("Retry-After", "5s"), t0, 0, false},
		{"words", header("Retry-After", "soon"), t0, 0, false},
		{"too large for a Duration", header("Retry-After", "9223372037"), t0, forever, true},
		{"too large for uint64", header("Retry-After", "99999999999999999999999"), t0, forever, true},
		{"largest representable", header("Retry-After", "9223372036"), t0, 9223372036 * time.Second, true},
		{"first of several", header("Retry-After", "2", "Retry-After", "9"), t0, 2 * time.Second, true},

		// HTTP-dates: relative to Date when valid, else to now.
		{"IMF-fixdate, no Date", header("Retry-After", "Sat, 29 Nov 2025 12:00:05 GMT"), t0, 5 * time.Second, true},
		{"IMF-fixdate, now later", header("Retry-After", "Sat, 29 Nov 2025 12:00:05 GMT"), t0.Add(2 * time.Second), 3 * time.Second, true},
		{"IMF-fixdate, Date wins over now", header("Retry-After", "Sat, 29 Nov 2025 12:00:05 GMT", "Date", date),
			t0.Add(time.Hour), 5 * time.Second, true},
		{"IMF-fixdate, invalid Date ignored", header("Retry-After", "Sat, 29 Nov 2025 12:00:05 GMT", "Date", "yesterday"),
			t0.Add(time.Second), 4 * time.Second, true},
		{"RFC 850", header("Retry-After", "Saturday, 29-Nov-25 12:01:00 GMT", "Date", date), t0, time.Minute, true},
		{"asctime", header("Retry-After", "Sat Nov 29 12:00:10 2025", "Date", date), t0, 10 * time.Second, true},
		{"date in the past", header("Retry-After", "Sat, 29 Nov 2025 11:00:00 GMT", "Date", date), t0, 0, true},
		{"bad date", header("Retry-After", "Sat, 32 Nov 2025 12:00:00 GMT"), t0, 0, false},
	}
	for _, s := range steps {
		got, ok := RetryAfter(s.h, s.now)
		if got != s.want || ok != s.ok {
			t.Errorf("%s: RetryAfter(%q) = %v, %v; want %v, %v", s.name, s.h, got, ok, s.want, s.ok)
		}
	}
}

// TestWait runs Transport.wait at explicit instants: what it waits, or that it gives the response
// back (ok false). rand is what Rand returns.
func TestWait(t *testing.T) {
	almost1 := 1 - 1e-12
	steps := []struct {
		name  string
		tr    Transport
		h     http.Header
		retry int
		left  time.Duration // until the context's deadline; 0: none
		rand  float64
		want  time.Duration
		ok    bool
	}{
		// Retry-After, default 10% jitter.
		{name: "told, no jitter drawn", h: header("Retry-After", "2"), rand: 0, want: 2 * time.Second, ok: true},
		{name: "told, half the jitter", h: header("Retry-After", "2"), rand: 0.5, want: 2100 * time.Millisecond, ok: true},
		{name: "told, most jitter", h: header("Retry-After", "2"), rand: almost1, want: 2200*time.Millisecond - 1, ok: true},
		{name: "Rand out of range is clamped", h: header("Retry-After", "2"), rand: 7, want: 2200*time.Millisecond - 1, ok: true},
		{name: "negative Rand is clamped", h: header("Retry-After", "2"), rand: -1, want: 2 * time.Second, ok: true},
		{name: "Retry-After 0", h: header("Retry-After", "0"), rand: almost1, want: 0, ok: true},
		{name: "custom jitter", tr: Transport{Jitter: 0.5}, h: header("Retry-After", "2"), rand: 0.5, want: 2500 * time.Millisecond, ok: true},
		{name: "no jitter", tr: Transport{Jitter: -1}, h: header("Retry-After", "2"), rand: almost1, want: 2 * time.Second, ok: true},

		// MaxWait.
		{name: "Retry-After at MaxWait: exactly it", h: header("Retry-After", "30"), rand: almost1, want: 30 * time.Second, ok: true},
		{name: "Retry-After past MaxWait", h: header("Retry-After", "31"), rand: 0, ok: false},
		{name: "custom MaxWait", tr: Transport{MaxWait: 5 * time.Second}, h: header("Retry-After", "6"), ok: false},
		{name: "jitter cut to MaxWait", tr: Transport{MaxWait: 5 * time.Second}, h: header("Retry-After", "5"), rand: almost1, want: 5 * time.Second, ok: true},
		{name: "no MaxWait", tr: Transport{MaxWait: -1, Jitter: -1}, h: header("Retry-After", "3600"), want: time.Hour, ok: true},
		{name: "no MaxWait, huge Retry-After", tr: Transport{MaxWait: -1}, h: header("Retry-After", "99999999999"), rand: almost1, want: forever, ok: true},

		// The context's deadline.
		{name: "deadline after the wait", h: header("Retry-After", "1"), left: 2 * time.Second, rand: almost1, want: 1100*time.Millisecond - 1, ok: true},
		{name: "deadline before Retry-After", h: header("Retry-After", "2"), left: time.Second, ok: false},
		{name: "deadline at Retry-After", h: header("Retry-After", "1"), left: time.Second, ok: false},
		{name: "jitter cut to the deadline", h: header("Retry-After", "1"), left: 1050 * time.Millisecond, rand: almost1, want: 1050*time.Millisecond - 1, ok: true},
		{name: "deadline passed", h: header("Retry-After", "0"), left: -time.Second, ok: false},
		{name: "backoff cut to the deadline", retry: 9, left: time.Second, rand: almost1, want: time.Second - 1, ok: true},

		// Backoff (no valid Retry-After): [0, min(5s, 100ms·2^retry)).
		{name: "backoff 0", retry: 0, rand: almost1, want: 100*time.Millisecond - 1, ok: true},
		{name: "backoff 1", retry: 1, rand: almost1, want: 200*time.Millisecond - 1, ok: true},
		{name: "backoff 5", retry: 5, rand: almost1, want: 3200*time.Millisecond - 1, ok: true},
		{name: "backoff 6 capped", retry: 6, rand: almost1, want: 5*time.Second - 1, ok: true},
		{name: "backoff 1000 capped", retry: 1000, rand: almost1, want: 5*time.Second - 1, ok: true},
		{name: "backoff full jitter", retry: 3, rand: 0, want: 0, ok: true},
		{name: "backoff half", retry: 3, rand: 0.5, want: 400 * time.Millisecond, ok: true},
		{name: "invalid Retry-After backs off", h: header("Retry-After", "soon"), rand: almost1, want: 100*time.Millisecond - 1, ok: true},
		{name: "custom backoff", tr: Transport{Backoff: Backoff{Base: time.Second, Cap: 3 * time.Second}}, retry: 1, rand: almost1, want: 2*time.Second - 1, ok: true},
		{name: "custom backoff capped", tr: Transport{Backoff: Backoff{Base: time.Second, Cap: 3 * time.Second}}, retry: 2, rand: almost1, want: 3*time.Second - 1, ok: true},
		{name: "base above cap", tr: Transport{Backoff: Backoff{Base: 10 * time.Second}}, rand: almost1, want: 5*time.Second - 1, ok: true},
		{name: "huge cap no overflow", tr: Transport{MaxWait: -1, Backoff: Backoff{Base: time.Second, Cap: forever}}, retry: 80, rand: 0.5, want: 1 << 62, ok: true},
		{name: "backoff cut to MaxWait", tr: Transport{MaxWait: time.Second, Backoff: Backoff{Cap: time.Minute}}, retry: 9, rand: almost1, want: time.Second - 1, ok: true},
	}
	for _, s := range steps {
		tr := s.tr
		r := s.rand
		tr.Rand = func() float64 { return r }
		var deadline time.Time
		if s.left != 0 {
			deadline = t0.Add(s.left)
		}
		got, ok := tr.wait(s.h, s.retry, t0, deadline)
		if ok != s.ok || (ok && got != s.want) {
			t.Errorf("%s: wait = %v, %v; want %v, %v", s.name, got, ok, s.want, s.ok)
		}
	}
}

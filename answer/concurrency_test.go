package answer

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

var inFlight = sluice.Policy{Name: "in-flight", Algorithm: sluice.Concurrency, Limit: 5, Period: 30 * time.Second}

// TestConcurrencyFields: a concurrency policy's RateLimit-Policy member has the draft's quota unit
// qu="concurrent-requests" and no window (its lease is none); the rate policy beside it keeps w.
func TestConcurrencyFields(t *testing.T) {
	h := http.Header{}
	Headers(h, []Applied{
		{perSecond, sluice.Decision{Allowed: true, Limit: 10, Remaining: 7, ResetAfter: 300 * time.Millisecond}, "", ""},
		{inFlight, sluice.Decision{Allowed: true, Limit: 5, Remaining: 4, ResetAfter: 30 * time.Second}, "", ""},
	}, false)
	if got, want := h.Get("RateLimit-Policy"), `"per-second";q=10;w=1, "in-flight";q=5;qu="concurrent-requests"`; got != want {
		t.Errorf("RateLimit-Policy: %s, want %s", got, want)
	}
	if got, want := h.Get("RateLimit"), `"per-second";r=7;t=1, "in-flight";r=4;t=30`; got != want {
		t.Errorf("RateLimit: %s, want %s", got, want)
	}
	refused := []Applied{{inFlight, sluice.Decision{Limit: 5, RetryAfter: time.Second, ResetAfter: 30 * time.Second}, "", ""}}
	h = http.Header{}
	Headers(h, refused, false)
	if got, want := h.Get("RateLimit"), `"in-flight";r=0;t=1`; got != want {
		t.Errorf("refused RateLimit: %s, want %s", got, want)
	}
	p := QuotaExceeded("partner-a", refused)
	if want := `client "partner-a" exceeded policy "in-flight" (5 requests in flight at once); retry after about 1 s (a slot frees when one of the client's requests in flight ends)`; p.Detail != want {
		t.Errorf("detail %q,\nwant %q", p.Detail, want)
	}
	if strings.Contains(p.Detail, "refused too") {
		t.Error("a concurrency refusal's wait is a hint, not a promise")
	}
}

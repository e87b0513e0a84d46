package answer

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	_ "time/tzdata" // the zones, also where there is no /usr/share/zoneinfo
)

// A calendar policy's w is the length of the calendar window now is in: Berlin's 23- and
// 25-hour days, a leap February, a year.
func TestHeadersCalendarWindow(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { now = time.Now }()
	for _, c := range []struct {
		at   time.Time
		cal  sluice.Calendar
		loc  *time.Location
		want string
	}{
		{time.Date(2026, 3, 29, 12, 0, 0, 0, berlin), sluice.Day, berlin, `"cal";q=10;w=82800`},
		{time.Date(2026, 10, 25, 12, 0, 0, 0, berlin), sluice.Day, berlin, `"cal";q=10;w=90000`},
		{time.Date(2026, 10, 26, 0, 0, 0, 0, berlin), sluice.Day, berlin, `"cal";q=10;w=86400`},
		{time.Date(2028, 2, 29, 23, 0, 0, 0, time.UTC), sluice.Month, nil, `"cal";q=10;w=2505600`},
		{time.Date(2026, 12, 31, 23, 0, 0, 0, berlin), sluice.Week, berlin, `"cal";q=10;w=604800`},
		{time.Date(2028, 7, 1, 0, 0, 0, 0, time.UTC), sluice.Year, nil, `"cal";q=10;w=31622400`},
	} {
		now = func() time.Time { return c.at }
		p := sluice.Policy{Name: "cal", Algorithm: sluice.SlidingWindow, Limit: 10, Calendar: c.cal, Location: c.loc}
		h := http.Header{}
		Headers(h, []Applied{{Policy: p, Decision: sluice.Decision{Allowed: true, Limit: 10, Remaining: 9, ResetAfter: time.Hour}}}, false)
		if got := h.Get(FieldRateLimitPolicy); got != c.want {
			t.Errorf("%v at %v: RateLimit-Policy %q, want %q", c.cal, c.at, got, c.want)
		}
	}
}

func TestQuotaExceededCalendar(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	p := sluice.Policy{Name: "daily", Algorithm: sluice.FixedWindow, Limit: 10000, Calendar: sluice.Day, Location: berlin}
	pr := QuotaExceeded("partner-a", []Applied{{Policy: p, Decision: sluice.Decision{Limit: 10000, RetryAfter: time.Hour}}})
	if want := `exceeded policy "daily" (10000 requests per day in Europe/Berlin)`; !strings.Contains(pr.Detail, want) {
		t.Errorf("detail %q, want it to say %q", pr.Detail, want)
	}
}

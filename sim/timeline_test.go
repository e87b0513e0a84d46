package sim

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

func TestNewTimelineWidth(t *testing.T) {
	for _, tc := range []struct {
		first, last    int64
		width, firstAt int64
		buckets        int
	}{
		{0, 20800 * ms, sec, 0, 21},
		{0, 59 * sec, sec, 0, 60},
		{0, 60 * sec, 2 * sec, 0, 31},
		{0, 600 * sec, 15 * sec, 0, 41},
		{3600 * sec, 3659*sec + 999999, sec, 3600 * sec, 60},
		{500 * ms, 500 * ms, sec, 0, 1},
		{0, 7198 * sec, 2 * minute, 0, 60},
		{0, 1000 * day, 17 * day, 0, 59},
	} {
		tl := NewTimeline([]Request{{TMicros: tc.first}, {TMicros: tc.last}}, 60)
		if tl.WidthMicros != tc.width || tl.FirstMicros != tc.firstAt || len(tl.Buckets) != tc.buckets {
			t.Errorf("requests from %d to %d µs: width %d, first %d, %d buckets; want %d, %d, %d",
				tc.first, tc.last, tl.WidthMicros, tl.FirstMicros, len(tl.Buckets), tc.width, tc.firstAt, tc.buckets)
		}
		if len(tl.Buckets) > 60 {
			t.Errorf("requests from %d to %d µs: %d buckets, more than 60", tc.first, tc.last, len(tl.Buckets))
		}
	}
	if tl := NewTimeline(nil, 60); len(tl.Buckets) != 0 {
		t.Errorf("no requests: %d buckets", len(tl.Buckets))
	}
}

func TestTimelineCounts(t *testing.T) {
	reqs := burstTraffic(t)
	tl := NewTimeline(reqs, 60)
	_, err := Simulate(sluice.Policy{Algorithm: sluice.LeakyBucket, Limit: 5, Period: time.Second, Burst: 10}, reqs, func(r Row) error {
		tl.Add(r)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A queue of 10 behind the one being served: in the burst, the i-th request waits i·175ms,
	// which must be ≤ 10·200ms: i ≤ 11 pass, then one more each time the queue drains a slot.
	b := tl.Buckets[10]
	if b.StartMicros != 10*sec || b.Offered != 40 || b.Allowed+b.Refused != 40 || b.Delayed != b.Allowed-1 {
		t.Errorf("burst bucket %+v", b)
	}
	if b.MaxDelayMicros > 2*sec || b.MaxDelayMicros < 1900*ms {
		t.Errorf("burst bucket: max delay %d µs, want just under 2s", b.MaxDelayMicros)
	}
	for i, b := range tl.Buckets[:10] {
		if b != (Bucket{StartMicros: int64(i) * sec, Offered: 5, Allowed: 5}) {
			t.Errorf("bucket %d = %+v, want 5 offered and allowed at once", i, b)
		}
	}
	tl.Add(Row{Request: Request{TMicros: 99 * sec}}) // outside: ignored
	var offered int64
	for _, b := range tl.Buckets {
		offered += b.Offered
	}
	if offered != 140 {
		t.Errorf("buckets hold %d requests, want 140", offered)
	}
}

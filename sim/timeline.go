package sim

// Timeline counts the rows of a run in buckets of equal width on the virtual clock, aligned to
// 0: bucket i covers [FirstMicros + i·WidthMicros, FirstMicros + (i+1)·WidthMicros).
type Timeline struct {
	WidthMicros int64    // one of TimelineWidths, or a whole number of days beyond them
	FirstMicros int64    // start of the first bucket: the first request's time, rounded down to WidthMicros
	Buckets     []Bucket // from the first request's bucket to the last one's, empty ones included
}

// Bucket counts the requests offered in one interval of a Timeline.
type Bucket struct {
	StartMicros    int64
	Offered        int64
	Allowed        int64
	Refused        int64 // Never included
	Delayed        int64
	MaxDelayMicros int64
}

const (
	second = int64(1e6)
	minute = 60 * second
	hour   = 60 * minute
	day    = 24 * hour
)

// TimelineWidths are the bucket widths NewTimeline chooses from, narrowest first.
var TimelineWidths = []int64{
	second, 2 * second, 5 * second, 10 * second, 15 * second, 30 * second,
	minute, 2 * minute, 5 * minute, 10 * minute, 15 * minute, 30 * minute,
	hour, 2 * hour, 3 * hour, 6 * hour, 12 * hour, day, 2 * day, 7 * day,
}

// NewTimeline returns an empty timeline for reqs (in time order) with at most maxBuckets buckets
// (taken as at least 2): the narrowest width of TimelineWidths that needs no more, or beyond them a whole
// number of days.
func NewTimeline(reqs []Request, maxBuckets int) *Timeline {
	if len(reqs) == 0 {
		return &Timeline{WidthMicros: second}
	}
	maxBuckets = max(2, maxBuckets)
	first, last := reqs[0].TMicros, reqs[len(reqs)-1].TMicros
	width := int64(0)
	for _, w := range TimelineWidths {
		if last/w-first/w < int64(maxBuckets) {
			width = w
			break
		}
	}
	if width == 0 {
		// (last-first)/w + 2 buckets at most; so with w ≥ (last-first)/(maxBuckets-1), maxBuckets.
		days := (last-first)/day/int64(maxBuckets-1) + 1
		width = days * day
	}
	t := &Timeline{WidthMicros: width, FirstMicros: first / width * width}
	t.Buckets = make([]Bucket, last/width-first/width+1)
	for i := range t.Buckets {
		t.Buckets[i].StartMicros = t.FirstMicros + int64(i)*width
	}
	return t
}

// Add counts r into its bucket; a row outside the timeline's span is ignored.
func (t *Timeline) Add(r Row) {
	if r.TMicros < t.FirstMicros {
		return
	}
	i := (r.TMicros - t.FirstMicros) / t.WidthMicros
	if i >= int64(len(t.Buckets)) {
		return
	}
	b := &t.Buckets[i]
	b.Offered++
	switch {
	case !r.Allowed:
		b.Refused++
	case r.DelayMicros > 0:
		b.Allowed++
		b.Delayed++
		b.MaxDelayMicros = max(b.MaxDelayMicros, r.DelayMicros)
	default:
		b.Allowed++
	}
}

package envoyfilter

import (
	"testing"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

var (
	a  = map[string]string{"name": "a"}
	b  = map[string]string{"name": "b"}
	t0 = time.Unix(1_000_000, 0)
)

func blanketRule(allow bool) *typev3.RateLimitStrategy {
	r := typev3.RateLimitStrategy_DENY_ALL
	if allow {
		r = typev3.RateLimitStrategy_ALLOW_ALL
	}
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: r}}
}

func bucketRule(max, perFill uint32, every time.Duration) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens: max, TokensPerFill: wrapperspb.UInt32(perFill), FillInterval: durationpb.New(every)}}}
}

func allowed(f *Filter, id map[string]string, n int, now time.Time) (k int) {
	for range n {
		if f.Decide(id, now).Allowed {
			k++
		}
	}
	return k
}

// A new bucket's first request is admitted (unless no_assignment is DENY_ALL) and reported at
// once, alone, with no time elapsed; the next requests follow no_assignment_behavior.
func TestFirstRequest(t *testing.T) {
	f := New(Config{NoAssignment: blanketRule(false)})
	d := f.Decide(a, t0)
	if d.Allowed || d.State != NoAssignment || len(d.First) != 1 || d.First[0].Elapsed != 0 || d.First[0].Denied != 1 {
		t.Fatalf("deny-all first request: %+v", d)
	}
	f = New(Config{NoAssignment: bucketRule(1, 1, time.Hour)})
	if d := f.Decide(a, t0); !d.Allowed || d.First == nil {
		t.Fatalf("first request under a fallback bucket: %+v", d)
	}
	// The fallback bucket is built for the second request, full: 1 more, then none.
	if got := allowed(f, a, 3, t0); got != 1 {
		t.Errorf("after the first: %d admitted, want 1", got)
	}
	if d := f.Decide(a, t0); d.First != nil {
		t.Error("a second report of the first request")
	}
	deferred := New(Config{DeferFirstReport: true})
	if d := deferred.Decide(a, t0); !d.Allowed || d.First != nil {
		t.Errorf("deferred first report: %+v", d)
	}
}

// An assignment's token bucket starts full and refills; the same assignment again keeps it (not
// built), a different one builds a new one, full; it expires into the expired behaviour.
func TestAssignment(t *testing.T) {
	f := New(Config{Expired: &ExpiredBehavior{Fallback: blanketRule(false)}})
	f.Decide(a, t0)
	s := bucketRule(5, 60, time.Minute) // 1 a second, 5 at most
	if ap := f.Apply(Action{ID: a, Strategy: s, TTL: 10 * time.Second}, t0); ap.Unknown || !ap.Built {
		t.Fatalf("first assignment: %+v", ap)
	}
	if got := allowed(f, a, 10, t0); got != 5 {
		t.Errorf("a full bucket admitted %d, want 5", got)
	}
	now := t0.Add(2 * time.Second)
	if ap := f.Apply(Action{ID: a, Strategy: bucketRule(5, 60, time.Minute), TTL: 10 * time.Second}, now); ap.Built {
		t.Error("the same assignment again built a new bucket")
	}
	if got := allowed(f, a, 10, now); got != 2 {
		t.Errorf("after 2s: %d admitted, want the 2 refilled", got)
	}
	if ap := f.Apply(Action{ID: a, Strategy: bucketRule(3, 60, time.Minute), TTL: 10 * time.Second}, now); !ap.Built {
		t.Error("a changed assignment built no bucket")
	}
	if got := allowed(f, a, 10, now); got != 3 {
		t.Errorf("a new bucket admitted %d, want its 3", got)
	}
	later := now.Add(10 * time.Second)
	if d := f.Decide(a, later); d.Allowed || d.State != Expired {
		t.Errorf("expired: %+v", d)
	}
	st, ok := f.Stats(a, later)
	if !ok || st.State != Expired || st.Total.Allowed != 11 {
		t.Errorf("stats %+v", st)
	}
	if ap := f.Apply(Action{ID: b, Abandon: true}, later); !ap.Unknown {
		t.Error("an unknown bucket's action applied")
	}
	f.Apply(Action{ID: a, Abandon: true}, later)
	if f.Buckets() != 0 {
		t.Error("abandoned bucket kept")
	}
}

// reuse_last_assignment keeps the expired bucket; a timeout abandons the bucket, so the next
// request is a new bucket's first; no expired behaviour goes back to no_assignment.
func TestExpiredBehaviours(t *testing.T) {
	s := bucketRule(2, 1, time.Hour)
	reuse := New(Config{NoAssignment: blanketRule(false), Expired: &ExpiredBehavior{ReuseLast: true, Timeout: time.Minute}})
	none := New(Config{NoAssignment: blanketRule(false)})
	for _, f := range []*Filter{reuse, none} {
		f.Decide(a, t0)
		f.Apply(Action{ID: a, Strategy: s, TTL: time.Second}, t0)
		f.Decide(a, t0) // one of the two tokens
	}
	later := t0.Add(2 * time.Second)
	if d := reuse.Decide(a, later); !d.Allowed || d.State != Expired {
		t.Errorf("reuse: %+v", d)
	}
	if d := none.Decide(a, later); d.Allowed || d.State != NoAssignment {
		t.Errorf("no expired behaviour: %+v", d)
	}
	if d := reuse.Decide(a, t0.Add(61*time.Second)); d.First == nil {
		t.Errorf("after the timeout: %+v, want a new bucket", d)
	}
}

// A report holds every bucket, in the order of their keys, with its counts since the last one (a
// first request was reported on its own).
func TestReport(t *testing.T) {
	f := New(Config{})
	if f.Report(t0) != nil {
		t.Error("a report without buckets")
	}
	f.Decide(b, t0)
	f.Decide(a, t0)
	f.Decide(a, t0)
	us := f.Report(t0.Add(5 * time.Second))
	if len(us) != 2 || us[0].ID["name"] != "a" || us[0].Allowed != 1 || us[0].Elapsed != 5*time.Second || us[1].Allowed != 0 {
		t.Fatalf("report %+v", us)
	}
	if us := f.Report(t0.Add(6 * time.Second)); us[0].Allowed != 0 || us[0].Elapsed != time.Second {
		t.Errorf("second report %+v", us)
	}
	if ws := f.Windows(nil); len(ws) != 1 || ws[0].Allowed != 3 {
		t.Errorf("windows %+v", ws)
	}
}

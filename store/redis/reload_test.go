package redis_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/store/redis"
)

// TestNegativeCacheFollowsAPolicyChange: a reload that changes a policy's numbers under the same
// name takes effect at once. A refusal cached under the old policy (2 an hour) is not served
// under the new one (100 an hour), which decides in Redis and approves, keeping the 2 used (97
// left after it); the stale entry is dropped, so that the old policy, were it back, asks Redis too.
func TestNegativeCacheFollowsAPolicyChange(t *testing.T) {
	srv := redistest.Start(t)
	t0 := int64(1_800_000_000_000_000)
	clock := sluice.NewManualClock(time.UnixMicro(t0))
	st := openStore(t, srv, redis.Options{Clock: clock, Timeout: 5 * time.Second})
	p := sluice.Policy{Name: "reloaded", Algorithm: sluice.FixedWindow, Limit: 2, Period: time.Hour}
	raised := p
	raised.Limit = 100
	// refuse spends key's quota under p and has its refusal cached.
	clone := func(s algorithm.State) *algorithm.State { return &s }
	refuse := func(key string) {
		t.Helper()
		for i := range 2 {
			if d, err := st.Decide(bg, key, p, 1); err != nil || !d.Allowed {
				t.Fatalf("%s request %d: %+v %v", key, i, d, err)
			}
		}
		for i := range 2 {
			if d, err := st.Decide(bg, key, p, 1); err != nil || d.Allowed || d.Cached() != (i == 1) {
				t.Fatalf("%s refusal %d: %+v %v; want refused, the second from the cache", key, i, d, err)
			}
		}
	}
	refuse("c")
	var used algorithm.State
	algorithm.Decide(&p, &used, t0, 2)
	want, _ := algorithm.Decide(&raised, clone(used), t0, 1)
	if want.Remaining != 97 {
		t.Fatalf("the model: %+v, want 97 left", want)
	}
	calls := st.Stats().Calls
	if d, err := st.Decide(bg, "c", raised, 1); err != nil || d != want {
		t.Fatalf("the raised limit after a refusal cached under the old one: %+v %v; want %+v", d, err, want)
	}
	if n := st.Stats().Calls - calls; n != 1 {
		t.Fatalf("%d calls to Redis for the decision under the raised limit; want 1", n)
	}

	// A peek under the new policy approves without writing, so only its lookup can drop the
	// stale entry: the old policy then asks Redis.
	refuse("d")
	want, _ = algorithm.Decide(&raised, clone(used), t0, 0)
	calls = st.Stats().Calls
	if d, err := st.Decide(bg, "d", raised, 0); err != nil || d != want {
		t.Fatalf("a peek under the raised limit: %+v %v; want %+v", d, err, want)
	}
	if d, err := st.Decide(bg, "d", p, 1); err != nil || d.Allowed || d.Cached() {
		t.Fatalf("the old policy after a lookup under the new one: %+v %v; want refused by Redis, not the cache", d, err)
	}
	if n := st.Stats().Calls - calls; n != 2 {
		t.Fatalf("%d calls to Redis for a peek and a refusal; want 2", n)
	}
}

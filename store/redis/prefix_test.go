package redis_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/store/redis"
)

// TestPrefixWithoutSeparator: a prefix that does not end in ':' is followed by one in every key
// (it used to be glued to the names: "ctrinstances", "ctr{client}:..."); one that does is kept as
// it is, as the default "rate-limit:" is.
func TestPrefixWithoutSeparator(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	rate := sluice.Policy{Name: "api", Algorithm: sluice.FixedWindow, Limit: 5, Period: time.Minute}
	conc := sluice.Policy{Name: "par", Algorithm: sluice.Concurrency, Limit: 2, Period: time.Minute}
	for prefix, want := range map[string]string{"ctr": "ctr:", "ok:": "ok:", "": "rate-limit:"} {
		s := openStore(t, srv, redis.Options{Prefix: prefix, Timeout: 2 * time.Second})
		if _, err := s.Decide(ctx, "client", rate, 1); err != nil {
			t.Fatal(err)
		}
		var out [1]sluice.Decision
		if _, err := s.DecideAll(ctx, "client", []sluice.Limit{{Policy: conc, Cost: 1, Lease: 7}}, out[:]); err != nil {
			t.Fatal(err)
		}
		beat(t, openFleet(t, s, "gw-"+prefix))
		keys := strings.Split(mustDo(t, srv, "KEYS", want+"*"), "\n")
		slices.Sort(keys)
		wantKeys := []string{want + "instances", want + "{client}:api:v2", want + "{client}:par:slots"}
		for _, k := range wantKeys {
			if !slices.Contains(keys, k) {
				t.Errorf("prefix %q: no key %q in Redis; its keys: %q", prefix, k, keys)
			}
		}
	}
	if all := mustDo(t, srv, "KEYS", "ctr{*"); all != "" {
		t.Errorf("keys glued to the prefix: %q", all)
	}
}

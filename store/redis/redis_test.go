package redis_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	redisstore "github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/storetest"
)

// newStore opens a store on opts, with a generous timeout unless opts sets one: these tests are
// about decisions, and under the race detector on a loaded CI machine a call can take longer
// than the 50 ms default (the failure tests, which are about timeouts, set their own).
func newStore(t testing.TB, opts redisstore.Options) *redisstore.Store {
	t.Helper()
	if opts.Timeout == 0 {
		opts.Timeout = 5 * time.Second
	}
	s, err := redisstore.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// The conformance suite on one real Redis: every decision of the golden and fuzzed traces equals
// the pure core's, on a virtual clock passed to the scripts. The negative cache is off here: it
// answers refusals locally, which the suite would not see (it is tested on its own).
func TestConformanceSingleRedis(t *testing.T) {
	srv := redistest.Start(t)
	n := 0
	storetest.Run(t, func(t *testing.T, c sluice.Clock) sluice.Store {
		n++ // a fresh prefix per trace: a fresh store
		return newStore(t, redisstore.Options{Addrs: []string{srv.Addr}, Clock: c, Prefix: fmt.Sprintf("t%d:", n), NegativeCacheSize: -1})
	})
}

// The same suite on a real 3-master Redis Cluster: keys spread over the masters' slots, one
// client's keys share a slot, and there is never a CROSSSLOT.
func TestConformanceCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	n := 0
	storetest.Run(t, func(t *testing.T, c sluice.Clock) sluice.Store {
		n++
		return newStore(t, redisstore.Options{Addrs: cluster.Addrs(), Clock: c, Prefix: fmt.Sprintf("t%d:", n), NegativeCacheSize: -1})
	})
	// The keys did spread: every master holds some.
	for _, s := range cluster.Servers {
		if n, err := s.Do("DBSIZE"); err != nil || n == "0" {
			t.Errorf("master %s holds %s keys (%v), want some: keys are not spread over slots", s.Addr, n, err)
		}
	}
}

// The negative cache answers the same refusals as Redis would: the conformance traces with it on
// give the same decisions, RetryAfter and ResetAfter included (on a virtual clock, which does not
// move during a call, the time the request was sent is Redis's time) — all but Remaining, which a
// cached refusal reports as of the refusal it remembers, so at most the truth.
func TestConformanceWithNegativeCache(t *testing.T) {
	srv := redistest.Start(t)
	n := 0
	storetest.Suite{CachedRefusals: true, New: func(t *testing.T, c sluice.Clock) sluice.Store {
		n++
		return newStore(t, redisstore.Options{Addrs: []string{srv.Addr}, Clock: c, Prefix: fmt.Sprintf("t%d:", n)})
	}}.Run(t)
}

func TestConnectByURLWithACLUser(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", "default-secret")
	// An ACL user that may run scripts on rate-limit keys only.
	if out, err := srv.DoAuth("default-secret", "ACL", "SETUSER", "sluice", "on", ">s3cret", "~rate-limit:*", "+@scripting", "+@read", "+@write", "+time", "+@connection", "+cluster"); err != nil {
		t.Fatalf("ACL SETUSER: %v %s", err, out)
	}
	p := sluice.Policy{Name: "api", Algorithm: sluice.FixedWindow, Limit: 2, Period: time.Minute}
	s := newStore(t, redisstore.Options{URL: "redis://sluice:s3cret@" + srv.Addr + "/0"})
	lim, err := sluice.NewLimiter(s, p)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := lim.Allow(context.Background(), "c"); err != nil || !d.Allowed || d.Remaining != 1 {
		t.Fatalf("decision as ACL user: %+v %v", d, err)
	}
	// A wrong password fails at New, with an error that says the store is unavailable.
	_, err = redisstore.New(redisstore.Options{URL: "redis://sluice:wrong@" + srv.Addr})
	if !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Fatalf("wrong password: %v, want ErrStoreUnavailable", err)
	}
	for _, bad := range []redisstore.Options{
		{},
		{URL: "http://" + srv.Addr},
		{URL: "redis://" + srv.Addr, Addrs: []string{srv.Addr}},
	} {
		if _, err := redisstore.New(bad); err == nil {
			t.Errorf("New(%+v): no error", bad)
		}
	}
}

// Policies whose products would lose exactness in Lua's doubles are refused by NewLimiter, with
// the field and the way out in the message; fixed windows and logs have no such bound.
func TestCheckPolicyBounds(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, redisstore.Options{Addrs: []string{srv.Addr}})
	big := sluice.Policy{Name: "daily", Algorithm: sluice.SlidingWindow, Limit: 1_000_000, Period: 24 * time.Hour}
	_, err := sluice.NewLimiter(s, big)
	if !errors.Is(err, sluice.ErrInvalidPolicy) || !strings.Contains(err.Error(), `policy "daily"`) || !strings.Contains(err.Error(), "fixed-window") {
		t.Fatalf("sliding window of a million a day: %v, want ErrInvalidPolicy naming the policy and the way out", err)
	}
	for _, ok := range []sluice.Policy{
		{Name: "daily-fw", Algorithm: sluice.FixedWindow, Limit: 1_000_000_000, Period: 24 * time.Hour},
		{Name: "daily-sw", Algorithm: sluice.SlidingWindow, Limit: 10_000, Period: 24 * time.Hour},
		{Name: "per-second", Algorithm: sluice.TokenBucket, Limit: 1_000_000, Period: time.Second, Burst: 2_000_000},
	} {
		if _, err := sluice.NewLimiter(s, ok); err != nil {
			t.Errorf("%s: %v", ok.Name, err)
		}
	}
}

// rediss:// connects over TLS, verifying the server against the CA given in Options.TLS; a
// client that does not trust that CA is refused.
func TestConnectOverTLS(t *testing.T) {
	srv, tlsConfig := redistest.StartTLS(t)
	s := newStore(t, redisstore.Options{URL: "rediss://" + srv.Addr, TLS: tlsConfig})
	lim, err := sluice.NewLimiter(s, sluice.Policy{Name: "api", Algorithm: sluice.TokenBucket, Limit: 5, Period: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := lim.Allow(context.Background(), "c"); err != nil || !d.Allowed || d.Remaining != 4 {
		t.Fatalf("decision over TLS: %+v %v", d, err)
	}
	if keys, _ := srv.Do("KEYS", "*"); !strings.Contains(keys, "rate-limit:{c}:api") {
		t.Fatalf("keys on the TLS server: %q", keys)
	}
	// (A generous timeout: a handshake slower than the dial timeout would be "no answer", which
	// New waits for in the background; this is about the refusal.)
	if _, err := redisstore.New(redisstore.Options{URL: "rediss://" + srv.Addr, Timeout: 5 * time.Second}); !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Fatalf("rediss:// without trusting the test CA: %v, want ErrStoreUnavailable", err)
	}
}

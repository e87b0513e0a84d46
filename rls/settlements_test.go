package rls_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decision"
	"github.com/sluicehq/sluice/rls"
	"github.com/sluicehq/sluice/rls/envoyconf"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/storetest"
)

// TestUsageChargePending: on a decider with Settlements (as sluice serve runs the service), a
// hits_addend charge past the limit — decided without it, then added — that the store could not
// take when asked neither fails the call (OVER_LIMIT) nor is lost: it is pending, and once the
// store takes it, it is counted once. The counter is a token bucket of 10 a day (a token every
// 2.4 hours): 6, then 6 more, owe 2, so a request of 1 waits 3 tokens' time, 7.2 hours (counted
// twice, it would wait 9 tokens').
func TestUsageChargePending(t *testing.T) {
	conf, err := envoyconf.Parse([]byte(usageConf), "envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	st := storetest.NewSettleOutage(memory.New())
	settlements := sluice.NewSettlements(st, sluice.SettlementOptions{Backoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	defer settlements.Close(context.Background())
	d := decision.Decider{Store: st, Settlements: settlements}
	s := rls.New(conf, d.Decide)
	if got := statuses(s, t, 0, use(desc("bucket", "a"), 6)); got[0] != (answered{"OK", 4}) {
		t.Fatalf("charge 6 of 10: %v", got)
	}
	st.Down.Store(true)
	// 6 more do not fit: decided without them (a peek), then charged on their own — which fails.
	if got := statuses(s, t, 0, use(desc("bucket", "a"), 6)); got[0].code != "OVER_LIMIT" {
		t.Fatalf("charge 6 more while the store takes no charge: %v, want OVER_LIMIT", got)
	}
	if p := settlements.Stats().Pending; p != 1 {
		t.Fatalf("pending %d, want the charge, 1", p)
	}
	st.Down.Store(false)
	deadline := time.Now().Add(20 * time.Second)
	for settlements.Stats().Pending != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the charge never landed: %+v", settlements.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	if st := settlements.Stats(); st.Landed != 1 || st.Lost() != 0 {
		t.Fatalf("stats %+v", st)
	}
	m, ok := conf.Match("usage", []envoyconf.Entry{{Key: "bucket", Value: "a"}}, nil)
	if !ok {
		t.Fatal("no match for bucket=a")
	}
	p := m.Policy
	p.Name = "rls" // (as the service keeps its counters)
	dd, err := st.Decide(context.Background(), m.Key, p, 1)
	token := 24 * time.Hour / 10
	if err != nil || dd.Allowed || dd.RetryAfter > 3*token || dd.RetryAfter < 3*token-time.Minute {
		t.Fatalf("a request of 1 after 12 of 10: %+v %v, want refused for 3 tokens' time, %v", dd, err, 3*token)
	}
}

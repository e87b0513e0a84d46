package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestServeE2ESharesNetOfRefunds: one `sluice serve` on one real Redis, a partner with a limit of
// 10, and a route whose requests cost nothing unless the upstream answers 401 (count_only: each
// is settled to 0 once its response is known). 15 of them and 3 ordinary requests all pass: the
// store holds 3. The instance's share of the partner's approvals is counted net of the
// settlements, 3, and no separate_counters finding is made; it was 18 of 10, reported as
// instances that do not count together, about one instance on one store.
func TestServeE2ESharesNetOfRefunds(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	up := newUpstream(t)
	p := startSluice(t, t.TempDir(), "sluice.yaml", func(listen, admin string) string {
		return sharesConfig(up.URL, rs.Addr, 10)(listen, admin) + `routes:
  - {path_prefix: /free, count_only: {status: [401]}}
`
	})
	waitFleet(t, []*sluiceProc{p}, 1, time.Time{}, 20*time.Second)
	id := statsFleet(t, p).Self
	if got := send(t, p, "/free", 15); got != 15 {
		t.Fatalf("%d of 15 requests that cost nothing passed; want all", got)
	}
	if got := send(t, p, "/orders", 3); got != 3 {
		t.Fatalf("%d of 3 passed; want all", got)
	}
	st := waitShares(t, []*sluiceProc{p}, fmt.Sprintf("%s=3", id))[0]
	for _, f := range st.Diagnosis.Findings {
		if f.Kind == "separate_counters" {
			t.Errorf("one instance on one store reported as separate counters: %+v", f)
		}
	}
}

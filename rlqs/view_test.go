package rlqs_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/rlqs"
)

func viewQuota() *config.Quota {
	return &config.Quota{ReportInterval: time.Second, TTL: 3 * time.Second, Idle: time.Minute, Algorithm: "fair",
		Buckets: []config.QuotaBucket{{Name: "chat", Match: map[string]string{"user": "*"}, Limit: 100000, Burst: 100000, Period: time.Minute}}}
}

// viewUsage is a report of n buckets, user-0 … user-(n-1), user-i with i+1 requests allowed.
func viewUsage(n int) *rlqspb.RateLimitQuotaUsageReports {
	r := &rlqspb.RateLimitQuotaUsageReports{Domain: "d"}
	for i := range n {
		r.BucketQuotaUsages = append(r.BucketQuotaUsages, &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqspb.BucketId{Bucket: map[string]string{"user": fmt.Sprintf("user-%d", i)}}, NumRequestsAllowed: uint64(i + 1)})
	}
	return r
}

// View reads the ledgers of the ViewBuckets busiest buckets, the busiest first, and says how
// many it left out; each ledger's records name the streams that report it, this instance's
// marked here. No bucket id's value is in it.
func TestViewBusiestFirst(t *testing.T) {
	mem := map[string]*ledger.Memory{}
	svc := rlqs.New(viewQuota(), rlqs.Options{Ledgers: func(name string, opts ledger.Options) (ledger.Ledger, error) {
		if mem[name] == nil {
			mem[name], _ = ledger.NewMemory(name, opts, ledger.MemoryOptions{})
		}
		return mem[name], nil
	}})
	c := svc.Open("peer")
	defer c.Close()
	const n = rlqs.ViewBuckets + 5
	if _, err := c.Report(context.Background(), viewUsage(n)); err != nil {
		t.Fatal(err)
	}
	st := svc.View(context.Background())
	if len(st.Buckets) != n || len(st.Ledgers) != rlqs.ViewBuckets || st.LedgersOmitted != 5 {
		t.Fatalf("%d buckets, %d ledgers read, %d omitted; want %d, %d, 5", len(st.Buckets), len(st.Ledgers), st.LedgersOmitted, n, rlqs.ViewBuckets)
	}
	for i, l := range st.Ledgers {
		if l.Error != "" || len(l.Envoys) != 1 || l.Envoys[0].Client != c.ID || !l.Envoys[0].Here || !l.Envoys[0].Live {
			t.Fatalf("ledger %d: %+v; want one live record of this instance's stream", i, l)
		}
		if i > 0 && l.Want > st.Ledgers[i-1].Want {
			t.Fatalf("ledger %d wants %d, more than the one before it (%d): not the busiest first", i, l.Want, st.Ledgers[i-1].Want)
		}
		if strings.Contains(fmt.Sprint(l), "user-") {
			t.Fatalf("ledger %d shows a bucket id's value: %+v", i, l)
		}
	}
	if got := st.Ledgers[0].Envoys[0].Allowed; got != n {
		t.Errorf("the busiest bucket's record: %d allowed, want %d", got, n)
	}
}

// stuck is a ledger that never answers a read before its caller gives up.
type stuck struct{ ledger.Ledger }

func (stuck) Read(ctx context.Context) (ledger.View, error) {
	<-ctx.Done()
	return ledger.View{}, ctx.Err()
}

// A ledger that does not answer: View gives up on it after ViewTimeout and shows the error.
func TestViewLedgerUnreachable(t *testing.T) {
	mem := map[string]*ledger.Memory{}
	svc := rlqs.New(viewQuota(), rlqs.Options{Ledgers: func(name string, opts ledger.Options) (ledger.Ledger, error) {
		if mem[name] == nil {
			mem[name], _ = ledger.NewMemory(name, opts, ledger.MemoryOptions{})
		}
		return stuck{mem[name]}, nil
	}})
	c := svc.Open("peer")
	defer c.Close()
	if _, err := c.Report(context.Background(), viewUsage(2)); err != nil {
		t.Fatal(err)
	}
	st := svc.View(context.Background())
	if len(st.Ledgers) != 2 {
		t.Fatalf("%d ledgers, want 2", len(st.Ledgers))
	}
	for _, l := range st.Ledgers {
		if !strings.Contains(l.Error, context.DeadlineExceeded.Error()) {
			t.Errorf("ledger %s: error %q, want the deadline's", l.Ledger, l.Error)
		}
	}
}

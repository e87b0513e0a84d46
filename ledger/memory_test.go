package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/ledger"
)

// A Memory ledger's state expires on its own clock as the Redis ledger's keys do (a lease after
// the last lease and hold it holds): the next refresh begins a new state, with a new epoch, in
// learning mode; Flush does the same at once. (TestLedgerMemoryDifferential, in store/redis,
// checks the rest against ledger.lua.)
func TestMemoryExpiryAndFlush(t *testing.T) {
	clock := sluice.NewManualClock(time.Unix(0, 0))
	opts := ledger.Options{Limit: 100, Regions: 2, Floor: 10, Lease: 10 * time.Second, Hold: 5 * time.Second}
	l, err := ledger.NewMemory("p", opts, ledger.MemoryOptions{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	g, err := l.Refresh(ctx, "eu", ledger.Report{Want: 80})
	if err != nil || !g.Learning || g.Epoch != "1" || g.Allotment != 10 || !g.Since.Equal(clock.Now()) {
		t.Fatalf("first refresh, at the clock's 0: %+v, %v; want learning on the floor, epoch 1", g, err)
	}
	clock.Advance(opts.Lease + opts.Hold)
	if g, _ = l.Refresh(ctx, "eu", ledger.Report{Want: 80}); g.Learning || g.Allotment != 80 || g.Epoch != "1" {
		t.Fatalf("past learning: %+v; want 80 of state 1", g)
	}
	// The state lives until the lease, the hold and a lease more after the last refresh.
	clock.Advance(2*opts.Lease + opts.Hold - time.Millisecond)
	if v, _ := l.Read(ctx); v.Epoch != "1" || len(v.Regions) != 1 || v.Regions[0].Live {
		t.Fatalf("before the state expires: %+v", v)
	}
	clock.Advance(time.Millisecond)
	if v, _ := l.Read(ctx); v.Epoch != "" || len(v.Regions) != 0 || !v.Since.IsZero() {
		t.Fatalf("the state expired: %+v", v)
	}
	if g, _ = l.Refresh(ctx, "us", ledger.Report{Want: 80}); !g.Learning || g.Epoch != "2" {
		t.Fatalf("after the expiry: %+v; want a new state, learning", g)
	}
	l.Flush()
	if g, _ = l.Refresh(ctx, "us", ledger.Report{Want: 80}); !g.Learning || g.Epoch != "3" || g.Allotment != 10 {
		t.Fatalf("after a flush: %+v; want a new state, learning, on the floor", g)
	}
	for i := range ledger.MaxRegions - 1 {
		if _, err := l.Refresh(ctx, fmt.Sprintf("r%d", i), ledger.Report{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.Refresh(ctx, "one-more", ledger.Report{}); !errors.Is(err, ledger.ErrTooManyRegions) {
		t.Fatalf("a 65th region: %v", err)
	}
	if _, err := l.Refresh(ctx, "e u", ledger.Report{}); err == nil {
		t.Fatal("a bad region name was taken")
	}
	if _, err := ledger.NewMemory("p", ledger.Options{Limit: 0}, ledger.MemoryOptions{}); err == nil {
		t.Fatal("a limit of 0 was taken")
	}
}

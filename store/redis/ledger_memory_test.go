package redis_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/allot"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/store/redis"
)

// The Go ledger (ledger.Memory, the simulator's) and ledger.lua on a real Redis, both on one
// virtual clock, given the same random sequences of refreshes (reports holding the last grant or
// not, uses, confirmations), reads, time steps (within a lease, past a lease, past the hold) and
// flushes: every grant and every view is the same, field for field; the epochs differ (random on
// Redis, counted in Go) but begin at the same refreshes.
func TestLedgerMemoryDifferential(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	r := rand.New(rand.NewPCG(34, 4))
	regions := []string{"ap", "eu", "us", "sa"}
	// What the sequences reached, so that the test fails if they stop reaching it.
	var learning, confirm, short, expired, flushed int
	for iter := range 60 {
		clock := sluice.NewManualClock(time.UnixMicro(1_700_000_000_000_000 + int64(iter)*1e12))
		lim := []int64{1 + r.Int64N(20), 1 + r.Int64N(10000), 1 + r.Int64N(ledger.MaxLimit)}[r.IntN(3)]
		k := 1 + r.IntN(len(regions))
		opts := ledger.Options{Limit: lim, Regions: max(1, k+r.IntN(3)-1), Lease: time.Duration(1+r.IntN(20)) * time.Second,
			Hold: time.Duration(r.IntN(30)) * time.Second, Algorithm: []allot.Algorithm{allot.Fair, allot.Proportional}[r.IntN(2)]}
		if r.IntN(2) == 0 {
			opts.Floor = r.Int64N(lim/int64(opts.Regions) + 1)
		}
		if r.IntN(3) == 0 {
			opts.Safe = r.Int64N(lim + 1)
		}
		policy := fmt.Sprintf("p%d", iter)
		lua := ledgerOn(t, []string{srv.Addr}, clock, policy, opts)
		mem, err := ledger.NewMemory(policy, opts, ledger.MemoryOptions{Now: clock.Now, Slack: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if lua.Options() != mem.Options() {
			t.Fatalf("options: %+v and %+v", lua.Options(), mem.Options())
		}
		epochs := map[string]string{} // Redis's epoch -> Go's
		last := map[string]ledger.Grant{}
		for step := range 150 {
			what := fmt.Sprintf("iter %d (%+v) step %d", iter, opts, step)
			switch x := r.IntN(20); {
			case x < 12:
				region := regions[r.IntN(k)]
				rep := ledger.Report{Want: []int64{0, r.Int64N(lim + 1), min(r.Int64N(2*lim+1), ledger.MaxLimit)}[r.IntN(3)], Admitted: r.Int64N(100), Refused: r.Int64N(100)}
				if g, ok := last[region]; ok && r.IntN(4) > 0 {
					rep.Holds, rep.HoldsExpires = g.Allotment, g.Expires
				} else if r.IntN(4) == 0 {
					rep.Holds, rep.HoldsExpires = r.Int64N(lim+1), clock.Now().Add(time.Duration(r.Int64N(int64(2*opts.Lease)))-opts.Lease)
				}
				if r.IntN(2) == 0 {
					rep.Used = r.Int64N(lim + 1)
					rep.UsedUntil = clock.Now().Add(time.Duration(r.Int64N(int64(3*opts.Lease))) - opts.Lease).Truncate(time.Microsecond)
				}
				gl, errL := lua.Refresh(ctx, region, rep)
				gm, errM := mem.Refresh(ctx, region, rep)
				if errL != nil || errM != nil {
					t.Fatalf("%s: refresh %s %+v: %v and %v", what, region, rep, errL, errM)
				}
				if e, ok := epochs[gl.Epoch]; !ok {
					for _, e2 := range epochs {
						if e2 == gm.Epoch {
							t.Fatalf("%s: Redis began a new state (%s), Go did not (%s)", what, gl.Epoch, gm.Epoch)
						}
					}
					epochs[gl.Epoch] = gm.Epoch
				} else if e != gm.Epoch {
					t.Fatalf("%s: Redis kept its state (%s), Go began one (%s, was %s)", what, gl.Epoch, gm.Epoch, e)
				}
				gl.Epoch, gm.Epoch = "", ""
				if !reflect.DeepEqual(gl, gm) {
					t.Fatalf("%s: refresh %s %+v:\nlua %+v\ngo  %+v", what, region, rep, gl, gm)
				}
				last[region] = gm
				learning += b2i(gm.Learning)
				confirm += b2i(gm.Confirm)
				short += b2i(gm.Allotment < gm.Share)
			case x < 15:
				vl, errL := lua.Read(ctx)
				vm, errM := mem.Read(ctx)
				if errL != nil || errM != nil {
					t.Fatalf("%s: read: %v and %v", what, errL, errM)
				}
				if vl.Epoch != "" && epochs[vl.Epoch] != vm.Epoch || (vl.Epoch == "") != (vm.Epoch == "") {
					t.Fatalf("%s: read: epochs %q and %q", what, vl.Epoch, vm.Epoch)
				}
				vl.Epoch, vm.Epoch = "", ""
				if !reflect.DeepEqual(vl, vm) {
					t.Fatalf("%s: read:\nlua %+v\ngo  %+v", what, vl, vm)
				}
				for _, reg := range vm.Regions {
					expired += b2i(!reg.Live && reg.Holding > 0)
				}
			case x < 19:
				step := []time.Duration{time.Duration(r.Int64N(int64(opts.Lease / 2))), opts.Lease, opts.Lease + opts.Hold,
					time.Duration(r.Int64N(int64(2*opts.Lease + opts.Hold)))}[r.IntN(4)]
				clock.Advance(step)
			default:
				if _, err := srv.Do("FLUSHALL"); err != nil {
					t.Fatal(err)
				}
				mem.Flush()
				clear(last)
				flushed++
			}
		}
	}
	if learning == 0 || confirm == 0 || short == 0 || expired == 0 || flushed == 0 {
		t.Fatalf("the sequences reached %d learning grants, %d to confirm, %d short of the share, %d expired regions still held, %d flushes; want some of each",
			learning, confirm, short, expired, flushed)
	}
	t.Logf("%d learning grants, %d to confirm, %d short of the share, %d expired regions still held, %d flushes", learning, confirm, short, expired, flushed)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

var _ = redis.Report{} // the aliases are package ledger's types

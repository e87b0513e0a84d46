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
	var learning, confirm, short, expired, flushed, grouped int // grouped: new states begun as old as their group
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
		if r.IntN(4) == 0 {
			// A ledger of many clients (Envoys): a limit of at most 2^43; reports clamped to it.
			opts.Clients = ledger.MaxRegions + 1 + r.IntN(ledger.MaxClients-ledger.MaxRegions)
			if opts.Limit > ledger.MaxClientsLimit {
				lim, opts.Limit, opts.Floor, opts.Safe = ledger.MaxClientsLimit, ledger.MaxClientsLimit, 0, 0
			}
		}
		policy := fmt.Sprintf("p%d", iter)
		// Every other iteration, two ledgers of one group (the quota service's buckets of a
		// rule), used in turn: a state begun in one is as old as the group.
		luas := []*redis.Ledger{ledgerOn(t, []string{srv.Addr}, clock, policy, opts)}
		mems := []*ledger.Memory{nil}
		var group *ledger.MemoryGroup
		if iter%2 == 1 {
			group = &ledger.MemoryGroup{}
			st := newStore(t, redis.Options{Addrs: []string{srv.Addr}, Clock: clock})
			luas = luas[:0]
			mems = []*ledger.Memory{nil, nil}
			for _, name := range []string{policy + ".a", policy + ".b"} {
				l, err := st.GroupLedger(policy, name, opts)
				if err != nil {
					t.Fatal(err)
				}
				luas = append(luas, l)
			}
		}
		for i := range mems {
			n := 0
			epoch := func() string { n++; return fmt.Sprintf("%d.%d", i, n) }
			var err error
			if mems[i], err = ledger.NewMemory(fmt.Sprintf("%s-%d", policy, i), opts, ledger.MemoryOptions{Now: clock.Now, Slack: time.Hour, Group: group, Epoch: epoch}); err != nil {
				t.Fatal(err)
			}
			if luas[i].Options() != mems[i].Options() {
				t.Fatalf("options: %+v and %+v", luas[i].Options(), mems[i].Options())
			}
		}
		epochs := map[string]string{} // Redis's epoch -> Go's
		last := map[string]ledger.Grant{}
		for step := range 150 {
			which := r.IntN(len(luas))
			lua, mem := luas[which], mems[which]
			what := fmt.Sprintf("iter %d (%+v) ledger %d step %d", iter, opts, which, step)
			switch x := r.IntN(20); {
			case x < 12:
				region := regions[r.IntN(k)]
				rep := ledger.Report{Want: []int64{0, r.Int64N(lim + 1), min(r.Int64N(2*lim+1), ledger.MaxLimit)}[r.IntN(3)], Admitted: r.Int64N(100), Refused: r.Int64N(100)}
				if g, ok := last[fmt.Sprint(which, region)]; ok && r.IntN(4) > 0 {
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
					grouped += b2i(group != nil && !gm.Learning)
				} else if e != gm.Epoch {
					t.Fatalf("%s: Redis kept its state (%s), Go began one (%s, was %s)", what, gl.Epoch, gm.Epoch, e)
				}
				gl.Epoch, gm.Epoch = "", ""
				if !reflect.DeepEqual(gl, gm) {
					t.Fatalf("%s: refresh %s %+v:\nlua %+v\ngo  %+v", what, region, rep, gl, gm)
				}
				last[fmt.Sprint(which, region)] = gm
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
				for _, m := range mems {
					m.Flush()
				}
				if group != nil {
					group.Flush()
				}
				clear(last)
				flushed++
			}
		}
	}
	if learning == 0 || confirm == 0 || short == 0 || expired == 0 || flushed == 0 || grouped == 0 {
		t.Fatalf("the sequences reached %d learning grants, %d to confirm, %d short of the share, %d expired regions still held, %d flushes, %d states begun as old as their group; want some of each",
			learning, confirm, short, expired, flushed, grouped)
	}
	t.Logf("%d learning grants, %d to confirm, %d short of the share, %d expired regions still held, %d flushes, %d states begun as old as their group", learning, confirm, short, expired, flushed, grouped)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

var _ = redis.Report{} // the aliases are package ledger's types

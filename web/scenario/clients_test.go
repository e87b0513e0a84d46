package scenario

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/sim"
)

// simBreakdowns runs reqs under each of sc's policies as `sluice simulate --compare --store`
// does (sim.Options.Simulate, totalled by sim.Breakdown), and returns each run's summary and
// breakdown, with the per-client allowed per instance counted from its rows.
func simBreakdowns(t *testing.T, sc *Scenario, reqs []sim.Request) ([]sim.Summary, []*sim.Breakdown, []map[string][]int64) {
	t.Helper()
	var sums []sim.Summary
	var bds []*sim.Breakdown
	var perInstance []map[string][]int64
	for _, p := range sc.Policies() {
		o := sc.Options()
		n := 0
		if o.Fleet != nil {
			n = o.Fleet.Instances
		}
		bd := sim.NewBreakdown(n)
		pi := map[string][]int64{}
		sum, err := o.Simulate(p, reqs, func(r sim.Row) error {
			bd.Add(r)
			if pi[r.Key] == nil {
				pi[r.Key] = make([]int64, n)
			}
			if r.Allowed && n > 0 {
				pi[r.Key][r.Instance-1]++
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		sums, bds, perInstance = append(sums, sum), append(bds, bd), append(perInstance, pi)
	}
	return sums, bds, perInstance
}

// checkClients checks every run of res against sim's: the summary, and what each client got, in
// all and per instance.
func checkClients(t *testing.T, name string, sc *Scenario, res *Result) {
	t.Helper()
	sums, bds, perInstance := simBreakdowns(t, sc, res.Requests)
	for i, run := range res.Runs {
		alg := run.Policy.Algorithm
		if run.Summary != sums[i] {
			t.Errorf("%s, %v: summary %+v; sim's %+v", name, alg, run.Summary, sums[i])
		}
		got := run.ClientCounts[res.Buckets-1]
		if len(got) != len(bds[i].Clients) {
			t.Fatalf("%s, %v: %d clients; sim's %d", name, alg, len(got), len(bds[i].Clients))
		}
		for j, c := range bds[i].Clients {
			want := ClientCount{c.Summary.Offered, c.Summary.Allowed, c.Summary.Refused, perInstance[i][c.Key]}
			if len(want.Instances) == 0 {
				want.Instances = nil
			}
			if res.Clients[j] != c.Key || !reflect.DeepEqual(got[j], want) {
				t.Errorf("%s, %v, client %s: %+v; sim's %s %+v", name, alg, res.Clients[j], got[j], c.Key, want)
			}
		}
	}
}

// A buggy partner (600 a minute) and a normal one (20 a minute) against 100 a minute on three
// instances: separate stores let 300 of the buggy partner's 600 through, 100 on each instance; a
// shared store 100. The normal partner gets 20 of 20 both ways, under every algorithm.
func TestClientsOnAFleet(t *testing.T) {
	const traffic = "traffic=buggy:+600/min+for+1m%3B+normal:+20/min+for+1m&limit=100&period=1m&burst=0"
	for _, tc := range []struct {
		store, fixedWindow string
	}{
		{"separate", `[{"key":"buggy","offered":600,"allowed":300,"refused":300,"instances":[100,100,100]},` +
			`{"key":"normal","offered":20,"allowed":20,"refused":0,"instances":[6,7,7]}]`},
		{"shared", `[{"key":"buggy","offered":600,"allowed":100,"refused":500,"instances":[34,33,33]},` +
			`{"key":"normal","offered":20,"allowed":20,"refused":0,"instances":[6,7,7]}]`},
	} {
		q := traffic + "&instances=3&store=" + tc.store
		sc, errs := Parse(q)
		if errs != nil {
			t.Fatal(errs)
		}
		if sc.Traffic != "buggy: 600/min for 1m; normal: 20/min for 1m" || sc.Encode() != q {
			t.Errorf("%s: traffic %q, Encode %s", tc.store, sc.Traffic, sc.Encode())
		}
		if c := sc.Commands(); len(c) != 1 || c[0] != "sluice simulate --compare --limit 100 --period 1m --burst 0 --instances 3 --store "+
			tc.store+" --traffic 'buggy: 600/min for 1m; normal: 20/min for 1m'" {
			t.Errorf("%s: commands %q", tc.store, c)
		}
		res, errs := sc.Run()
		if errs != nil {
			t.Fatal(errs)
		}
		if !reflect.DeepEqual(res.Clients, []string{"buggy", "normal"}) {
			t.Errorf("%s: clients %q", tc.store, res.Clients)
		}
		all := string(res.ClientsJSON(res.Buckets))
		if first := strings.SplitN(all[1:], "],[", 2)[0] + "]"; first != tc.fixedWindow {
			t.Errorf("%s: fixed-window per client\n%s\nwant\n%s", tc.store, first, tc.fixedWindow)
		}
		for _, run := range res.Runs {
			if n := run.ClientCounts[res.Buckets-1][1]; n.Offered != 20 || n.Allowed != 20 {
				t.Errorf("%s, %v: the normal partner got %d of %d", tc.store, run.Policy.Algorithm, n.Allowed, n.Offered)
			}
		}
		checkClients(t, tc.store, &sc, res)
		if got := string(res.ClientsJSON(0)); !strings.HasPrefix(got, `[[{"key":"buggy","offered":0,"allowed":0,"refused":0,"instances":[]}`) {
			t.Errorf("%s: before the first bucket: %s", tc.store, got)
		}
		if !strings.Contains(string(res.JSON()), `,"clients":["buggy","normal"],"runs":`) {
			t.Errorf("%s: the JSON does not list the clients", tc.store)
		}
		// The plots show the first client's state: the fixed window's count reaches the limit.
		if fw := res.Runs[0]; tc.store == "shared" && maxOf(fw.Level) != 100 {
			t.Errorf("shared: fixed-window's level peaks at %d; want the buggy partner's 100", maxOf(fw.Level))
		}
	}

	// A pattern without names has no per-client counts, as before.
	sc, _ := Parse("traffic=5/s+for+2s&limit=5&period=1s&burst=0")
	res, errs := sc.Run()
	if errs != nil || res.Clients != nil || res.Runs[0].ClientCounts != nil || strings.Contains(string(res.JSON()), `"clients"`) ||
		string(res.ClientsJSON(res.Buckets)) != "[[],[],[],[],[]]" {
		t.Errorf("no clients: %v, %q, %s", errs, res.Clients, res.ClientsJSON(res.Buckets))
	}
}

// Many clients on one run each keep their own count: the page's store has room for every one of
// them (none is evicted), so each gets what `sluice simulate` gives it.
func TestManyClients(t *testing.T) {
	var segs []string
	for i := range MaxClients {
		segs = append(segs, fmt.Sprintf("c%d: %d/min for 1m", i+1, 10+3*i))
	}
	pattern := strings.Join(segs, "; ")
	for _, fleet := range []string{"", "&instances=3&store=separate", "&instances=2&store=shared&outage=10s-30s&on-error=local"} {
		sc, errs := Parse("traffic=" + strings.ReplaceAll(pattern, ";", "%3B") + "&limit=20&period=1m&burst=5" + fleet)
		if errs != nil {
			t.Fatal(errs)
		}
		res, errs := sc.Run()
		if errs != nil {
			t.Fatal(errs)
		}
		if len(res.Clients) != MaxClients {
			t.Fatalf("%d clients", len(res.Clients))
		}
		checkClients(t, "fleet "+fleet, &sc, res)
	}
	sc, errs := Parse("traffic=" + strings.ReplaceAll(pattern+"; extra: 1 at once", ";", "%3B") + "&limit=20&period=1m")
	if errs != nil {
		t.Fatal(errs)
	}
	if _, errs := sc.Run(); len(errs) != 1 || errs[0].Field != KeyTraffic || errs[0].Message != "names 17 clients; the page shows at most 16 (use sluice simulate, which takes any number)" {
		t.Errorf("17 clients: %v", errs)
	}
	for _, tc := range []struct{ pattern, want string }{
		{"a: 1 at once; a: 2 at once", `traffic: client "a" is named twice`},
		{"a: 1 at once; b: 5 per s", `traffic of client "b": traffic segment 1`},
	} {
		sc, _ := Parse("traffic=" + strings.ReplaceAll(tc.pattern, ";", "%3B") + "&limit=1&period=1s")
		if _, errs := sc.Run(); len(errs) != 1 || errs[0].Field != KeyTraffic || !strings.HasPrefix(errs[0].Message, tc.want) {
			t.Errorf("%q: %v; want traffic: %s", tc.pattern, errs, tc.want)
		}
	}
}

func maxOf(vs []int64) int64 {
	m := vs[0]
	for _, v := range vs {
		m = max(m, v)
	}
	return m
}

// The fleet's other keys: balance (random, from the draw), store-latency, outage and on-error.
// They read back as they were written, go to sim's Fleet, and say so on the command line; a
// run is sim's to the number, with the plots' gap where the store is down.
func TestFleetKeys(t *testing.T) {
	const traffic = "traffic=buggy:+600/min+for+1m%3B+normal:+20/min+for+1m&limit=100&period=1m&burst=0"
	q := traffic + "&draw=7&instances=3&store=shared&balance=random&store-latency=2ms&outage=20s-40s&on-error=local"
	sc, errs := Parse(q)
	if errs != nil {
		t.Fatal(errs)
	}
	if sc.Encode() != q {
		t.Errorf("Encode: %s\nwant    %s", sc.Encode(), q)
	}
	want := sim.Fleet{Instances: 3, Stores: sim.SharedStore, Balance: sim.Random, Draw: 7, StoreLatency: 2 * time.Millisecond,
		Outage: &sim.Outage{FromMicros: 20_000_000, ToMicros: 40_000_000, OnError: sluice.FailLocal}}
	if f := sc.Options().Fleet; f == nil || !reflect.DeepEqual(*f, want) {
		t.Errorf("the fleet: %+v; want %+v", f, want)
	}
	if c := sc.Commands(); len(c) != 1 || c[0] != "sluice simulate --compare --limit 100 --period 1m --burst 0 --instances 3 --store shared"+
		" --balance random --draw 7 --store-latency 2ms --outage 20s-40s --on-error local --traffic 'buggy: 600/min for 1m; normal: 20/min for 1m'" {
		t.Errorf("commands %q", c)
	}
	res, errs := sc.Run()
	if errs != nil {
		t.Fatal(errs)
	}
	checkClients(t, "outage", &sc, res)
	// As `sluice simulate` prints it: 207 of the 620 requests come in the outage, and each waits
	// 2ms for the one call its instance makes to the store.
	if s := res.Runs[0].Summary; s.Allowed != 219 || s.Local != 207 || s.MaxLatencyMicros != 2000 || s.TotalLatencyMicros != 620*2000 {
		t.Errorf("fixed-window: %+v", s)
	}
	if !strings.Contains(string(res.JSON()), `"instances":3,"store":"shared","balance":"random","draw":7,"store_latency_us":2000,`+
		`"outage":{"from_us":20000000,"to_us":40000000,"on_error":"local"},"clients":`) {
		t.Errorf("the JSON's fleet: %.400s", res.JSON())
	}
	for i, l := range res.Runs[0].Level {
		t0 := int64(i) * res.WidthMicros
		if down := t0 >= 20_000_000 && t0 < 40_000_000; down != (l == NoLevel) || down != (res.Runs[0].DrainMicros[i] == NoLevel) {
			t.Errorf("level at %d µs: %d (drain %d); the store is down: %v", t0, l, res.Runs[0].DrainMicros[i], down)
		}
	}
	// Each failure mode, and an outage that fails closed, run as sim's do.
	for _, mode := range []string{"open", "closed"} {
		sc, errs := Parse(strings.Replace(q, "on-error=local", "on-error="+mode, 1))
		if errs != nil {
			t.Fatal(errs)
		}
		res, errs := sc.Run()
		if errs != nil {
			t.Fatal(errs)
		}
		checkClients(t, mode, &sc, res)
	}
	// Another draw deals the requests to other instances.
	sc8, _ := Parse(strings.Replace(q, "draw=7", "draw=8", 1))
	res8, errs := sc8.Run()
	if errs != nil {
		t.Fatal(errs)
	}
	if reflect.DeepEqual(res8.Runs[0].InstanceAllowed, res.Runs[0].InstanceAllowed) {
		t.Error("draws 7 and 8 deal the requests alike")
	}

	// The defaults are left out of the address; with one instance the balance is dropped too.
	for in, out := range map[string]string{
		traffic + "&instances=3&store=shared&balance=round-robin&store-latency=0s&on-error=": traffic + "&instances=3&store=shared",
		traffic + "&instances=3&store=shared&outage=+1m+-+2m+":                               traffic + "&instances=3&store=shared&outage=1m-2m&on-error=closed",
		traffic + "&instances=1&balance=random":                                              traffic,
	} {
		sc, errs := Parse(in)
		if errs != nil || sc.Encode() != out {
			t.Errorf("Parse(%s): %v, %s; want %s", in, errs, sc.Encode(), out)
		}
	}

	for _, tc := range []struct{ query, field, want string }{
		{"instances=3&balance=x", KeyBalance, `"x": want round-robin or random`},
		{"instances=3&store=separate&store-latency=1ms", KeyStoreLatency, "1ms needs store shared: a separate memory store is in its instance's own process, without a round trip"},
		{"instances=3&store-latency=2h", KeyStoreLatency, "2h must be from 0 to 1h"},
		{"instances=3&store-latency=-1ms", KeyStoreLatency, "-1ms must be ≥ 0"},
		{"instances=3&store-latency=1500ns", KeyStoreLatency, "1500ns must be a whole number of microseconds"},
		{"instances=3&store-latency=fast", KeyStoreLatency, `"fast" is not a duration`},
		{"store-latency=1ms", KeyStoreLatency, "needs a fleet: 2 or more instances sharing a store"},
		{"instances=3&outage=1m", KeyOutage, "want FROM-TO, two durations of virtual time such as 1m-2m"},
		{"instances=3&outage=x-1m", KeyOutage, `"x" is not a Go duration (want e.g. 30s, 1m, 1m30s)`},
		{"instances=3&outage=2m-1m", KeyOutage, "the outage must end after it begins"},
		{"instances=3&outage=1500ns-1m", KeyOutage, "1500ns must be a whole number of microseconds"},
		{"instances=3&store=separate&outage=1m-2m", KeyOutage, "1m-2m needs store shared: separate memory stores are in each instance's own process, which does not lose them"},
		{"outage=1m-2m", KeyOutage, "needs a fleet: 2 or more instances sharing a store: the outage is the shared store's"},
		{"instances=3&outage=1m-2m&actual=5", KeyOutage, "and real costs exclude each other: a settlement needs the store"},
		{"instances=3&outage=1m-2m&on-error=maybe", KeyOnError, `"maybe": want open, closed or local`},
		{"instances=3&on-error=open", KeyOnError, "needs an outage: the store fails only in one"},
	} {
		_, errs := Parse("traffic=1+at+once&limit=1&period=1s&" + tc.query)
		if len(errs) != 1 || errs[0].Field != tc.field || !strings.HasPrefix(errs[0].Message, tc.want) {
			t.Errorf("%s: errors %v; want %s: %s", tc.query, errs, tc.field, tc.want)
		}
	}
	// Each key alone makes a query the scenario's, as every other key does.
	for _, k := range []string{KeyBalance, KeyStoreLatency, KeyOutage, KeyOnError} {
		if _, errs := Parse(k + "=x"); len(errs) == 0 || errs[0].Field != KeyTraffic {
			t.Errorf("%s=x: %v; want the traffic required", k, errs)
		}
	}
}

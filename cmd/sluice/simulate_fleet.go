package main

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/sim"
)

// storeFleet returns the fleet of --store, --instances, --balance, --draw, --outage and
// --on-error (with --local-budget, budgets on the shared store), checked flag by flag.
func (o *simulateOptions) storeFleet(changed func(string) bool, policies []sluice.Policy) (*sim.Fleet, error) {
	var f sim.Fleet
	switch o.stores {
	case "shared":
		f.Stores = sim.SharedStore
	case "separate":
		f.Stores = sim.SeparateStores
	default:
		return nil, fmt.Errorf("--store %s: want separate (each instance its own memory store) or shared (one store for all)", o.stores)
	}
	if changed("local-budget") {
		if f.Stores == sim.SeparateStores {
			return nil, errors.New("--local-budget needs --store shared: budgets are taken from a store the instances share")
		}
		b, err := o.budgetFleet(changed, policies)
		if err != nil {
			return nil, err
		}
		f.Instances, f.Budget = b.Instances, b.Budget
	} else {
		if changed("budget-max-age") {
			return nil, errors.New("--budget-max-age needs --local-budget")
		}
		var err error
		if f.Instances, err = o.instanceCount(changed); err != nil {
			return nil, err
		}
	}
	switch o.balance {
	case "round-robin":
		f.Balance = sim.RoundRobin
		if changed("draw") {
			return nil, errors.New("--draw needs --balance random: round robin deals in turn")
		}
	case "random":
		f.Balance, f.Draw = sim.Random, o.draw
	default:
		return nil, fmt.Errorf("--balance %s: want round-robin or random", o.balance)
	}
	if changed("store-latency") {
		switch d := o.latency.d; {
		case f.Stores == sim.SeparateStores:
			return nil, fmt.Errorf("--store-latency %s needs --store shared: a separate memory store is in its instance's own process, without a round trip", o.latency.text)
		case d < 0 || d > time.Hour:
			return nil, fmt.Errorf("--store-latency %s: must be from 0 to 1h", o.latency.text)
		case d%time.Microsecond != 0:
			return nil, fmt.Errorf("--store-latency %s: must be a whole number of microseconds", o.latency.text)
		}
		f.StoreLatency = o.latency.d
	}
	if !changed("outage") {
		if changed("on-error") {
			return nil, errors.New("--on-error needs --outage: the store fails only in an outage")
		}
		return &f, nil
	}
	if f.Stores == sim.SeparateStores {
		return nil, fmt.Errorf("--outage %s needs --store shared: separate memory stores are in each instance's own process, which does not lose them", o.outage)
	}
	if o.actual != nil {
		return nil, errors.New("--outage and a trace's actual column exclude each other: a settlement needs the store")
	}
	out, err := parseOutage(o.outage)
	if err != nil {
		return nil, err
	}
	var ok bool
	if out.OnError, ok = sim.ParseFailureMode(o.onError); !ok {
		return nil, fmt.Errorf("--on-error %s: want open, closed or local", o.onError)
	}
	f.Outage = &out
	return &f, nil
}

// parseOutage parses --outage FROM-TO, two Go durations of virtual time (0s-30s, 1m-2m30s).
func parseOutage(s string) (sim.Outage, error) {
	o, err := sim.ParseOutage(s)
	if err != nil {
		return o, fmt.Errorf("--outage %s: %w", s, err)
	}
	return o, nil
}

// fleetLabel names a --store fleet's run in the table: "3 × separate stores", "3 × shared store".
func fleetLabel(f sim.Fleet) string {
	l := fmt.Sprintf("%d × shared store", f.Instances)
	if f.Stores == sim.SeparateStores {
		l = fmt.Sprintf("%d × separate stores", f.Instances)
	}
	if f.Budget.Size > 0 {
		l += fmt.Sprintf(", budget %d", f.Budget.Size)
	}
	return l
}

type instanceSummaryJSON struct {
	Instance int         `json:"instance"`
	Summary  sim.Summary `json:"summary"`
}

type clientSummaryJSON struct {
	Key     string      `json:"key"`
	Summary sim.Summary `json:"summary"`
}

// perInstanceJSON is JSON's "per_instance": what each instance let through, from instance 1.
func perInstanceJSON(b *sim.Breakdown) []instanceSummaryJSON {
	out := make([]instanceSummaryJSON, len(b.Instances))
	for i, s := range b.Instances {
		out[i] = instanceSummaryJSON{i + 1, s}
	}
	return out
}

// perClientJSON is JSON's "per_client": what each client got, in the order of its first request.
func perClientJSON(b *sim.Breakdown) []clientSummaryJSON {
	out := make([]clientSummaryJSON, len(b.Clients))
	for i, c := range b.Clients {
		out[i] = clientSummaryJSON{c.Key, c.Summary}
	}
	return out
}

// describeFleet says, in the table's head, what the --store fleet is.
func (s *simulation) describeFleet(w io.Writer) {
	f := s.fleet
	how := "dealt in turn (round robin)"
	if f.Balance == sim.Random {
		how = fmt.Sprintf("each to an instance drawn at random (draw %d)", f.Draw)
	}
	stores := "each with its own memory store: each counts only the requests it sees"
	if f.Stores == sim.SharedStore {
		stores = "sharing one store: they count together, as one instance would"
		if f.Budget.Size > 0 {
			stores += fmt.Sprintf("; each takes budgets of %d from it, spent for at most %s", f.Budget.Size, sim.FormatDuration(f.Budget.MaxAge.Microseconds()))
		}
	}
	fmt.Fprintf(w, "fleet: %s behind a load balancer, requests %s, %s\n", plural(int64(f.Instances), "instance"), how, stores)
	if f.StoreLatency > 0 {
		fmt.Fprintf(w, "store latency: %s a call to the shared store: a request reaches the backend that much later for each call its instance makes to decide it\n", sim.FormatDuration(f.StoreLatency.Microseconds()))
	}
	if o := f.Outage; o != nil {
		what := map[sluice.FailureMode]string{
			sluice.FailOpen:   "fail open (admit every request unchecked)",
			sluice.FailClosed: "fail closed (refuse every request: 503, no Retry-After)",
			sluice.FailLocal:  fmt.Sprintf("fail to local (each decides on its own memory with 1/%d of the policy)", f.Instances),
		}[o.OnError]
		fmt.Fprintf(w, "outage: the shared store fails from %s to %s; the instances %s\n", sim.FormatDuration(o.FromMicros), sim.FormatDuration(o.ToMicros), what)
	}
}

// writeBreakdown writes, after the summaries, what passed to the backend per instance and per
// client, in each run; then the last run's (a fleet's) waits for the store and outage, from its
// summary last.
func (s *simulation) writeBreakdown(w io.Writer, runs []simRun, bds []*sim.Breakdown, last sim.Summary) {
	fmt.Fprintln(w)
	for i, r := range runs {
		if r.fleet == nil {
			continue
		}
		fmt.Fprintf(w, "passed to the backend per instance (%s):", r.label)
		for j, sum := range bds[i].Instances {
			fmt.Fprintf(w, " %d: %d", j+1, sum.Allowed)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "\nper client:\n")
	groups := []*group{{}, {}}
	key := groups[0].add("client", true)
	offered := groups[1].add("offered", false)
	for _, c := range bds[0].Clients {
		key.cells = append(key.cells, c.Key)
		offered.cells = append(offered.cells, itoa(c.Summary.Offered))
	}
	for i, bd := range bds {
		g := &group{name: runs[i].label}
		groups = append(groups, g)
		allowed, refused := g.add("allowed", false), g.add("refused", false)
		for _, c := range bd.Clients {
			allowed.cells = append(allowed.cells, itoa(c.Summary.Allowed))
			refused.cells = append(refused.cells, itoa(c.Summary.Refused))
		}
	}
	writeColumns(w, groups, 2)
	if s.fleet.StoreLatency > 0 {
		fmt.Fprintf(w, "\nwaiting for the store: %s in all, %s a request on average, at most %s\n",
			sim.FormatDuration(last.TotalLatencyMicros), sim.FormatDuration(last.TotalLatencyMicros/max(1, last.Offered)), sim.FormatDuration(last.MaxLatencyMicros))
	}
	if s.fleet.Outage != nil {
		fmt.Fprintf(w, "\ndecided without the store in the outage: %d (open %d, local %d, closed %d)\n", last.Open+last.Local+last.Closed, last.Open, last.Local, last.Closed)
	}
}

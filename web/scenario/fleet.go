package scenario

import (
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/sim"
)

// The query keys of a fleet: instances=3&store=shared&balance=random&store-latency=2ms&
// outage=20s-40s&on-error=local (Scenario.Instances, Stores, Balance, StoreLatency, Outage). The
// random balancer's number is the scenario's draw (KeyDraw).
const (
	KeyInstances    = "instances"
	KeyStore        = "store"
	KeyBalance      = "balance"
	KeyStoreLatency = "store-latency"
	KeyOutage       = "outage"
	KeyOnError      = "on-error"
)

// MaxClients bounds the clients a pattern may name on the page: it keeps, per time bucket, what
// each client got on each instance (`sluice simulate` takes any number).
const MaxClients = 16

// parseFleetKeys reads instances (1..sim.MaxInstances; 1 is one instance, as without it), store
// (separate or shared, the default), balance (round-robin, the default, or random), and, with a
// shared store, store-latency and outage with on-error (open, closed the default, or local),
// failing the field at fault with the messages of `sluice simulate`'s flags. With one instance
// the store and the balance make no difference and are dropped, so that equal runs have equal
// addresses; a store latency or an outage needs a fleet.
func parseFleetKeys(sc *Scenario, get func(string) (string, bool), fail func(field, format string, args ...any)) {
	if text, ok := get(KeyInstances); ok && text != "" {
		n, err := strconv.Atoi(text)
		switch {
		case err != nil:
			fail(KeyInstances, "%q is not a whole number", text)
		case n < 1 || n > sim.MaxInstances:
			fail(KeyInstances, "%d must be from 1 to %d", n, sim.MaxInstances)
		default:
			sc.Instances = n
		}
	}
	if text, ok := get(KeyStore); ok && text != "" {
		switch text {
		case "shared":
			sc.Stores = sim.SharedStore
		case "separate":
			sc.Stores = sim.SeparateStores
		default:
			fail(KeyStore, "%q: want separate (each instance its own memory store) or shared (one store for all)", text)
		}
	}
	if text, ok := get(KeyBalance); ok && text != "" {
		switch text {
		case "round-robin":
			sc.Balance = sim.RoundRobin
		case "random":
			sc.Balance = sim.Random
		default:
			fail(KeyBalance, "%q: want round-robin or random", text)
		}
	}
	fleet := sc.Instances > 1
	const needsFleet = "needs a fleet: 2 or more instances sharing a store"
	if text, ok := get(KeyStoreLatency); ok && text != "" {
		d, msg := parseDuration(text, 0)
		switch {
		case msg != "":
			fail(KeyStoreLatency, "%s", msg)
		case d > time.Hour:
			fail(KeyStoreLatency, "%s must be from 0 to 1h", text)
		case !fleet:
			fail(KeyStoreLatency, "%s: it is each call's round trip to the store the instances share", needsFleet)
		case sc.Stores == sim.SeparateStores:
			fail(KeyStoreLatency, "%s needs store shared: a separate memory store is in its instance's own process, without a round trip", text)
		default:
			sc.StoreLatency = d
		}
	}
	onError, hasOnError := get(KeyOnError)
	if text, ok := get(KeyOutage); ok && text != "" {
		o, err := sim.ParseOutage(text)
		switch {
		case err != nil:
			fail(KeyOutage, "%s", err.Error())
		case !fleet:
			fail(KeyOutage, "%s: the outage is the shared store's", needsFleet)
		case sc.Stores == sim.SeparateStores:
			fail(KeyOutage, "%s needs store shared: separate memory stores are in each instance's own process, which does not lose them", text)
		case sc.Actual.Set:
			fail(KeyOutage, "and real costs exclude each other: a settlement needs the store")
		}
		if onError == "" {
			o.OnError = sluice.FailClosed
		} else if mode, ok := sim.ParseFailureMode(onError); ok {
			o.OnError = mode
		} else {
			fail(KeyOnError, "%q: want open, closed or local", onError)
		}
		if err == nil && fleet && sc.Stores == sim.SharedStore && !sc.Actual.Set {
			sc.Outage = &o
		}
	} else if hasOnError && onError != "" {
		fail(KeyOnError, "needs an outage: the store fails only in one")
	}
	if sc.Instances <= 1 {
		sc.Instances, sc.Stores, sc.Balance = 0, sim.SharedStore, sim.RoundRobin
	}
}

// outageText writes an outage as the outage key takes it: 20s-40s.
func outageText(o *sim.Outage) string {
	return sim.FormatDuration(o.FromMicros) + "-" + sim.FormatDuration(o.ToMicros)
}

// encodeFleet puts a fleet's keys after instances and store: balance (only if random),
// store-latency, and outage with on-error.
func encodeFleet(sc *Scenario, put func(key, value string)) {
	if sc.Balance == sim.Random {
		put(KeyBalance, sc.Balance.String())
	}
	if sc.StoreLatency > 0 {
		put(KeyStoreLatency, formatDuration(sc.StoreLatency))
	}
	if o := sc.Outage; o != nil {
		put(KeyOutage, outageText(o))
		put(KeyOnError, sim.FailureModeName(o.OnError))
	}
}

// fleetFlags are the command line's flags of a fleet after --instances and --store.
func fleetFlags(sc *Scenario) string {
	var b strings.Builder
	if sc.Balance == sim.Random {
		b.WriteString(" --balance random --draw " + strconv.FormatUint(sc.Draw, 10))
	}
	if sc.StoreLatency > 0 {
		b.WriteString(" --store-latency " + formatDuration(sc.StoreLatency))
	}
	if o := sc.Outage; o != nil {
		b.WriteString(" --outage " + outageText(o) + " --on-error " + sim.FailureModeName(o.OnError))
	}
	return b.String()
}

// fleet is the sim.Fleet of the scenario's runs; nil with one instance.
func (sc *Scenario) fleet() *sim.Fleet {
	if sc.Instances <= 1 {
		return nil
	}
	f := &sim.Fleet{Instances: sc.Instances, Stores: sc.Stores, Balance: sc.Balance, StoreLatency: sc.StoreLatency}
	if sc.Balance == sim.Random {
		f.Draw = sc.Draw
	}
	if sc.Outage != nil {
		o := *sc.Outage
		f.Outage = &o
	}
	return f
}

// InstancesJSON is, per run, what each instance let through to the backend in the first k
// buckets: [[106,107,107],...] (empty arrays for one instance).
func (r *Result) InstancesJSON(k int) []byte {
	k = min(max(k, 0), r.Buckets)
	b := []byte{'['}
	for i, run := range r.Runs {
		if i > 0 {
			b = append(b, ',')
		}
		var counts []int64
		if k > 0 && run.InstanceAllowed != nil {
			counts = run.InstanceAllowed[k-1]
		}
		b = appendInts(b, counts)
	}
	return append(b, ']')
}

// clientsOf returns the keys of reqs in the order of each one's first request: the order of
// `sluice simulate`'s per_client (sim.Breakdown).
func clientsOf(reqs []sim.Request) []string {
	var keys []string
	seen := map[string]bool{}
	for _, rq := range reqs {
		if !seen[rq.Key] {
			seen[rq.Key] = true
			keys = append(keys, rq.Key)
		}
	}
	return keys
}

// ClientCount is what one client got in a run so far: its requests, those let through and
// refused, and with a fleet those let through by each instance.
type ClientCount struct {
	Offered, Allowed, Refused int64
	Instances                 []int64 // [j]: let through by instance j+1; nil with one instance
}

// ClientsJSON is, per run, what each client (Result.Clients, in order) got in the first k
// buckets: [[{"key":"buggy","offered":600,"allowed":300,"refused":300,"instances":[100,100,100]},
// ...],...] ("instances" empty with one instance); [] per run when the traffic names no clients.
func (r *Result) ClientsJSON(k int) []byte {
	k = min(max(k, 0), r.Buckets)
	b := []byte{'['}
	for i, run := range r.Runs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '[')
		for j, key := range r.Clients {
			if j > 0 {
				b = append(b, ',')
			}
			var c ClientCount
			if k > 0 {
				c = run.ClientCounts[k-1][j]
			}
			b = append(b, `{"key":`...)
			b = appendString(b, key)
			b = append(b, `,"offered":`...)
			b = strconv.AppendInt(b, c.Offered, 10)
			b = append(b, `,"allowed":`...)
			b = strconv.AppendInt(b, c.Allowed, 10)
			b = append(b, `,"refused":`...)
			b = strconv.AppendInt(b, c.Refused, 10)
			b = append(b, `,"instances":`...)
			b = appendInts(b, c.Instances)
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	return append(b, ']')
}

package scenario

import (
	"strconv"

	"github.com/sluicehq/sluice/sim"
)

// The query keys of a fleet: instances=3&store=separate (Scenario.Instances, Scenario.Stores).
const (
	KeyInstances = "instances"
	KeyStore     = "store"
)

// parseFleetKeys reads instances (1..sim.MaxInstances; 1 is one instance, as without it) and
// store (separate or shared, the default), failing the field at fault. With one instance the
// store makes no difference and is dropped, so that equal runs have equal addresses.
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
	if sc.Instances <= 1 {
		sc.Instances, sc.Stores = 0, sim.SharedStore
	}
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

package redis_test

import (
	"testing"

	"github.com/sluicehq/sluice/internal/changetest"
)

// TestChangedPolicyKeepsWhatWasUsed runs the memory store's scenarios of changed policies on a
// real server (through functions and through scripts) and a real Cluster, on virtual clocks:
// each algorithm and calendar window with 5 used, its limit raised, lowered or alternated, its
// burst changed (the use kept: a bucket's converted to the new limit, written even by a refusal
// or a peek), its period or algorithm changed (a fresh key), with settlements across the change;
// concurrency keeps its slots; racing goroutines under alternating limits get exactly the higher.
func TestChangedPolicyKeepsWhatWasUsed(t *testing.T) {
	for _, be := range calBackends(t) {
		be.clock.Set(changetest.T0)
		changetest.Run(t, be.store, be.clock, be.name)
		changetest.RunConcurrency(t, be.store, be.clock, be.name)
		changetest.RunRacing(t, be.store, be.clock, be.name)
	}
}

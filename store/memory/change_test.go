package memory_test

import (
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/changetest"
	"github.com/sluicehq/sluice/store/memory"
)

// TestChangedPolicyKeepsWhatWasUsed: each algorithm (and calendar window) with 5 used, then its
// limit raised, lowered, alternated with the old one, its burst changed, its period or algorithm
// changed; every decision after is package algorithm's, and the first one by hand: the use is
// kept under another limit or burst, a key starts afresh under another period or algorithm.
// Reservations made before a change are settled after it. Concurrency keeps the slots held; 16
// goroutines racing under two alternating limits get exactly the higher one approved.
func TestChangedPolicyKeepsWhatWasUsed(t *testing.T) {
	clock := sluice.NewManualClock(changetest.T0)
	st := memory.New(memory.WithClock(clock))
	changetest.Run(t, st, clock, "mem")
	changetest.RunConcurrency(t, st, clock, "mem")
	changetest.RunRacing(t, st, clock, "mem")
}

package sim

import (
	"math/rand/v2"
	"slices"
	"time"
)

// Workload is a built-in LLM workload: requests charged an estimate up front (a model request's
// max_tokens plus its prompt's estimated size), with the tokens they really used and how long
// their responses streamed, and the token policy it is meant to be run under. Its requests are
// drawn from a fixed random source: every run of a workload is the same.
type Workload struct {
	Name        string
	Description string
	Limit       int64 // tokens per Period
	Period      time.Duration
	build       func(r *rand.Rand) Trace
}

// Trace returns the workload's requests, their real costs and their responses' durations (for
// Options.Actual and Options.Durations).
func (w Workload) Trace() Trace {
	return w.build(rand.New(rand.NewPCG(1, 2)))
}

// Workloads are the built-in workloads, by Name.
var Workloads = []Workload{
	{
		Name: "llm-team",
		Description: "a team's key at 100,000 tokens a minute, for 5 minutes: 20 chat requests a minute, each " +
			"estimated at 4,500 tokens (max_tokens 4,000 and a 500-token prompt) and really using 800-2,000, " +
			"streaming for 2-20 s; at 2m an agent opens 30 streams at once; at 3m30s a long document is " +
			"estimated at 24,000 tokens and really uses 120,000, streaming for 40 s",
		Limit:  100_000,
		Period: time.Minute,
		build:  llmTeam,
	},
}

// WorkloadNamed returns the built-in workload of that name.
func WorkloadNamed(name string) (Workload, bool) {
	i := slices.IndexFunc(Workloads, func(w Workload) bool { return w.Name == name })
	if i < 0 {
		return Workload{}, false
	}
	return Workloads[i], true
}

// WorkloadNames lists the built-in workloads' names, for messages.
func WorkloadNames() []string {
	names := make([]string, len(Workloads))
	for i, w := range Workloads {
		names[i] = w.Name
	}
	return names
}

// llmTeam is the llm-team workload (see its Description).
func llmTeam(r *rand.Rand) Trace {
	const key = "team"
	var tr Trace
	between := func(lo, hi int64) int64 { return lo + r.Int64N(hi-lo+1) }
	add := func(t, estimate, actual, dur int64) {
		tr.Requests = append(tr.Requests, Request{TMicros: t, Key: key, Cost: estimate})
		tr.Actual = append(tr.Actual, actual)
		tr.Durations = append(tr.Durations, dur)
	}
	chat := func(t, minDur int64) { add(t, 4_500, 500+between(300, 1_500), between(minDur, 20*second/1000)*1000) }
	for i := range int64(100) { // 20 a minute for 5 minutes, every 3 s
		t := i * 3 * second
		chat(t, 2_000)
		switch t {
		case 2 * minute: // the agent's streams
			for range 30 {
				chat(t, 10_000)
			}
		case 3*minute + 30*second: // the long document
			add(t, 24_000, 120_000, 40*second)
		}
	}
	return tr
}

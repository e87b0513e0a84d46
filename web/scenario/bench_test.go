package scenario

import (
	"testing"

	"github.com/sluicehq/sluice/sim"
)

// BenchmarkRun is what the page waits for after each input: a scenario's run, buckets, peeks and
// JSON, beside its baseline, sim.Compare on the same requests (the decisions alone).
func BenchmarkRun(b *testing.B) {
	for _, tc := range []struct{ name, query string }{
		{"burst-140", burstQuery},
		{"steady-36000", "traffic=100/s+for+6m&limit=90&period=1s&burst=40"},
	} {
		sc, errs := Parse(tc.query)
		if errs != nil {
			b.Fatal(errs)
		}
		reqs, _ := sc.Requests()
		b.Run(tc.name+"/page", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				res, errs := sc.Run()
				if errs != nil {
					b.Fatal(errs)
				}
				_ = res.JSON()
			}
		})
		b.Run(tc.name+"/sim.Compare", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := sim.Compare(sc.Limit, sc.Period, sc.Burst, reqs); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

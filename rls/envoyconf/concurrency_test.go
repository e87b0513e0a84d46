package envoyconf

import "testing"

// Envoy's rate limit service never sees a response end: a concurrency policy there could never
// give a slot back, so it is refused at its line.
func TestConcurrencyRefused(t *testing.T) {
	parseErr(t, "domain: d\ndescriptors:\n  - key: k\n    algorithm: concurrency\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
		`f.yaml:4:16: descriptors[0] "k": algorithm concurrency is not supported by Envoy's rate limit service`)
}

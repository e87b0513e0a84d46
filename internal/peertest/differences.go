package peertest

// Differences are the sequences sluice answers differently from the peer, on purpose, and why
// (docs/envoy.md, "Differences from the reference"); every test that compares the two skips or
// checks them by this one list.
var Differences = map[string]string{
	// All or nothing: a request over the limit consumes nothing on its plain descriptors (those
	// without a hits_addend of their own), so the ones that were under their limit are not
	// counted, nor the hits that crossed it (the reference counts them). Usage (a descriptor's
	// own hits_addend) is counted by both.
	"integration/two-descriptors-one-over":      "a refused request consumes nothing",
	"readme/example2-nested-and-aggregate":      "a refused request consumes nothing",
	"addend/descriptor-level":                   "a refused request consumes nothing",
	"cost/over-check-beside-a-plain-descriptor": "a refused request consumes nothing on its plain descriptors",
	"addend/over-the-limit-is-counted":          "a plain request's refused hits are not counted",
	"override/shares-the-counter":               "each limit has its own counter",
	"errors/bad-requests":                       "bad requests are InvalidArgument, not Unknown",
}

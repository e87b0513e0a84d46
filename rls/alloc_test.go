package rls_test

import (
	"strconv"
	"testing"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestAnswersShareNothing: each answer's messages, and each request's limits, are allocated
// together for the first descriptors (room for two) and grown past them; no answer shares a
// message with another. For 1 to 5 descriptors (the same counter twice among them, a usage one
// and one over its limit), an answer kept aside is unchanged by the requests after it, and the
// same request asked of a fresh service answers the same, whether asked first or after others
// (the clock is stopped; but a peek's duration until reset reads the wall clock, so durations
// are left out of that comparison).
func TestAnswersShareNothing(t *testing.T) {
	const yaml = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 100}\n" +
		"  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 3}\n  - key: c\n    rate_limit: {unit: second, requests_per_unit: 0}\n"
	request := func(n, v int) *rlspb.RateLimitRequest {
		r := &rlspb.RateLimitRequest{Domain: "d", HitsAddend: uint32(1 + v%3)} // answers that differ
		for i := range n {
			var d = desc()
			switch i {
			case 2:
				d = desc("a", "x"+strconv.Itoa(v)) // the same counter as descriptor 0
			case 3:
				d = desc("b", "y"+strconv.Itoa(v))
				d.HitsAddend = wrapperspb.UInt64(1) // usage
			case 4:
				d = desc("c", "z") // a limit of 0: over
			default:
				d = desc([]string{"a", "b"}[i], []string{"x", "y"}[i]+strconv.Itoa(v))
			}
			r.Descriptors = append(r.Descriptors, d)
		}
		return r
	}
	for n := 1; n <= 5; n++ {
		fresh, _ := service(t, yaml)
		first, err := fresh.ShouldRateLimit(t.Context(), request(n, 1))
		if err != nil {
			t.Fatal(err)
		}
		s, _ := service(t, yaml)
		var kept []*rlspb.RateLimitResponse
		var copies []*rlspb.RateLimitResponse
		for v := 1; v <= 4; v++ {
			for m := 1; m <= 5; m++ {
				resp, err := s.ShouldRateLimit(t.Context(), request(m, v*10+m))
				if err != nil {
					t.Fatal(err)
				}
				kept, copies = append(kept, resp), append(copies, proto.Clone(resp).(*rlspb.RateLimitResponse))
			}
		}
		again, err := s.ShouldRateLimit(t.Context(), request(n, 1))
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(withoutResets(first), withoutResets(again)) {
			t.Errorf("%d descriptors: asked first %v, asked after others %v", n, first, again)
		}
		for i := range kept {
			if !proto.Equal(kept[i], copies[i]) {
				t.Fatalf("%d descriptors: answer %d changed after the requests that followed it:\nwas %v\nnow %v", n, i, copies[i], kept[i])
			}
		}
	}
}

// withoutResets is a copy of resp without its durations until reset.
func withoutResets(resp *rlspb.RateLimitResponse) *rlspb.RateLimitResponse {
	c := proto.Clone(resp).(*rlspb.RateLimitResponse)
	for _, st := range c.Statuses {
		st.DurationUntilReset = nil
	}
	return c
}

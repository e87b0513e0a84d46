package main

import (
	"context"
	"testing"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// The floor answers as a service whose limits are never reached: OK overall, and one OK status
// per descriptor, in order (what rlsload counts as an answered decision), sharing nothing
// between answers.
func TestAnswersOKPerDescriptor(t *testing.T) {
	for _, n := range []int{1, 2, 5} {
		in := &rlspb.RateLimitRequest{Domain: "d"}
		for range n {
			in.Descriptors = append(in.Descriptors, &commonpb.RateLimitDescriptor{
				Entries: []*commonpb.RateLimitDescriptor_Entry{{Key: "client", Value: "v"}}})
		}
		a, err := null{}.ShouldRateLimit(context.Background(), in)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := null{}.ShouldRateLimit(context.Background(), in)
		if a.GetOverallCode() != rlspb.RateLimitResponse_OK || len(a.GetStatuses()) != n {
			t.Fatalf("%d descriptors: %v with %d statuses, want OK with %d", n, a.GetOverallCode(), len(a.GetStatuses()), n)
		}
		for i, s := range a.GetStatuses() {
			if s.GetCode() != rlspb.RateLimitResponse_OK {
				t.Fatalf("status %d: %v, want OK", i, s.GetCode())
			}
			if s == b.GetStatuses()[i] {
				t.Fatalf("status %d is shared by two answers", i)
			}
		}
	}
}

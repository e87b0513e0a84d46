// Command rlsnull is the floor of scripts/bench-rls.sh: a gRPC rate limit service
// (envoy.service.ratelimit.v3) that decides nothing. It answers every ShouldRateLimit with OK,
// one OK status per descriptor, on a gRPC server with sluice's own settings (rls.ServerOptions)
// and the health service, so that what it costs per call under the load generator is what
// grpc-go, HTTP/2 and protobuf cost any Go rate limit service: the part of a decision's CPU no
// store, matching or answer can save.
//
//	go run ./bench/rlsnull -listen 127.0.0.1:8081
package main

import (
	"context"
	"flag"
	"log"
	"net"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice/rls"
)

type null struct {
	rlspb.UnimplementedRateLimitServiceServer
}

// ShouldRateLimit answers OK for every descriptor, as a service whose limits are never reached
// would, without looking at them.
func (null) ShouldRateLimit(_ context.Context, in *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	n := len(in.GetDescriptors())
	statuses := make([]*rlspb.RateLimitResponse_DescriptorStatus, n)
	room := make([]rlspb.RateLimitResponse_DescriptorStatus, n)
	for i := range statuses {
		room[i].Code = rlspb.RateLimitResponse_OK
		statuses[i] = &room[i]
	}
	return &rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OK, Statuses: statuses}, nil
}

func main() {
	listen := flag.String("listen", "127.0.0.1:8081", "the address to serve gRPC on")
	flag.Parse()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	gs := grpc.NewServer(rls.ServerOptions()...)
	rlspb.RegisterRateLimitServiceServer(gs, null{})
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
	log.Fatal(gs.Serve(ln))
}

package rls

import (
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
)

// maxMessage bounds a request's size: a rate limit request is a few descriptors of short
// entries (the bounds above), never megabytes.
const maxMessage = 64 << 10

// maxStreams bounds the calls in flight on one connection; more wait for one to end.
const maxStreams = 1024

// Server returns a gRPC server that serves s and the standard health service
// (grpc.health.v1.Health: SERVING for "" and for envoy.service.ratelimit.v3.RateLimitService),
// and the health server, to set NOT_SERVING when draining (see health.Server.Shutdown). opts
// come after ServerOptions (the quota service's larger message bound).
func (s *Service) Server(opts ...grpc.ServerOption) (*grpc.Server, *health.Server) {
	gs := grpc.NewServer(append(ServerOptions(), opts...)...)
	rlspb.RegisterRateLimitServiceServer(gs, s)
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(rlspb.RateLimitService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
	return gs, hs
}

// ServerOptions are the gRPC server's settings, for Server and for a benchmark's server that is
// to cost what this one does (bench/rlsnull).
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(maxMessage),
		// Workers keep their grown stacks: a goroutine per stream would grow its stack again for
		// every call (measured: 10–25% of the service's CPU on the Redis store).
		grpc.NumStreamWorkers(64),
		// One connection carries many calls at once (an Envoy worker's), but not without bound:
		// each call in flight holds memory until it is answered.
		grpc.MaxConcurrentStreams(maxStreams),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: 5 * time.Minute}),
		// Envoy pings its long-lived connections; allow it as often as every 10 s.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}
}

package rls_test

import (
	"context"
	"net"
	"strconv"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/decision"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/rls"
	"github.com/sluicehq/sluice/rls/envoyconf"
	redisstore "github.com/sluicehq/sluice/store/redis"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// BenchmarkShouldRateLimit is the service's own cost of one decision (no gRPC): matching, the
// decision on the memory store, and the answer.
func BenchmarkShouldRateLimit(b *testing.B) {
	s, _ := service(&testing.T{}, "domain: d\ndescriptors:\n  - key: client\n    rate_limit: {unit: second, requests_per_unit: 1000000000}\n")
	reqs := make([]*rlspb.RateLimitRequest, 1024)
	for i := range reqs {
		reqs[i] = &rlspb.RateLimitRequest{Domain: "d", Descriptors: []*commonpb.RateLimitDescriptor{{
			Entries: []*commonpb.RateLimitDescriptor_Entry{{Key: "client", Value: "value-" + strconv.Itoa(i)}}}}}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := s.ShouldRateLimit(context.Background(), reqs[i%len(reqs)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkGRPC is one decision over a real gRPC connection on loopback, 64 callers: the
// service, gRPC's server and its client in one process.
func BenchmarkGRPC(b *testing.B) {
	s, _ := service(&testing.T{}, "domain: d\ndescriptors:\n  - key: client\n    rate_limit: {unit: second, requests_per_unit: 1000000000}\n")
	benchGRPC(b, s)
}

// BenchmarkGRPCRedis is BenchmarkGRPC on a real redis-server.
func BenchmarkGRPCRedis(b *testing.B) {
	rs := redistest.Start(b)
	st, err := redisstore.New(redisstore.Options{Addrs: []string{rs.Addr}})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	conf, err := envoyconf.Parse([]byte("domain: d\ndescriptors:\n  - key: client\n    rate_limit: {unit: second, requests_per_unit: 1000000000}\n"), "envoy.yaml")
	if err != nil {
		b.Fatal(err)
	}
	d := decision.Decider{Store: st}
	benchGRPC(b, rls.New(conf, d.Decide))
}

func benchGRPC(b *testing.B, s *rls.Service) {
	gs, _ := s.Server()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go gs.Serve(ln)
	defer gs.Stop()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	c := rlspb.NewRateLimitServiceClient(conn)
	reqs := make([]*rlspb.RateLimitRequest, 1024)
	for i := range reqs {
		reqs[i] = &rlspb.RateLimitRequest{Domain: "d", Descriptors: []*commonpb.RateLimitDescriptor{{
			Entries: []*commonpb.RateLimitDescriptor_Entry{{Key: "client", Value: "value-" + strconv.Itoa(i)}}}}}
	}
	b.SetParallelism(32)
	b.ReportAllocs()
	var n atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.ShouldRateLimit(context.Background(), reqs[n.Add(1)%int64(len(reqs))]); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

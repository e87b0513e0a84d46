package rlqs

import (
	"context"
	"errors"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Register adds the service to a gRPC server (the rate limit service's, on rls.listen).
func (s *Service) Register(gs *grpc.Server) {
	rlqspb.RegisterRateLimitQuotaServiceServer(gs, server{s})
}

type server struct{ s *Service }

// StreamRateLimitQuotas serves one Envoy's stream: each report is answered at once with its
// buckets' actions; between reports, a timer of half the report interval sends what is due
// (assignments about to expire, shares freed by other Envoys, abandons). A report the service
// refuses whole ends the stream with InvalidArgument; the service's Close with Unavailable.
func (sv server) StreamRateLimitQuotas(stream grpc.BidiStreamingServer[rlqspb.RateLimitQuotaUsageReports, rlqspb.RateLimitQuotaResponse]) error {
	s := sv.s
	ctx := stream.Context()
	addr := ""
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		addr = p.Addr.String()
	}
	c := s.Open(addr)
	defer c.Close()

	reports := make(chan *rlqspb.RateLimitQuotaUsageReports)
	recvErr := make(chan error, 1)
	go func() {
		for {
			r, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case reports <- r:
			case <-ctx.Done():
				return
			}
		}
	}()
	tick := time.NewTicker(max(s.rules.Load().quota.ReportInterval/2, time.Millisecond))
	defer tick.Stop()
	send := func(actions []*rlqspb.RateLimitQuotaResponse_BucketAction) error {
		if len(actions) == 0 {
			return nil
		}
		return stream.Send(&rlqspb.RateLimitQuotaResponse{BucketAction: actions})
	}
	for {
		select {
		case r := <-reports:
			actions, err := c.Report(ctx, r)
			var re *ReportError
			if errors.As(err, &re) {
				return status.Error(codes.InvalidArgument, "rlqs: "+re.Msg)
			}
			if err := send(actions); err != nil {
				return err
			}
		case <-tick.C:
			if err := send(c.Tick(ctx)); err != nil {
				return err
			}
		case err := <-recvErr:
			if errors.Is(err, context.Canceled) || status.Code(err) == codes.Canceled {
				return nil
			}
			return nil // the Envoy closed its side (io.EOF) or went away
		case <-s.closing:
			return status.Error(codes.Unavailable, "rlqs: sluice is shutting down; reconnect")
		case <-ctx.Done():
			return nil
		}
	}
}

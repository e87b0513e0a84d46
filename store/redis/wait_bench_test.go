package redis

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
)

// BenchmarkRedisReplicasAck measures what replicas_ack costs: token-bucket approvals on a local
// primary with one replica, on 10,000 keys, from one caller (the latency of one decision) and
// from 64 (throughput), with replicas_ack off and 1 (each consuming call confirmed by WAIT 1 on
// its own connection: a round trip more and the replica's acknowledgement, and no sharing of
// pipelined connections).
func BenchmarkRedisReplicasAck(b *testing.B) {
	g := redistest.StartReplicated(b, 1)
	policy := sluice.Policy{Name: "bench", Algorithm: sluice.TokenBucket, Limit: 1_000_000, Period: time.Second}
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = fmt.Sprintf("customer-%d", i)
	}
	for _, callers := range []int{1, 64} {
		for _, variant := range []struct {
			name string
			ack  int
		}{{"impl=off", 0}, {"impl=ack1", 1}} {
			b.Run(fmt.Sprintf("callers=%d/%s", callers, variant.name), func(b *testing.B) {
				s, err := New(Options{Addrs: []string{g.Primary.Addr}, Timeout: time.Second, ReplicasAck: variant.ack})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				ctx := context.Background()
				runDecisions(b, callers, keys, func(key string) (bool, error) {
					d, err := s.Decide(ctx, key, policy, 1)
					return d.Allowed, err
				})
			})
		}
	}
}

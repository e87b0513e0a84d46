package rlqs_test

import (
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/internal/rlqstest"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/rlqs"
)

// waitFor polls cond until it holds; the deadline only guards against a hang.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(30 * time.Second); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Over gRPC, with Envoys imitated by the harness: each gets a token bucket assignment for its
// bucket; an Envoy of another domain has its stream ended (InvalidArgument) and gets nothing;
// the service's Close ends every stream, so that the server's graceful stop returns.
func TestStreams(t *testing.T) {
	q := &config.Quota{Domain: "edge", ReportInterval: 100 * time.Millisecond, TTL: 300 * time.Millisecond, Idle: time.Minute, Algorithm: "fair",
		Buckets: []config.QuotaBucket{api}}
	group := &ledger.MemoryGroup{}
	svc := rlqs.New(q, rlqs.Options{Ledgers: func(name string, o ledger.Options) (ledger.Ledger, error) {
		return ledger.NewMemory(name, o, ledger.MemoryOptions{Group: group})
	}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	svc.Register(gs)
	served := make(chan error, 1)
	go func() { served <- gs.Serve(ln) }()

	var downs atomic.Int64
	var fs []*rlqstest.Filter
	for range 3 {
		f, err := rlqstest.New(rlqstest.Config{Addr: ln.Addr().String(), Domain: "edge", ReportInterval: 100 * time.Millisecond,
			OnStream: func(up bool) {
				if !up {
					downs.Add(1)
				}
			}})
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		fs = append(fs, f)
	}
	stranger, err := rlqstest.New(rlqstest.Config{Addr: ln.Addr().String(), Domain: "other", ReportInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	stranger.Decide(apiID)
	// The service's ledgers learn for a lease and the margin after their first use; the Envoys
	// keep deciding and reporting until each holds a token bucket.
	waitFor(t, "every Envoy holds a token bucket", func() bool {
		all := true
		for _, f := range fs {
			f.Decide(apiID)
			if s, ok := f.Stats(apiID); !ok || s.State != rlqstest.Active || s.Assignment.GetTokenBucket() == nil {
				all = false
			}
		}
		return all
	})
	if s, _ := stranger.Stats(apiID); s.State != rlqstest.NoAssignment || stranger.Client().Responses != 0 {
		t.Fatalf("the other domain's Envoy: %+v, %+v; want no assignment, no response", s, stranger.Client())
	}
	if st := svc.Stats(); len(st.Clients) < 3 || st.Assignments == 0 {
		t.Fatalf("stats %+v", st)
	}
	svc.Close()
	waitFor(t, "every stream ended", func() bool { return downs.Load() >= 3 })
	gs.GracefulStop()
	<-served
}

package main

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestOpenStoreSentinel: store.sentinel and replicas_ack reach the Redis store: a gateway's
// store opened from them finds the primary through a real sentinel and confirms decisions on
// its replica (WAIT runs on the primary).
func TestOpenStoreSentinel(t *testing.T) {
	g := redistest.StartReplicated(t, 1)
	ss := redistest.StartSentinels(t, g.Primary, 1, redistest.SentinelConfig{})
	cfg := config.Store{Type: config.StoreRedis, Timeout: 250 * time.Millisecond, OnError: sluice.FailClosed,
		Sentinel: &config.Sentinel{Master: ss.Master, Addrs: ss.Addrs()}, ReplicasAck: 1, ReplicasAckTimeout: 100 * time.Millisecond}
	o := redisOptions(cfg, nil)
	if o.Sentinel == nil || o.Sentinel.Master != ss.Master || o.ReplicasAck != 1 || o.ReplicasAckTimeout != 100*time.Millisecond {
		t.Fatalf("redisOptions = %+v", o)
	}
	st, err := openStore(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	waits := func() int {
		n, _ := strconv.Atoi(strings.Split(strings.TrimPrefix(g.Primary.Info("commandstats", "cmdstat_wait"), "calls="), ",")[0])
		return n
	}
	before := waits()
	p := sluice.Policy{Name: "p", Algorithm: sluice.FixedWindow, Limit: 3, Period: time.Hour}
	if d, err := st.Decide(context.Background(), "k", p, 1); err != nil || !d.Allowed {
		t.Fatalf("Decide: %+v, %v", d, err)
	}
	if got := waits() - before; got != 1 {
		t.Fatalf("the primary ran WAIT %d times for one consuming decision, want 1", got)
	}
}

package main

import (
	"context"
	"fmt"
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
// a replica (WAIT runs on the primary). When the primary is killed, on_error answers (here
// local: the local share) until the sentinel has promoted a replica, and then decisions go to
// the new primary again, without a restart.
func TestOpenStoreSentinel(t *testing.T) {
	g := redistest.StartReplicated(t, 2)
	ss := redistest.StartSentinels(t, g.Primary, 1, redistest.SentinelConfig{})
	cfg := config.Store{Type: config.StoreRedis, Timeout: 250 * time.Millisecond, OnError: sluice.FailLocal, LocalShare: 0.5,
		Sentinel: &config.Sentinel{Master: ss.Master, Addrs: ss.Addrs()}, ReplicasAck: 1, ReplicasAckTimeout: 100 * time.Millisecond}
	o := redisOptions(cfg, nil)
	if o.Sentinel == nil || o.Sentinel.Master != ss.Master || o.ReplicasAck != 1 || o.ReplicasAckTimeout != 100*time.Millisecond {
		t.Fatalf("redisOptions = %+v", o)
	}
	st, err := openStore(cfg, nil, nil)
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

	g.Primary.Kill()
	killed := time.Now()
	local := 0
	for n := 0; ; n++ {
		d, err := st.Decide(context.Background(), fmt.Sprintf("k%d", n), p, 1)
		if err != nil {
			t.Fatalf("decision %d after the kill: %v; want the failure mode's answer", n, err)
		}
		if d.Fallback == sluice.NoFallback {
			break // Redis decides again: the new primary's
		}
		if d.Fallback != sluice.FallbackLocal || !d.Allowed {
			t.Fatalf("decision %d after the kill: %+v; want allowed by the local share", n, d)
		}
		local++
		if time.Since(killed) > 20*time.Second {
			t.Fatalf("decisions did not return to Redis within 20 s of the kill (the sentinel says %q)", ss.MasterAddr(""))
		}
		time.Sleep(10 * time.Millisecond) // the sentinel's failover takes seconds: sample it
	}
	if local == 0 {
		t.Fatal("no decision was answered by the failure mode while the primary was down")
	}
	t.Logf("the local share answered %d decisions for %v, then the new primary %s", local, time.Since(killed).Round(time.Millisecond), ss.MasterAddr(""))
}

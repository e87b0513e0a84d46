package redistest

import (
	"strings"
	"testing"
	"time"
)

// TestSentinelFailover: sentinels promote the replica of a killed primary; a stopped server
// answers nothing until continued; a replaced node rejoins as a replica of the new primary.
func TestSentinelFailover(t *testing.T) {
	g := StartReplicated(t, 1)
	if _, err := g.Primary.Do("SET", "k", "v"); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Primary.Do("WAIT", "1", "1000"); err != nil {
		t.Fatal(err)
	}
	if v, _ := g.Replicas[0].Do("GET", "k"); v != "v" {
		t.Fatalf("replica GET k = %q, want v", v)
	}
	ss := StartSentinels(t, g.Primary, 3, SentinelConfig{})
	if got := ss.MasterAddr(""); got != g.Primary.Addr {
		t.Fatalf("sentinels report master %q, want %s", got, g.Primary.Addr)
	}

	g.Replicas[0].Stop()
	if _, err := doTimeout(g.Replicas[0].Addr, 200*time.Millisecond, "PING"); err == nil {
		t.Fatal("a stopped server answered PING")
	}
	g.Replicas[0].Cont()
	if r, err := g.Replicas[0].Do("PING"); err != nil || r != "PONG" {
		t.Fatalf("continued server: PING = %q, %v", r, err)
	}

	old := g.Primary.Addr
	g.Primary.Kill()
	start := time.Now()
	addr := ss.WaitNewMaster(old, "", 20*time.Second)
	if addr != g.Replicas[0].Addr {
		t.Fatalf("new master %s, want the replica %s", addr, g.Replicas[0].Addr)
	}
	t.Logf("sentinels promoted the replica %v after the primary was killed", time.Since(start).Round(time.Millisecond))
	if v, _ := g.Replicas[0].Do("GET", "k"); v != "v" {
		t.Fatalf("promoted replica GET k = %q, want v", v)
	}
	g.Primary.RestartAsReplicaOf(addr)
	WaitReplicas(t, g.Replicas[0], 1, 15*time.Second)
	if role := g.Primary.Info("replication", "role"); role != "slave" {
		t.Fatalf("replaced node's role %q, want slave", role)
	}
}

// TestClusterReplicasFailover: a cluster with a replica per master promotes the replica of a
// killed master.
func TestClusterReplicasFailover(t *testing.T) {
	c := StartClusterReplicas(t, 3, time.Second)
	if len(c.Servers) != 3 || len(c.Replicas) != 3 {
		t.Fatalf("%d masters and %d replicas, want 3 and 3", len(c.Servers), len(c.Replicas))
	}
	info, _ := c.Servers[0].Do("CLUSTER", "INFO")
	if !strings.Contains(info, "cluster_known_nodes:6") {
		t.Fatalf("CLUSTER INFO: %s", info)
	}
	c.Servers[0].Kill()
	start := time.Now()
	s := c.WaitPromoted(t, 20*time.Second)
	t.Logf("replica %s took over %v after its master was killed", s.Addr, time.Since(start).Round(time.Millisecond))
}

package redistest

import (
	"strings"
	"testing"
)

func TestServerAndCluster(t *testing.T) {
	s := Start(t)
	if _, err := s.Do("SET", "k", "v"); err != nil {
		t.Fatal(err)
	}
	if v, _ := s.Do("GET", "k"); v != "v" {
		t.Fatalf("GET k = %q", v)
	}
	s.Restart()
	if v, _ := s.Do("GET", "k"); v != "" {
		t.Fatalf("after a restart GET k = %q, want nothing (no persistence)", v)
	}
	c := StartCluster(t, 3)
	info, err := c.Servers[0].Do("CLUSTER", "INFO")
	if err != nil || !strings.Contains(info, "cluster_known_nodes:3") {
		t.Fatalf("CLUSTER INFO: %v %s", err, info)
	}
}

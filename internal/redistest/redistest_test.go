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
	if r, err := s.Tx([]string{"INCR", "n"}, []string{"ECHO", "between"}, []string{"INCRBY", "n", "2"}); err != nil ||
		len(r) != 3 || r[0] != "1" || r[1] != "between" || r[2] != "3" {
		t.Fatalf("Tx: %q %v", r, err)
	}
	if _, err := s.Tx([]string{"NOSUCHCOMMAND"}); err == nil {
		t.Fatal("Tx of an unknown command: no error")
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

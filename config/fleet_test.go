package config

import (
	"strings"
	"testing"
)

// TestFleetLocalShare: local_share is fleet (the default: 1/n of each policy, n the instances on
// the Redis) or a fixed number.
func TestFleetLocalShare(t *testing.T) {
	for _, c := range []struct {
		store string
		want  float64
	}{
		{"{type: redis, addrs: [r:6379], on_error: local}", LocalShareFleet},
		{"{type: redis, addrs: [r:6379], on_error: local, local_share: fleet}", LocalShareFleet},
		{"{type: redis, addrs: [r:6379], on_error: local, local_share: 0.25}", 0.25},
		{"{type: redis, addrs: [r:6379], on_error: local, local_share: 1}", 1},
	} {
		cfg, err := parseTest(t, "upstream: http://127.0.0.1:9000\nstore: "+c.store+"\n")
		if err != nil {
			t.Errorf("store: %s: %v", c.store, err)
			continue
		}
		if cfg.Store.LocalShare != c.want {
			t.Errorf("store: %s: LocalShare %v; want %v", c.store, cfg.Store.LocalShare, c.want)
		}
	}
}

// TestFleetName: store.fleet names the instance registry's fleet; without it the fleet is
// DefaultFleet ("default"), whose registry is the one of before fleets had names.
func TestFleetName(t *testing.T) {
	for _, c := range []struct{ store, want string }{
		{"{type: redis, addrs: [r:6379]}", "default"},
		{"{type: redis, addrs: [r:6379], fleet: api}", "api"},
		{"{type: redis, addrs: [r:6379], fleet: LLM-gw_2.eu}", "LLM-gw_2.eu"},
		{"{type: memory}", DefaultFleet},
	} {
		cfg, err := parseTest(t, "upstream: http://127.0.0.1:9000\nstore: "+c.store+"\n")
		if err != nil {
			t.Errorf("store: %s: %v", c.store, err)
			continue
		}
		if cfg.Store.Fleet != c.want {
			t.Errorf("store: %s: Fleet %q; want %q", c.store, cfg.Store.Fleet, c.want)
		}
		if named := strings.Contains(cfg.String(), " fleet "+c.want+","); named != (c.want != DefaultFleet) {
			t.Errorf("store: %s: the configuration's summary %q; want the fleet named unless it is the default", c.store, cfg.String())
		}
	}
}

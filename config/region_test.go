package config

import (
	"strings"
	"testing"
	"time"
)

const regionStore = "store: {type: redis, addrs: [127.0.0.1:6379]}\n"

// TestRegion: the region section's defaults and fields, and global: true on a policy.
func TestRegion(t *testing.T) {
	cfg, err := parseTest(t, up+regionStore+`region:
  name: eu
  regions: 2
  global: {addrs: [127.0.0.1:6380]}
policies:
  - {name: partner, algorithm: fixed-window, limit: 6000, period: 1m, global: true}
  - {name: local, algorithm: fixed-window, limit: 10, period: 1s}
default_policy: [partner, local]
`)
	if err != nil {
		t.Fatal(err)
	}
	r := cfg.Region
	if r == nil || r.Name != "eu" || r.Regions != 2 || r.Refresh != time.Second || r.Lease != 10*time.Second || r.Hold != 0 ||
		r.Floor != 0.25 || r.SafeShare != 0.25 || r.Algorithm != "fair" || r.Global.Type != StoreRedis || r.Global.Addrs[0] != "127.0.0.1:6380" {
		t.Fatalf("defaults: %+v", r)
	}
	if got := cfg.String(); !strings.Contains(got, ", store redis [127.0.0.1:6379] fail-closed, region eu of 2, ledger [127.0.0.1:6380], ") {
		t.Fatalf("String: %s", got)
	}
	if !cfg.policies["partner"].Global || cfg.policies["local"].Global {
		t.Fatal("global: true is the partner policy's only")
	}
	applied := cfg.defaults.applied
	if len(applied) != 2 || !applied[0].Global || applied[1].Global {
		t.Fatalf("resolution: %+v", applied)
	}
	cfg, err = parseTest(t, up+regionStore+`region:
  name: us-east.1
  regions: 3
  global: {type: redis, url: redis://127.0.0.1:6380/0, prefix: "g:"}
  refresh: 500ms
  lease: 5s
  hold: 2s
  floor: 0.1
  safe_share: 0.2
  algorithm: proportional
`)
	if err != nil {
		t.Fatal(err)
	}
	if r := cfg.Region; r.Name != "us-east.1" || r.Refresh != 500*time.Millisecond || r.Lease != 5*time.Second || r.Hold != 2*time.Second ||
		r.Floor != 0.1 || r.SafeShare != 0.2 || r.Algorithm != "proportional" || r.Global.Prefix != "g:" {
		t.Fatalf("fields: %+v", r)
	}
}

// TestRegionErrors: each mistake is named with its field and line.
func TestRegionErrors(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{"policies:\n  - {name: p, algorithm: fixed-window, limit: 5, period: 1s, global: true}\n",
			"config.yaml:3:70: policies[0] \"p\": global: true needs a region section"},
		{"store: {type: memory}\nregion: {name: eu, regions: 1, global: {addrs: [127.0.0.1:6380]}}\n",
			"config.yaml:3:9: region: region needs a Redis store"},
		{regionStore + "region: {regions: 1, global: {addrs: [127.0.0.1:6380]}}\n", "config.yaml:3:9: region: region needs name"},
		{regionStore + "region: {name: eu, global: {addrs: [127.0.0.1:6380]}}\n", "config.yaml:3:9: region: region needs regions"},
		{regionStore + "region: {name: eu, regions: 1}\n", "config.yaml:3:9: region: region needs global"},
		{regionStore + "region: {name: eu, regions: 1, global: {type: memory}}\n", "config.yaml:3:40: region.global: type must be redis"},
		{regionStore + "region: {name: eu, regions: 1, global: {}}\n", "config.yaml:3:40: region.global: the redis store needs addrs"},
		{regionStore + "region: {name: eu, regions: 1, global: {addrs: [x]}}\n", "config.yaml:3:49: region.global: addrs[0] \"x\" is not host:port"},
		{regionStore + "region: {name: 'e u', regions: 1, global: {addrs: [127.0.0.1:6380]}}\n", "config.yaml:3:16: region: name \"e u\" may only have"},
		{regionStore + "region: {name: eu, regions: 65, global: {addrs: [127.0.0.1:6380]}}\n", "config.yaml:3:29: region: regions 65 must be from 1 to 64"},
		{regionStore + "region: {name: eu, regions: 2, floor: 0.6, global: {addrs: [127.0.0.1:6380]}}\n", "config.yaml:3:39: region: floor 0.6 must be from 0 to 0.5"},
		{regionStore + "region: {name: eu, regions: 2, safe_share: 2, global: {addrs: [127.0.0.1:6380]}}\n", "config.yaml:3:44: region: safe_share 2 must be from 0 to 1"},
		{regionStore + "region: {name: eu, regions: 2, refresh: 6s, global: {addrs: [127.0.0.1:6380]}}\n", "config.yaml:3:9: region: lease 10s must be at least twice refresh (6s)"},
		{regionStore + "region: {name: eu, regions: 2, algorithm: x, global: {addrs: [127.0.0.1:6380]}}\n", "config.yaml:3:43: region: algorithm \"x\" must be fair"},
		{regionStore + "region: {name: eu, regions: 2, globl: {}, global: {addrs: [127.0.0.1:6380]}}\n", "config.yaml:3:32: region: unknown field \"globl\"; did you mean \"global\"?"},
		{regionStore + "region: {name: eu, regions: 1, global: {addrs: [127.0.0.1:6380]}}\npolicies:\n  - {name: p, algorithm: leaky-bucket, limit: 5, period: 1s, global: true}\n",
			"config.yaml:5:70: policies[0] \"p\": global: true is for fixed-window, sliding-window and token-bucket, not leaky-bucket"},
		{regionStore + "region: {name: eu, regions: 1, global: {addrs: [127.0.0.1:6380]}}\npolicies:\n  - {name: p, algorithm: fixed-window, limit: 5, calendar: day, global: true}\n",
			"config.yaml:5:73: policies[0] \"p\": global: true and calendar exclude each other"},
	} {
		_, err := parseTest(t, up+c.yaml)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s\ngot  %v\nwant %s", c.yaml, err, c.want)
		}
	}
}

package config

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

func TestDemo(t *testing.T) {
	cfg, err := Demo("http://127.0.0.1:41234")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.File != "demo" || cfg.Upstream.String() != "http://127.0.0.1:41234" || cfg.Store.Type != StoreMemory ||
		cfg.Listen != DefaultListen || cfg.AdminListen != DefaultAdminListen {
		t.Errorf("%v", cfg)
	}
	anon := cfg.PoliciesFor(nil, nil)
	if len(anon) != 1 || anon[0] != (sluice.Policy{Name: "anonymous", Algorithm: sluice.TokenBucket, Limit: 10, Period: 10 * time.Second, Burst: 20}) {
		t.Errorf("anonymous: %+v", anon)
	}
	demo, ok := cfg.ClientByAPIKey(DemoAPIKey)
	if !ok || demo.Name != "demo-partner" {
		t.Fatalf("the demo key names %v", demo)
	}
	if ps := cfg.PoliciesFor(demo, nil); len(ps) != 1 || ps[0].Name != "partner" {
		t.Errorf("demo-partner: %+v", ps)
	}
	if r, ok := cfg.Route("POST", "/reports/weekly"); !ok || r.Cost != 5 {
		t.Errorf("POST /reports: %+v", r)
	}
	q, _ := cfg.Route("GET", "/queue")
	if ps := cfg.PoliciesFor(demo, q); len(ps) != 1 || ps[0].Algorithm != sluice.LeakyBucket {
		t.Errorf("/queue: %+v", ps)
	}
	if strings.Contains(string(DemoYAML("http://x")), DemoAPIKey+"\n") {
		t.Error("the demo file should hold the key's hash, and the key only in a comment")
	}
	for _, bad := range []string{"", "127.0.0.1:1", "ftp://x", "http://x\nlisten: y"} {
		if _, err := Demo(bad); err == nil {
			t.Errorf("Demo(%q): no error", bad)
		}
	}
}

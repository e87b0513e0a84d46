package envoyconf

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/config"
)

// The examples of docs/envoy.md load and mean what the text says.
func TestDocsExamples(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "envoy.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllSubmatch(doc, -1)
	if len(blocks) != 10 {
		t.Fatalf("%d yaml blocks in docs/envoy.md, want 10", len(blocks))
	}
	// The 7th and 8th are the quota service's, sluice's and Envoy's (package rlqs's
	// TestEnvoyDocsConfig checks them). The last two are Kubernetes': Envoy Gateway's
	// configuration and Istio's container, with sluice's image in place of the reference's.
	for i, want := range map[int]string{8: "rateLimitDeployment", 9: "/bin/ratelimit"} {
		var v any
		if err := yaml.Unmarshal(blocks[i][1], &v); err != nil || !bytes.Contains(blocks[i][1], []byte(want)) ||
			!bytes.Contains(blocks[i][1], []byte("image: registry.example.com/sluice:")) {
			t.Errorf("the Kubernetes example %d: %v; want YAML with %s and sluice's image", i, err, want)
		}
	}
	// The last is the configuration of rules over xDS: valid but for its certificate files,
	// which are the ones a pod would have.
	_, err = config.Parse(blocks[5][1], "sluice.yaml")
	var errs config.Errors
	if !errors.As(err, &errs) || len(errs) != 3 {
		t.Fatalf("the xds example: want the three certificate files unreadable, got %v", err)
	}
	for _, e := range errs {
		if !strings.Contains(e.Msg, "/certs/") || !strings.Contains(e.Msg, "cannot be read") {
			t.Errorf("the xds example: %v", e)
		}
	}
	// The first is sluice's own configuration of the service, the second Envoy's: the others
	// are the files' format.
	if cfg, err := config.Parse(blocks[0][1], "sluice.yaml"); err != nil || cfg.RLS == nil || cfg.RLS.Listen != "127.0.0.1:8081" || cfg.Listen != "" {
		t.Fatalf("the sluice configuration's example: %v", err)
	}
	blocks = blocks[2:]
	c, err := Parse(blocks[0][1], "format")
	if err != nil || len(c.Warnings()) != 0 {
		t.Fatalf("the format's example: %v %v", err, c.Warnings())
	}
	want(t, c, "my-service", kv("remote_address", "10.0.0.1"), 10, Second, "my-service/remote_address")
	a := want(t, c, "my-service", kv("header_match", "premium", "path", "/api/a"), 600, Minute, "my-service/header_match=premium/path=/api/*")
	b := want(t, c, "my-service", kv("header_match", "premium", "path", "/api/b"), 600, Minute, "my-service/header_match=premium/path=/api/*")
	if a.Key != b.Key || !a.ShadowMode || a.Name != "premium-api" || len(a.Replaces) != 1 {
		t.Errorf("premium-api: %+v", a)
	}
	if m, ok := c.Match("my-service", kv("health", "x"), nil); !ok || !m.Unlimited {
		t.Errorf("health: %+v", m)
	}

	c, err = Parse(append([]byte("domain: d\n"), blocks[1][1]...), "matching")
	if err != nil {
		t.Fatal(err)
	}
	k1 := want(t, c, "d", kv("key2", "a"), 20, Minute, "d/key2")
	k2 := want(t, c, "d", kv("key2", "b"), 20, Minute, "d/key2")
	if k1.Key == k2.Key {
		t.Error("(key2, a) and (key2, b) share a counter")
	}
	want(t, c, "d", kv("key2", "value2"), 30, Minute, "d/key2=value2")
	none(t, c, "d", kv("key2", "value3"))

	c, err = Parse(append([]byte("domain: d\ndescriptors:\n"), blocks[2][1]...), "extension")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := c.Match("d", kv("api_key", "k"), nil)
	if m.Policy != (sluice.Policy{Algorithm: sluice.TokenBucket, Limit: 5, Period: time.Second, Burst: 20}) {
		t.Errorf("extension: %+v", m.Policy)
	}
}

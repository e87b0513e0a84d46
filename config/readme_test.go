package config

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// TestReadmeExamples parses every YAML example in the README as a new user would copy it, and
// checks its walk-through to a limit per API key: each key's printed SHA-256 is the key's, the
// configuration names a client by it, and that client gets the limit the text describes.
func TestReadmeExamples(t *testing.T) {
	doc, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllSubmatch(doc, -1)
	if len(blocks) < 3 {
		t.Fatalf("%d YAML examples in README.md", len(blocks))
	}
	fix := strings.NewReplacer(`"<sha-256 of the key>"`, sum("readme"))
	var walk *Config // the walk-through's, the example with a per-key policy
	for i, b := range blocks {
		cfg, err := parse([]byte(fix.Replace(string(b[1]))), "sluice.yaml", lookupEnv)
		if err != nil {
			t.Errorf("README example %d:\n%s\n%v", i+1, b[1], err)
			continue
		}
		if _, ok := cfg.Policy("per-key"); ok {
			walk = cfg
		}
	}
	if walk == nil {
		t.Fatal("no README example has the per-key policy of the walk-through")
	}

	printed := regexp.MustCompile("\\$ printf %s (\\S+) \\| sha256sum\n([0-9a-f]{64})  -").FindAllSubmatch(doc, -1)
	if len(printed) < 2 {
		t.Fatalf("the README prints %d keys' SHA-256, want the walk-through's two", len(printed))
	}
	want := sluice.Policy{Name: "per-key", Algorithm: sluice.TokenBucket, Limit: 5, Period: time.Minute}
	for _, p := range printed {
		key, hash := string(p[1]), string(p[2])
		if sum(key) != hash {
			t.Errorf("the README prints %s as the SHA-256 of %q; it is %s", hash, key, sum(key))
		}
		c, ok := walk.ClientByAPIKey(key)
		if !ok {
			t.Errorf("no client of the walk-through's configuration has the key %q", key)
			continue
		}
		if got := walk.PoliciesFor(c, nil); len(got) != 1 || got[0] != want {
			t.Errorf("client %s (key %q) has the policies %+v; the README describes %+v", c.Name, key, got, want)
		}
	}
}

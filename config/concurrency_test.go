package config

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// TestConcurrencyPolicy: algorithm: concurrency takes a limit and a lease (default 30s) and no
// period; its Period is the lease.
func TestConcurrencyPolicy(t *testing.T) {
	cfg, err := parseTest(t, up+"policies:\n"+
		"  - {name: slots, algorithm: concurrency, limit: 20}\n"+
		"  - {name: short, algorithm: concurrency, limit: 5, lease: 2s}\n"+
		"default_policy: [slots, short]\n")
	if err != nil {
		t.Fatal(err)
	}
	for name, lease := range map[string]time.Duration{"slots": DefaultLease, "short": 2 * time.Second} {
		a, ok := cfg.Applied(name)
		if !ok {
			t.Fatalf("no policy %q", name)
		}
		if a.Policy.Algorithm != sluice.Concurrency || a.Policy.Period != lease {
			t.Errorf("%s: %v with period %v, want concurrency with the lease %v", name, a.Policy.Algorithm, a.Policy.Period, lease)
		}
	}
}

// TestConcurrencyErrors: what a concurrency policy does not take, and a lease elsewhere, each an
// error at its line naming the field.
func TestConcurrencyErrors(t *testing.T) {
	for _, c := range []struct {
		name, yaml string
		line       int
		words      []string
	}{
		{"period on concurrency", "  - name: c\n    algorithm: concurrency\n    limit: 5\n    period: 1s\n", 6, []string{"period has no meaning for concurrency", "lease"}},
		{"burst on concurrency", "  - name: c\n    algorithm: concurrency\n    limit: 5\n    burst: 3\n", 6, []string{"burst 3 has no meaning for concurrency"}},
		{"lease on a token bucket", "  - name: c\n    algorithm: token-bucket\n    limit: 5\n    period: 1s\n    lease: 1s\n", 7, []string{"lease has no meaning for token-bucket"}},
		{"lease too short", "  - name: c\n    algorithm: concurrency\n    limit: 5\n    lease: 500us\n", 6, []string{"lease 500µs must be ≥ 1ms"}},
		{"lease not a duration", "  - name: c\n    algorithm: concurrency\n    limit: 5\n    lease: 30\n", 6, []string{"lease", "has no unit"}},
		{"no limit", "  - name: c\n    algorithm: concurrency\n", 3, []string{"limit is required"}},
		{"local budget", "  - name: c\n    algorithm: concurrency\n    limit: 5\n    local_budget: {size: 1, max_age: 1s}\n", 6, []string{"local_budget is not supported by concurrency"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := parseTest(t, up+"policies:\n"+c.yaml)
			var errs Errors
			if !errors.As(err, &errs) || cfg != nil {
				t.Fatalf("got %v, %v; want errors", cfg, err)
			}
			if len(errs) != 1 {
				t.Fatalf("%d errors, want 1:\n%v", len(errs), err)
			}
			if errs[0].Line != c.line {
				t.Errorf("at line %d, want %d: %v", errs[0].Line, c.line, errs[0])
			}
			for _, w := range c.words {
				if !strings.Contains(errs[0].Error(), w) {
					t.Errorf("%q lacks %q", errs[0], w)
				}
			}
		})
	}
}

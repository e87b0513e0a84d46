package config

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestStoreSettleRetryFor: store.settle_retry_for is read (on either store), 0 (the default)
// when absent, and one outside 1s…24h is an error naming the field at its line.
func TestStoreSettleRetryFor(t *testing.T) {
	for yaml, want := range map[string]time.Duration{
		"store: {type: redis, addrs: [r:6379], settle_retry_for: 2m}\n": 2 * time.Minute,
		"store: {settle_retry_for: 1s}\n":                               time.Second,
		"store: {type: redis, addrs: [r:6379]}\n":                       0,
	} {
		cfg, err := parseTest(t, up+yaml)
		if err != nil || cfg.Store.SettleRetryFor != want {
			t.Fatalf("%s: %+v %v; want settle_retry_for %v", yaml, cfg, err, want)
		}
	}
	for _, bad := range []string{"500ms", "25h", "-1m"} {
		_, err := parseTest(t, up+"store:\n  type: redis\n  addrs: [r:6379]\n  settle_retry_for: "+bad+"\n")
		var errs Errors
		if !errors.As(err, &errs) || len(errs) != 1 || errs[0].Line != 5 || !strings.Contains(errs[0].Error(), "settle_retry_for") {
			t.Fatalf("settle_retry_for %s: %v; want one error at line 5 naming the field", bad, err)
		}
	}
}

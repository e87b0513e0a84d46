package main

import (
	"strings"
	"testing"
)

// TestSimulateChange: --change applies from its instant, to every algorithm with --compare (the
// burst to the buckets), in time order whatever the flags' order; the table says so; bad changes
// name the flag and exit 2.
func TestSimulateChange(t *testing.T) {
	// 10/s against 5 a second: fixed-window lets 5 through in each of the first two seconds,
	// then 8 a second from the change at 2s.
	out := ok(t, "", "simulate", "--algorithm", "fixed-window", "--limit", "5", "--period", "1s", "--traffic", "10/s for 4s",
		"--change", "t=2s,limit=8", "--format", "json")
	if !strings.Contains(out, `"summary":{"offered":40,"allowed":26,"refused":14,`) {
		t.Errorf("fixed-window, limit 8 from 2s:\n%.300s", out)
	}
	out = ok(t, "", "simulate", "--compare", "--limit", "5", "--period", "1s", "--burst", "5", "--traffic", "10/s for 4s",
		"--change", "t=3s,burst=10", "--change", "t=2s,limit=8")
	for _, w := range []string{"change: t=2s,limit=8\nchange: t=3s,burst=10\n", "fixed-window         40       26  65.0%"} {
		if !strings.Contains(out, w) {
			t.Errorf("the table has no %q:\n%s", w, out)
		}
	}
	for _, bad := range []struct{ flags, want string }{
		{"--change t=1s", `--change "t=1s": want t=D and limit=N or burst=N`},
		{"--change t=1s,limit=0", "--change limit=0: must be > 0"},
		{"--change t=1s,burst=999999999999999", "--change t=1s,burst=999999999999999: token-bucket: "},
		{"--change t=1s,limit=2 --instances 2 --store shared", "--change applies to one instance"},
	} {
		args := append([]string{"simulate", "--compare", "--limit", "5", "--period", "1s", "--traffic", "10/s for 2s"}, strings.Fields(bad.flags)...)
		if code, _, stderr := runCLI(t, "", args...); code != 2 || !strings.Contains(stderr, bad.want) {
			t.Errorf("%s: exit %d, %q; want 2 and %q", bad.flags, code, stderr, bad.want)
		}
	}
}

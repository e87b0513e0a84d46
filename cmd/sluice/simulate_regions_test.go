package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestSimulateRegions: --regions runs a global policy across regions with a latency to the ledger,
// a partition and a flush: the table shows the allotments following demand and ends with the
// bound, with its numbers, held; CSV and JSON give the same run; the same --draw gives the same
// output; bad flags name the flag and exit 2.
func TestSimulateRegions(t *testing.T) {
	args := []string{"simulate", "--regions", "eu,us,ap", "--algorithm", "fixed-window", "--limit", "6000", "--period", "1m",
		"--ledger-latency", "50ms-150ms", "--floor", "0.05", "--safe-share", "0.1", "--partition", "eu@1m30s-3m", "--flush-ledger", "4m",
		"--traffic", "eu: 105/s for 2m; 15/s for 3m; us: 30/s for 5m; ap: 15/s for 2m; 105/s for 3m"}
	out := ok(t, "", args...)
	for _, w := range []string{
		"global policy: fixed-window, 6000 per 1m worldwide across 3 regions (eu, us, ap)\n",
		"ledger: fair share, floor F = 300, safe share S = 600, lease 15s, hold 1m; refresh every 5s, latency to the ledger 50ms-150ms each way (drawn from 1)\n",
		"partition: eu cut off from the ledger 1m30s-3m\n",
		"flush: the ledger's state is lost at 4m\n",
		"cut safe-share", "learning",
		"≤ L + k·max(0, S − F) = 6000 + k·max(0, 600 − 300) = 6000 + k·300: held in all 5 windows\n",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("the table has no %q:\n%s", w, out)
		}
	}
	if again := ok(t, "", args...); again != out {
		t.Error("the same --draw gave another table")
	}
	var res struct {
		Timeline []struct {
			T         float64 `json:"t_ms"`
			Region    string  `json:"region"`
			Allotment int64   `json:"allotment"`
		} `json:"timeline"`
		Windows []struct {
			Admitted, Bound int64
			Held            bool
		} `json:"windows"`
		Summary struct {
			Held  bool   `json:"held"`
			Bound string `json:"bound"`
		} `json:"summary"`
	}
	if err := json.Unmarshal([]byte(ok(t, "", append(args, "--format", "json")...)), &res); err != nil {
		t.Fatal(err)
	}
	if !res.Summary.Held || len(res.Windows) != 5 || !strings.Contains(res.Summary.Bound, "held in all 5 windows") {
		t.Fatalf("JSON summary %+v, %d windows", res.Summary, len(res.Windows))
	}
	// ap's allotment follows its demand: small before the move at 2m, most of the limit after.
	var before, after int64
	for _, r := range res.Timeline {
		if r.Region == "ap" && r.T == 100_000 {
			before = r.Allotment
		}
		if r.Region == "ap" && r.T == 200_000 {
			after = r.Allotment
		}
	}
	if before > 1000 || after < 3000 {
		t.Errorf("ap's allotment %d at 1m40s, %d at 3m20s; want it to follow its demand (900 → 6300 a minute)", before, after)
	}
	csv := ok(t, "", append(args, "--format", "csv")...)
	if !strings.HasPrefix(csv, "t_ms,region,want,allotment,offered,admitted,refused,cut,safe_share,learning,floor\n0,eu,") {
		t.Errorf("CSV:\n%.300s", csv)
	}
	base := []string{"simulate", "--algorithm", "fixed-window", "--limit", "100", "--period", "1m", "--traffic", "eu: 1/s for 1m"}
	for _, bad := range []struct{ flags, want string }{
		{"--regions eu --partition eu", "--partition eu: want REGION@FROM-TO"},
		{"--regions eu --partition eu@1m-30s", "--partition eu@1m-30s: "},
		{"--regions eu --partition us@1s-2s", `--regions: partition of "us"`},
		{"--regions eu --ledger-latency fast", "--ledger-latency fast: want Go durations"},
		{"--regions eu --ledger-latency 2s", "at most a quarter of the refresh interval"},
		{"--regions eu --flush-ledger soon", "--flush-ledger soon: want a virtual time"},
		{"--regions eu --refresh 0s", "--refresh 0s: must be > 0"},
		{"--regions eu --lease 1s", "--regions: lease 1s; at least twice"},
		{"--regions eu --floor 2", "--regions: floor 2"},
		{"--regions eu --ledger-algorithm random", "ledger algorithm"},
		{"--regions eu --instances 3", "--instances does not apply with --regions"},
		{"--regions us", `--regions: the traffic names "eu"`},
		{"--partition eu@1s-2s", "--partition applies with --regions only"},
		{"--refresh 3s", "--refresh applies with --regions only"},
	} {
		args := append(append([]string{}, base...), strings.Fields(bad.flags)...)
		if code, _, stderr := runCLI(t, "", args...); code != 2 || !strings.Contains(stderr, bad.want) {
			t.Errorf("%s: exit %d, %q; want 2 and %q", bad.flags, code, stderr, bad.want)
		}
	}
	if code, _, stderr := runCLI(t, "", "simulate", "--regions", "eu", "--algorithm", "sliding-log", "--limit", "10", "--period", "1s",
		"--traffic", "eu: 1/s for 1s"); code != 2 || !strings.Contains(stderr, "sliding-log") {
		t.Errorf("sliding-log: exit %d, %q", code, stderr)
	}
}

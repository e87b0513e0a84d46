package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestSimulateEnvoys: --envoys runs Envoys on RLQS beside per-request RLS on the same traffic:
// the table shows each Envoy's assignment following its demand, the calls to the service (RLQS a
// few per report interval, RLS one per request) and ends with the bounds, with their numbers,
// held; CSV and JSON give the same run; bad flags name the flag and exit 2.
func TestSimulateEnvoys(t *testing.T) {
	args := []string{"simulate", "--envoys", "3", "--limit", "1800", "--period", "1m", "--burst", "300", "--envoy-latency", "10ms",
		"--traffic", "e1: 30/s for 2m; 5/s for 2m; e2: 10/s for 4m; e3: 5/s for 2m; 30/s for 2m"}
	out := ok(t, "", args...)
	for _, w := range []string{
		"RLQS: 3 Envoys (e1, e2, e3) on one bucket {name: api}: 1800 per 1m, burst 300, split fair by demand; reports every 5s, assignment TTL 15s, latency 10ms each way; no_assignment allow, expired no-assignment\n",
		"RLS: the same requests to sluice one by one: token-bucket 1800 per 1m, burst 300, memory store, latency 10ms each way\n",
		"900/1m ×150", "600/1m ×100", "300/1m ×50",
		"totals: offered 10800; RLQS admitted 7588 (781 without an active assignment); RLS admitted 7498\n",
		"calls to the service: RLQS 285 (146 reports, 139 responses, on 3 streams); RLS 10800 (one per request): RLQS made 2.64% of RLS's calls\n",
		"bound: RLQS admitted under assignments per 1m window ≤ L·W/P + Σ max_tokens of the buckets held or built in it = 1800 + 104…304: held in all 4 windows; RLS admitted by the store per window ≤ B + L = 300 + 1800 = 2100: held in all 4 windows\n",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("the table has no %q:\n%s", w, out)
		}
	}
	if again := ok(t, "", args...); again != out {
		t.Error("the same flags gave another table")
	}
	var res struct {
		Timeline []struct {
			T        float64 `json:"t_ms"`
			Envoy    string  `json:"envoy"`
			Assigned int64   `json:"assigned"`
		} `json:"timeline"`
		Windows []struct {
			Held bool `json:"held"`
		} `json:"windows"`
		Summary struct {
			Held      bool   `json:"held"`
			RLQSCalls int64  `json:"rlqs_calls"`
			RLSCalls  int64  `json:"rls_calls"`
			Bound     string `json:"bound"`
		} `json:"summary"`
	}
	if err := json.Unmarshal([]byte(ok(t, "", append(args, "--format", "json")...)), &res); err != nil {
		t.Fatal(err)
	}
	if !res.Summary.Held || len(res.Windows) != 4 || res.Summary.RLQSCalls != 285 || res.Summary.RLSCalls != 10800 ||
		!strings.Contains(res.Summary.Bound, "held in all 4 windows") {
		t.Fatalf("JSON summary %+v, %d windows", res.Summary, len(res.Windows))
	}
	var e3Before, e3After int64
	for _, r := range res.Timeline {
		if r.Envoy == "e3" && r.T == 60_000 {
			e3Before = r.Assigned
		}
		if r.Envoy == "e3" && r.T == 180_000 {
			e3After = r.Assigned
		}
	}
	if e3Before != 300 || e3After != 900 {
		t.Errorf("e3's assignment %d at 1m, %d at 3m; want 300 then 900 (its demand moved)", e3Before, e3After)
	}
	csv := ok(t, "", append(args, "--format", "csv")...)
	if !strings.HasPrefix(csv, "t_ms,envoy,offered,rlqs_admitted,rlqs_fallback,rls_admitted,state,assigned,max_tokens,reports,responses\n0,e1,") {
		t.Errorf("CSV:\n%.300s", csv)
	}
	kill := ok(t, "", "simulate", "--envoys", "2", "--limit", "600", "--period", "1m", "--burst", "100", "--no-assignment", "deny",
		"--expired", "deny", "--kill-at", "1m", "--restart-at", "1m30s", "--traffic", "10/s for 3m")
	for _, w := range []string{"kill: the service dies at 1m", "it restarts at 1m30s", "expired", "(+600 unasked)", "600 of them unanswered while it was down", "held in all 3 windows"} {
		if !strings.Contains(kill, w) {
			t.Errorf("the kill's table has no %q:\n%s", w, kill)
		}
	}

	base := []string{"simulate", "--limit", "100", "--period", "1m", "--traffic", "1/s for 1m"}
	for _, bad := range []struct{ flags, want string }{
		{"--envoys 0", "--envoys: 0 Envoys; 1 to 64"},
		{"--envoys e1,e1", `--envoys: Envoy "e1" is named twice`},
		{"--envoys 2 --algorithm token-bucket", "--algorithm does not apply with --envoys"},
		{"--envoys 2 --regions eu", "--regions does not apply with --envoys"},
		{"--envoys 2 --partition eu@1s-2s", "--partition does not apply with --envoys"},
		{"--envoys 2 --report-interval 0s", "--report-interval 0s: must be > 0"},
		{"--envoys 2 --report-interval soon", "--report-interval"},
		{"--envoys 2 --assignment-ttl 6s", "--assignment-ttl: assignment TTL 6s; at least twice"},
		{"--envoys 2 --envoy-latency 2s", "--envoy-latency: latency 2s"},
		{"--envoys 2 --no-assignment reuse", "--no-assignment reuse: want allow or deny"},
		{"--envoys 2 --expired later", "--expired later: want no-assignment, allow, deny or reuse"},
		{"--envoys 2 --restart-at 1m", "--restart-at: a restart without --kill-at"},
		{"--envoys 2 --kill-at 1m --restart-at 30s", "--restart-at: restart at 30s, kill at 1m"},
		{"--envoys 2 --ledger-algorithm random", "--ledger-algorithm: ledger algorithm"},
		{"--envoys 2 --burst 0", "--burst 0: must be > 0"},
		{"--envoys 2 --format xml", "--format xml"},
		{"--kill-at 1m", "--kill-at applies with --envoys only"},
		{"--report-interval 1s", "--report-interval applies with --envoys only"},
	} {
		args := append(append([]string{}, base...), strings.Fields(bad.flags)...)
		if code, _, stderr := runCLI(t, "", args...); code != 2 || !strings.Contains(stderr, bad.want) {
			t.Errorf("%s: exit %d, %q; want 2 and %q", bad.flags, code, stderr, bad.want)
		}
	}
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"simulate", "--envoys", "2", "--limit", "100", "--period", "1500ms", "--traffic", "1/s for 1m"}, "--period: period 1.5s; whole seconds"},
		{[]string{"simulate", "--envoys", "2", "--limit", "100", "--period", "1m", "--traffic", "e3: 1/s for 1m"}, `--traffic: the traffic names "e3"`},
		{[]string{"simulate", "--envoys", "2", "--limit", "100", "--period", "1m"}, "--envoys needs --traffic"},
		{[]string{"simulate", "--envoys", "2", "--period", "1m", "--traffic", "1/s for 1m"}, "--limit is required"},
	} {
		if code, _, stderr := runCLI(t, "", bad.args...); code != 2 || !strings.Contains(stderr, bad.want) {
			t.Errorf("%q: exit %d, %q; want 2 and %q", bad.args, code, stderr, bad.want)
		}
	}
}

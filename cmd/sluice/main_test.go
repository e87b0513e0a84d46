package main

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// The README's simulation command (without "go run ./cmd/sluice").
var readme = []string{"simulate", "--compare", "--traffic", "5/s for 10s; 40 in 1s; 5/s for 10s", "--limit", "5", "--period", "1s", "--burst", "40"}

var algorithms = []string{"fixed-window", "sliding-log", "sliding-window", "token-bucket", "leaky-bucket"}

// runCLI runs the command line in process and returns its exit code, stdout and stderr.
func runCLI(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(args, strings.NewReader(stdin), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// ok runs the command line and fails the test unless it succeeds silently on stderr.
func ok(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	code, stdout, stderr := runCLI(t, stdin, args...)
	if code != 0 || stderr != "" {
		t.Fatalf("sluice %q: exit code %d, stderr %q", args, code, stderr)
	}
	return stdout
}

func simulate(extra ...string) []string {
	return append([]string{"simulate", "--traffic", "5/s for 10s; 40 in 1s; 5/s for 10s", "--limit", "5", "--period", "1s"}, extra...)
}

func TestSimulateTableCompare(t *testing.T) {
	out := ok(t, "", readme...)
	for _, want := range []string{
		`(?m)^sluice simulate --compare: limit 5 per 1s, burst 40 \(token-bucket and leaky-bucket only\)$`,
		`(?m)^traffic: 5/s for 10s; 40 in 1s; 5/s for 10s \(140 requests from 0s to 20\.8s, key "k"\)$`,
		`(?m)^per 1s +fixed-window +sliding-log +sliding-window +token-bucket +leaky-bucket$`,
		`(?m)^ +t +offered +allowed +refused +allowed +refused +allowed +refused +allowed +allowed +delayed$`,
		`(?m)^ +0s +5 +5 +0 +5 +0 +5 +0 +5 +5 +0$`,
		`(?m)^ +10s +40 +5 +35 +5 +35 +4 +36 +40 +40 +39$`,
		`(?m)^ +20s +5 +5 +0 +5 +0 +4 +1 +5 +5 +5$`,
		`(?m)^algorithm +offered +allowed +% +refused +delayed +max delay$`,
		`(?m)^fixed-window +140 +105 +75\.0% +35 +0 +0s$`,
		`(?m)^sliding-log +140 +105 +75\.0% +35 +0 +0s$`,
		`(?m)^sliding-window +140 +85 +60\.7% +55 +0 +0s$`,
		`(?m)^token-bucket +140 +140 +100\.0% +0 +0 +0s$`,
		`(?m)^leaky-bucket +140 +140 +100\.0% +0 +89 +7s$`,
	} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("the table has no line matching %s:\n%s", want, out)
		}
	}
	checkTableShape(t, out, 21)
}

// checkTableShape checks that every line fits 100 columns, has no trailing space, and that
// the timeline has rows timeline rows.
func checkTableShape(t *testing.T, out string, rows int) {
	t.Helper()
	timeline := 0
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if n := utf8.RuneCountInString(line); n > 100 {
			t.Errorf("line of %d columns: %q", n, line)
		}
		if strings.TrimRight(line, " ") != line {
			t.Errorf("trailing space: %q", line)
		}
		if regexp.MustCompile(`^ *[0-9][0-9hms.]* +[0-9]`).MatchString(line) {
			timeline++
		}
	}
	if timeline != rows {
		t.Errorf("%d timeline rows, want %d:\n%s", timeline, rows, out)
	}
}

// --local-budget runs the policy exactly and on the fleet side by side; CSV and JSON give the
// fleet's rows with the instance that decided each, dealt in turn.
func TestSimulateLocalBudget(t *testing.T) {
	args := []string{"simulate", "--algorithm", "token-bucket", "--limit", "10", "--period", "1s",
		"--traffic", "6 at once; idle 500ms; 10/s for 2s", "--local-budget", "5", "--instances", "3"}
	out := ok(t, "", args...)
	for _, want := range []string{
		`(?m)^fleet: 3 instances sharing one store, requests dealt in turn; each takes budgets of 5 from the store, spent for at most 1s$`,
		`(?m)^ +t +offered +allowed +allowed +refused$`,
		`(?m)^exact +26 +26 +100\.0% +0 `,
		`(?m)^3 × budget 5 +26 +24 +92\.3% +2 `,
		`(?m)^allowed per instance: 1: 9 2: 9 3: 6$`,
		`(?m)^bound with budgets: over any interval T, at most 10 \+ 10 per 1s × T, as exact, plus up to .* = 10 more$`,
	} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("the table has no line matching %s:\n%s", want, out)
		}
	}
	recs, err := csv.NewReader(strings.NewReader(ok(t, "", append(args, "--format", "csv")...))).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(recs[0], ","); got != "t_ms,key,cost,allowed,remaining,retry_after_ms,delay_ms,instance" {
		t.Fatalf("CSV header %s", got)
	}
	allowed := 0
	for i, r := range recs[1:] {
		if want := strconv.Itoa(i%3 + 1); r[7] != want {
			t.Errorf("row %d decided by instance %s; want %s (in turn)", i+1, r[7], want)
		}
		if r[3] == "true" {
			allowed++
		}
	}
	if len(recs) != 27 || allowed != 24 {
		t.Errorf("%d rows, %d allowed; want 26 and 24, as the table says", len(recs)-1, allowed)
	}
	var doc struct {
		Fleet struct {
			Instances   int `json:"instances"`
			LocalBudget struct {
				Size     int64   `json:"size"`
				MaxAgeMs float64 `json:"max_age_ms"`
			} `json:"local_budget"`
		} `json:"fleet"`
		Requests []struct {
			Instance int `json:"instance"`
		} `json:"requests"`
		Summary struct {
			Allowed int64 `json:"allowed"`
		} `json:"summary"`
	}
	if err := json.Unmarshal([]byte(ok(t, "", append(args, "--format", "json")...)), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Fleet.Instances != 3 || doc.Fleet.LocalBudget.Size != 5 || doc.Fleet.LocalBudget.MaxAgeMs != 1000 ||
		len(doc.Requests) != 26 || doc.Requests[4].Instance != 2 || doc.Summary.Allowed != 24 {
		t.Errorf("JSON: %+v", doc)
	}
}

func TestSimulateTableOne(t *testing.T) {
	out := ok(t, "", simulate("--algorithm", "leaky-bucket", "--burst", "40")...)
	for _, want := range []string{
		`(?m)^sluice simulate: leaky-bucket, limit 5 per 1s, burst 40$`,
		`(?m)^policy: a queue drained 5 per 1s, with room for 40 waiting$`,
		`(?m)^ +t +offered +allowed +refused +delayed +max delay$`,
		`(?m)^ +10s +40 +40 +0 +39 +6\.825s$`,
		`(?m)^ +11s +5 +5 +0 +5 +7s$`,
		`(?m)^leaky-bucket +140 +140 +100\.0% +0 +89 +7s$`,
	} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("the table has no line matching %s:\n%s", want, out)
		}
	}
	checkTableShape(t, out, 21)

	out = ok(t, "", simulate("--algorithm", "fixed-window")...)
	if !strings.Contains(out, "sluice simulate: fixed-window, limit 5 per 1s\npolicy: at most 5 in each 1s window") ||
		!regexp.MustCompile(`(?m)^ +t +offered +allowed +refused$`).MatchString(out) {
		t.Errorf("fixed-window table:\n%s", out)
	}
}

func TestSimulateTableLongTraffic(t *testing.T) {
	out := ok(t, "", "simulate", "--algorithm", "token-bucket", "--limit", "1", "--period", "1m", "--traffic", "0.5/s for 2h; 100 at once")
	if !strings.Contains(out, "per 5m") {
		t.Errorf("2h of traffic not in 5m buckets:\n%s", out)
	}
	checkTableShape(t, out, 25)
}

func TestSimulateCSV(t *testing.T) {
	out := ok(t, "", simulate("--algorithm", "fixed-window", "--format", "csv")...)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if lines[0] != "t_ms,key,cost,allowed,remaining,retry_after_ms,delay_ms" {
		t.Errorf("header %q", lines[0])
	}
	if len(lines) != 141 {
		t.Fatalf("%d lines, want a header and 140 rows", len(lines))
	}
	for i, want := range map[int]string{
		1:  "0,k,1,true,4,0,0",
		51: "10000,k,1,true,4,0,0",
		56: "10125,k,1,false,0,875,0",
		90: "10975,k,1,false,0,25,0",
		91: "11000,k,1,true,4,0,0",
	} {
		if lines[i] != want {
			t.Errorf("line %d = %q, want %q", i+1, lines[i], want)
		}
	}

	out = ok(t, "", simulate("--algorithm", "leaky-bucket", "--burst", "40", "--format", "csv")...)
	if lines := strings.Split(out, "\n"); lines[52] != "10025,k,1,true,39,0,175" {
		t.Errorf("leaky-bucket line 53 = %q", lines[52])
	}

	out = ok(t, "", append(readme, "--format", "csv")...)
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(recs[0], ","); got != "algorithm,t_ms,key,cost,allowed,remaining,retry_after_ms,delay_ms" {
		t.Errorf("--compare header %q", got)
	}
	if len(recs) != 1+5*140 {
		t.Fatalf("%d records, want 1 + 5·140", len(recs))
	}
	for i, rec := range recs[1:] {
		if want := algorithms[i/140]; rec[0] != want {
			t.Fatalf("record %d: algorithm %q, want %q", i+1, rec[0], want)
		}
	}
}

type jsonRun struct {
	Algorithm string           `json:"algorithm"`
	Policy    map[string]any   `json:"policy"`
	Requests  []map[string]any `json:"requests"`
	Summary   map[string]any   `json:"summary"`
}

var (
	requestKeys = []string{"allowed", "cost", "delay_ms", "key", "remaining", "retry_after_ms", "t_ms"}
	summaryKeys = []string{"allowed", "allowed_cost", "delayed", "max_delay_ms", "never", "offered", "offered_cost", "refused", "total_delay_ms"}
)

func checkJSONRun(t *testing.T, r jsonRun, alg string, burst float64, summary map[string]any) {
	t.Helper()
	want := map[string]any{"algorithm": alg, "limit": 5.0, "period_ms": 1000.0, "burst": burst}
	if !equalJSON(r.Policy, want) {
		t.Errorf("%s: policy %v, want %v", alg, r.Policy, want)
	}
	if len(r.Requests) != 140 {
		t.Fatalf("%s: %d requests, want 140", alg, len(r.Requests))
	}
	for i, rq := range r.Requests {
		if keys := sortedKeys(rq); !slices.Equal(keys, requestKeys) {
			t.Fatalf("%s: request %d has keys %v, want %v", alg, i, keys, requestKeys)
		}
		if _, isBool := rq["allowed"].(bool); !isBool {
			t.Fatalf("%s: request %d: allowed is %T", alg, i, rq["allowed"])
		}
		for _, k := range []string{"t_ms", "cost", "remaining", "retry_after_ms", "delay_ms"} {
			if _, isNumber := rq[k].(float64); !isNumber {
				t.Fatalf("%s: request %d: %s is %T, want a number", alg, i, k, rq[k])
			}
		}
	}
	if keys := sortedKeys(r.Summary); !slices.Equal(keys, summaryKeys) {
		t.Errorf("%s: summary keys %v, want %v", alg, keys, summaryKeys)
	}
	for k, v := range summary {
		if r.Summary[k] != v {
			t.Errorf("%s: summary %s = %v, want %v", alg, k, r.Summary[k], v)
		}
	}
}

func TestSimulateJSON(t *testing.T) {
	out := ok(t, "", simulate("--algorithm", "leaky-bucket", "--burst", "40", "--format", "json")...)
	var one jsonRun
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&one); err != nil {
		t.Fatalf("%v in\n%s", err, out)
	}
	checkJSONRun(t, one, "leaky-bucket", 40, map[string]any{"offered": 140.0, "allowed": 140.0, "refused": 0.0,
		"delayed": 89.0, "never": 0.0, "max_delay_ms": 7000.0, "total_delay_ms": 486500.0})
	if got := one.Requests[51]; got["t_ms"] != 10025.0 || got["delay_ms"] != 175.0 || got["allowed"] != true {
		t.Errorf("request 51 = %v", got)
	}

	out = ok(t, "", append(readme, "--format", "json")...)
	var cmp struct{ Runs []jsonRun }
	if err := json.Unmarshal([]byte(out), &cmp); err != nil {
		t.Fatalf("%v in\n%s", err, out)
	}
	if len(cmp.Runs) != 5 {
		t.Fatalf("%d runs, want 5", len(cmp.Runs))
	}
	allowed := []float64{105, 105, 85, 140, 140}
	for i, r := range cmp.Runs {
		burst := 0.0
		if i >= 3 {
			burst = 40
		}
		if r.Algorithm != algorithms[i] {
			t.Errorf("run %d: algorithm %q, want %q", i, r.Algorithm, algorithms[i])
		}
		checkJSONRun(t, r, algorithms[i], burst, map[string]any{"offered": 140.0, "allowed": allowed[i], "refused": 140 - allowed[i]})
	}
}

func TestSimulateTrace(t *testing.T) {
	trace := "t_ms,key,cost\n0,alice,1\n0,alice,1\n0,bob,1\n0.5,alice,3\n1000,alice,1\n"
	args := []string{"simulate", "--algorithm", "fixed-window", "--limit", "2", "--period", "1s", "--format", "csv"}
	want := "t_ms,key,cost,allowed,remaining,retry_after_ms,delay_ms\n" +
		"0,alice,1,true,1,0,0\n0,alice,1,true,0,0,0\n0,bob,1,true,1,0,0\n0.5,alice,3,false,0,-1,0\n1000,alice,1,true,1,0,0\n"
	if out := ok(t, trace, append(args, "--trace", "-")...); out != want {
		t.Errorf("--trace - (stdin):\n%s\nwant\n%s", out, want)
	}
	file := filepath.Join(t.TempDir(), "trace.csv")
	if err := os.WriteFile(file, []byte(trace), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := ok(t, "", append(args, "--trace", file)...); out != want {
		t.Errorf("--trace FILE:\n%s\nwant\n%s", out, want)
	}
	args[len(args)-1] = "table"
	out := ok(t, "", append(args, "--trace", file)...)
	for _, w := range []string{"traffic: trace " + file + " (5 requests from 0s to 1s, 2 keys, total cost 7)", "never fit"} {
		if !strings.Contains(out, w) {
			t.Errorf("table has no %q:\n%s", w, out)
		}
	}
}

func TestVersion(t *testing.T) {
	out := ok(t, "", "version")
	if !regexp.MustCompile(`^sluice \S+( \(commit \S+(, \S+)?\))?\n$`).MatchString(out) {
		t.Errorf("version printed %q", out)
	}
	defer func(v string) { version = v }(version)
	version = "v1.2.3"
	if out := ok(t, "", "version"); out != "sluice v1.2.3\n" {
		t.Errorf("version printed %q, want %q", out, "sluice v1.2.3\n")
	}
}

func TestHelp(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{nil, []string{"simulate", "version"}},
		{[]string{"--help"}, []string{"simulate", "version"}},
		{[]string{"help", "simulate"}, []string{"R/s for D"}},
		{[]string{"simulate", "--help"}, []string{"R/s for D", "N in D", "N at once", "idle D", "--limit", "--period", "--burst",
			"retry_after_ms", "max_delay_ms", `{"runs":[`}},
		{[]string{"simulate", "-h"}, []string{"--traffic"}},
		{[]string{"demo", "--help"}, []string{"sluice serve", "25 requests at once", "429", "Retry-After", "held", "--proxy", "--admin"}},
		{[]string{"ratelimit", "--help"}, []string{"/bin/ratelimit", "GRPC_HOST:GRPC_PORT", "/healthcheck", "exits with code 2", "docs/envoy.md"}},
	} {
		out := ok(t, "", tc.args...)
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("sluice %q: no %q in\n%s", tc.args, w, out)
			}
		}
	}
}

func TestBadInput(t *testing.T) {
	pol := []string{"--limit", "5", "--period", "1s"}
	traffic := []string{"--traffic", "5/s for 2s"}
	sim := func(args ...string) []string { return append([]string{"simulate"}, args...) }
	cat := func(parts ...[]string) []string { return slices.Concat(parts...) }
	for _, tc := range []struct {
		name  string
		args  []string
		stdin string
		want  []string
	}{
		{"limit 0", sim(cat(traffic, []string{"--algorithm", "fixed-window", "--limit", "0", "--period", "1s"})...), "", []string{"--limit 0: must be > 0"}},
		{"limit over 2^53", sim(cat(traffic, []string{"--algorithm", "fixed-window", "--limit", "9007199254740993", "--period", "1s"})...), "", []string{"--limit 9007199254740993: must be ≤ 2^53"}},
		{"limit not a number", sim(cat(traffic, []string{"--algorithm", "fixed-window", "--limit", "abc", "--period", "1s"})...), "", []string{`invalid argument "abc" for "--limit"`, "whole number"}},
		{"limit missing", sim(cat(traffic, []string{"--algorithm", "fixed-window", "--period", "1s"})...), "", []string{"--limit is required"}},
		{"period under 1ms", sim(cat(traffic, []string{"--algorithm", "fixed-window", "--limit", "5", "--period", "500us"})...), "", []string{"--period 500us: must be ≥ 1ms"}},
		{"period not whole µs", sim(cat(traffic, []string{"--algorithm", "fixed-window", "--limit", "5", "--period", "1000001ns"})...), "", []string{"--period 1000001ns", "microseconds"}},
		{"period not a duration", sim(cat(traffic, []string{"--algorithm", "fixed-window", "--limit", "5", "--period", "5"})...), "", []string{`invalid argument "5" for "--period"`, "duration"}},
		{"period missing", sim(cat(traffic, []string{"--algorithm", "fixed-window", "--limit", "5"})...), "", []string{"--period is required"}},
		{"burst -1", sim(cat(traffic, pol, []string{"--algorithm", "token-bucket", "--burst", "-1"})...), "", []string{"--burst -1: must be ≥ 0"}},
		{"burst on a window", sim(cat(traffic, pol, []string{"--burst", "5", "--algorithm", "fixed-window"})...), "", []string{"--burst 5: fixed-window takes no burst"}},
		{"burst too long to drain", sim(cat(traffic, []string{"--algorithm", "token-bucket", "--limit", "1", "--period", "1000h", "--burst", "9007199254740992"})...), "", []string{"invalid policy", "token-bucket", "burst"}},
		{"burst too long to drain, compare", sim(cat(traffic, []string{"--compare", "--limit", "1", "--period", "1000h", "--burst", "9007199254740992"})...), "", []string{"invalid policy", "token-bucket", "burst"}},
		{"algorithm bogus", sim(cat(traffic, pol, []string{"--algorithm", "bogus"})...), "", []string{"--algorithm bogus: unknown algorithm", "token-bucket"}},
		{"algorithm missing", sim(cat(traffic, pol)...), "", []string{"--algorithm is required", "--compare"}},
		{"algorithm and compare", sim(cat(traffic, pol, []string{"--algorithm", "token-bucket", "--compare"})...), "", []string{"--algorithm token-bucket and --compare exclude each other"}},
		{"instances without a budget", sim(cat(traffic, pol, []string{"--algorithm", "token-bucket", "--instances", "3"})...), "", []string{"--instances needs --local-budget"}},
		{"budget and compare", sim(cat(traffic, pol, []string{"--compare", "--local-budget", "2"})...), "", []string{"--local-budget and --compare exclude each other"}},
		{"budget over the limit", sim(cat(traffic, pol, []string{"--algorithm", "fixed-window", "--local-budget", "6"})...), "", []string{"--local-budget 6: must be ≤ the policy's capacity 5"}},
		{"budget 0", sim(cat(traffic, pol, []string{"--algorithm", "fixed-window", "--local-budget", "0"})...), "", []string{"--local-budget 0: must be > 0"}},
		{"budget on a sliding log", sim(cat(traffic, pol, []string{"--algorithm", "sliding-log", "--local-budget", "2"})...), "", []string{"--local-budget: local_budget is not supported by sliding-log"}},
		{"instances 0", sim(cat(traffic, pol, []string{"--algorithm", "token-bucket", "--local-budget", "2", "--instances", "0"})...), "", []string{"--instances 0: must be from 1 to 64"}},
		{"budget max age", sim(cat(traffic, pol, []string{"--algorithm", "token-bucket", "--local-budget", "2", "--budget-max-age", "0s"})...), "", []string{"--budget-max-age 0s: must be ≥ 1ms"}},
		{"bad traffic", sim(cat(pol, []string{"--algorithm", "token-bucket", "--traffic", "5/s for 10s; 40 in"})...), "", []string{`traffic segment 2 "40 in": want "R/s for D", "N in D", "N at once" or "idle D"`}},
		{"bad traffic duration", sim(cat(pol, []string{"--algorithm", "token-bucket", "--traffic", "5/s for 10x"})...), "", []string{`traffic segment 1`, `"10x" is not a Go duration`}},
		{"traffic of no requests", sim(cat(pol, []string{"--algorithm", "token-bucket", "--traffic", "idle 5s"})...), "", []string{`--traffic "idle 5s" makes no requests`}},
		{"bad trace line", sim(cat(pol, []string{"--algorithm", "token-bucket", "--trace", "-"})...), "t_ms\n1\n1.2345\n", []string{`trace line 3: t_ms "1.2345" has more than 3 decimals`}},
		{"bad trace header", sim(cat(pol, []string{"--algorithm", "token-bucket", "--trace", "-"})...), "time,key\n1,a\n", []string{`trace line 1: unknown column "time"`}},
		{"trace of no requests", sim(cat(pol, []string{"--algorithm", "token-bucket", "--trace", "-"})...), "t_ms\n", []string{"the trace has no requests"}},
		{"trace file missing", sim(cat(pol, []string{"--algorithm", "token-bucket", "--trace", "/nonexistent/trace.csv"})...), "", []string{"--trace: open /nonexistent/trace.csv: no such file or directory"}},
		{"traffic and trace", sim(cat(pol, traffic, []string{"--algorithm", "token-bucket", "--trace", "-"})...), "t_ms\n0\n", []string{"--traffic, --trace and --workload exclude each other"}},
		{"neither traffic nor trace", sim(cat(pol, []string{"--algorithm", "token-bucket"})...), "", []string{"want --traffic PATTERN, --trace FILE or --workload NAME"}},
		{"unknown flag", sim(cat(pol, traffic, []string{"--algorithm", "token-bucket", "--bogus"})...), "", []string{"unknown flag: --bogus", "sluice simulate --help"}},
		{"bad format", sim(cat(pol, traffic, []string{"--algorithm", "token-bucket", "--format", "xml"})...), "", []string{"--format xml: want table, csv or json"}},
		{"unquoted pattern", sim(cat(pol, []string{"--algorithm", "token-bucket", "--traffic", "5/s", "for", "10s"})...), "", []string{`simulate takes no arguments, got "for"`, "quote"}},
		{"unknown command", []string{"simulat"}, "", []string{`unknown command "simulat": did you mean "simulate"?`}},
		{"unknown command, no suggestion", []string{"frobnicate"}, "", []string{`unknown command "frobnicate": want one of check, clients, completion, demo, ratelimit, serve, simulate, version`}},
		{"unknown root flag", []string{"--bogus"}, "", []string{"unknown flag: --bogus"}},
		{"version with an argument", []string{"version", "x"}, "", []string{`version takes no arguments, got "x"`}},
		{"demo proxy not a URL", []string{"demo", "--proxy", "127.0.0.1:8080"}, "", []string{`--proxy "127.0.0.1:8080": want an http or https URL`}},
		{"demo admin not http", []string{"demo", "--admin", "ftp://127.0.0.1:9090"}, "", []string{`--admin "ftp://127.0.0.1:9090": want an http or https URL`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, tc.stdin, tc.args...)
			if code != 2 {
				t.Errorf("exit code %d, want 2", code)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
			if !strings.HasPrefix(stderr, "sluice: ") || !strings.HasSuffix(stderr, "\n") || strings.Count(stderr, "\n") != 1 {
				t.Errorf("stderr %q, want one line starting \"sluice: \"", stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr %q does not contain %q", stderr, w)
				}
			}
		})
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestOutputFailure(t *testing.T) {
	for _, format := range []string{"table", "csv", "json"} {
		var stderr bytes.Buffer
		code := run(append(readme, "--format", format), nil, failingWriter{}, &stderr)
		if code != 1 || stderr.String() != "sluice: disk full\n" {
			t.Errorf("--format %s to a failing writer: exit code %d, stderr %q; want 1, \"sluice: disk full\"", format, code, stderr.String())
		}
	}
}

// TestBinary builds sluice and runs it as a real process: exit codes and streams as a shell sees them.
func TestBinary(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "sluice")
	build := exec.Command(goTool, "build", "-ldflags", "-X main.version=v0.0.0-test", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	exe := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if ee, isExit := err.(*exec.ExitError); isExit {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, stdout.String(), stderr.String()
	}

	code, stdout, stderr := exe(readme...)
	if code != 0 || stderr != "" || !regexp.MustCompile(`(?m)^leaky-bucket +140 +140 +100\.0% +0 +89 +7s$`).MatchString(stdout) {
		t.Errorf("README command: exit code %d, stderr %q, stdout\n%s", code, stderr, stdout)
	}
	if _, want, _ := runCLI(t, "", readme...); stdout != want {
		t.Errorf("the binary's table differs from run's:\n%s\nwant\n%s", stdout, want)
	}

	code, stdout, stderr = exe("simulate", "--limit", "0")
	if code != 2 || stdout != "" || stderr != "sluice: --limit 0: must be > 0\n" {
		t.Errorf("bad flag: exit code %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	code, stdout, stderr = exe("simulate", "--bogus")
	if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "unknown flag: --bogus") {
		t.Errorf("unknown flag: exit code %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	// The commit and its date follow when go build stamped them (in a git clone).
	if code, stdout, _ = exe("version"); code != 0 || !strings.HasPrefix(stdout, "sluice v0.0.0-test") {
		t.Errorf("version: exit code %d, stdout %q", code, stdout)
	}
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func equalJSON(a, b map[string]any) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

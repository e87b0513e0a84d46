package main

import (
	"strings"
	"testing"
)

// TestSimulateActual: a trace's actual column settles each approved request on the virtual
// clock; CSV gives actual and balance per request, --compare per algorithm, and the table the
// estimated and real totals.
func TestSimulateActual(t *testing.T) {
	trace := "t_ms,key,cost,actual\n0,a,1000,250\n100,a,1000,4000\n200,a,1000,\n300,a,1000,9000\n400,a,1000,0\n"
	out := ok(t, trace, "simulate", "--algorithm", "fixed-window", "--limit", "10000", "--period", "1s", "--format", "csv", "--trace", "-")
	want := "t_ms,key,cost,allowed,remaining,retry_after_ms,delay_ms,actual,balance\n" +
		"0,a,1000,true,9000,0,0,250,9750\n" +
		"100,a,1000,true,8750,0,0,4000,5750\n" +
		"200,a,1000,true,4750,0,0,,\n" +
		"300,a,1000,true,3750,0,0,9000,0\n" +
		"400,a,1000,false,0,600,0,0,0\n"
	if out != want {
		t.Errorf("csv:\n%s\nwant\n%s", out, want)
	}
	out = ok(t, trace, "simulate", "--compare", "--limit", "10000", "--period", "1s", "--format", "csv", "--trace", "-")
	if !strings.Contains(out, "token-bucket,100,a,1000,true,9000,0,0,4000,6000\n") || !strings.HasPrefix(out, "algorithm,t_ms,key,cost,allowed,remaining,retry_after_ms,delay_ms,actual,balance\n") {
		t.Errorf("--compare csv:\n%s", out)
	}
	out = ok(t, trace, "simulate", "--compare", "--limit", "10000", "--period", "1s", "--trace", "-")
	for _, w := range []string{"settled  estimated  actual", "fixed-window          5        4  80.0%        1        0         0s        3       3000   13250"} {
		if !strings.Contains(out, w) {
			t.Errorf("table has no %q:\n%s", w, out)
		}
	}
	out = ok(t, trace, "simulate", "--algorithm", "token-bucket", "--limit", "10000", "--period", "1s", "--format", "json", "--trace", "-")
	if !strings.Contains(out, `"actual":4000,"balance":6000`) || !strings.Contains(out, `"settled":3,"settled_cost":3000,"actual_cost":13250`) {
		t.Errorf("json:\n%s", out)
	}
	if code, _, stderr := runCLI(t, "t_ms,actual\n0,-5\n", "simulate", "--algorithm", "fixed-window", "--limit", "1", "--period", "1s", "--trace", "-"); code != 2 || !strings.Contains(stderr, `actual "-5"`) {
		t.Errorf("a bad actual: exit %d, %q", code, stderr)
	}
}

// TestSimulateStreams: a trace's duration_ms column holds each approved request's estimate until
// its response ends, and settles it then (the figures of sim's TestStreamsSettleAtTheirEnd).
func TestSimulateStreams(t *testing.T) {
	trace := "t_ms,key,cost,actual,duration_ms\n0,team,4000,14000,5000\n1000,team,4000,1000,19000\n6000,team,4000,4000,3000\n12000,team,4000,4000,0\n20000,team,10000,,\n"
	out := ok(t, trace, "simulate", "--algorithm", "token-bucket", "--limit", "10000", "--period", "10s", "--format", "csv", "--trace", "-")
	want := "t_ms,key,cost,allowed,remaining,retry_after_ms,delay_ms,actual,balance,end_ms,in_flight,reserved,wait_ms\n" +
		"0,team,4000,true,6000,0,0,14000,0,5000,1,4000,3001\n" +
		"1000,team,4000,true,3000,0,0,1000,8000,20000,2,8000,0\n" +
		"6000,team,4000,false,0,6000,0,4000,0,6000,1,4000,0\n" +
		"12000,team,4000,true,0,0,0,4000,0,12000,1,4000,1\n" +
		"20000,team,10000,false,8000,2000,0,,,20000,0,0,0\n"
	if out != want {
		t.Errorf("csv:\n%s\nwant\n%s", out, want)
	}
	out = ok(t, trace, "simulate", "--algorithm", "token-bucket", "--limit", "10000", "--period", "10s", "--format", "json", "--trace", "-")
	for _, w := range []string{`"actual":14000,"balance":0,"end_ms":5000,"in_flight":1,"reserved":4000,"wait_ms":3001}`,
		`"settled":3,"settled_cost":12000,"actual_cost":19000},"streams":{"max_in_flight":2,"max_reserved":8000,"waits":2,"max_wait_ms":3001}}`} {
		if !strings.Contains(out, w) {
			t.Errorf("json has no %s:\n%s", w, out)
		}
	}
	if code, _, stderr := runCLI(t, "t_ms,duration_ms\n0,-5\n", "simulate", "--algorithm", "fixed-window", "--limit", "1", "--period", "1s", "--trace", "-"); code != 2 || !strings.Contains(stderr, `trace line 2: duration_ms "-5"`) {
		t.Errorf("a bad duration: exit %d, %q", code, stderr)
	}
}

// TestSimulateWorkload: --workload llm-team runs the built-in LLM workload under its own policy,
// 100,000 tokens a minute. By hand, for the fixed window: the 31 requests at 2m (a chat request
// and the agent's 30 streams, 4,500 each) open a new window, so 22 fit (99,000) and the other 9
// are refused until it ends, 60 s; the long document at 3m30s is allowed (24,000) and settled at
// its end, 4m10s, at 120,000: 96,000 more in the window of 4m, which refuses every request after
// it until 5m (a wait of 50 s).
func TestSimulateWorkload(t *testing.T) {
	out := ok(t, "", "simulate", "--algorithm", "fixed-window", "--workload", "llm-team", "--format", "csv")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 132 || lines[0] != "t_ms,key,cost,allowed,remaining,retry_after_ms,delay_ms,actual,balance,end_ms,in_flight,reserved,wait_ms" {
		t.Fatalf("%d lines, header %q", len(lines), lines[0])
	}
	allowed, refused := 0, 0
	for _, l := range lines[1:] {
		switch {
		case strings.HasPrefix(l, "120000,team,4500,true,"):
			allowed++
		case strings.HasPrefix(l, "120000,team,4500,false,1000,60000,0,"):
			refused++
		case strings.HasPrefix(l, "210000,team,24000,"):
			if !strings.HasPrefix(l, "210000,team,24000,true,") || !strings.HasSuffix(l, ",120000,0,250000,5,42000,50000") {
				t.Errorf("the document: %s", l)
			}
		}
	}
	if allowed != 22 || refused != 9 {
		t.Errorf("at 2m: %d allowed, %d refused; want 22 and 9", allowed, refused)
	}
	for _, l := range lines[len(lines)-16:] { // 252 s to 297 s, every 3 s
		if !strings.Contains(l, ",team,4500,false,0,") {
			t.Errorf("after the document: %s", l)
		}
	}
	out = ok(t, "", "simulate", "--compare", "--workload", "llm-team")
	for _, w := range []string{"sluice simulate --compare: limit 100000 per 1m", "traffic: workload llm-team: a team's key",
		"max in flight  max reserved  waits", "fixed-window        131      103  78.6%       28"} {
		if !strings.Contains(out, w) {
			t.Errorf("table has no %q:\n%s", w, out)
		}
	}
	out = ok(t, "", "simulate", "--algorithm", "sliding-log", "--workload", "llm-team", "--limit", "200000", "--format", "json")
	if !strings.Contains(out, `"policy":{"algorithm":"sliding-log","limit":200000,"period_ms":60000,`) || !strings.Contains(out, `},"streams":{"max_in_flight":`) {
		t.Errorf("json with --limit: %.300s", out)
	}
	for _, c := range [][]string{
		{"--workload", "nope", "--algorithm", "fixed-window"},
		{"--workload", "llm-team", "--traffic", "1 at once", "--algorithm", "fixed-window"},
	} {
		code, _, stderr := runCLI(t, "", append([]string{"simulate"}, c...)...)
		if code != 2 || !strings.Contains(stderr, "--workload") {
			t.Errorf("%v: exit %d, %q", c, code, stderr)
		}
	}
}

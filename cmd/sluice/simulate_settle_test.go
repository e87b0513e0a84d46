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

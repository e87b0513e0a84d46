package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestScriptTables prints scripts/bench-rlqs.sh's tables from a kept run (testdata/run: a short
// run's RLQS_OUT, FROM=, measuring nothing) and checks every target's row and the ratios are
// there, so that the script's Python keeps reading what the load generators write.
func TestScriptTables(t *testing.T) {
	from, err := filepath.Abs("testdata/run")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", filepath.Join("..", "..", "scripts", "bench-rlqs.sh"))
	cmd.Env = append(os.Environ(), "FROM="+from)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("FROM=%s bash scripts/bench-rlqs.sh: %v\n%s", from, err, out)
	}
	text := string(out)
	for _, want := range []string{
		"| target | rounds | decisions/s | admitted/s |",
		"| sluice, RLQS, Redis, the same rate as sluice's RLS |",
		"| sluice, RLQS, Redis, as fast as the Envoys go |",
		"| sluice, RLS, Redis |",
		"| envoyproxy/ratelimit, RLS, Redis |",
		"| sluice, RLQS, memory store, the same rate as sluice's RLS |",
		"| sluice, RLS, memory store |",
		"| ratio |",
		"| sluice, RLQS, Redis, the same rate as sluice's RLS / sluice, RLS, Redis |",
		"load average before",
		// The kept RLS round's figures, worked out: 36,411 decisions of which 10,000 admitted in
		// 2 s, 27.7 µs of server CPU a decision, so 101.0 µs an admitted request; 10 users at 500 a
		// second refuse 1 − 5,000/18,206 of them.
		"| sluice, RLS, Redis | 1 | 18206 | 5000 | 72.5 % (limit: 72.5 %) | 27.7 µs | 101.0 µs | 3.6 µs |",
		// The RLQS rounds' seconds: the most admitted in one, beside the limit.
		"The most admitted in a second of an RLQS round's measured window: sluice, RLQS, Redis, the same rate as sluice's RLS: 4993 (1.00× the limit",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the tables have no %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "Warning") {
		t.Errorf("the kept run warns:\n%s", text)
	}
}

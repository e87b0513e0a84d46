package config

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestPerformanceDocTables prints the tables of scripts/bench.sh, scripts/bench-gateway.sh and
// scripts/bench-rls.sh from saved runs (FROM=, measuring nothing: benchmark lines written for the
// test, a gateway run's whole output, and a rate limit service run's RLS_OUT) and checks that docs/performance.md has them in the same form, so that the doc's
// tables can be pasted from the scripts and neither drifts from the other: every header line as
// printed, every row's first cell (its label), and in the goals tables every row's goal.
func TestPerformanceDocTables(t *testing.T) {
	doc, err := os.ReadFile("../docs/performance.md")
	if err != nil {
		t.Fatal(err)
	}
	fixtures, err := filepath.Abs("testdata/bench")
	if err != nil {
		t.Fatal(err)
	}
	docHeaders, docRows := markdownTables(string(doc))
	for _, run := range []struct{ script, from string }{
		{"bench.sh", fixtures},
		{"bench-gateway.sh", filepath.Join(fixtures, "gateway-run.txt")},
		{"bench-rls.sh", filepath.Join(fixtures, "rls")},
		{"bench-rlqs.sh", filepath.Join(filepath.Dir(fixtures), "..", "..", "bench", "rlqsload", "testdata", "run")},
	} {
		cmd := exec.Command("bash", filepath.Join("..", "scripts", run.script))
		cmd.Env = append(os.Environ(), "FROM="+run.from)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("FROM=%s bash scripts/%s: %v\n%s", run.from, run.script, err, out)
		}
		headers, rows := markdownTables(string(out))
		if len(headers) < 2 {
			t.Fatalf("scripts/%s printed %d tables, want its table and the goals at least:\n%s", run.script, len(headers), out)
		}
		for h := range headers {
			if !docHeaders[h] {
				t.Errorf("scripts/%s prints the table header\n%s\nwhich docs/performance.md does not have", run.script, h)
			}
		}
		for _, r := range rows {
			want, ok := docRows[r.cells[0]]
			if !ok {
				t.Errorf("scripts/%s prints the row %q (in the table %s); docs/performance.md has no row of that label", run.script, r.cells[0], r.header)
				continue
			}
			if r.header == goalsHeader && (len(want.cells) < 3 || want.cells[2] != r.cells[2]) {
				t.Errorf("scripts/%s prints the goal %q for %q; docs/performance.md has %q", run.script, r.cells[2], r.cells[0], want.cells)
			}
		}
	}
}

// goalsHeader is the header of the scripts' goals tables.
const goalsHeader = "| ratio | value | goal | met |"

type tableRow struct {
	header string   // the header line of the row's table
	cells  []string // the row's cells, trimmed
}

// markdownTables returns the header lines of the Markdown tables in text (the line above each
// delimiter row), with a count of rounds ("median of 10 rounds") made N so that a run of any
// length compares, and their rows, by first cell.
func markdownTables(text string) (headers map[string]bool, rows map[string]tableRow) {
	rounds := regexp.MustCompile(`median of \d+ rounds`)
	headers, rows = map[string]bool{}, map[string]tableRow{}
	lines := strings.Split(text, "\n")
	header := ""
	for i, line := range lines {
		switch {
		case !strings.HasPrefix(line, "|"):
			header = ""
		case strings.HasPrefix(line, "|---"):
			if i > 0 {
				header = rounds.ReplaceAllString(lines[i-1], "median of N rounds")
				headers[header] = true
			}
		case header != "":
			cells := strings.Split(strings.Trim(line, "|"), "|")
			for j := range cells {
				cells[j] = strings.TrimSpace(cells[j])
			}
			rows[cells[0]] = tableRow{header, cells}
		}
	}
	return headers, rows
}

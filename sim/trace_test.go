package sim

import (
	"io"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

func TestParseTrace(t *testing.T) {
	for _, tc := range []struct {
		name, trace string
		want        []Request
	}{
		{"t_ms only", "t_ms\n0\n1.5\n1.5\n2.001\n",
			[]Request{{0, "k", 1}, {1500, "k", 1}, {1500, "k", 1}, {2001, "k", 1}}},
		{"columns in any order, empty values default", "cost,t_ms,key\n2,0.001,alice\n,3,\n0,3.25,bob\n",
			[]Request{{1, "alice", 2}, {3000, "k", 1}, {3250, "bob", 0}}},
		{"blank lines, comments, CRLF, BOM, spaces, upper case", "\ufeffT_MS , Key\r\n\r\n# a comment\r\n 10 , a \r\n\r\n   \r\n20,b\r\n",
			[]Request{{10000, "a", 1}, {20000, "b", 1}}},
		{"zeros beyond 3 decimals", "t_ms\n1.2000\n", []Request{{1200, "k", 1}}},
		{"quoted key", "t_ms,key\n0,\"a,b\"\"c\"\n", []Request{{0, `a,b"c`, 1}}},
		{"no final newline", "t_ms,cost\n5,3", []Request{{5000, "k", 3}}},
		{"header only", "t_ms,key,cost\n", nil},
		{"large time", "t_ms\n9007199254740.992\n", []Request{{MaxTimeMicros, "k", 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseTrace(strings.NewReader(tc.trace))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestParseTraceErrors(t *testing.T) {
	for _, tc := range []struct {
		trace string
		want  string
	}{
		{"", "trace is empty: want a CSV header line such as t_ms,key,cost"},
		{"\n\n", "trace is empty"},
		{"t_ms,speed\n0,1\n", `trace line 1: unknown column "speed"`},
		{"0,k,1\n", `trace line 1: unknown column "0"`},
		{"# c\nkey,cost\n", "trace line 2: the header has no t_ms column"},
		{"t_ms,key,t_ms\n", `trace line 1: column "t_ms" appears twice`},
		{"t_ms\n0\n\n1.2345\n", `trace line 4: t_ms "1.2345" has more than 3 decimals`},
		{"t_ms\n-1\n", `trace line 2: t_ms "-1" is not a non-negative decimal number`},
		{"t_ms\n1e3\n", `trace line 2: t_ms "1e3" is not a non-negative decimal number`},
		{"t_ms\n9007199254740.993\n", `trace line 2: t_ms "9007199254740.993" is too large`},
		{"t_ms,key\n,alice\n", "trace line 2: t_ms is empty"},
		{"t_ms\n5\n7\n3\n", "trace line 4: t_ms 3 is before the previous line's 7 (lines must be in time order)"},
		{"t_ms,key\n1\n", "trace line 2: 1 fields, want 2 like the header (t_ms,key)"},
		{"t_ms,key\n1,a,b\n", "trace line 2: 3 fields, want 2"},
		{"t_ms,cost\n1,-2\n", `trace line 2: cost "-2" is not a whole number ≥ 0`},
		{"t_ms,cost\n1,1.5\n", `trace line 2: cost "1.5" is not a whole number ≥ 0`},
		{"t_ms,key\n1,a\n2,\"open\n3,b\n", "trace line 3: extraneous or missing \" in quoted-field (in the record that runs on to line 4)"},
		{"t_ms,key\n1,a\"b\n", "trace line 2: bare \" in non-quoted-field"},
	} {
		_, err := ParseTrace(strings.NewReader(tc.trace))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseTrace(%q) error = %v, want it to contain %q", tc.trace, err, tc.want)
		}
	}
}

func TestParseTraceBounds(t *testing.T) {
	trace := "t_ms\n1\n2\n3\n"
	if _, err := parseTrace(strings.NewReader(trace), 3, 1<<10); err != nil {
		t.Errorf("3 requests, bound 3: %v", err)
	}
	_, err := parseTrace(strings.NewReader(trace+"4\n"), 3, 1<<10)
	if want := "trace line 5: more than 3 requests"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("4 requests, bound 3: error %v, want %q", err, want)
	}
	if _, err := parseTrace(strings.NewReader(trace), 10, int64(len(trace))); err != nil {
		t.Errorf("a trace of exactly the byte bound: %v", err)
	}
	_, err = parseTrace(strings.NewReader(trace+"4\n"), 10, int64(len(trace)))
	if err == nil || !strings.Contains(err.Error(), "trace is too large") {
		t.Errorf("a trace over the byte bound: error %v, want one saying it is too large", err)
	}
	// An endless trace ends at the bound, not when memory does.
	_, err = parseTrace(io.MultiReader(strings.NewReader("t_ms,key\n0,"), endless{}), 10, 1<<20)
	if err == nil || !strings.Contains(err.Error(), "trace is too large") {
		t.Errorf("an endless line: error %v, want one saying it is too large", err)
	}
}

type endless struct{}

func (endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}

func TestParseTraceInternsKeys(t *testing.T) {
	reqs, err := ParseTrace(strings.NewReader("t_ms,key\n0,alice\n1,alice\n"))
	if err != nil {
		t.Fatal(err)
	}
	if a, b := reqs[0].Key, reqs[1].Key; a != "alice" || unsafe.StringData(a) != unsafe.StringData(b) {
		t.Fatalf("keys %q and %q are not one string", a, b)
	}
}

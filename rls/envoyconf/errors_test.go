package envoyconf

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/config"
)

// parseErr parses src as f.yaml and checks its errors, as wantErrors does.
func parseErr(t *testing.T, src string, want ...string) {
	t.Helper()
	c, err := Parse([]byte(src), "f.yaml")
	if c != nil {
		t.Errorf("a Config with the errors")
	}
	wantErrors(t, err, want...)
}

// Every invalid case names the file, the line and column, and the field; what the reference
// refuses is refused here, each for its reason.
func TestErrors(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		want      []string
	}{
		{"empty file", "", []string{"f.yaml:1:1: domain is required"}},
		{"not a mapping", "- a\n", []string{"f.yaml:1:1: the file must be a mapping (field: value), not a list"}},
		{"empty domain", "domain: \"\"\n", []string{"f.yaml:1:9: domain must not be empty"}},
		{"null domain", "domain: ~\ndescriptors: []\n", []string{"f.yaml:1:1: domain is required"}},
		{"domain a list", "domain: [a]\n", []string{`f.yaml:1:9: domain must be a string, not a list`}},
		{"domain fractional", "domain: 1.5\n", []string{`f.yaml:1:9: domain 1.5 is a floating-point number`}},
		{"descriptors a mapping", "domain: d\ndescriptors: {key: k}\n", []string{"f.yaml:2:14: descriptors must be a list, not a mapping"}},
		{"null descriptor", "domain: d\ndescriptors:\n  -\n", []string{"f.yaml:3:4: descriptors[0] is empty; it must be a mapping"}},
		{"key a mapping", "domain: d\ndescriptors:\n  - key: {name: x}\n", []string{"f.yaml:3:10: descriptors[0]: key must be a string, not a mapping"}},
		{"value fractional", "domain: d\ndescriptors:\n  - key: k\n    value: 2.5\n", []string{`f.yaml:4:12: descriptors[0] "k": value 2.5 is a floating-point number`}},
		{"value above 2^63", "domain: d\ndescriptors:\n  - key: k\n    value: 18446744073709551615\n", []string{`f.yaml:4:12: descriptors[0] "k": value 18446744073709551615 is out of range`}},
		{"rate_limit a string", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: fast\n", []string{`f.yaml:4:17: descriptors[0] "k": rate_limit must be a mapping (field: value), not "fast"`}},
		{"empty rate_limit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {}\n", []string{`f.yaml:4:17: descriptors[0] "k": rate_limit.unit is required`}},
		{"negative requests", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n", []string{`f.yaml:4:51: descriptors[0] "k": rate_limit.requests_per_unit -1 must be an integer from 0 to 4294967295`}},
		{"requests above uint32", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 4294967296}\n", []string{`rate_limit.requests_per_unit 4294967296 must be an integer from 0 to 4294967295`}},
		{"requests quoted", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: \"5\"}\n", []string{`rate_limit.requests_per_unit "5" must be an integer from 0 to 4294967295`}},
		{"requests fractional", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5.0}\n", []string{`rate_limit.requests_per_unit 5.0 is a floating-point number`}},
		{"requests in e notation", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1e3}\n", []string{`rate_limit.requests_per_unit 1e3 is a floating-point number`}},
		{"unit a number", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: 60, requests_per_unit: 1}\n", []string{`f.yaml:4:24: descriptors[0] "k": rate_limit.unit "60" is not a unit: want one of second, minute, hour, day, week, month or year`}},
		{"unit unknown", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: unknown, requests_per_unit: 1}\n", []string{`rate_limit.unit "unknown" is not a unit`}},
		{"unlimited not a bool", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: 1}\n", []string{`f.yaml:4:29: descriptors[0] "k": rate_limit.unlimited 1 must be true or false`}},
		{"shadow_mode quoted", "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: \"true\"\n", []string{`f.yaml:4:18: descriptors[0] "k": shadow_mode "true" must be true or false`}},
		{"replaces a mapping", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: {name: x}}\n", []string{`rate_limit.replaces must be a list, not a mapping`}},
		{"replaces of strings", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [x]}\n", []string{`f.yaml:4:65: descriptors[0] "k": rate_limit.replaces[0] must be a mapping (field: value), not "x"`}},
		{"replaces unknown field", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      replaces:\n        - nam: x\n", []string{`f.yaml:7:11: descriptors[0] "k": unknown field "nam"; did you mean "name"?`, `f.yaml:7:11: descriptors[0] "k": rate_limit.replaces[0].name is empty`}},
		{"share without wildcard", "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n", []string{`f.yaml:5:22: descriptors[0] "k=v": share_threshold can only be used with a wildcard value (containing '*'), and "k_v" has none`}},
		{"metadata a list", "domain: d\ndescriptors:\n  - key: k\n    metadata: [a]\n", []string{`f.yaml:4:15: descriptors[0] "k": metadata must be a mapping, not a list`}},
		{"unknown top field", "domain: d\ndescriptor: []\n", []string{`f.yaml:2:1: unknown field "descriptor"; did you mean "descriptors"?`}},
		{"unknown field far from any", "domain: d\nfoo: 1\n", []string{`f.yaml:2:1: unknown field "foo" (known in the top level: domain, descriptors)`}},
		{"non-string key", "domain: d\ndescriptors:\n  - key: k\n    yes: 1\n", []string{`f.yaml:4:5: descriptors[0]: key yes is not a field name (keys must be strings)`}},
		{"misplaced field's bad value", "domain: d\ndescriptors:\n  - key: k\n    unit: 1.5\n", []string{`f.yaml:4:11: descriptors[0] "k": unit 1.5 is a floating-point number`}},
		{"misplaced list of scalars", "domain: d\nname: [a]\n", []string{`f.yaml:2:8: name[0] must be a mapping, not "a"`}},
		{"misplaced mapping unknown field", "domain: d\nkey: {bogus: 1}\n", []string{`f.yaml:2:7: key: unknown field "bogus"`}},
		{"bad merge", "domain: d\n<<: 5\n", []string{"f.yaml:2:5: << merges a mapping or a list of mappings, not 5"}},
		{"tab", "domain: d\ndescriptors:\n\t- key: k\n", []string{"f.yaml:3: YAML: found character that cannot start any token"}},
		{"bad tag", "domain: !!int abc\n", []string{`f.yaml:1:9: domain "abc" is not a !!int`}},
	} {
		t.Run(tc.name, func(t *testing.T) { parseErr(t, tc.src, tc.want...) })
	}
}

// Several problems in one file are all reported, sorted by line, each naming its field.
func TestErrorsAllReported(t *testing.T) {
	src := `domain: d
descriptors:
  - key: a
    rate_limit:
      unit: fortnight
      requests_per_unit: -3
  - value: v
  - key: b
    ratelimit: {}
    descriptors:
      - key: c
        rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: ""}]}
      - key: c
  - key: a
`
	parseErr(t, src,
		`f.yaml:5:13: descriptors[0] "a": rate_limit.unit "fortnight" is not a unit`,
		`f.yaml:6:26: descriptors[0] "a": rate_limit.requests_per_unit -3 must be an integer`,
		`f.yaml:7:5: descriptors[1]: key is required`,
		`f.yaml:9:5: descriptors[2] "b": unknown field "ratelimit"; did you mean "rate_limit"?`,
		`f.yaml:12:69: descriptors[2] "b" > descriptors[0] "c": rate_limit.replaces[0].name is empty`,
		`f.yaml:13:9: descriptors[2] "b" > descriptors[1] "c": descriptor "c" is already defined at this level (line 11): duplicate descriptor composite key "d.b.c"`,
		`f.yaml:14:5: descriptors[3] "a": descriptor "a" is already defined at this level (line 3): duplicate descriptor composite key "d.a"`,
	)
	// Across files, in the order given; a file that cannot be read is one of them.
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")
	os.WriteFile(a, []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: eon}\n"), 0o644)
	os.WriteFile(b, []byte("domain: d\n"), 0o644)
	_, err := Load(a, filepath.Join(dir, "missing.yaml"), b, dir)
	es := wantErrors(t, err,
		`a.yaml:4:24: descriptors[0] "k": rate_limit.unit "eon" is not a unit`,
		`missing.yaml: cannot read the configuration: no such file or directory`,
		dir+`: cannot read the configuration: not a regular file`,
	)
	if !errors.Is(es[1], os.ErrNotExist) {
		t.Error("a missing file's error is not fs.ErrNotExist")
	}
	// Once a is fixed, b's domain is a's too.
	os.WriteFile(a, []byte("domain: d\n"), 0o644)
	_, err = Load(a, b)
	wantErrors(t, err, "b.yaml:1:9: domain \"d\" is also the domain of "+a+" (line 1): each domain is defined in one file")
}

// A file the reference accepts loads, with a warning for each thing it ignores: fields at a
// level that does not read them, a field set twice (the last value is used, as there),
// documents after the first.
func TestWarnings(t *testing.T) {
	c, err := Parse([]byte(`domain: d
unit: second
descriptors:
  - key: k
    requests_per_unit: 5
    rate_limit:
      unit: minute
      unit: hour
      requests_per_unit: 2
      metadata: {anything: [1.5]}
      shadow_mode: true
---
domain: other
`), "w.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m := want(t, c, "d", kv("k", "v"), 2, Hour, "d/k")
	if m.ShadowMode {
		t.Error("shadow_mode inside rate_limit took effect; the reference ignores it there")
	}
	none(t, c, "other", kv("k", "v"))
	w := c.Warnings()
	got := w.Error()
	for _, s := range []string{
		"w.yaml:2:1: unit has no meaning in the top level; it is ignored",
		`w.yaml:5:5: descriptors[0] "k": requests_per_unit has no meaning in a descriptor; it is ignored`,
		`w.yaml:8:7: descriptors[0] "k": unit is set twice (first at line 7); the last value is used`,
		`w.yaml:10:7: descriptors[0] "k": metadata has no meaning in rate_limit; it is ignored`,
		`w.yaml:11:7: descriptors[0] "k": shadow_mode has no meaning in rate_limit; it is ignored`,
		"w.yaml:12:1: only the file's first YAML document is read",
	} {
		if !strings.Contains(got, s) {
			t.Errorf("warnings lack %q:\n%s", s, got)
		}
	}
	if len(w) != 6 {
		t.Errorf("%d warnings:\n%s", len(w), got)
	}
	// Merged configurations keep their warnings.
	merged, err := Merge(c)
	if err != nil || len(merged.Warnings()) != 6 {
		t.Errorf("Merge: %v, %d warnings", err, len(merged.Warnings()))
	}
}

// Scalars mean what they mean to the reference's YAML 1.1 reader: yes/no/on/off are booleans,
// 0x and 0o and 1_000 are integers, leading-zero octal too; strings are kept as written.
func TestYAML11Scalars(t *testing.T) {
	c, err := Parse([]byte(`domain: d
descriptors:
  - key: a
    shadow_mode: yes
    rate_limit: {unit: second, requests_per_unit: 1_000}
  - key: b
    shadow_mode: off
    rate_limit: {unit: second, requests_per_unit: 0x10}
  - key: c
    shadow_mode: Y
    rate_limit: {unit: second, requests_per_unit: 010}
  - key: 0x1F
    value: yes
    rate_limit: {unit: second, requests_per_unit: 0o17}
  - key: date
    value: 2001-12-14
    rate_limit: {unit: second, requests_per_unit: !!int "3"}
  - key: bin
    value: !!binary aGk=
    rate_limit: {unlimited: on, unit: fortnight}
  - &base
    key: e
    rate_limit: {unit: second, requests_per_unit: 4}
  - <<: *base
    key: f
    shadow_mode: true
`), "s.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		entries []Entry
		rpu     uint32
		rule    string
		shadow  bool
	}{
		{kv("a", "x"), 1000, "d/a", true},
		{kv("b", "x"), 16, "d/b", false},
		{kv("c", "x"), 8, "d/c", true},
		{kv("0x1F", "yes"), 15, "d/0x1F=yes", false},
		{kv("date", "2001-12-14"), 3, "d/date=2001-12-14", false},
		{kv("e", "x"), 4, "d/e", false},
		{kv("f", "x"), 4, "d/f", true},
	} {
		m := want(t, c, "d", tc.entries, tc.rpu, Second, tc.rule)
		if m.ShadowMode != tc.shadow {
			t.Errorf("%v: ShadowMode %v", tc.entries, m.ShadowMode)
		}
	}
	// unlimited: on, and a unit that is not one, which the reference ignores when unlimited.
	if m, ok := c.Match("d", kv("bin", "hi"), nil); !ok || !m.Unlimited {
		t.Errorf("bin=hi: %+v", m)
	}
}

// rate_limit: (null) is no limit, as the reference decodes it; requests_per_unit left out is 0,
// which the reference applies as "every request is over the limit".
func TestNullsAndZero(t *testing.T) {
	c, err := Parse([]byte(`domain: d
descriptors:
  - key: free
    rate_limit:
  - key: zero
    rate_limit: {unit: minute}
  - key: nameless
    rate_limit:
      unit: second
      requests_per_unit: 1
      replaces: [{name: other}]
`), "n.yaml")
	if err != nil {
		t.Fatal(err)
	}
	none(t, c, "d", kv("free", "x"))
	m := want(t, c, "d", kv("zero", "x"), 0, Minute, "d/zero")
	if err := m.Policy.Validate(); !errors.Is(err, sluice.ErrInvalidPolicy) {
		t.Errorf("requests_per_unit 0: Policy.Validate() = %v", err)
	}
	// A limit without a name may replace others (the reference checks only that the names
	// differ and are not empty).
	m = want(t, c, "d", kv("nameless", "x"), 1, Second, "d/nameless")
	if len(m.Replaces) != 1 || m.Replaces[0] != "other" {
		t.Errorf("replaces %v", m.Replaces)
	}
}

// Nothing panics on hostile documents: aliases expanding without bound, deep nesting.
func TestHostileDocuments(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n  - key: k\n    metadata:\n      x0: &a0 [{name: x}]\n")
	for i := 1; i <= 30; i++ {
		b.WriteString("      x" + strconv.Itoa(i) + ": &a" + strconv.Itoa(i) + " [*a" + strconv.Itoa(i-1) + ", *a" + strconv.Itoa(i-1) + "]\n")
	}
	_, err := Parse([]byte(b.String()), "bomb.yaml")
	var es config.Errors
	if !errors.As(err, &es) || len(es) != 1 || !strings.Contains(err.Error(), "bomb.yaml:5:17: the document is too large or expands too many aliases") {
		t.Errorf("alias bomb: %v", err)
	}
	if _, err := Parse([]byte(indentNested(maxDepth)), "deep.yaml"); err != nil {
		t.Errorf("%d levels: %v", maxDepth, err)
	}
	_, err = Parse([]byte(indentNested(3000)), "deep.yaml")
	es = wantErrors(t, err, "deep.yaml:2:"+strconv.Itoa(1+len("descriptors: ")+maxDepth*len("[{key: k, descriptors: "))+": ... > ")
	if !strings.HasSuffix(err.Error(), `descriptors[0] "k": descriptors are nested more than 64 levels deep`) || len(es[0].Path) > 200 {
		t.Errorf("deep: %v", err)
	}
}

// indentNested is a document with n nested levels of descriptors, in flow style.
func indentNested(n int) string {
	return "domain: d\ndescriptors: " + strings.Repeat("[{key: k, descriptors: ", n) + "[]" + strings.Repeat("}]", n) + "\n"
}

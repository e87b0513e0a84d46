package config

import (
	"fmt"
	"github.com/sluicehq/sluice/internal/suggest"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// This file walks a YAML node tree by hand rather than decoding into structs: that way every
// value keeps its line and column for the errors, unknown and repeated fields are caught in every
// mapping, and a problem is recorded and the walk goes on, so that one run reports them all.

// parser walks one document and collects its problems.
type parser struct {
	file   string                      // the name errors carry
	dir    string                      // relative file names are resolved against it
	getenv func(string) (string, bool) // os.LookupEnv, or a test's environment
	errs   Errors                      // every problem found so far, in the order found
	visits int                         // nodes visited; bounded by maxVisits
	over   bool                        // visits went past maxVisits: stop walking and reporting

	identityBad bool // an identity item names no source: do not also report clients that no source matches
}

// maxVisits bounds the work of one file. Aliases let a small file name a node many times (a list
// of aliases to a list of aliases ...); a real configuration visits a few thousand nodes.
const maxVisits = 1 << 20

// maxFileSize bounds the files a configuration names (keys, certificates); maxConfigSize the
// configuration file itself (10,000 clients in it take about 1.3 MiB).
const (
	maxFileSize   = 1 << 20
	maxConfigSize = 16 << 20
)

// errorf records a problem at n (nil: unknown position) under path.
func (p *parser) errorf(n *yaml.Node, path string, cause error, format string, args ...any) {
	if p.over {
		return
	}
	e := &Error{File: p.file, Path: path, Msg: fmt.Sprintf(format, args...), Err: cause}
	if n != nil {
		e.Line, e.Column = n.Line, n.Column
	}
	p.errs = append(p.errs, e)
}

// deref follows aliases and counts the visit. It returns nil for a missing or null value, and
// after the work bound is passed.
func (p *parser) deref(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode; i++ {
		if i == 1000 { // the parser refuses cycles; this only bounds a pathological chain
			return nil
		}
		n = n.Alias
	}
	if n == nil || p.over {
		return nil
	}
	if p.visits++; p.visits > maxVisits {
		p.errorf(n, "", nil, "the document is too large or expands too many aliases (over %d nodes)", maxVisits)
		p.over = true
		return nil
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return nil
	}
	return n
}

// describe names what n is, for "must be X, not Y" errors.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return literal(n)
	}
	return "empty"
}

// literal is a scalar as the file spells it: strings quoted, numbers and booleans bare.
func literal(n *yaml.Node) string {
	v := n.Value
	if len(v) > 80 {
		v = v[:77] + "..."
	}
	switch n.ShortTag() {
	case "!!int", "!!float", "!!bool":
		return v
	}
	return strconv.Quote(v)
}

// what prefixes a message with the field's name, if there is one.
func what(field, msg string) string {
	if field == "" {
		return msg
	}
	return field + " " + msg
}

// mapping is one YAML mapping's fields, merges (<<) applied.
type mapping struct {
	node   *yaml.Node            // the mapping (or the null or missing value's parent), for "is required" errors
	keys   []*yaml.Node          // the key nodes in file order, merged ones after, for the unknown-field check
	values map[string]*yaml.Node // field -> value (nil for null)
}

// mapping returns n's fields; an empty mapping located at at if n is nil (absent or null); nil,
// after recording the problem, if n is not a mapping.
func (p *parser) mapping(n, at *yaml.Node, path, field string) *mapping {
	m := &mapping{node: at, values: map[string]*yaml.Node{}}
	if n == nil {
		return m
	}
	if n.Kind != yaml.MappingNode {
		p.errorf(n, path, nil, "%s", what(field, "must be a mapping (key: value), not "+describe(n)))
		return nil
	}
	m.node = n
	defined := map[string]*yaml.Node{}
	var merges []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := p.deref(n.Content[i])
		if k == nil {
			p.errorf(n.Content[i], path, nil, "%s", what(field, "has an empty key"))
			continue
		}
		if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			merges = append(merges, n.Content[i+1])
			continue
		}
		if k.Kind != yaml.ScalarNode {
			p.errorf(k, path, nil, "%s", what(field, "has a key that is "+describe(k)+"; keys are field names"))
			continue
		}
		if prev, ok := defined[k.Value]; ok {
			p.errorf(k, path, nil, "%s is set twice (first at line %d)", k.Value, prev.Line)
			continue
		}
		defined[k.Value] = k
		m.keys = append(m.keys, k)
		m.values[k.Value] = n.Content[i+1]
	}
	for _, mn := range merges {
		p.merge(m, mn, path, field, 0)
	}
	return m
}

// merge adds the fields of a YAML merge (<<: *anchor, or a list of them) that m does not set.
func (p *parser) merge(m *mapping, n *yaml.Node, path, field string, depth int) {
	n = p.deref(n)
	switch {
	case n == nil:
	case n.Kind == yaml.SequenceNode && depth == 0:
		for _, item := range n.Content {
			p.merge(m, item, path, field, depth+1)
		}
	case n.Kind == yaml.MappingNode:
		sub := p.mapping(n, n, path, field)
		if sub == nil {
			return
		}
		for _, k := range sub.keys {
			if _, ok := m.values[k.Value]; !ok {
				m.keys = append(m.keys, k)
				m.values[k.Value] = sub.values[k.Value]
			}
		}
	default:
		p.errorf(n, path, nil, "%s", what(field, "<< merges a mapping or a list of mappings, not "+describe(n)))
	}
}

// get returns the value of field, nil if it is absent or null.
func (p *parser) get(m *mapping, field string) *yaml.Node {
	if m == nil {
		return nil
	}
	return p.deref(m.values[field])
}

// has reports whether field is present (even if null).
func (m *mapping) has(field string) bool {
	if m == nil {
		return false
	}
	_, ok := m.values[field]
	return ok
}

// checkKnown records every field of m not in fields, suggesting the nearest known one.
func (p *parser) checkKnown(m *mapping, path string, fields ...string) {
	if m == nil {
		return
	}
	for _, k := range m.keys {
		if slices.Contains(fields, k.Value) {
			continue
		}
		if near := suggest.Field(k.Value, fields); near != "" {
			p.errorf(k, path, nil, "unknown field %q; did you mean %q?", k.Value, near)
		} else {
			p.errorf(k, path, nil, "unknown field %q (known: %s)", k.Value, strings.Join(fields, ", "))
		}
	}
}

// The scalar readers below take a non-nil value node (from get), record a problem and return
// ok false if it is not of their type.

// str reads a string. Numbers and booleans are taken as written (a JWT subject 12345 is the
// string "12345"), as yaml.v3 does when decoding into a string.
func (p *parser) str(n *yaml.Node, path, field string) (string, bool) {
	if n.Kind != yaml.ScalarNode {
		p.errorf(n, path, nil, "%s", what(field, "must be a string, not "+describe(n)))
		return "", false
	}
	return n.Value, true
}

// secretStr reads a string without ever echoing it.
func (p *parser) secretStr(n *yaml.Node, path, field string) (string, bool) {
	if n.Kind != yaml.ScalarNode {
		p.errorf(n, path, nil, "%s must be a string", field)
		return "", false
	}
	return n.Value, true
}

func (p *parser) int(n *yaml.Node, path, field string) (int64, bool) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
		p.errorf(n, path, nil, "%s", what(field, describe(n)+" must be an integer"))
		return 0, false
	}
	var v int64
	if err := n.Decode(&v); err != nil {
		p.errorf(n, path, nil, "%s", what(field, n.Value+" is out of range"))
		return 0, false
	}
	return v, true
}

func (p *parser) bool(n *yaml.Node, path, field string) (bool, bool) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" {
		p.errorf(n, path, nil, "%s", what(field, describe(n)+" must be true or false"))
		return false, false
	}
	var v bool
	if err := n.Decode(&v); err != nil {
		p.errorf(n, path, nil, "%s", what(field, describe(n)+" must be true or false"))
		return false, false
	}
	return v, true
}

func (p *parser) float(n *yaml.Node, path, field string) (float64, bool) {
	if t := n.ShortTag(); n.Kind != yaml.ScalarNode || (t != "!!float" && t != "!!int") {
		p.errorf(n, path, nil, "%s", what(field, describe(n)+" must be a number"))
		return 0, false
	}
	var v float64
	if err := n.Decode(&v); err != nil {
		p.errorf(n, path, nil, "%s", what(field, describe(n)+" must be a number"))
		return 0, false
	}
	return v, true
}

// duration reads a Go duration ("50ms", "1m", "1h30m"); 0 may be written bare.
func (p *parser) duration(n *yaml.Node, path, field string) (time.Duration, bool) {
	if n.Kind != yaml.ScalarNode {
		p.errorf(n, path, nil, "%s", what(field, "must be a duration (e.g. 1s, 1m, 1h30m), not "+describe(n)))
		return 0, false
	}
	d, err := time.ParseDuration(n.Value)
	if err != nil {
		switch _, e := strconv.ParseFloat(n.Value, 64); {
		case e == nil:
			p.errorf(n, path, nil, "%s", what(field, describe(n)+" has no unit (e.g. "+n.Value+"s; units: ms, s, m, h)"))
		case strings.HasSuffix(n.Value, "d"):
			p.errorf(n, path, nil, "%s", what(field, describe(n)+" is not a duration: there is no unit d (write 24h for a day)"))
		default:
			p.errorf(n, path, nil, "%s", what(field, describe(n)+" is not a duration (e.g. 1s, 1m, 1h30m)"))
		}
		return 0, false
	}
	return d, true
}

// durationIn reads m's duration field, if set, into dst: from min to max, else an error that says
// why (what the field is).
func (p *parser) durationIn(m *mapping, path, field string, min, max time.Duration, why string, dst *time.Duration) {
	if n := p.get(m, field); n != nil {
		if d, ok := p.duration(n, path, field); ok {
			if d < min || d > max {
				p.errorf(n, path, nil, "%s %v must be from %v to %v: %s", field, d, min, max, why)
			} else {
				*dst = d
			}
		}
	}
}

// seq reads a list; a single scalar is not a list.
func (p *parser) seq(n *yaml.Node, path, field string) ([]*yaml.Node, bool) {
	if n.Kind != yaml.SequenceNode {
		p.errorf(n, path, nil, "%s", what(field, "must be a list, not "+describe(n)))
		return nil, false
	}
	return n.Content, true
}

// ref is a name that refers to another part of the file (a policy), with where it was written.
type ref struct {
	name string
	node *yaml.Node
}

// names reads a name or a list of names ("standard", [per-second, per-day]).
func (p *parser) names(n *yaml.Node, path, field string) []ref {
	if n.Kind == yaml.ScalarNode {
		return []ref{{n.Value, n}}
	}
	if n.Kind != yaml.SequenceNode {
		p.errorf(n, path, nil, "%s", what(field, "must be a name or a list of names, not "+describe(n)))
		return nil
	}
	if len(n.Content) == 0 {
		p.errorf(n, path, nil, "%s", what(field, "is an empty list; name at least one, or leave it out"))
		return nil
	}
	var out []ref
	for i, item := range n.Content {
		item = p.deref(item)
		if item == nil {
			p.errorf(n.Content[i], path, nil, "%s[%d] is empty", field, i)
			continue
		}
		if item.Kind != yaml.ScalarNode {
			p.errorf(item, path, nil, "%s[%d] must be a name, not %s", field, i, describe(item))
			continue
		}
		out = append(out, ref{item.Value, item})
	}
	return out
}

// path resolves a file name relative to the configuration's directory.
func (p *parser) path(name string) string {
	if name == "" || p.dir == "" || filepath.IsAbs(name) {
		return name
	}
	return filepath.Join(p.dir, name)
}

// readFile reads a regular file of at most maxFileSize bytes (readFileMax: of at most most bytes).
// Its error says what to fix and does not repeat the name (the message quotes it already).
func readFile(name string) ([]byte, error) { return readFileMax(name, maxFileSize) }

func readFileMax(name string, most int64) ([]byte, error) {
	st, err := os.Stat(name)
	if err != nil {
		return nil, unwrapPath(err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file")
	}
	if st.Size() > most {
		return nil, fmt.Errorf("larger than %d bytes", most)
	}
	f, err := os.Open(name)
	if err != nil {
		return nil, unwrapPath(err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, most+1))
	if err != nil {
		return nil, unwrapPath(err)
	}
	if int64(len(b)) > most {
		return nil, fmt.Errorf("larger than %d bytes", most)
	}
	return b, nil
}

// unwrapPath drops an *fs.PathError's operation and name, keeping "no such file or directory".
func unwrapPath(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}

// syntaxLine matches the position yaml.v3 puts in its syntax errors.
var syntaxLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// syntaxError turns a yaml.v3 error into an Error with the line, finding the line itself for the
// errors yaml.v3 gives none (bad UTF-8, control characters, unknown anchors).
func syntaxError(file string, data []byte, err error) *Error {
	msg := err.Error()
	e := &Error{File: file, Msg: "YAML: " + strings.TrimPrefix(msg, "yaml: "), Err: err}
	if m := syntaxLine.FindStringSubmatch(msg); m != nil {
		e.Line, _ = strconv.Atoi(m[1])
		e.Msg = "YAML: " + m[2]
		lines := strings.Split(string(data), "\n")
		switch {
		case e.Line <= len(lines) && strings.Contains(lines[e.Line-1][:len(lines[e.Line-1])-len(strings.TrimLeft(lines[e.Line-1], " \t"))], "\t"):
			e.Msg += " (a tab indents this line; YAML indents with spaces only)"
		case strings.Contains(m[2], "did not find expected key"):
			e.Msg += " (in the mapping that starts here: check the indentation of its lines)"
		}
		return e
	}
	switch {
	case strings.Contains(msg, "UTF-8"):
		for i := 0; i < len(data); {
			r, size := utf8.DecodeRune(data[i:])
			if r == utf8.RuneError && size <= 1 {
				e.Line = 1 + strings.Count(string(data[:i]), "\n")
				break
			}
			i += size
		}
	case strings.Contains(msg, "control characters"):
		for i, r := range string(data) {
			if r < 0x20 && r != '\t' && r != '\n' && r != '\r' || r == 0x7f {
				e.Line = 1 + strings.Count(string(data[:i]), "\n")
				break
			}
		}
	case strings.Contains(msg, "unknown anchor"):
		if _, rest, ok := strings.Cut(msg, "anchor '"); ok {
			name, _, _ := strings.Cut(rest, "'")
			if i := strings.Index(string(data), "*"+name); i >= 0 {
				e.Line = 1 + strings.Count(string(data[:i]), "\n")
			}
		}
	}
	return e
}

package envoyconf

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"errors"
	"fmt"
	"github.com/sluicehq/sluice/internal/suggest"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/config"
)

// This file walks a YAML node tree by hand, as package config does, so that every problem has
// its line and column and one run reports them all. What it accepts and refuses is the reference
// service's: that service checks every mapping's keys against one list of field names, whatever
// the level (so a field written at the wrong level is accepted there and does nothing), refuses
// lists of anything but mappings, and floating-point numbers (1.5, 1e3, .inf) anywhere outside
// metadata; then it decodes the document into its structures (so a value of the wrong type is
// refused), then checks domains, keys, units and replaces. A field it ignores is read here with
// a warning.

// peerFields is every field name the reference service accepts, at any level.
var peerFields = []string{
	"domain", "key", "value", "descriptors", "rate_limit", "unit", "requests_per_unit", "unlimited",
	"shadow_mode", "quota_mode", "name", "replaces", "detailed_metric", "value_to_metric",
	"share_threshold", "metadata",
}

// The fields each level reads. algorithm and burst are sluice's own (beside rate_limit).
var (
	topFields        = []string{"domain", "descriptors"}
	descriptorFields = []string{"key", "value", "rate_limit", "descriptors", "shadow_mode", "quota_mode",
		"detailed_metric", "value_to_metric", "share_threshold", "metadata", "algorithm", "burst"}
	rateLimitFields = []string{"requests_per_unit", "unit", "unlimited", "name", "replaces"}
	replacesFields  = []string{"name"}
	extensionFields = []string{"algorithm", "burst"}
)

// maxVisits bounds the work of one file: aliases let a small file name a node many times. A
// real configuration of ten thousand descriptors visits about two hundred thousand nodes.
const maxVisits = 1 << 21

// maxDepth bounds the nesting of descriptors (a request descriptor has as many entries as its
// rule has levels; real ones have a few). Each level's names repeat its parents', so a file
// nested without bound would cost the square of its size.
const maxDepth = 64

// maxErrors bounds the problems reported for one file, as package config does.
const maxErrors = 100

// parser walks one file and collects its problems.
type parser struct {
	file   string
	errs   config.Errors
	warns  config.Errors
	visits int
	over   bool // visits went past maxVisits: stop walking and reporting
}

func (p *parser) errorf(n *yaml.Node, path, format string, args ...any) {
	if p.over {
		return
	}
	p.errs = append(p.errs, p.at(n, path, fmt.Sprintf(format, args...), nil))
}

func (p *parser) errorCause(n *yaml.Node, path string, cause error, msg string) {
	if p.over {
		return
	}
	p.errs = append(p.errs, p.at(n, path, msg, cause))
}

func (p *parser) warnf(n *yaml.Node, path, format string, args ...any) {
	if p.over {
		return
	}
	p.warns = append(p.warns, p.at(n, path, fmt.Sprintf(format, args...), nil))
}

func (p *parser) at(n *yaml.Node, path, msg string, cause error) *config.Error {
	e := &config.Error{File: p.file, Path: path, Msg: msg, Err: cause}
	if n != nil {
		e.Line, e.Column = n.Line, n.Column
	}
	return e
}

// deref follows aliases and counts the visit. It returns nil for a missing or null value, and
// after the work bound is passed.
func (p *parser) deref(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode; i++ {
		if i == 1000 {
			return nil
		}
		n = n.Alias
	}
	if n == nil || p.over {
		return nil
	}
	if p.visits++; p.visits > maxVisits {
		p.errorf(n, "", "the document is too large or expands too many aliases (over %d nodes)", maxVisits)
		p.over = true
		return nil
	}
	if n.Kind == yaml.ScalarNode {
		if s, ok := resolve(n); ok && s.kind == kNull {
			return nil
		}
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

// literal is a scalar as the file spells it, quoted unless it is a number or a boolean, and cut
// at 80 bytes.
func literal(n *yaml.Node) string {
	v := n.Value
	if len(v) > 80 {
		v = v[:77] + "..."
	}
	if s, ok := resolve(n); ok && s.kind != kString && s.kind != kNull {
		return v
	}
	return strconv.Quote(v)
}

// quote quotes a configured string for a message, cut at 80 bytes.
func quote(s string) string {
	if len(s) > 80 {
		s = s[:77] + "..."
	}
	return strconv.Quote(s)
}

// mapping is one YAML mapping's fields as the reference reads them: merges (<<) applied where
// they are written, and a field written twice taking its last value.
type mapping struct {
	node   *yaml.Node
	keys   []*yaml.Node          // one key node per field, in the order first written
	values map[string]*yaml.Node // field -> value (nil for null)
}

// mapping returns n's fields, or nil after recording the problem if n is not a mapping; what
// names n in that message.
func (p *parser) mapping(n *yaml.Node, path, what string) *mapping {
	m := &mapping{node: n, values: map[string]*yaml.Node{}}
	if n.Kind != yaml.MappingNode {
		p.errorf(n, path, "%s must be a mapping (field: value), not %s", what, describe(n))
		return nil
	}
	p.fill(m, n, path, 0)
	return m
}

// fill adds n's fields to m in document order, later ones replacing earlier ones, as the
// reference's YAML library decodes a mapping.
func (p *parser) fill(m *mapping, n *yaml.Node, path string, depth int) {
	where := map[string]*yaml.Node{} // this mapping's own keys, for the "set twice" warning
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := p.deref(n.Content[i])
		if k == nil {
			if !p.over {
				p.errorf(n.Content[i], path, "a key is empty (null): keys are field names")
			}
			continue
		}
		if k.Kind != yaml.ScalarNode {
			p.errorf(k, path, "a key is %s: keys are field names", describe(k))
			continue
		}
		if k.ShortTag() == "!!merge" && k.Style&yaml.TaggedStyle == 0 {
			p.merge(m, n.Content[i+1], path, depth)
			continue
		}
		if s, ok := resolve(k); !ok || s.kind != kString {
			p.errorf(k, path, "key %s is not a field name (keys must be strings)", literal(k))
			continue
		}
		if prev, ok := where[k.Value]; ok {
			p.warnf(k, path, "%s is set twice (first at line %d); the last value is used", k.Value, prev.Line)
		}
		where[k.Value] = k
		if _, ok := m.values[k.Value]; !ok {
			m.keys = append(m.keys, k)
		}
		m.values[k.Value] = n.Content[i+1]
	}
}

// merge applies a merge (<<: *anchor, or a list of them, the first one winning).
func (p *parser) merge(m *mapping, n *yaml.Node, path string, depth int) {
	at := n
	n = p.deref(n)
	switch {
	case n == nil:
		if !p.over {
			p.errorf(at, path, "<< merges a mapping or a list of mappings, not null")
		}
	case n.Kind == yaml.MappingNode && depth < 100:
		p.fill(m, n, path, depth+1)
	case n.Kind == yaml.SequenceNode && depth == 0:
		for i := len(n.Content) - 1; i >= 0; i-- {
			item := p.deref(n.Content[i])
			if item == nil || item.Kind != yaml.MappingNode {
				p.errorf(n.Content[i], path, "<< merges a mapping or a list of mappings")
				continue
			}
			p.fill(m, item, path, depth+1)
		}
	default:
		p.errorf(n, path, "<< merges a mapping or a list of mappings, not %s", describe(n))
	}
}

// get returns the value of field, nil if it is absent or null.
func (p *parser) get(m *mapping, field string) *yaml.Node {
	if m == nil {
		return nil
	}
	return p.deref(m.values[field])
}

// fields checks m's fields against those its level reads (own): a field the reference accepts
// elsewhere is ignored with a warning (its value still checked as the reference checks it), an
// extension field out of place and any other field are errors.
func (p *parser) fields(m *mapping, path, level string, own []string) {
	for _, k := range m.keys {
		switch {
		case slices.Contains(own, k.Value):
		case slices.Contains(peerFields, k.Value):
			p.warnf(k, path, "%s has no meaning in %s; it is ignored", k.Value, level)
			if k.Value != "metadata" {
				p.anyValue(m.values[k.Value], path, k.Value)
			}
		case slices.Contains(extensionFields, k.Value):
			p.errorf(k, path, "%s belongs in a descriptor, beside rate_limit, not in %s", k.Value, level)
		default:
			if near := suggest.Field(k.Value, own); near != "" {
				p.errorf(k, path, "unknown field %q; did you mean %q?", k.Value, near)
			} else {
				p.errorf(k, path, "unknown field %q (known in %s: %s)", k.Value, level, strings.Join(own, ", "))
			}
		}
	}
}

// anyValue checks an ignored value as the reference checks every value: mappings hold known
// fields only, lists hold mappings only, and no number is floating-point or above 2^63.
func (p *parser) anyValue(n *yaml.Node, path, field string) {
	n = p.deref(n)
	if n == nil {
		return
	}
	switch n.Kind {
	case yaml.MappingNode:
		m := p.mapping(n, path, field)
		if m == nil {
			return
		}
		for _, k := range m.keys {
			if !slices.Contains(peerFields, k.Value) {
				p.errorf(k, path, "%s: unknown field %q", field, k.Value)
				continue
			}
			if k.Value != "metadata" {
				p.anyValue(m.values[k.Value], path, field+"."+k.Value)
			}
		}
	case yaml.SequenceNode:
		for i, item := range n.Content {
			at := item
			if item = p.deref(item); item == nil || item.Kind != yaml.MappingNode {
				if item == nil {
					item = at
				}
				p.errorf(item, path, "%s[%d] must be a mapping, not %s", field, i, describe(item))
				continue
			}
			p.anyValue(item, path, fmt.Sprintf("%s[%d]", field, i))
		}
	case yaml.ScalarNode:
		p.plainScalar(n, path, field)
	}
}

// plainScalar refuses what the reference refuses in any scalar outside metadata: a floating-point
// number, an integer above 2^63 - 1, or a tagged value not of its tag.
func (p *parser) plainScalar(n *yaml.Node, path, field string) (scalar, bool) {
	s, ok := resolve(n)
	switch {
	case !ok:
		p.errorf(n, path, "%s %s is not a %s", field, literal(n), n.ShortTag())
		return s, false
	case s.kind == kFloat:
		p.errorf(n, path, "%s %s is a floating-point number, which this format refuses (quote it if it is a string)", field, literal(n))
		return s, false
	case s.kind == kUint:
		p.errorf(n, path, "%s %s is out of range (above 2^63 - 1; quote it if it is a string)", field, literal(n))
		return s, false
	}
	return s, true
}

// str reads a string field (numbers and booleans as written, as the reference does).
func (p *parser) str(n *yaml.Node, path, field string) (string, bool) {
	if n.Kind != yaml.ScalarNode {
		p.errorf(n, path, "%s must be a string, not %s", field, describe(n))
		return "", false
	}
	if _, ok := p.plainScalar(n, path, field); !ok {
		return "", false
	}
	if n.Style&yaml.TaggedStyle != 0 && n.ShortTag() == "!!binary" {
		b, err := base64.StdEncoding.DecodeString(n.Value)
		if err != nil {
			p.errorf(n, path, "%s is !!binary but not valid base64", field)
			return "", false
		}
		return string(b), true
	}
	return n.Value, true
}

// bool reads a boolean field: true, false, and YAML 1.1's yes, no, on, off, y, n.
func (p *parser) bool(n *yaml.Node, path, field string) (bool, bool) {
	if n.Kind == yaml.ScalarNode {
		if s, ok := resolve(n); ok && s.kind == kBool {
			return s.b, true
		}
		if _, ok := p.plainScalar(n, path, field); !ok {
			return false, false
		}
	}
	p.errorf(n, path, "%s %s must be true or false", field, describe(n))
	return false, false
}

// integer reads an integer field within [lo, hi].
func (p *parser) integer(n *yaml.Node, path, field string, lo, hi int64) (int64, bool) {
	if n.Kind == yaml.ScalarNode {
		s, ok := resolve(n)
		if ok && s.kind == kInt {
			if s.i < lo || s.i > hi {
				p.errorf(n, path, "%s %s must be an integer from %d to %d", field, n.Value, lo, hi)
				return 0, false
			}
			return s.i, true
		}
		if ok && s.kind == kUint {
			p.errorf(n, path, "%s %s must be an integer from %d to %d", field, n.Value, lo, hi)
			return 0, false
		}
		if _, ok := p.plainScalar(n, path, field); !ok {
			return 0, false
		}
	}
	p.errorf(n, path, "%s %s must be an integer from %d to %d", field, describe(n), lo, hi)
	return 0, false
}

// list reads a list of mappings, calling f for each one.
func (p *parser) list(n *yaml.Node, path, field string, f func(i int, item *yaml.Node, m *mapping)) {
	if n.Kind != yaml.SequenceNode {
		p.errorf(n, path, "%s must be a list, not %s", field, describe(n))
		return
	}
	for i, item := range n.Content {
		at := item
		if item = p.deref(item); item == nil {
			if !p.over {
				p.errorf(at, path, "%s[%d] is empty; it must be a mapping", field, i)
			}
			continue
		}
		if item.Kind != yaml.MappingNode {
			p.errorf(item, path, "%s[%d] must be a mapping (field: value), not %s", field, i, describe(item))
			continue
		}
		itemPath := fmt.Sprintf("%s[%d]", field, i)
		if path != "" {
			itemPath = path + " > " + itemPath
		}
		m := &mapping{node: item, values: map[string]*yaml.Node{}}
		p.fill(m, item, itemPath, 0)
		f(i, item, m)
	}
}

// parse reads one file's document into a domain.
func parse(data []byte, name string) (*domain, config.Errors, config.Errors) {
	p := &parser{file: name}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, config.Errors{syntaxError(name, err)}, nil
	}
	// The reference reads a file's first document only; the others are never looked at.
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var first, second yaml.Node
	if dec.Decode(&first) == nil {
		if err := dec.Decode(&second); !errors.Is(err, io.EOF) {
			at := &second
			if err != nil {
				at = nil
			}
			p.warnf(at, "", "only the file's first YAML document is read; the documents after it are ignored")
		}
	}
	d := p.document(&doc)
	return d, finish(p.errs), finish(p.warns)
}

// finish sorts problems by line and column, drops repeats and bounds their number.
func finish(es config.Errors) config.Errors {
	if len(es) == 0 {
		return nil
	}
	slices.SortStableFunc(es, func(a, b *config.Error) int {
		return cmp.Or(cmp.Compare(a.Line, b.Line), cmp.Compare(a.Column, b.Column))
	})
	out := es[:0]
	seen := map[string]bool{}
	for _, e := range es {
		if s := e.Error(); !seen[s] {
			seen[s] = true
			out = append(out, e)
		}
	}
	if len(out) > maxErrors {
		more := &config.Error{File: out[0].File, Line: out[maxErrors].Line, Msg: fmt.Sprintf("and %d more problems from here on", len(out)-maxErrors)}
		out = append(out[:maxErrors], more)
	}
	return out
}

var syntaxLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// syntaxError turns a YAML syntax error into an Error with its line.
func syntaxError(file string, err error) *config.Error {
	msg := err.Error()
	e := &config.Error{File: file, Msg: "YAML: " + strings.TrimPrefix(msg, "yaml: "), Err: err}
	if m := syntaxLine.FindStringSubmatch(msg); m != nil {
		e.Line, _ = strconv.Atoi(m[1])
		e.Msg = "YAML: " + m[2]
	}
	return e
}

// document reads the top level: domain and descriptors.
func (p *parser) document(doc *yaml.Node) *domain {
	start := &yaml.Node{Line: 1, Column: 1}
	var root *yaml.Node
	if doc.Kind == yaml.DocumentNode && len(doc.Content) > 0 {
		root = doc.Content[0]
		start = root
	}
	root = p.deref(root)
	d := &domain{file: p.file, line: start.Line, col: start.Column}
	d.root.children = map[string]*node{}
	if root == nil { // an empty file: no domain
		p.errorf(start, "", "domain is required: the file's domain, e.g. domain: my-service")
		return d
	}
	m := p.mapping(root, "", "the file")
	if m == nil {
		return d
	}
	p.fields(m, "", "the top level", topFields)
	if n := p.get(m, "domain"); n == nil {
		p.errorf(root, "", "domain is required (and must not be empty): the file's domain, e.g. domain: my-service")
	} else if s, ok := p.str(n, "", "domain"); ok {
		if s == "" {
			p.errorf(n, "", "domain must not be empty")
		}
		d.name, d.line, d.col = s, n.Line, n.Column
	}
	d.root.rule = d.name
	if n := p.get(m, "descriptors"); n != nil {
		p.descriptors(n, &d.root, 1, "", d.name+".")
	}
	return d
}

// descriptors reads one level of descriptors into parent. composite is the reference's name of
// the level ("domain.key1_value1."), for its duplicate-key message.
func (p *parser) descriptors(n *yaml.Node, parent *node, depth int, path, composite string) {
	field := "descriptors"
	if depth > maxDepth && n.Kind == yaml.SequenceNode && len(n.Content) > 0 {
		p.errorf(n, path, "descriptors are nested more than %d levels deep", maxDepth)
		return
	}
	p.list(n, path, field, func(i int, item *yaml.Node, m *mapping) {
		here := fmt.Sprintf("%s[%d]", field, i)
		if path != "" {
			here = shortPath(path) + " > " + here
		}
		nd := &node{file: p.file, line: item.Line, col: item.Column, children: map[string]*node{}}
		keyOK := false
		if kn := p.get(m, "key"); kn == nil {
			p.errorf(item, here, "key is required (a descriptor has a key, and may have a value)")
		} else if s, ok := p.str(kn, here, "key"); ok {
			if s == "" {
				p.errorf(kn, here, "key must not be empty")
			} else {
				nd.key, keyOK = s, true
			}
		}
		bare := here
		if keyOK {
			here = bare + " " + quote(nd.key)
		}
		if vn := p.get(m, "value"); vn != nil {
			if s, ok := p.str(vn, here, "value"); ok {
				nd.value = s
			}
		}
		if keyOK {
			here = bare + " " + quote(segment(nd.key, nd.value))
		}
		p.fields(m, here, "a descriptor", descriptorFields)

		// The reference names a descriptor key_value, or key without a value; two descriptors of
		// one level with the same name are one too many, whichever way it was spelled.
		nd.finalKey = nd.key
		if nd.value != "" {
			nd.finalKey += "_" + nd.value
		}
		nd.rule = parent.rule + "/" + segment(nd.key, nd.value)
		dup := false
		if prev, ok := parent.children[nd.finalKey]; ok && keyOK {
			dup = true
			p.errorf(item, here, "descriptor %s is already defined at this level%s: duplicate descriptor composite key %s",
				quote(segment(nd.key, nd.value)), atLine(prev.line), quote(composite+nd.finalKey))
		}

		for _, f := range []struct {
			name string
			dst  *bool
		}{{"shadow_mode", &nd.shadow}, {"quota_mode", &nd.quota}, {"detailed_metric", &nd.detailed},
			{"value_to_metric", &nd.valueToMetric}, {"share_threshold", &nd.share}} {
			if fn := p.get(m, f.name); fn != nil {
				if v, ok := p.bool(fn, here, f.name); ok {
					*f.dst = v
				}
			}
		}
		if nd.share && keyOK && !strings.Contains(nd.finalKey, "*") {
			p.errorf(m.values["share_threshold"], here, "share_threshold can only be used with a wildcard value (containing '*'), and %s has none", quote(nd.finalKey))
		}
		if nd.share && strings.Contains(nd.finalKey, "*") {
			nd.pattern = nd.finalKey
		}
		if mn := p.get(m, "metadata"); mn != nil {
			nd.metadata = p.metadata(mn, here)
		}

		rn := p.get(m, "rate_limit")
		algN, burstN := p.get(m, "algorithm"), p.get(m, "burst")
		if rn != nil {
			nd.limit = p.rateLimit(rn, here, algN, burstN)
		} else {
			for _, f := range []struct {
				name string
				n    *yaml.Node
			}{{"algorithm", algN}, {"burst", burstN}} {
				if f.n != nil {
					p.errorf(m.values[f.name], here, "%s needs a rate_limit beside it (it says how that limit is applied)", f.name)
				}
			}
		}

		if cn := p.get(m, "descriptors"); cn != nil {
			p.descriptors(cn, nd, depth+1, here, composite+nd.finalKey+".")
		}
		if !keyOK || dup {
			return
		}
		if strings.Contains(nd.finalKey, "*") {
			parent.wildcards = append(parent.wildcards, wildcard{key: nd.finalKey, parts: strings.Split(nd.finalKey, "*")})
		}
		parent.children[nd.finalKey] = nd
		parent.order = append(parent.order, nd)
	})
}

// shortPath keeps the last levels of a long path, so that an error deep in a file reads in one
// line: "... > descriptors[2] "b" > descriptors[0] "c"".
func shortPath(path string) string {
	const max = 160
	if len(path) <= max {
		return path
	}
	tail := path[len(path)-max:]
	if i := strings.Index(tail, " > "); i >= 0 {
		tail = tail[i+len(" > "):]
	}
	return "... > " + tail
}

// atLine is " (line N)", or "" for a descriptor read from xDS, which has no lines.
func atLine(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(" (line %d)", n)
}

// segment is one level of a rule's name: key, or key=value.
func segment(key, value string) string {
	if value == "" {
		return key
	}
	return key + "=" + value
}

// rateLimit reads a descriptor's rate_limit and sluice's algorithm and burst beside it.
func (p *parser) rateLimit(n *yaml.Node, path string, algN, burstN *yaml.Node) *limit {
	m := p.mapping(n, path, "rate_limit")
	if m == nil {
		return nil
	}
	p.fields(m, path, "rate_limit", rateLimitFields)
	l := &limit{}
	good := true
	unlimitedRead := true
	if un := p.get(m, "unlimited"); un != nil {
		l.unlimited, unlimitedRead = p.bool(un, path, "rate_limit.unlimited")
		good = good && unlimitedRead
	}
	unitText, unitN, unitRead := "", p.get(m, "unit"), true
	if unitN != nil {
		unitText, unitRead = p.str(unitN, path, "rate_limit.unit")
		good = good && unitRead
	}
	u, valid := parseUnit(unitText)
	switch {
	case !unitRead || !unlimitedRead: // whether a unit is wanted is not known
	case l.unlimited && valid:
		p.errorf(unitN, path, "rate_limit.unit must not be set with unlimited: true (an unlimited descriptor has no unit)")
		good = false
	case l.unlimited:
		// The reference ignores any other unit of an unlimited descriptor (even one that is not a unit).
	case !valid && unitN == nil:
		p.errorf(n, path, "rate_limit.unit is required: one of %s", unitList)
		good = false
	case !valid:
		p.errorf(unitN, path, "rate_limit.unit %s is not a unit: want one of %s", quote(unitText), unitList)
		good = false
	default:
		l.unit = u
	}
	rpuN := p.get(m, "requests_per_unit")
	if rpuN != nil {
		if v, ok := p.integer(rpuN, path, "rate_limit.requests_per_unit", 0, 1<<32-1); ok {
			l.rpu = uint32(v)
		} else {
			good = false
		}
	}
	if nameN := p.get(m, "name"); nameN != nil {
		if s, ok := p.str(nameN, path, "rate_limit.name"); ok {
			l.name = s
		}
	}
	if repN := p.get(m, "replaces"); repN != nil {
		p.list(repN, path, "rate_limit.replaces", func(i int, item *yaml.Node, rm *mapping) {
			field := fmt.Sprintf("rate_limit.replaces[%d].name", i)
			p.fields(rm, path, "a replaces entry", replacesFields)
			name := ""
			if nn := p.get(rm, "name"); nn != nil {
				if s, ok := p.str(nn, path, field); ok {
					name = s
				} else {
					return
				}
			}
			switch {
			case name == "":
				p.errorf(item, path, "%s is empty: each replaces entry names the limit it replaces", field)
			case name == l.name:
				p.errorf(item, path, "%s %s is this limit's own name: a limit cannot replace itself", field, quote(name))
			default:
				l.replaces = append(l.replaces, name)
			}
		})
	}

	// sluice's extension: how the limit is applied. Without it, a fixed window of the unit.
	alg := sluice.FixedWindow
	if algN != nil {
		if l.unlimited {
			p.errorf(algN, path, "algorithm has no meaning with rate_limit.unlimited: true")
			good = false
		} else if s, ok := p.str(algN, path, "algorithm"); ok {
			a, err := sluice.ParseAlgorithm(s)
			if err != nil {
				p.errorf(algN, path, "algorithm %s is unknown: want fixed-window, sliding-log, sliding-window, token-bucket or leaky-bucket", quote(s))
				good = false
			} else if a == sluice.Concurrency {
				p.errorf(algN, path, "algorithm concurrency is not supported by Envoy's rate limit service: it never sees a response end, so no slot could be given back (limit requests in flight in the sluice proxy)")
				good = false
			} else {
				alg = a
			}
		} else {
			good = false
		}
	}
	burst, burstSet := int64(0), false
	if burstN != nil {
		switch {
		case l.unlimited:
			p.errorf(burstN, path, "burst has no meaning with rate_limit.unlimited: true")
			good = false
		case algN == nil:
			p.errorf(burstN, path, "burst needs algorithm: token-bucket or leaky-bucket beside it (the default, a fixed window, has no burst)")
			good = false
		default:
			if v, ok := p.integer(burstN, path, "burst", 0, algorithm.MaxLimit); ok {
				burst, burstSet = v, true
			} else {
				good = false
			}
		}
	}
	if good && !l.unlimited {
		pol := sluice.Policy{Algorithm: alg, Limit: int64(l.rpu), Period: l.unit.Duration()}
		if alg == sluice.TokenBucket || alg == sluice.LeakyBucket {
			pol.Burst = int64(l.rpu) // the default: a bucket as deep as a unit's requests
			if burstSet {
				pol.Burst = burst
			}
		} else if burstSet {
			pol.Burst = burst // Validate says why a window has no burst
		}
		l.policy = pol
		// A plain file's requests_per_unit: 0 is the reference's "every request is over the
		// limit"; only sluice's extension, which names an algorithm, must make a valid policy.
		if algN != nil {
			p.policyError(pol, path, map[string]*yaml.Node{"algorithm": algN, "burst": burstN, "limit": rpuN, "period": unitN}, n)
		}
	}
	return l
}

// policyError reports what Policy.Validate says of pol, at the field it names.
func (p *parser) policyError(pol sluice.Policy, path string, at map[string]*yaml.Node, fallback *yaml.Node) {
	pol.Name = "x"
	err := pol.Validate()
	if err == nil {
		return
	}
	msg := err.Error()
	if _, rest, ok := strings.Cut(msg, `policy "x": `); ok {
		msg = rest
	}
	field, _, _ := strings.Cut(msg, " ")
	where := at[field]
	if where == nil {
		where = at["algorithm"]
	}
	if where == nil {
		where = fallback
	}
	names := map[string]string{"limit": "rate_limit.requests_per_unit (the limit)", "period": "rate_limit.unit (the period)"}
	if full, ok := names[field]; ok {
		msg = full + strings.TrimPrefix(msg, field)
	}
	p.errorCause(where, path, err, "algorithm "+pol.Algorithm.String()+": "+msg)
}

// metadata reads a descriptor's metadata: any YAML, returned as plain Go values (maps with
// string keys, lists, strings, int64, uint64, float64, bool, nil).
func (p *parser) metadata(n *yaml.Node, path string) map[string]any {
	if n.Kind != yaml.MappingNode {
		p.errorf(n, path, "metadata must be a mapping, not %s", describe(n))
		return nil
	}
	v, ok := p.anyToGo(n, path, true)
	if !ok {
		return nil
	}
	return v.(map[string]any)
}

// anyToGo converts a metadata node. top: the outer mapping, whose keys are read as written;
// nested keys are read as the reference prints them (its library types them first).
func (p *parser) anyToGo(n *yaml.Node, path string, top bool) (any, bool) {
	n = p.deref(n)
	if n == nil {
		return nil, !p.over
	}
	switch n.Kind {
	case yaml.MappingNode:
		m := p.mapping(n, path, "metadata")
		if m == nil {
			return nil, false
		}
		out := make(map[string]any, len(m.keys))
		for _, k := range m.keys {
			key := k.Value
			if !top {
				s, _ := resolve(k)
				key = s.text(k.Value)
			}
			v, ok := p.anyToGo(m.values[k.Value], path, false)
			if !ok {
				return nil, false
			}
			out[key] = v
		}
		return out, true
	case yaml.SequenceNode:
		out := make([]any, 0, len(n.Content))
		for _, item := range n.Content {
			v, ok := p.anyToGo(item, path, false)
			if !ok {
				return nil, false
			}
			out = append(out, v)
		}
		return out, true
	}
	s, ok := resolve(n)
	if !ok {
		p.errorf(n, path, "metadata value %s is not a %s", literal(n), n.ShortTag())
		return nil, false
	}
	return s.value(n.Value), true
}

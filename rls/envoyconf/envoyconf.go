// Package envoyconf reads the rate limit configuration files of envoyproxy/ratelimit, the
// reference implementation of Envoy's rate limit service, as that service reads them, and finds
// the limit of each descriptor of a request as it does. A user's existing files work unchanged:
// what the reference accepts is accepted (the fields it ignores with a warning), and what it
// refuses is refused, every problem of a file at once, each with file, line and column.
//
//	cfg, err := envoyconf.Load("config/a.yaml", "config/b.yaml")
//	m, ok := cfg.Match("my-domain", []envoyconf.Entry{{Key: "remote_address", Value: ip}}, nil)
//	// ok: m.Policy (a fixed window of m.RequestsPerUnit per m.Unit, by default) applies to the
//	// counter m.Key; !ok: the descriptor is not limited.
//
// One file is one YAML document: a domain and its descriptors. Beside a descriptor's rate_limit,
// sluice also reads algorithm and burst, which choose how the limit is applied; a file without
// them means what it means to the reference.
//
// A Config is immutable once loaded and safe for concurrent use; a reload builds a new one.
package envoyconf

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/config"
)

// Config is a set of domains, each a tree of descriptors.
type Config struct {
	domains  map[string]*domain
	warnings config.Errors
}

// domain is one domain's descriptors and where it was defined.
type domain struct {
	name      string
	file      string
	line, col int // where domain: is written
	root      node
	keyPart   string // the domain as Match.Key spells it
}

// node is one descriptor of the configuration, or a domain's root.
type node struct {
	key, value string
	// finalKey is the reference's name of the descriptor within its level: key_value, or key
	// alone when it has no value. A request's entry is looked up under key_value first.
	finalKey  string
	children  map[string]*node // by finalKey
	order     []*node          // children in file order
	wildcards []wildcard       // the children whose finalKey has a '*', in file order
	limit     *limit           // rate_limit; nil if the descriptor has none
	rule      string           // "domain/key1=value1/key2", for Match.Rule
	keyPart   string           // rule without the domain, as Match.Key spells it

	shadow, quota, detailed, valueToMetric, share bool
	pattern                                       string // finalKey, when share is set and it has a '*'
	metadata                                      map[string]any

	file      string
	line, col int
}

// wildcard is a child whose finalKey has a '*': each '*' matches any run of characters.
type wildcard struct {
	key   string   // the child's finalKey
	parts []string // key split at each '*'
}

// limit is one rate_limit, with sluice's algorithm and burst beside it.
type limit struct {
	name      string
	unlimited bool
	replaces  []string
	unit      Unit
	rpu       uint32
	policy    sluice.Policy // Name left empty
}

// maxFileSize bounds a file that Load reads.
const maxFileSize = 64 << 20

// Load reads the files, each one YAML document with a domain and its descriptors, as the
// reference does. Two files with the same domain are an error (naming both); to merge them, as
// the reference does when told to, Parse each and call MergeDomains.
//
// The error, if any, is config.Errors: every problem of every file, a file's sorted by line and
// column, in the order the files were given. Warnings (fields the reference ignores) are on the
// Config.
func Load(files ...string) (*Config, error) {
	var errs config.Errors
	var cfgs []*Config
	for _, f := range files {
		data, err := readFile(f)
		if err != nil {
			errs = append(errs, &config.Error{File: f, Msg: "cannot read the configuration: " + err.Error(), Err: err})
			continue
		}
		c, err := Parse(data, f)
		if err != nil {
			errs = append(errs, err.(config.Errors)...)
			if c == nil {
				continue
			}
		}
		cfgs = append(cfgs, c)
	}
	return mergeAll(cfgs, errs)
}

// mergeAll merges the domains of cfgs (one file's or resource's each) into one Config, or
// returns every error: errs (found reading them) and the merge's.
func mergeAll(cfgs []*Config, errs config.Errors) (*Config, error) {
	c, err := merge(false, cfgs)
	if err != nil {
		errs = append(errs, err.(config.Errors)...)
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return c, nil
}

// readFile reads a regular file of at most maxFileSize bytes.
func readFile(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		if pe, ok := err.(*os.PathError); ok {
			return nil, pe.Err
		}
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file")
	}
	b, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxFileSize {
		return nil, fmt.Errorf("larger than %d bytes", maxFileSize)
	}
	return b, nil
}

// Parse reads one file's contents; name is the file's name, which errors carry. The error, if
// any, is config.Errors, every problem found, sorted by line; the Config is then nil.
func Parse(data []byte, name string) (*Config, error) {
	d, errs, warns := parse(data, name)
	if len(errs) > 0 {
		return nil, errs
	}
	finishDomain(d)
	return &Config{domains: map[string]*domain{d.name: d}, warnings: warns}, nil
}

// Merge combines configurations of different domains. A domain in two of them is an error, as
// the reference makes it by default; the error (config.Errors) names both files.
func Merge(cfgs ...*Config) (*Config, error) { return merge(false, cfgs) }

// MergeDomains combines configurations as the reference does when told to merge domains: the
// descriptors of a domain defined in several files are put together, and a top-level descriptor
// defined in two of them is an error (as one defined twice in one file is). Wildcards are tried in
// the order of the configurations, then of their files.
func MergeDomains(cfgs ...*Config) (*Config, error) { return merge(true, cfgs) }

func merge(domains bool, cfgs []*Config) (*Config, error) {
	out := &Config{domains: map[string]*domain{}}
	var errs config.Errors
	for _, c := range cfgs {
		if c == nil {
			continue
		}
		out.warnings = append(out.warnings, c.warnings...)
		for _, name := range c.Domains() {
			d := c.domains[name]
			prev, ok := out.domains[name]
			if !ok {
				out.domains[name] = d
				continue
			}
			if !domains {
				errs = append(errs, &config.Error{File: d.file, Line: d.line, Column: d.col,
					Msg: fmt.Sprintf("domain %s is also the domain of %s%s: each domain is defined in one file", quote(name), prev.file, atLine(prev.line))})
				continue
			}
			merged, dupErrs := mergeDomain(prev, d)
			errs = append(errs, dupErrs...)
			out.domains[name] = merged
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return out, nil
}

// mergeDomain returns a's domain with b's top-level descriptors added after a's, as the
// reference patches a domain; a and b are left as they are.
func mergeDomain(a, b *domain) (*domain, config.Errors) {
	m := *a
	m.root.children = make(map[string]*node, len(a.root.children)+len(b.root.children))
	for k, v := range a.root.children {
		m.root.children[k] = v
	}
	m.root.order = slices.Clone(a.root.order)
	m.root.wildcards = slices.Clone(a.root.wildcards)
	var errs config.Errors
	for _, n := range b.root.order {
		if prev, ok := m.root.children[n.finalKey]; ok {
			errs = append(errs, &config.Error{File: n.file, Line: n.line, Column: n.col,
				Msg: fmt.Sprintf("descriptor %s is already defined in %s%s: duplicate descriptor composite key %s",
					quote(segment(n.key, n.value)), prev.file, atLine(prev.line), quote(a.name+"."+n.finalKey))})
			continue
		}
		m.root.children[n.finalKey] = n
		m.root.order = append(m.root.order, n)
		if strings.Contains(n.finalKey, "*") {
			m.root.wildcards = append(m.root.wildcards, wildcard{key: n.finalKey, parts: strings.Split(n.finalKey, "*")})
		}
	}
	return &m, errs
}

// Domains returns the configured domains, sorted.
func (c *Config) Domains() []string {
	out := make([]string, 0, len(c.domains))
	for name := range c.domains {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// Warnings returns what the files hold that the reference accepts but ignores, so that a server
// can log it: a field at a level that does not read it (rate_limit's unit written beside
// rate_limit), a field written twice in one mapping (the last value is used), documents after a
// file's first. Sorted like errors.
func (c *Config) Warnings() config.Errors { return c.warnings }

// finishDomain computes the names that Match puts into keys.
func finishDomain(d *domain) {
	d.keyPart = keyText(d.name, maxDomainKey)
	var walk func(n *node)
	walk = func(n *node) {
		for _, c := range n.order {
			c.keyPart = keyText(strings.TrimPrefix(c.rule, d.name+"/"), maxRuleKey)
			walk(c)
		}
	}
	walk(&d.root)
}

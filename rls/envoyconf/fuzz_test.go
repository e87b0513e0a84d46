package envoyconf

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/config"
)

// FuzzParse: no document panics Parse, an error is config.Errors naming the file, and a
// configuration that loads answers Match without panicking, with keys of the promised shape.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "*.yaml"))
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data, "key1", "value1")
	}
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k\n    value: \"a*b*\"\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), "k", "aXbY")
	f.Add([]byte("domain: d\ndescriptors: [{key: k, algorithm: token-bucket, burst: 3, rate_limit: {unit: day, requests_per_unit: 2}}]\n"), "k", "v")
	f.Fuzz(func(t *testing.T, data []byte, key, value string) {
		c, err := Parse(data, "fuzz.yaml")
		if err != nil {
			var es config.Errors
			if !errors.As(err, &es) || len(es) == 0 || c != nil {
				t.Fatalf("error %v (%T), config %v", err, err, c)
			}
			for _, e := range es {
				if e.File != "fuzz.yaml" || e.Msg == "" {
					t.Fatalf("error %#v", e)
				}
			}
			return
		}
		for _, d := range c.Domains() {
			for _, entries := range [][]Entry{nil, {{key, value}}, {{key, value}, {key, value}}, {{"key1", value}, {"subkey1", key}}} {
				for _, o := range []*Override{nil, {RequestsPerUnit: 3, Unit: Minute}} {
					m, ok := c.Match(d, entries, o)
					if !ok {
						continue
					}
					if m.Unlimited != (m.Key == "") || (m.Key != "" && (len(m.Key) > maxKeyLen || !keyShape.MatchString(m.Key))) {
						t.Fatalf("%q: key %q", d, m.Key)
					}
					// The readable part of a key is the rule's, whatever the request's values.
					other := make([]Entry, len(entries))
					for i, e := range entries {
						other[i] = Entry{e.Key, e.Value + "#other"}
					}
					if m2, ok := c.Match(d, other, o); ok && m2.Rule == m.Rule && !m.Unlimited {
						if a, b := m.Key[:strings.LastIndexByte(m.Key, ':')], m2.Key[:strings.LastIndexByte(m2.Key, ':')]; a != b {
							t.Fatalf("%v: key %q, and %q for other values", entries, a, b)
						}
					}
					if m.RequestsPerUnit > 0 && !m.Unlimited {
						if err := m.Policy.Validate(); err != nil {
							t.Fatalf("%q %v: policy %+v: %v", d, entries, m.Policy, err)
						}
					}
				}
			}
			Replaced([]Match{{}, {Name: "a"}})
		}
	})
}

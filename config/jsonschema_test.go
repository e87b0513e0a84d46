package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.yaml.in/yaml/v3"
)

// compiledSchema compiles JSONSchema as a validator would (the chart's values.schema.json
// embeds it; helm validates with this library).
func compiledSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(JSONSchema()))
	if err != nil {
		t.Fatalf("JSONSchema is not JSON: %v", err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("config.schema.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("config.schema.json")
	if err != nil {
		t.Fatalf("JSONSchema does not compile: %v", err)
	}
	return s
}

// asJSON turns a YAML configuration into the JSON value a schema validator sees (anchors and
// merges resolved, as any YAML-to-JSON conversion does).
func asJSON(t *testing.T, y string) any {
	t.Helper()
	var v any
	if err := yaml.Unmarshal([]byte(y), &v); err != nil {
		t.Fatalf("YAML: %v\n%s", err, y)
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("JSON: %v\n%s", err, y)
	}
	out, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestJSONSchemaAcceptsValidConfigurations validates every configuration of the repository that
// Parse accepts against JSONSchema: the examples of docs/config.md and the README, the demo,
// and the container image's default file. (The chart's rendered configuration is checked by
// the chart's tests in deploy/.) A schema narrower than the parser would refuse one of them.
func TestJSONSchemaAcceptsValidConfigurations(t *testing.T) {
	s := compiledSchema(t)
	configs := map[string]string{"demo": string(DemoYAML("http://127.0.0.1:9000"))}
	for i, ex := range docsExamples(t) {
		configs[fmt.Sprintf("docs/config.md example %d", i+1)] = ex[1]
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllSubmatch(readme, -1) {
		configs[fmt.Sprintf("README.md example %d", i+1)] = strings.ReplaceAll(string(b[1]), `"<sha-256 of the key>"`, sum("readme"))
	}
	// The other documents' blocks that are sluice configurations (those Parse accepts, with an
	// upstream if they lack one; Envoy's, Kubernetes' and envoyproxy/ratelimit's blocks are not).
	others, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	parsedElsewhere := 0
	for _, name := range others {
		if filepath.Base(name) == "config.md" {
			continue
		}
		doc, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for i, b := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllSubmatch(doc, -1) {
			y := string(b[1])
			if !regexp.MustCompile(`(?m)^upstream:`).MatchString(y) {
				y += up // a fragment: what it lacks to stand alone
			}
			if _, err := parse([]byte(y), "sluice.yaml", lookupEnv); err == nil {
				configs[fmt.Sprintf("%s example %d", filepath.Base(name), i+1)] = y
				parsedElsewhere++
			}
		}
	}
	t.Logf("%d sluice configurations in docs/*.md besides config.md", parsedElsewhere)
	if parsedElsewhere < 3 {
		t.Errorf("%d sluice configurations in docs/*.md besides config.md; the docs have more", parsedElsewhere)
	}
	image, err := os.ReadFile("../deploy/container/sluice.yaml")
	if err != nil {
		t.Fatal(err)
	}
	configs["deploy/container/sluice.yaml"] = string(image)
	for name, y := range configs {
		if _, err := parse([]byte(y), name, lookupEnv); err != nil {
			t.Errorf("%s: Parse refuses it: %v", name, err)
			continue
		}
		if err := s.Validate(asJSON(t, y)); err != nil {
			t.Errorf("%s: Parse accepts it, JSONSchema refuses it:\n%s\n%v", name, y, err)
		}
	}
}

// walkContext is what a mapping needs for the parser to read further into it: usage reads
// nothing more without its format.
var walkContext = map[*schemaNode]map[string]any{usageSchema: {"format": "openai"}}

// objectPaths lists every mapping of the schema, each as a document that sets a field named
// unknown there (and only what leads to it).
func objectPaths(n *schemaNode, unknown string, wrap func(any) any, path string, out map[string]any, seen map[*schemaNode]bool) {
	switch n.kind {
	case kObject:
		if !seen[n] {
			seen[n] = true
			out[path] = wrap(map[string]any{unknown: 1})
		}
		for _, f := range n.fields {
			objectPaths(f.node, unknown, func(v any) any {
				m := map[string]any{f.name: v}
				for k, cv := range walkContext[n] {
					m[k] = cv
				}
				return wrap(m)
			}, path+"."+f.name, out, seen)
		}
	case kList:
		objectPaths(n.items, unknown, func(v any) any { return wrap([]any{v}) }, path+"[0]", out, seen)
	case kMap:
		objectPaths(n.items, unknown, func(v any) any { return wrap(map[string]any{"k": v}) }, path+".k", out, seen)
	case kAnyOf:
		for _, a := range n.anyOf {
			objectPaths(a, unknown, wrap, path, out, seen)
		}
	}
}

// TestUnknownFieldsRefusedEverywhere puts an unknown field into every mapping of the schema and
// checks that Parse and JSONSchema both refuse it: the schema knows every mapping the parser
// reads, and no mapping takes fields the schema does not list.
func TestUnknownFieldsRefusedEverywhere(t *testing.T) {
	s := compiledSchema(t)
	docs := map[string]any{}
	objectPaths(configSchema, "zz_unknown", func(v any) any { return v }, "", docs, map[*schemaNode]bool{})
	if len(docs) < 35 {
		t.Fatalf("the schema has %d mappings; the parser reads more", len(docs))
	}
	for path, doc := range docs {
		y, err := yaml.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		_, perr := parse(y, "sluice.yaml", lookupEnv)
		if perr == nil || !strings.Contains(perr.Error(), `unknown field "zz_unknown"`) {
			t.Errorf("at %q Parse does not refuse an unknown field:\n%s\n%v", path, y, perr)
		}
		if err := s.Validate(asJSON(t, string(y))); err == nil || !strings.Contains(err.Error(), "zz_unknown") {
			t.Errorf("at %q JSONSchema does not refuse an unknown field:\n%s\n%v", path, y, err)
		}
	}
}

// TestMisspeltFieldNamed checks that a misspelt field (algoritm) is refused by both, each naming
// where it is.
func TestMisspeltFieldNamed(t *testing.T) {
	y := up + "policies:\n  - {name: p, algoritm: token-bucket, limit: 10, period: 1s}\n"
	_, err := parse([]byte(y), "sluice.yaml", lookupEnv)
	if err == nil || !strings.Contains(err.Error(), `sluice.yaml:3:15: policies[0] "p": unknown field "algoritm"; did you mean "algorithm"?`) {
		t.Errorf("Parse: %v", err)
	}
	verr := compiledSchema(t).Validate(asJSON(t, y))
	if verr == nil || !strings.Contains(verr.Error(), "/policies/0") || !strings.Contains(verr.Error(), "'algoritm'") {
		t.Errorf("JSONSchema: %v", verr)
	}
}

// TestJSONSchemaEnumsAreTheParsers checks every enumerated value of the schema against Parse:
// each is accepted where the schema puts it, and a value outside the enum is refused by both.
func TestJSONSchemaEnumsAreTheParsers(t *testing.T) {
	s := compiledSchema(t)
	cases := []struct {
		node *schemaNode
		doc  func(v string) string
	}{
		{storeSchema.fields[0].node, func(v string) string {
			if v == StoreRedis {
				return up + "store: {type: redis, addrs: [127.0.0.1:6379]}\n"
			}
			return up + "store: {type: " + v + "}\n"
		}},
		{storeSchema.fields[9].node, func(v string) string {
			return up + "store: {type: redis, addrs: [127.0.0.1:6379], on_error: " + v + "}\n"
		}},
		{policySchema.fields[1].node, func(v string) string {
			if v == "concurrency" {
				return up + "policies: [{name: p, algorithm: concurrency, limit: 10}]\n"
			}
			return up + "policies: [{name: p, algorithm: " + v + ", limit: 10, period: 1s}]\n"
		}},
		{logSchema.fields[0].node, func(v string) string { return up + "log: {format: " + v + "}\n" }},
		{policySchema.fields[8].node, func(v string) string {
			return up + "policies: [{name: p, algorithm: fixed-window, limit: 10, calendar: " + v + "}]\n"
		}},
		{quotaBucketSchema.fields[2].node, func(v string) string {
			return up + "rls: {listen: 127.0.0.1:8081, quota: {buckets: [{name: b, match: {user: \"*\"}, blanket: " + v + "}]}}\n"
		}},
	}
	for _, c := range cases {
		if c.node.kind != kEnum {
			t.Fatalf("not an enum: %+v", c.node)
		}
		for _, v := range append(c.node.enum, "nonsense") {
			y := c.doc(v)
			_, perr := parse([]byte(y), "sluice.yaml", lookupEnv)
			verr := s.Validate(asJSON(t, y))
			if want := v != "nonsense"; (perr == nil) != want || (verr == nil) != want {
				t.Errorf("%s: Parse says %v, JSONSchema says %v", strings.TrimSpace(y), perr, verr)
			}
		}
	}
}

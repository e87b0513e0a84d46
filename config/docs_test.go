package config

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestDocsExamples parses every YAML example in docs/config.md, so that the documentation cannot
// drift from the parser. A fragment gets what it needs around it: an upstream, the policies and
// identity sources it refers to.
func TestDocsExamples(t *testing.T) {
	for i, ex := range docsExamples(t) {
		b, y := ex[0], ex[1]
		cfg, err := parse([]byte(y), "config.md", lookupEnv)
		if err != nil {
			t.Errorf("example %d:\n%s\n%v", i+1, b, err)
			continue
		}
		if strings.Contains(y, "demo-partner") { // the documented demo is Demo's
			demo, _ := Demo("http://127.0.0.1:41234")
			if got, want := summary(cfg), summary(demo); got != want {
				t.Errorf("the documented demo is\n%s\nDemo is\n%s", got, want)
			}
		}
	}
}

// docsExamples returns every YAML example of docs/config.md, as written and as parsed: a fragment
// gets what it needs around it (an upstream, the policies and identity sources it refers to).
func docsExamples(t *testing.T) [][2]string {
	doc, err := os.ReadFile("../docs/config.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllSubmatch(doc, -1)
	if len(blocks) < 8 {
		t.Fatalf("%d YAML examples in docs/config.md", len(blocks))
	}
	fix := strings.NewReplacer(
		`"<hex sha-256 of the key>"`, sum("doc-a"), `"<hex>"`, sum("doc-b"),
		"<the demo backend's free port>", "41234", "/etc/sluice/", fixtures(t)+"/")
	var out [][2]string
	for _, b := range blocks {
		y := fix.Replace(dedent(string(b[1])))
		has := func(field string) bool { return regexp.MustCompile(`(?m)^` + field + `:`).MatchString(y) }
		if !has("upstream") {
			y += up
		}
		if !has("policies") {
			y += "policies:\n"
			for _, name := range []string{"per-second", "per-day", "large", "bulk-queue"} {
				y += "  - {name: " + name + ", algorithm: fixed-window, limit: 100, period: 1s}\n"
			}
		}
		if !has("identity") && strings.Contains(y, "jwt_subject") {
			y += "identity: [api_key: {}, jwt: {secret_env: JWT_SECRET}, ip: {}]\n"
		}
		out = append(out, [2]string{string(b[1]), y})
	}
	return out
}

// summary prints what a configuration decides, for comparing two.
func summary(c *Config) string {
	var b strings.Builder
	fmt.Fprintln(&b, c.Upstream, c.Listen, c.AdminListen, c.Store.Type, c.DefaultPolicy)
	for _, id := range c.Identity {
		fmt.Fprintf(&b, "%s %+v %+v\n", id.Kind(), id.APIKey, id.IP)
	}
	for _, p := range c.Policies {
		fmt.Fprintf(&b, "%+v %v\n", p.Policy, p.DryRun)
	}
	for _, cl := range c.Clients {
		fmt.Fprintln(&b, cl.Name, cl.APIKeySHA256, cl.JWTSubject, cl.Policy)
	}
	for _, r := range c.Routes {
		fmt.Fprintln(&b, r.Method, r.PathPrefix, r.Cost, r.Policy, r.Scope)
	}
	return b.String()
}

// dedent removes the indentation of a block indented as a whole (an example inside a list item).
func dedent(s string) string {
	lines := strings.Split(s, "\n")
	indent := -1
	for _, l := range lines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		if n := len(l) - len(strings.TrimLeft(l, " ")); indent < 0 || n < indent {
			indent = n
		}
	}
	for i, l := range lines {
		if len(l) >= indent && indent > 0 {
			lines[i] = l[indent:]
		}
	}
	return strings.Join(lines, "\n")
}

package config

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/shed"
)

const shedClients = `identity: [api_key: {}]
clients:
  - {name: partner-a, api_key_sha256: ` + "0000000000000000000000000000000000000000000000000000000000000000" + `}
  - {name: partner-b, api_key_sha256: ` + "1111111111111111111111111111111111111111111111111111111111111111" + `}
`

// TestLoadShedding: load_shedding's defaults, its fields, and the priority of each client.
func TestLoadShedding(t *testing.T) {
	cfg, err := parseTest(t, up+shedClients+"load_shedding: {}\n")
	if err != nil {
		t.Fatal(err)
	}
	l := cfg.LoadShedding
	want := shed.Params{MinLimit: 4, MaxLimit: 1000, Window: time.Second, BaselineWindow: time.Minute, Tolerance: 2, Slack: 5 * time.Millisecond}
	if l == nil || l.Params != want || l.RetryAfter != time.Second || l.Priority("anonymous", nil) != shed.Low || l.Priority("partner-a", nil) != shed.Normal {
		t.Fatalf("defaults: %+v", l)
	}
	if cfg, _ := parseTest(t, up); cfg.LoadShedding != nil {
		t.Fatal("no load_shedding section: no shedding")
	}
	cfg, err = parseTest(t, up+shedClients+`load_shedding:
  min_limit: 2
  max_limit: 50
  window: 250ms
  baseline_window: 30s
  tolerance: 1.5
  slack: 0s
  retry_after: 2s
  default_priority: low
  priorities: {partner-a: high, anonymous: normal}
`)
	if err != nil {
		t.Fatal(err)
	}
	l = cfg.LoadShedding
	want = shed.Params{MinLimit: 2, MaxLimit: 50, Window: 250 * time.Millisecond, BaselineWindow: 30 * time.Second, Tolerance: 1.5}
	if l.Params != want || l.RetryAfter != 2*time.Second || l.Line != 7 {
		t.Fatalf("%+v", l)
	}
	for client, p := range map[string]shed.Priority{"partner-a": shed.High, "partner-b": shed.Low, "anonymous": shed.Normal} {
		if got := l.Priority(client, nil); got != p {
			t.Errorf("%s: %v, want %v", client, got, p)
		}
	}
}

// TestLoadSheddingErrors: each bad field is one error at its line, naming it.
func TestLoadSheddingErrors(t *testing.T) {
	for _, c := range []struct {
		name, yaml string
		line       int
		words      []string
	}{
		{"unknown field", "  max_limt: 5\n", 7, []string{`unknown field "max_limt"`, `"max_limit"`}},
		{"min above max", "  min_limit: 10\n  max_limit: 5\n", 7, []string{"min_limit 10 is above max_limit 5"}},
		{"zero limit", "  max_limit: 0\n", 7, []string{"max_limit 0 must be from 1"}},
		{"limit not an integer", "  min_limit: two\n", 7, []string{"min_limit", "must be an integer"}},
		{"window too short", "  window: 0s\n", 7, []string{"window 0s must be ≥ 1ms"}},
		{"baseline shorter than window", "  window: 10s\n  baseline_window: 5s\n", 8, []string{"baseline_window 5s is shorter than window 10s"}},
		{"tolerance below 1", "  tolerance: 0.5\n", 7, []string{"tolerance 0.5 must be from 1 to 100"}},
		{"retry_after not whole seconds", "  retry_after: 1500ms\n", 7, []string{"retry_after 1.5s must be whole seconds"}},
		{"retry_after too short", "  retry_after: 0s\n", 7, []string{"retry_after 0s must be ≥ 1s"}},
		{"unknown priority", "  default_priority: urgent\n", 7, []string{`default_priority "urgent" must be low, normal or high`}},
		{"unknown client", "  priorities: {partner-z: high}\n", 7, []string{`priorities names "partner-z", which is no configured client`, "partner-a"}},
		{"bad client priority", "  priorities:\n    partner-a: top\n", 8, []string{`priorities.partner-a "top" must be low, normal or high`}},
		{"priorities not a mapping", "  priorities: [partner-a]\n", 7, []string{"priorities must be a mapping"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := parseTest(t, up+shedClients+"load_shedding:\n"+c.yaml)
			var errs Errors
			if !errors.As(err, &errs) || cfg != nil {
				t.Fatalf("got %v, %v; want errors", cfg, err)
			}
			if len(errs) != 1 {
				t.Fatalf("%d errors, want 1:\n%v", len(errs), err)
			}
			if errs[0].Line != c.line {
				t.Errorf("at line %d, want %d: %v", errs[0].Line, c.line, errs[0])
			}
			for _, w := range append(c.words, "load_shedding") {
				if !strings.Contains(errs[0].Error(), w) {
					t.Errorf("%q does not say %q", errs[0].Error(), w)
				}
			}
		})
	}
	if _, err := parseTest(t, "listen: \"\"\n"+shedClients+"load_shedding: {}\n"); err == nil || !strings.Contains(err.Error(), "no proxy listener") {
		t.Errorf("load_shedding without a proxy: %v", err)
	}
}

// TestRoutePriority: a route's priority is every request's on it, whoever sends it (it lowers a
// high client and raises anonymous); without one the client's stands. A bad one, and one without
// load_shedding, are errors at their line.
func TestRoutePriority(t *testing.T) {
	cfg, err := parseTest(t, up+shedClients+`routes:
  - {path_prefix: /reports, priority: low}
  - {path_prefix: /checkout, method: POST, priority: high}
  - {path_prefix: /other}
load_shedding:
  priorities: {partner-a: high}
`)
	if err != nil {
		t.Fatal(err)
	}
	l := cfg.LoadShedding
	route := func(method, path string) *Route {
		rt, _ := cfg.Route(method, path)
		return rt
	}
	for _, c := range []struct {
		client, method, path string
		want                 shed.Priority
	}{
		{"partner-a", "GET", "/reports/2026", shed.Low},
		{"anonymous", "POST", "/checkout", shed.High},
		{"anonymous", "GET", "/checkout", shed.Low}, // the route is POST's only
		{"partner-a", "GET", "/other", shed.High},
		{"partner-b", "GET", "/other", shed.Normal},
		{"partner-b", "GET", "/elsewhere", shed.Normal},
	} {
		if got := l.Priority(c.client, route(c.method, c.path)); got != c.want {
			t.Errorf("%s %s %s: %v, want %v", c.client, c.method, c.path, got, c.want)
		}
	}
	for _, c := range []struct {
		name, yaml string
		line       int
		words      []string
	}{
		{"unknown priority", "routes:\n  - {path_prefix: /a, priority: urgent}\nload_shedding: {}\n", 7,
			[]string{`routes[0] "/a"`, `priority "urgent" must be low, normal or high`}},
		{"not a string", "routes:\n  - path_prefix: /a\n    priority: [low]\nload_shedding: {}\n", 8, []string{"priority"}},
		{"without load_shedding", "routes:\n  - {path_prefix: /a}\n  - {path_prefix: /b, priority: low}\n", 8,
			[]string{`routes[1] "/b"`, "priority orders what load shedding sheds first, and there is no load_shedding section"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := parseTest(t, up+shedClients+c.yaml)
			var errs Errors
			if !errors.As(err, &errs) || cfg != nil || len(errs) != 1 {
				t.Fatalf("got %v, %v; want one error", cfg, err)
			}
			if errs[0].Line != c.line {
				t.Errorf("at line %d, want %d: %v", errs[0].Line, c.line, errs[0])
			}
			for _, w := range c.words {
				if !strings.Contains(errs[0].Error(), w) {
					t.Errorf("%q does not say %q", errs[0].Error(), w)
				}
			}
		})
	}
}

package config

import (
	"errors"
	"strings"
	"testing"
)

// FuzzParse: no input panics, hangs or gives an error without a place; every error is sorted by
// line; a configuration that parses answers every lookup.
func FuzzParse(f *testing.F) {
	dir := fixtures(f)
	f.Add(designYAML)
	f.Add(strings.ReplaceAll(fullYAML, "$DIR", dir))
	f.Add(string(DemoYAML("http://127.0.0.1:1")))
	f.Add("upstream: http://u\nx-a: &a {name: p, algorithm: fixed-window, limit: 1, period: 1s}\npolicies: [*a, {<<: *a, name: q}]\n")
	for _, c := range errorCases {
		f.Add(strings.ReplaceAll(c.yaml, "$DIR", dir))
	}
	f.Fuzz(func(t *testing.T, yaml string) {
		cfg, err := parse([]byte(yaml), "f.yaml", lookupEnv)
		if err != nil {
			if cfg != nil {
				t.Fatal("a Config with an error")
			}
			var errs Errors
			if !errors.As(err, &errs) || len(errs) == 0 {
				t.Fatalf("%T %v", err, err)
			}
			for i, e := range errs {
				if e.File != "f.yaml" || e.Msg == "" || (i > 0 && e.Line < errs[i-1].Line) {
					t.Fatalf("error %d: %#v in\n%v", i, e, err)
				}
			}
			return
		}
		_ = cfg.String()
		for _, r := range append(cfg.Routes, nil) {
			for _, c := range append(cfg.Clients, nil) {
				for _, p := range cfg.PoliciesFor(c, r) {
					if err := p.Validate(); err != nil {
						t.Fatalf("an invalid policy applies: %v", err)
					}
				}
			}
			if r != nil {
				if got, ok := cfg.Route(r.Method, r.PathPrefix); !ok || len(got.PathPrefix) < len(r.PathPrefix) {
					t.Fatalf("Route(%q, %q) = %+v", r.Method, r.PathPrefix, got)
				}
			}
		}
		for _, c := range cfg.Clients {
			for _, h := range c.APIKeySHA256 {
				if got, ok := cfg.ClientByKeyHash(h); !ok || got != c {
					t.Fatalf("ClientByKeyHash(%s)", h)
				}
			}
		}
	})
}

// TestAliasBomb: aliases that multiply the work are cut off with an error, quickly.
func TestAliasBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString("upstream: http://u\nx-l: &l [")
	for i := range 1000 {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("10.0.0.1")
	}
	b.WriteString("]\nx-m: &m {ip: {trusted_proxies: *l}}\nidentity: [")
	for i := range 2000 {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("*m")
	}
	b.WriteString("]\n")
	// The parser stops expanding at its alias budget (the error says so) instead of building
	// two million addresses; that refusal, not a stopwatch (this machine may be loaded), is
	// what bounds the work.
	_, err := parseTest(t, b.String())
	if err == nil || !strings.Contains(err.Error(), "too many aliases") {
		t.Errorf("error: %.300v", err)
	}
}

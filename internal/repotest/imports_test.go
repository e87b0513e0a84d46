package repotest

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/sluicehq/sluice"

// layers are the architecture's import rules: a package (or every package under it) must not
// import the packages listed (nor anything under them). The decision layer and config build
// nothing; only the composition root (cmd/sluice), the simulator and tests open stores.
var layers = map[string][]string{
	"config":     {"store", "gateway", "decision", "rls", "web", "middleware", "sim", "cmd"},
	"identity":   {"store", "gateway", "decision", "config", "rls", "web"},
	"answer":     {"store", "gateway", "decision", "config", "rls", "web"},
	"decision":   {"store", "gateway", "rls", "web", "middleware", "sim", "cmd"},
	"gateway":    {"store", "web", "rls", "middleware", "sim", "cmd"},
	"clients":    {"store", "gateway", "decision", "web", "rls", "middleware", "sim", "cmd"}, // the clients API: a store's registry through clients/registry
	"rls":        {"store", "gateway", "web", "middleware", "sim", "cmd"},
	"middleware": {"store", "gateway", "web", "rls", "sim", "cmd"},
	"algorithm":  {""},                                                                                                                    // nothing of ours at all
	"shed":       {""},                                                                                                                    // load shedding's limiter: pure, nothing of ours
	"llm":        {"store", "gateway", "decision", "config", "answer", "identity", "rls", "web", "middleware", "sim", "cmd", "algorithm"}, // reads LLM APIs' bodies: pure
}

// TestImportLayers checks the non-test imports of every package against layers.
func TestImportLayers(t *testing.T) {
	out, err := exec.Command("go", "list", "-e", "-json=ImportPath,Imports", module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	seen := 0
	for dec.More() {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		for layer, banned := range layers {
			if rel != layer && !strings.HasPrefix(rel, layer+"/") {
				continue
			}
			seen++
			for _, imp := range p.Imports {
				if imp != module && !strings.HasPrefix(imp, module+"/") {
					continue
				}
				irel := strings.TrimPrefix(strings.TrimPrefix(imp, module), "/")
				if strings.HasPrefix(irel, layer+"/") || irel == layer {
					continue // its own sub-packages
				}
				for _, b := range banned {
					if b == "" || irel == b || strings.HasPrefix(irel, b+"/") {
						t.Errorf("%s imports %s: the layers forbid %s → %s", rel, irel, layer, b)
					}
				}
			}
		}
	}
	if seen < len(layers) {
		t.Fatalf("only %d packages matched the %d layers: has the layout changed?", seen, len(layers))
	}
}

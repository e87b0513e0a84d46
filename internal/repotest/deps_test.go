package repotest

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// jwtFree are the packages a program may import without carrying a JWT library: the library
// (sluice), its net/http middleware, and the layers under it. Only identity/jwt imports one, and
// only what builds identity sources from a configuration (the gateway, the CLI) imports it.
var jwtFree = []string{"", "middleware", "decision", "identity", "config", "answer", "algorithm"}

// jwtModules are the JWT libraries such a package must not depend on, even indirectly.
var jwtModules = []string{"github.com/golang-jwt/"}

// TestNoJWTDependency lists every dependency of the JWT-free packages (go list -deps: the import
// graph the build would compile, whatever the build constraints of this machine) and fails on a
// JWT library among them, naming the path that brings it in.
func TestNoJWTDependency(t *testing.T) {
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	for _, rel := range jwtFree {
		pkg := module
		if rel != "" {
			pkg += "/" + rel
		}
		out, err := exec.Command(goTool, "list", "-deps", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		importers := map[string]string{} // a dependency → one package that imports it
		var found []string
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			fields := strings.Fields(line)
			if len(fields) == 0 {
				continue
			}
			for _, imp := range fields[1:] {
				if _, ok := importers[imp]; !ok {
					importers[imp] = fields[0]
				}
			}
			for _, m := range jwtModules {
				if strings.HasPrefix(fields[0], m) {
					found = append(found, fields[0])
				}
			}
		}
		for _, dep := range found {
			chain := []string{dep}
			for p := dep; importers[p] != "" && len(chain) < 20; p = importers[p] {
				chain = append(chain, importers[p])
			}
			slices.Reverse(chain)
			t.Errorf("%s depends on %s: %s", pkg, dep, strings.Join(chain, " → "))
		}
	}
}

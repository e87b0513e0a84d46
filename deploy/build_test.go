// Package deploy holds no code: its tests check the deployment files beside them (systemd/,
// and the others' directories) against a real sluice binary and the real tools that read them.
package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sync"
	"testing"
)

// The binary, built once per run.
var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

// sluiceBinary returns the path of a sluice binary built from ./cmd/sluice (with -race when this
// test binary was), building it on first use, in a temporary directory that TestMain removes.
func sluiceBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "sluice-deploy-bin-")
		if err != nil {
			buildErr = err
			return
		}
		goTool, err := exec.LookPath("go")
		if err != nil {
			goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		bin := filepath.Join(dir, "sluice")
		args := []string{"build", "-o", bin}
		if raceEnabled() {
			args = append(args, "-race")
		}
		// The package path, not a relative directory: it builds the same from any directory of
		// the module.
		out, err := exec.Command(goTool, append(args, "github.com/sluicehq/sluice/cmd/sluice")...).CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
			os.RemoveAll(dir)
			return
		}
		builtBin = bin
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

// raceEnabled reports whether this test binary was built with -race.
func raceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" && s.Value == "true" {
			return true
		}
	}
	return false
}

// TestMain removes the built binary after the run.
func TestMain(m *testing.M) {
	code := m.Run()
	if builtBin != "" {
		os.RemoveAll(filepath.Dir(builtBin))
	}
	os.Exit(code)
}

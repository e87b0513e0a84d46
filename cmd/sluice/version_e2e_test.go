package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The sluice_build_info metric says what --version says, for a binary built as
// scripts/build-image.sh builds the container image's (-trimpath, -ldflags "-s -w -X
// main.version=…"): it said version="(devel)", commit="unknown" while --version said the version
// the build stamped.
func TestBuildInfoMetricAgreesWithVersion(t *testing.T) {
	t.Parallel()
	bin := buildSluice(t, "-trimpath", "-ldflags", "-s -w -X main.version=v9.8.7-3-gabc1234 -X main.commit=abc1234def -X main.date=2026-02-03T04:05:06Z")
	line := strings.TrimSpace(output(t, bin, "--version"))
	if line != "sluice v9.8.7-3-gabc1234 (commit abc1234def, 2026-02-03T04:05:06Z)" {
		t.Fatalf("--version: %q", line)
	}
	dir := t.TempDir()
	listen, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	admin, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "sluice.yaml")
	writeFile(t, cfg, fmt.Sprintf("listen: %s\nadmin_listen: %s\nupstream: http://127.0.0.1:9\n", listen, admin))
	cmd := exec.Command(bin, "serve", "--config", cfg, "--watch", "0")
	stderr := &syncBuffer{}
	cmd.Stderr, cmd.Env = stderr, sluiceEnv()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Signal(os.Interrupt); _ = cmd.Wait() }()
	var labels map[string]string
	for deadline := time.Now().Add(20 * time.Second); labels == nil; {
		if time.Now().After(deadline) {
			t.Fatalf("no sluice_build_info on /metrics in 20 s\nstderr:\n%s", stderr.String())
		}
		resp, err := e2eClient.Get("http://" + admin + "/metrics")
		if err != nil {
			time.Sleep(20 * time.Millisecond) // polling for the listener, with a deadline
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, l := range strings.Split(string(body), "\n") {
			if name, ls, _, ok := parseSample(l); ok && name == "sluice_build_info" {
				labels = ls
			}
		}
		if labels == nil {
			t.Fatalf("/metrics has no sluice_build_info:\n%s", body)
		}
	}
	if got := fmt.Sprintf("sluice %s (commit %s, %s)", labels["version"], labels["commit"], labels["commit_time"]); got != line {
		t.Errorf("sluice_build_info says %q (%v); --version says %q", got, labels, line)
	}
}

package deploy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/config"
)

// The unit as shipped, and where it expects the binary.
const (
	unitFile    = "systemd/sluice.service"
	installedAt = "/usr/local/bin/sluice"
)

// maxExposure bounds the unit's `systemd-analyze security` exposure (0 is the best, 10 the
// worst): it scored 1.2 with systemd 252, and one sandboxing line lost costs 0.1 to 0.5, so this
// catches losing a few (ProtectSystem, DynamicUser and the capabilities together make 3.5).
const maxExposure = 2.0

// systemdAnalyze returns the path of systemd-analyze, failing the test when it is missing:
// scripts/test.sh installs it (Debian package systemd), so a machine without it is not set up.
func systemdAnalyze(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Fatalf("systemd-analyze is not installed (Debian: apt-get install systemd; scripts/test.sh does it): %v", err)
	}
	return path
}

// readUnit returns the unit file's text.
func readUnit(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// unitValue returns the value of the last "key=value" line for key (the one systemd keeps for a
// single-valued setting), and whether there is one. Comments and section headers are skipped.
func unitValue(unit, key string) (string, bool) {
	value, found := "", false
	for _, line := range strings.Split(unit, "\n") {
		line = strings.TrimSpace(line)
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") && strings.TrimSpace(k) == key {
			value, found = strings.TrimSpace(v), true
		}
	}
	return value, found
}

// withBinary returns unit with ExecStart's program replaced by bin (verify requires it to exist).
func withBinary(t *testing.T, unit, bin string) string {
	t.Helper()
	if !strings.Contains(unit, "\nExecStart="+installedAt+" ") {
		t.Fatalf("%s: ExecStart does not run %s", unitFile, installedAt)
	}
	return strings.Replace(unit, "\nExecStart="+installedAt+" ", "\nExecStart="+bin+" ", 1)
}

// writeUnit writes unit as sluice.service (the name matters: DynamicUser's user is named after
// it) in a directory of its own and returns the path.
func writeUnit(t *testing.T, unit string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sluice.service")
	if err := os.WriteFile(path, []byte(unit), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// hostUnit matches verify's lines about the host's own units (those ours pulls in, such as
// network-online.target): not ours to fix, so they are only logged.
var hostUnit = regexp.MustCompile(`^(/usr)?/lib/systemd/|^/etc/systemd/|^/run/systemd/`)

// verifyProblems runs `systemd-analyze verify` on unit and returns what is wrong with it: its
// exit status when not 0, and every line it prints (verify prints nothing for a good unit, and
// exits 0 even for an unknown directive: "Unknown key 'ProtectHomee' in section [Service],
// ignoring." is only a line).
func verifyProblems(t *testing.T, unit string) []string {
	t.Helper()
	path := writeUnit(t, unit)
	cmd := exec.Command(systemdAnalyze(t), "verify", path)
	// No pager, no colours, and the same words in any locale.
	cmd.Env = append(os.Environ(), "SYSTEMD_PAGER=", "SYSTEMD_COLORS=0", "LC_ALL=C")
	out, err := cmd.CombinedOutput()
	var problems []string
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		problems = append(problems, fmt.Sprintf("systemd-analyze verify exited with %d", exit.ExitCode()))
	case err != nil:
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		switch {
		case line == "":
		case hostUnit.MatchString(line):
			t.Logf("systemd-analyze verify, about a host unit: %s", line)
		default:
			problems = append(problems, line)
		}
	}
	return problems
}

// TestSystemdUnitVerifies: systemd-analyze verify accepts the unit (with ExecStart on a real
// sluice binary) without a word: every directive is known and well-formed.
func TestSystemdUnitVerifies(t *testing.T) {
	unit := withBinary(t, readUnit(t), sluiceBinary(t))
	if problems := verifyProblems(t, unit); len(problems) > 0 {
		t.Fatalf("systemd-analyze verify %s:\n%s", unitFile, strings.Join(problems, "\n"))
	}
	out, err := exec.Command(systemdAnalyze(t), "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", strings.SplitN(string(out), "\n", 2)[0])
}

// TestSystemdVerifyCatchesMistakes: the check above is not blind. A misspelt directive (which
// verify only mentions, exiting 0) and an ExecStart on a missing binary both fail it.
func TestSystemdVerifyCatchesMistakes(t *testing.T) {
	unit := withBinary(t, readUnit(t), sluiceBinary(t))
	if !strings.Contains(unit, "\nProtectHome=yes\n") {
		t.Fatalf("%s: no ProtectHome=yes line to misspell", unitFile)
	}
	typo := strings.Replace(unit, "\nProtectHome=yes\n", "\nProtectHomee=yes\n", 1)
	problems := verifyProblems(t, typo)
	if len(problems) == 0 || !strings.Contains(strings.Join(problems, "\n"), "ProtectHomee") {
		t.Errorf("a unit with ProtectHomee=yes: problems %q; want one naming ProtectHomee", problems)
	}
	missing := strings.Replace(unit, "\nExecStart="+sluiceBinary(t)+" ", "\nExecStart=/nonexistent/sluice ", 1)
	if problems := verifyProblems(t, missing); len(problems) == 0 {
		t.Errorf("a unit whose ExecStart is /nonexistent/sluice: no problems; want some")
	}
}

var exposureLine = regexp.MustCompile(`Overall exposure level for sluice\.service: ([0-9]+\.[0-9]+) (\S+)`)

// TestSystemdSecurity: systemd-analyze security (offline: it reads the file, no running systemd
// needed) rates the unit's sandbox below maxExposure.
func TestSystemdSecurity(t *testing.T) {
	path := writeUnit(t, withBinary(t, readUnit(t), sluiceBinary(t)))
	cmd := exec.Command(systemdAnalyze(t), "security", "--offline=yes", "--no-pager", path)
	cmd.Env = append(os.Environ(), "SYSTEMD_COLORS=0", "LC_ALL=C")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-analyze security: %v\n%s", err, out)
	}
	m := exposureLine.FindSubmatch(out)
	if m == nil {
		t.Fatalf("systemd-analyze security printed no overall exposure level:\n%s", out)
	}
	exposure, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("systemd-analyze security: exposure %.1f %s", exposure, m[2])
	if exposure >= maxExposure {
		t.Errorf("systemd-analyze security: exposure %.1f %s; want below %.1f\n%s", exposure, m[2], maxExposure, out)
	}
}

// lineWaiter reads a process's log lines and waits for one containing a string.
type lineWaiter struct {
	lines chan string
	seen  strings.Builder
}

func (w *lineWaiter) waitFor(t *testing.T, what string, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case line, ok := <-w.lines:
			if !ok {
				t.Fatalf("sluice exited before logging %q:\n%s", what, w.seen.String())
			}
			w.seen.WriteString(line + "\n")
			if strings.Contains(line, what) {
				return
			}
		case <-deadline:
			t.Fatalf("sluice did not log %q within %v:\n%s", what, timeout, w.seen.String())
		}
	}
}

// TestSystemdCommandsRunSluice: the unit's commands do what it says with a real sluice. ExecStart
// (its flags exist; the configuration is in the ConfigurationDirectory) serves, ExecReload's
// kill -HUP reloads the configuration, and KillSignal stops it with exit 0 (no restart under
// Restart=on-failure) well within TimeoutStopSec, which is above the default drain_timeout.
func TestSystemdCommandsRunSluice(t *testing.T) {
	unit := readUnit(t)
	value := func(key string) string {
		t.Helper()
		v, ok := unitValue(unit, key)
		if !ok {
			t.Fatalf("%s: no %s=", unitFile, key)
		}
		return v
	}
	stopTimeout, err := time.ParseDuration(value("TimeoutStopSec"))
	if err != nil {
		t.Fatalf("%s: TimeoutStopSec: %v", unitFile, err)
	}
	if stopTimeout <= config.DefaultDrainTimeout {
		t.Errorf("%s: TimeoutStopSec=%v; want above the default drain_timeout %v, or systemd kills the drain", unitFile, stopTimeout, config.DefaultDrainTimeout)
	}
	if got := value("KillSignal"); got != "SIGTERM" {
		t.Fatalf("%s: KillSignal=%s; sluice drains on SIGTERM", unitFile, got)
	}

	args := strings.Fields(value("ExecStart"))
	if args[0] != installedAt {
		t.Fatalf("%s: ExecStart runs %s; want %s", unitFile, args[0], installedAt)
	}
	configDir := "/etc/" + value("ConfigurationDirectory") + "/"
	cfgPath := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(cfgPath, []byte(`listen: 127.0.0.1:0
admin_listen: ""
upstream: http://127.0.0.1:1
store: {type: memory}
identity:
  - ip: {}
policies:
  - {name: anonymous, algorithm: token-bucket, limit: 10, period: 1s}
default_policy: anonymous
`), 0o644); err != nil {
		t.Fatal(err)
	}
	replaced := false
	for i, a := range args {
		if strings.HasPrefix(a, configDir) && strings.HasSuffix(a, ".yaml") {
			args[i], replaced = cfgPath, true
		}
	}
	if !replaced {
		t.Fatalf("%s: ExecStart %q names no configuration file in %s (ConfigurationDirectory)", unitFile, value("ExecStart"), configDir)
	}
	args[0] = sluiceBinary(t)

	cmd := exec.Command(args[0], args[1:]...)
	// Its log through a pipe of our own: Wait returns once sluice has exited and the copy into
	// the pipe is done, and then the pipe is closed, which ends the reader.
	logR, logW := io.Pipe()
	cmd.Stderr = logW
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &lineWaiter{lines: make(chan string, 64)}
	go func() {
		s := bufio.NewScanner(logR)
		for s.Scan() {
			w.lines <- s.Text()
		}
		close(w.lines)
	}()
	exited := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		logW.Close()
		exited <- err
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	w.waitFor(t, "sluice serving", 30*time.Second)

	// ExecReload, run as systemd would, $MAINPID being sluice's pid.
	reload := strings.Fields(strings.ReplaceAll(value("ExecReload"), "$MAINPID", strconv.Itoa(cmd.Process.Pid)))
	if out, err := exec.Command(reload[0], reload[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("ExecReload %q: %v\n%s", reload, err, out)
	}
	w.waitFor(t, "configuration reloaded", 30*time.Second)

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	w.waitFor(t, "shutting down", 30*time.Second)
	// Drain what is left so that Wait can return.
	go func() {
		for range w.lines {
		}
	}()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("sluice after KillSignal: %v; want exit 0\n%s", err, w.seen.String())
		}
	case <-time.After(stopTimeout):
		t.Fatalf("sluice did not exit within TimeoutStopSec=%v after KillSignal", stopTimeout)
	}
}

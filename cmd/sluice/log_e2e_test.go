package main

import (
	"encoding/json"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// With log: {format: json}, every line sluice writes to standard error is one JSON object with a
// time, a level and a message: at start, on a reload (a bad one too), and at shutdown.
func TestServeE2EJSONLogs(t *testing.T) {
	up := newUpstream(t)
	dir := t.TempDir()
	p := startSluice(t, dir, "sluice.yaml", openConfig(up.URL, "log: {format: json}\n"))
	resp, err := e2eClient.Get(p.proxy + "/a")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	writeFile(t, p.config, "upstream: [not, a, url]\n")
	p.signal(syscall.SIGHUP)
	waitLog(t, p, "configuration not reloaded")
	if code := p.stop(); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	lines := strings.Split(strings.TrimSpace(p.stderr.String()), "\n")
	if len(lines) < 4 {
		t.Fatalf("%d log lines:\n%s", len(lines), p.stderr.String())
	}
	for i, line := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("line %d is not JSON (%v): %q", i+1, err, line)
		}
		for _, k := range []string{"time", "level", "msg"} {
			if _, ok := rec[k]; !ok {
				t.Errorf("line %d has no %q: %q", i+1, k, line)
			}
		}
	}
	if !strings.Contains(p.stderr.String(), `"level":"ERROR","msg":"configuration not reloaded`) {
		t.Errorf("the failed reload is not an ERROR line:\n%s", p.stderr.String())
	}
}

// log.level hides what is below it: at warn, the start's INFO lines are not written.
func TestServeE2ELogLevel(t *testing.T) {
	up := newUpstream(t)
	p := startSluice(t, t.TempDir(), "sluice.yaml", openConfig(up.URL, "log: {level: warn}\n"))
	if code := p.stop(); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	if s := p.stderr.String(); strings.Contains(s, "level=INFO") {
		t.Errorf("INFO lines at level warn:\n%s", s)
	}
}

// A reload changes the level: at warn, a good reload's INFO line is not written; after a reload
// to debug, the next one's is.
func TestServeE2ELogLevelReload(t *testing.T) {
	up := newUpstream(t)
	p := startSluice(t, t.TempDir(), "sluice.yaml", openConfig(up.URL, "log: {level: warn}\n"))
	old, err := os.ReadFile(p.config)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(string(old), "log: {level: warn}", "log: {level: debug}", 1)
	writeFile(t, p.config, text)
	p.signal(syscall.SIGHUP)
	// At warn, the reload logs nothing: its metric says when it is done.
	deadline := time.Now().Add(10 * time.Second)
	for p.metric(t, "sluice_config_reloads_total", map[string]string{"result": "ok"}) < 1 {
		if time.Now().After(deadline) {
			t.Fatal("the first reload did not happen")
		}
		time.Sleep(10 * time.Millisecond)
	}
	writeFile(t, p.config, text+"# again\n")
	p.signal(syscall.SIGHUP)
	waitLog(t, p, "configuration reloaded")
	if n := strings.Count(p.stderr.String(), "configuration reloaded"); n != 1 {
		t.Errorf("%d INFO lines for the two reloads, want 1 (the second, at debug):\n%s", n, p.stderr.String())
	}
}

// admin.metrics_listen is a listener of its own for /metrics, open while the admin listener
// wants its token.
func TestServeE2EMetricsListener(t *testing.T) {
	up := newUpstream(t)
	maddr, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("SLUICE_TEST_ADMIN_TOKEN", "e2e-admin-token")
	p := startSluice(t, t.TempDir(), "sluice.yaml", openConfig(up.URL, "admin: {token_env: SLUICE_TEST_ADMIN_TOKEN, metrics_listen: "+maddr+"}\n"))
	for url, want := range map[string]int{"http://" + maddr + "/metrics": 200, p.admin + "/metrics": 401, p.admin + "/readyz": 200} {
		resp, err := e2eClient.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s: %d, want %d", url, resp.StatusCode, want)
		}
	}
}

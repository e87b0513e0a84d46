package gateway_test

import (
	"bytes"
	"strings"
	"sync"
	"testing"
)

// lockedBuffer is a log a server writes while a test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// accessLines returns the access log's lines, each as key=value pairs.
func accessLines(log string) []map[string]string {
	var out []map[string]string
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, "msg=access") {
			continue
		}
		kv := map[string]string{}
		for _, f := range strings.Fields(line) {
			if k, v, ok := strings.Cut(f, "="); ok {
				kv[k] = strings.Trim(v, `"`)
			}
		}
		out = append(out, kv)
	}
	return out
}

// The access log: a line per request with the client, method, path (no query), policies,
// decision, status and times, on both engines; never the API key, not even in the query.
func TestAccessLog(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		up := newUpstream(t)
		var log lockedBuffer
		fe, _ := startLoggingTo(t, engine, `
upstream: UPSTREAM
identity:
  - api_key: {header: X-API-Key}
policies:
  - {name: standard, algorithm: fixed-window, limit: 2, period: 1h}
clients:
  - {name: partner-a, api_key_sha256: `+sum("secret-key-42")+`, policy: standard}
log: {access: true}
`, up, &log)
		for range 3 {
			get(t, fe.URL+"/orders?api_key=secret-key-42", "X-API-Key", "secret-key-42")
		}
		lines := accessLines(log.String())
		if len(lines) != 3 {
			t.Fatalf("%d access lines, want 3:\n%s", len(lines), log.String())
		}
		for i, want := range []struct{ decision, status string }{{"allowed", "200"}, {"allowed", "200"}, {"refused", "429"}} {
			l := lines[i]
			if l["client"] != "partner-a" || l["method"] != "GET" || l["path"] != "/orders" || l["policies"] != "standard" ||
				l["decision"] != want.decision || l["status"] != want.status || l["ms"] == "" {
				t.Errorf("line %d: %v", i, l)
			}
			if (want.status == "200") != (l["upstream_ms"] != "") {
				t.Errorf("line %d: upstream_ms %q for status %s", i, l["upstream_ms"], want.status)
			}
		}
		if strings.Contains(log.String(), "secret-key-42") {
			t.Errorf("the log holds the API key:\n%s", log.String())
		}
	})
}

// per_second bounds the lines; the ones left out are counted on the next line written.
func TestAccessLogBounded(t *testing.T) {
	up := newUpstream(t)
	var log lockedBuffer
	fe, _ := startLoggingTo(t, "fasthttp", `
upstream: UPSTREAM
log: {access: {per_second: 1}}
`, up, &log)
	for range 5 {
		get(t, fe.URL+"/x")
	}
	if n := len(accessLines(log.String())); n != 1 {
		t.Errorf("%d access lines for 5 requests at 1 a second, want 1", n)
	}
}

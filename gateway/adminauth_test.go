package gateway_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/gateway"
)

// adminWithToken serves the admin listener of a gateway whose admin.token_env holds token.
func adminWithToken(t *testing.T, token string) *httptest.Server {
	t.Helper()
	t.Setenv("SLUICE_TEST_ADMIN_TOKEN", token)
	cfg, err := config.Parse([]byte("upstream: http://127.0.0.1:9\nadmin: {token_env: SLUICE_TEST_ADMIN_TOKEN}\n"), "admin.yaml")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := gateway.NewTestServer(cfg, "", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	admin := httptest.NewServer(srv.Admin())
	t.Cleanup(admin.Close)
	return admin
}

// With admin.token_env, every admin endpoint but the probes and forward-auth wants the bearer
// token; a wrong one is refused like none, and the answer never echoes it.
func TestAdminToken(t *testing.T) {
	admin := adminWithToken(t, "s3cret-admin-token")
	do := func(method, path, token string) (int, string) {
		req, _ := http.NewRequest(method, admin.URL+path, strings.NewReader(`{"key":"k"}`))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode == http.StatusUnauthorized && resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s %s: 401 without WWW-Authenticate", method, path)
		}
		return resp.StatusCode, string(b)
	}
	for _, c := range []struct{ method, path string }{{"GET", "/metrics"}, {"GET", "/v1/stats"}, {"GET", "/v1/history"}, {"POST", "/v1/check"}, {"GET", "/operator/"}, {"GET", "/"}} {
		for _, tok := range []string{"", "wrong-token"} {
			if code, body := do(c.method, c.path, tok); code != http.StatusUnauthorized || strings.Contains(body, "s3cret") {
				t.Errorf("%s %s with token %q: %d %s, want 401", c.method, c.path, tok, code, body)
			}
		}
		if code, _ := do(c.method, c.path, "s3cret-admin-token"); code == http.StatusUnauthorized {
			t.Errorf("%s %s with the token: 401", c.method, c.path)
		}
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, _ := do("GET", path, ""); code != http.StatusOK {
			t.Errorf("%s without a token: %d, want 200 (probes carry none)", path, code)
		}
	}
	if code, _ := do("GET", "/v1/forward-auth", ""); code != http.StatusForbidden {
		t.Errorf("/v1/forward-auth without a token: %d, want 403 (its own rule: trusted proxies only)", code)
	}
}

// The metrics listener serves /metrics and /healthz, without a token, and nothing else.
func TestMetricsServer(t *testing.T) {
	t.Setenv("SLUICE_TEST_ADMIN_TOKEN", "s3cret-admin-token")
	cfg, err := config.Parse([]byte("upstream: http://127.0.0.1:9\nadmin: {token_env: SLUICE_TEST_ADMIN_TOKEN, metrics_listen: 127.0.0.1:0}\n"), "admin.yaml")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := gateway.NewTestServer(cfg, "", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	m := httptest.NewServer(srv.MetricsServer().Handler)
	defer m.Close()
	for path, want := range map[string]int{"/metrics": 200, "/healthz": 200, "/v1/stats": 404, "/v1/history": 404, "/operator/": 404} {
		resp, err := http.Get(m.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("metrics listener %s: %d, want %d", path, resp.StatusCode, want)
		}
	}
}

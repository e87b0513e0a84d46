package gateway_test

import (
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/gateway"
)

// reloadable starts a gateway from a configuration file holding yaml, with
// UPSTREAM replaced by up's URL, and returns it with a function that rewrites the file and
// reloads it.
func reloadable(t *testing.T, up *upstream, yaml string) (*gateway.Server, func(yaml string) error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	write := func(yaml string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(strings.ReplaceAll(yaml, "UPSTREAM", up.URL)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(yaml)
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := gateway.NewTestServer(cfg, path, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return srv, func(yaml string) error {
		write(yaml)
		return srv.Reload()
	}
}

// TestReloadKeepsWhatWasUsed: a client has used 2 of a policy's 2; the file is reloaded with
// limit 3, and exactly one more request passes (RateLimit r=0 on it), then 429. Lowered to 1
// instead, the 2 used stay counted: refused. For a sliding log and a token bucket (an hour's
// period: no window or refill comes between the requests).
func TestReloadKeepsWhatWasUsed(t *testing.T) {
	for _, alg := range []string{"sliding-log", "token-bucket"} {
		t.Run(alg, func(t *testing.T) {
			up := newUpstream(t)
			conf := func(limit string) string {
				return "upstream: UPSTREAM\npolicies: [{name: p, algorithm: " + alg + ", limit: " + limit + ", period: 1h}]\ndefault_policy: p\n"
			}
			srv, reload := reloadable(t, up, conf("2"))
			gw := httptest.NewServer(srv)
			defer gw.Close()
			expect := func(what string, code int, r string) {
				t.Helper()
				resp := get(t, gw.URL+"/a")
				if resp.StatusCode != code || !strings.HasPrefix(resp.Header.Get("RateLimit"), `"p";r=`+r+`;`) {
					t.Fatalf("%s: %d, RateLimit %q; want %d, r=%s", what, resp.StatusCode, resp.Header.Get("RateLimit"), code, r)
				}
			}
			expect("first of 2", 200, "1")
			expect("second of 2", 200, "0")
			expect("third of 2", 429, "0")
			if err := reload(conf("3")); err != nil {
				t.Fatal(err)
			}
			expect("the one more under 3", 200, "0")
			expect("the next under 3", 429, "0")
			if err := reload(conf("1")); err != nil {
				t.Fatal(err)
			}
			expect("3 used, lowered to 1", 429, "0")
			if err := reload(conf("5")); err != nil {
				t.Fatal(err)
			}
			expect("3 used, raised to 5", 200, "1")
		})
	}
}

package gateway_test

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/gateway"
	"github.com/sluicehq/sluice/internal/redistest"
)

// A gateway whose Redis never answers starts, is not ready, and closes promptly; a bad Redis
// option is still an error at start.
func TestRedisDownAtStartCloses(t *testing.T) {
	rs := redistest.Start(t)
	rs.Kill()
	cfg, err := config.Parse([]byte("upstream: http://127.0.0.1:9\nstore: {type: redis, addrs: ["+rs.Addr+"]}\n"), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := gateway.NewTestServer(cfg, "", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("NewServer with Redis down: %v", err)
	}
	st := stats(t, httptestServer(t, srv))
	if st.Store.Reachable || st.Store.Error == "" {
		t.Fatalf("store with Redis down: %+v", st.Store)
	}
	done := make(chan struct{})
	go func() { srv.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return within 5 s while Redis was down")
	}

	// A Redis that answers and refuses (a wrong password) is an error at start, not a wait.
	locked := redistest.Start(t, "--requirepass", "right-password")
	t.Setenv("SLUICE_TEST_REDIS_PASSWORD", "wrong-password")
	bad, err := config.Parse([]byte("upstream: http://127.0.0.1:9\nstore: {type: redis, addrs: ["+locked.Addr+"], password_env: SLUICE_TEST_REDIS_PASSWORD}\n"), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gateway.NewTestServer(bad, "", slog.New(slog.NewTextHandler(io.Discard, nil))); err == nil {
		t.Fatal("a wrong Redis password started a server")
	}
}

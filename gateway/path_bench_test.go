package gateway

import (
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/identity"
)

// BenchmarkDecisionPath is what the limiter adds to a forwarded request on the fasthttp engine:
// identify (an API key), judge (one token-bucket policy on the memory store, metrics, early
// retries) and the RateLimit fields, without the proxying.
func BenchmarkDecisionPath(b *testing.B) {
	srv := benchServer(b, "http://127.0.0.1:9")
	g := srv.current.Load()
	var ctx fasthttp.RequestCtx
	ctx.Init(&fasthttp.Request{}, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5000}, nil)
	ctx.Request.Header.SetMethod("GET")
	ctx.Request.SetRequestURI("/orders")
	ctx.Request.Header.Set("X-API-Key", "bench-key")
	b.ReportAllocs()
	for b.Loop() {
		req := g.policies.Resolve(fastRequest{&ctx}, b2s(ctx.Method()), b2s(ctx.Path()))
		v := g.decider.Decide(b.Context(), &req)
		if !v.Passes() {
			b.Fatal("refused")
		}
		ctx.Response.Header.Reset()
		g.fields(&ctx.Response.Header, v.Decisions)
		v.Release()
	}
}

// benchServer is a Server in front of upstream on the memory store: one token-bucket policy
// that refuses nothing, for the client with API key "bench-key", and the YAML lines extra (routes).
// It closes when b ends.
func benchServer(b *testing.B, upstream string, extra ...string) *Server {
	b.Helper()
	cfg, err := config.Parse([]byte(`
upstream: `+upstream+`
identity:
  - api_key: {}
policies:
  - {name: open, algorithm: token-bucket, limit: 1000000000, period: 1s}
clients:
  - {name: bench, api_key_sha256: `+identity.HashAPIKey("bench-key")+`, policy: open}
`+strings.Join(extra, "\n")), "bench.yaml")
	if err != nil {
		b.Fatal(err)
	}
	srv, err := NewTestServer(cfg, "", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.Close)
	return srv
}

// benchListen serves srv on the fasthttp engine on a loopback port until b ends, and returns
// its address.
func benchListen(b *testing.B, srv *Server) string {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	fs := srv.FastServer()
	go fs.Serve(ln)
	b.Cleanup(func() { fs.Shutdown() })
	return ln.Addr().String()
}

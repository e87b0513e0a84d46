package gateway_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// Both engines continue the caller's trace, pass their span on to the upstream as its parent,
// and record the store call as a child. (cmd/sluice's TestServeE2ETracing sends the spans to a
// real OTLP receiver.)
func TestTracingBothEngines(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	defer tp.Shutdown(t.Context())
	forEachEngine(t, func(t *testing.T, engine string) {
		var mu sync.Mutex
		var got string
		up := &upstream{count: map[string]int{}}
		up.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			got = r.Header.Get("Traceparent")
			mu.Unlock()
		}))
		t.Cleanup(up.Close)
		fe, _ := start(t, engine, `
upstream: UPSTREAM
policies: [{name: p, algorithm: token-bucket, limit: 100, period: 1s}]
default_policy: p
tracing: {otlp_endpoint: 127.0.0.1:4317}
`, up)
		trace := map[string]string{"fasthttp": "4bf92f3577b34da6a3ce929d0e0e4736", "nethttp": "5bf92f3577b34da6a3ce929d0e0e4737"}[engine]
		get(t, fe.URL+"/t", "Traceparent", "00-"+trace+"-00f067aa0ba902b7-01")
		mu.Lock()
		parts := strings.Split(got, "-")
		mu.Unlock()
		if len(parts) != 4 || parts[1] != trace || parts[2] == "00f067aa0ba902b7" {
			t.Fatalf("upstream traceparent %q", got)
		}
		var request, store sdktrace.ReadOnlySpan
		for _, s := range rec.Ended() {
			if s.SpanContext().TraceID().String() != trace {
				continue
			}
			if s.SpanContext().SpanID().String() == parts[2] {
				request = s
			}
			if strings.HasPrefix(s.Name(), "sluice.store") {
				store = s
			}
		}
		if request == nil || store == nil || store.Parent().SpanID() != request.SpanContext().SpanID() {
			t.Fatalf("spans: request %v, store %v", request, store)
		}
	})
}

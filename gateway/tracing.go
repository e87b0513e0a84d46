package gateway

import (
	"context"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decision"
)

// Tracing (config tracing): a span per proxied request, continuing the caller's W3C traceparent;
// a child span per store call; and the traceparent passed on to the upstream. The spans go to the
// global TracerProvider, which cmd/sluice sets to an OTLP exporter; without a tracing section the
// gateway starts no span at all.
var (
	tracer     = otel.Tracer("github.com/sluicehq/sluice/gateway")
	propagator = propagation.TraceContext{}
)

// startSpan starts a request's span from the traceparent carried in c.
func startSpan(ctx context.Context, c propagation.TextMapCarrier, method, path string) (context.Context, trace.Span) {
	ctx = propagator.Extract(ctx, c)
	return tracer.Start(ctx, "sluice "+method, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("http.request.method", method), attribute.String("url.path", path)))
}

// endSpan ends a request's span with what was decided and answered. The client is the configured
// one's name or "anonymous", never a key.
func endSpan(span trace.Span, req *decision.Request, o decision.Outcome, status int) {
	span.SetAttributes(attribute.String("sluice.client", req.Client), attribute.String("sluice.decision", o.String()),
		attribute.Int("http.response.status_code", status))
	if status >= 500 {
		span.SetStatus(codes.Error, "")
	}
	span.End()
}

// fastCarrier is a fasthttp request header as a propagation carrier.
type fastCarrier struct{ h *fasthttp.RequestHeader }

func (c fastCarrier) Get(key string) string { return string(c.h.Peek(key)) }
func (c fastCarrier) Set(key, value string) { c.h.Set(key, value) }
func (c fastCarrier) Keys() []string {
	var keys []string
	for k := range c.h.All() {
		keys = append(keys, string(k))
	}
	return keys
}

// tracedStore is the store with a span per call.
type tracedStore struct{ sluice.Store }

func (t tracedStore) Decide(ctx context.Context, key string, p sluice.Policy, cost int64) (sluice.Decision, error) {
	ctx, span := tracer.Start(ctx, "sluice.store Decide", trace.WithSpanKind(trace.SpanKindClient))
	d, err := t.Store.Decide(ctx, key, p, cost)
	endStoreSpan(span, err)
	return d, err
}

func (t tracedStore) DecideAll(ctx context.Context, key string, limits []sluice.Limit, out []sluice.Decision) (bool, error) {
	ctx, span := tracer.Start(ctx, "sluice.store DecideAll", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.Int("sluice.limits", len(limits))))
	ok, err := t.Store.DecideAll(ctx, key, limits, out)
	span.SetAttributes(attribute.Bool("sluice.allowed", ok))
	endStoreSpan(span, err)
	return ok, err
}

// Available is the store's, if it has one (the breaker: /readyz, /v1/stats).
func (t tracedStore) Available() bool {
	if a, ok := t.Store.(sluice.Available); ok {
		return a.Available()
	}
	return true
}

func endStoreSpan(span trace.Span, err error) {
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

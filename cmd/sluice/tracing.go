package main

import (
	"context"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/sluicehq/sluice/config"
)

// startTracing makes the OTLP exporter of cfg (nil: none; over gRPC or HTTP by cfg.Protocol) the
// global TracerProvider, which
// the gateway's spans go to, with W3C trace context as the propagator; it returns the function
// that flushes and stops it. The exporter connects lazily: a collector that is down costs spans,
// never requests.
func startTracing(cfg *config.Tracing) (shutdown func(context.Context) error, _ error) {
	if cfg == nil {
		return func(context.Context) error { return nil }, nil
	}
	var exp sdktrace.SpanExporter
	var err error
	switch cfg.Protocol {
	case config.OTLPHTTP: // POSTs to http://ENDPOINT/v1/traces
		exp, err = otlptracehttp.New(context.Background(), otlptracehttp.WithEndpoint(cfg.Endpoint), otlptracehttp.WithInsecure())
	default:
		exp, err = otlptracegrpc.New(context.Background(), otlptracegrpc.WithEndpoint(cfg.Endpoint), otlptracegrpc.WithInsecure())
	}
	if err != nil {
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(time.Second)),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", cfg.ServiceName),
			attribute.String("service.version", versionString()))),
		// A request's own traceparent decides whether it is sampled; new traces by cfg.Sample.
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.Sample))),
	)
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	return tp.Shutdown, nil
}

package main

import (
	"compress/gzip"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/config"
)

// otlpReceiver is a real OTLP trace receiver, the collector's protocols served on loopback: over
// gRPC (Export) and over HTTP (ServeHTTP: protobuf POSTed to /v1/traces).
type otlpReceiver struct {
	collectorpb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []*tracepb.Span
}

func (r *otlpReceiver) Export(_ context.Context, req *collectorpb.ExportTraceServiceRequest) (*collectorpb.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			r.spans = append(r.spans, ss.Spans...)
		}
	}
	return &collectorpb.ExportTraceServiceResponse{}, nil
}

func (r *otlpReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "want a protobuf POST to /v1/traces", http.StatusBadRequest)
		return
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	raw, err := io.ReadAll(body)
	var msg collectorpb.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(raw, &msg)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	resp, _ := r.Export(req.Context(), &msg)
	out, _ := proto.Marshal(resp)
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

// listen serves the receiver over protocol (config.OTLPGRPC or config.OTLPHTTP) on a free loopback
// port until the test ends, and returns its address.
func (r *otlpReceiver) listen(t *testing.T, protocol string) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if protocol == config.OTLPHTTP {
		hs := &http.Server{Handler: r}
		go hs.Serve(ln)
		t.Cleanup(func() { hs.Close() })
	} else {
		gs := grpc.NewServer()
		collectorpb.RegisterTraceServiceServer(gs, r)
		go gs.Serve(ln)
		t.Cleanup(gs.Stop)
	}
	return ln.Addr().String()
}

func (r *otlpReceiver) got() []*tracepb.Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*tracepb.Span(nil), r.spans...)
}

func spanAttr(s *tracepb.Span, key string) string {
	for _, a := range s.Attributes {
		if a.Key == key {
			if v := a.Value.GetStringValue(); v != "" {
				return v
			}
			return fmt.Sprint(a.Value.GetIntValue())
		}
	}
	return ""
}

// With tracing, a request's span continues the caller's traceparent, has a child span for the
// store call, carries the decision, and the upstream receives a traceparent of the same trace
// whose parent is sluice's span; the spans reach a real OTLP receiver, over gRPC and over HTTP.
func TestServeE2ETracing(t *testing.T) {
	for _, protocol := range []string{config.OTLPGRPC, config.OTLPHTTP} {
		t.Run(strings.ReplaceAll(protocol, "/", "-"), func(t *testing.T) { testServeTracing(t, protocol) })
	}
}

func testServeTracing(t *testing.T, protocol string) {
	recv := &otlpReceiver{}
	addr := recv.listen(t, protocol)

	var mu sync.Mutex
	var upstreamParent string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		upstreamParent = r.Header.Get("Traceparent")
		mu.Unlock()
	}))
	defer up.Close()
	p := startSluice(t, t.TempDir(), "sluice.yaml", openConfig(up.URL, "tracing: {otlp_endpoint: "+addr+", otlp_protocol: "+protocol+"}\n"))

	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	req, _ := http.NewRequest("GET", p.proxy+"/traced", nil)
	req.Header.Set("Traceparent", "00-"+traceID+"-"+parentID+"-01")
	resp, err := e2eClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	mu.Lock()
	got := upstreamParent
	mu.Unlock()
	parts := strings.Split(got, "-")
	if len(parts) != 4 || parts[1] != traceID || parts[2] == parentID {
		t.Fatalf("the upstream got traceparent %q: want trace %s with sluice's span as the parent", got, traceID)
	}
	if code := p.stop(); code != 0 { // flushes the spans
		t.Fatalf("exit code %d", code)
	}
	deadline := time.Now().Add(10 * time.Second)
	var request, store *tracepb.Span
	for request == nil || store == nil {
		if time.Now().After(deadline) {
			t.Fatalf("spans received: %v", recv.got())
		}
		for _, s := range recv.got() {
			if hex.EncodeToString(s.TraceId) != traceID {
				continue
			}
			switch {
			case s.Name == "sluice GET":
				request = s
			case strings.HasPrefix(s.Name, "sluice.store"):
				store = s
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if hex.EncodeToString(request.ParentSpanId) != parentID || hex.EncodeToString(request.SpanId) != parts[2] {
		t.Errorf("request span: parent %x, id %x; want parent %s, id %s (the upstream's parent)", request.ParentSpanId, request.SpanId, parentID, parts[2])
	}
	if spanAttr(request, "sluice.decision") != "allowed" || spanAttr(request, "sluice.client") != "anonymous" || spanAttr(request, "http.response.status_code") != "200" {
		t.Errorf("request span attributes: %v", request.Attributes)
	}
	if string(store.ParentSpanId) != string(request.SpanId) {
		t.Errorf("the store's span is not the request's child: parent %x, request %x", store.ParentSpanId, request.SpanId)
	}
}

package gateway

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/llmtest"
)

// BenchmarkUsageStream is one streamed chat completion of 1,000 content events (OpenAI's chunks,
// then the usage chunk and [DONE]) through the fasthttp engine over loopback, from the fake LLM
// API (internal/llmtest) to a net/http client that reads it whole: on a usage route (the body is
// fed to an llm.Meter as it is copied, and the request settled at its end) and on a route
// without usage, so that the difference is the metering's. ns/event is the time per event;
// allocs/op counts the client's, sluice's and the upstream's, all in this process.
func BenchmarkUsageStream(b *testing.B) {
	const events = 1000
	up := httptest.NewServer(llmtest.NewHandler())
	defer up.Close()
	for _, bc := range []struct {
		name  string
		extra []string
	}{
		{"usage", []string{"routes:", "  - {path_prefix: /v1/chat/completions, usage: {format: openai}}"}},
		{"plain", nil},
	} {
		b.Run(bc.name, func(b *testing.B) {
			url := "http://" + benchListen(b, benchServer(b, up.URL, bc.extra...)) + "/v1/chat/completions"
			c := &http.Client{Transport: &http.Transport{DisableCompression: true}}
			body := `{"model":"gpt-bench","stream":true,"stream_options":{"include_usage":true},"max_tokens":1000,"messages":[{"role":"user","content":"Hi"}]}`
			b.ReportAllocs()
			for b.Loop() {
				req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
				req.Header.Set("X-API-Key", "bench-key")
				req.Header.Set("X-Test-Events", strconv.Itoa(events))
				req.Header.Set("X-Test-Usage", "input=100,output=1000")
				resp, err := c.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				n, err := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK || n < events*100 {
					b.Fatalf("status %d, %d bytes: %v", resp.StatusCode, n, err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*events), "ns/event")
		})
	}
}

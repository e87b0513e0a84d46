package gateway_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gateway"
	"github.com/sluicehq/sluice/internal/llmtest"
)

// startUsage runs usageConfig on the memory store, changed by edit, in front of up (nil: the fake
// LLM API, f.up).
func startUsage(t *testing.T, engine string, up *upstream, edit func(cfg string) string) *llmFixture {
	t.Helper()
	var h *llmtest.Handler
	if up == nil {
		h = llmtest.NewHandler()
		up = &upstream{Server: httptest.NewServer(h)}
		t.Cleanup(up.Close)
	}
	cfg := strings.ReplaceAll(strings.ReplaceAll(usageConfig, "STORE", "store: {type: memory}"), "SUM", sum("sk-team"))
	fe, srv := start(t, engine, edit(cfg), up)
	return &llmFixture{t: t, url: fe.URL, srv: srv, up: h, http: &http.Client{}}
}

// startRefundLLM is startUsage with the chat route's no_usage: refund and load shedding of one
// request in flight.
func startRefundLLM(t *testing.T, engine string, up *upstream) *llmFixture {
	t.Helper()
	return startUsage(t, engine, up, func(cfg string) string {
		cfg = strings.Replace(cfg, "usage: {format: openai}", "usage: {format: openai, no_usage: refund}", 1)
		return cfg + "load_shedding: {min_limit: 1, max_limit: 1, retry_after: 2s}\n"
	})
}

// openAIError is the body of an answer in OpenAI's error shape.
type openAIError struct {
	Error struct{ Type, Code, Message string }
}

// TestUsageShedSettledOnce: a request shed for load on a no_usage: refund route is refunded
// once, when it is shed — its end does not settle it again (which refunded its estimate a
// second time and wiped the charge of the stream in flight), and it is not counted as an LLM
// request that reported no usage (it was never forwarded). Its 503 is in the route's error shape.
// The stream in flight, whose client then leaves before the usage arrives, keeps its estimate:
// what the upstream did decides, and it was producing tokens.
func TestUsageShedSettledOnce(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		f := startRefundLLM(t, engine, nil)
		// "hello": 2 tokens of prompt; 1,000 output: 1,002 tokens, $(2·1 + 1000·4) µ.
		resp := f.post("/v1/chat/completions", `{"model":"gpt-small","max_tokens":1000,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hello"}]}`,
			"X-Test-Events", "100000", "X-Test-Interval", "5ms", "X-Test-Usage", "input=1,output=1")
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		shed := f.post("/v1/chat/completions", `{"model":"gpt-small","max_tokens":500,"messages":[{"role":"user","content":"hello"}]}`)
		body, _ := io.ReadAll(shed.Body)
		shed.Body.Close()
		var e openAIError
		if shed.StatusCode != http.StatusServiceUnavailable || json.Unmarshal(body, &e) != nil || e.Error.Type != "server_error" || e.Error.Message == "" ||
			shed.Header.Get("Retry-After") != "2" || shed.Header.Get("Content-Type") != "application/json" {
			t.Errorf("a request shed on an OpenAI route: %d %v %s; want 503 in OpenAI's error shape with Retry-After 2", shed.StatusCode, shed.Header, body)
		}
		if got, want := f.left("tpm", 100000), int64(100000-1002); got != want {
			t.Errorf("after a request was shed: %d tokens left, want %d (the stream's estimate; the shed one refunded once)", got, want)
		}
		if got, want := f.left("budget", 1_000_000), int64(1_000_000-4002); got != want {
			t.Errorf("after a request was shed: %d micro-dollars left, want %d", got, want)
		}
		if got := f.left("rpm", 1000); got != 999 {
			t.Errorf("after a request was shed: %d requests left, want 999 (the shed one given back)", got)
		}
		if n := counterSum(t, f.srv.Registry(), "sluice_llm_requests_total", nil); n != 0 {
			t.Errorf("sluice_llm_requests_total = %v after a request was shed, want 0 (it was never forwarded)", n)
		}
	})
}

// TestUsageRefundFollowsUpstream: on a no_usage: refund route, what the upstream did decides: a
// stream the upstream cut short, or an upstream that never answered, is refunded (requests still
// count); a stream that reported its usage is charged it, even if its client left right after.
func TestUsageRefundFollowsUpstream(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		f := startRefundLLM(t, engine, nil)
		stream := `{"model":"gpt-small","max_tokens":100,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hello"}]}`
		resp := f.post("/v1/chat/completions", stream, "X-Test-Usage", "input=30,output=70", "X-Test-Cut", "2")
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		f.settled(1)
		if tok, req := f.left("tpm", 100000), f.left("rpm", 1000); tok != 100000 || req != 999 {
			t.Errorf("a stream the upstream cut short: %d tokens, %d requests left; want 100000 (refunded), 999", tok, req)
		}
		resp = f.post("/v1/chat/completions", stream, "X-Test-Usage", "input=30,output=70")
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		f.settled(2)
		if tok := f.left("tpm", 100000); tok != 100000-100 {
			t.Errorf("a stream that reported 100 tokens: %d left, want %d", tok, 100000-100)
		}
	})
}

// TestUsageAnswersInRouteShape: every answer sluice gives on a usage route is in the route's error
// shape: an upstream that does not answer is a 502 in OpenAI's shape, not a problem.
func TestUsageAnswersInRouteShape(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		dead := &upstream{Server: &httptest.Server{URL: "http://" + ln.Addr().String()}}
		ln.Close() // nothing listens there: every connection is refused
		f := startRefundLLM(t, engine, dead)
		resp := f.post("/v1/chat/completions", `{"model":"gpt-small","max_tokens":10,"messages":[{"role":"user","content":"hello"}]}`)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e openAIError
		if resp.StatusCode != http.StatusBadGateway || json.Unmarshal(body, &e) != nil || e.Error.Type != "server_error" || e.Error.Message == "" {
			t.Fatalf("an upstream that does not answer, on an OpenAI route: %d %s; want 502 in OpenAI's error shape", resp.StatusCode, body)
		}
		f.settled(1)
		if tok, req := f.left("tpm", 100000), f.left("rpm", 1000); tok != 100000 || req != 999 {
			t.Errorf("an upstream that never answered: %d tokens, %d requests left; want 100000 (refunded), 999", tok, req)
		}
	})
}

// TestClientBodyFailureLogged: a request whose own body fails on its way to the upstream (bad
// chunking) is logged, and traced, with the status its client was answered, on both engines.
func TestClientBodyFailureLogged(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		up := newEcho(t)
		var log lockedBuffer
		gw, _ := startLoggingTo(t, engine, forwardYAML+"log: {access: true}\n", up, &log)
		resp, _, _, err := rawExchange(t, gw, "POST /upload HTTP/1.1\r\nHost: api.example\r\nTransfer-Encoding: chunked\r\n\r\n"+
			"5\r\nhello\r\nZZ-not-a-size\r\n\r\n")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("malformed chunked body: %d, want 400", resp.StatusCode)
		}
		waitFor(t, "the access line", func() bool { return len(accessLines(log.String())) == 1 })
		if l := accessLines(log.String())[0]; l["status"] != "400" {
			t.Errorf("access line %v: status %q, want 400 (what the client was answered)", l, l["status"])
		}
	})
}

// TestUsageBodyMemoryFull: while one usage request's body holds all of server.body_memory (its
// client sends it slowly), another usage request waits up to server.body_timeout and is then
// answered 503 with Retry-After in the route's error shape, charging nothing; a request on a
// plain route meanwhile is answered at once. Once the slow body is gone, the next one is read.
func TestUsageBodyMemoryFull(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		f := startUsage(t, engine, nil, func(cfg string) string {
			cfg = strings.Replace(cfg, "usage: {format: openai}", "usage: {format: openai, max_body: 1048576}", 1)
			cfg = strings.Replace(cfg, "usage: {format: anthropic, count: output}", "usage: {format: anthropic, count: output, max_body: 1048576}", 1)
			return cfg + "server: {body_memory: 1048576, body_timeout: 1s}\n"
		})
		fe, srv := &frontend{f.url}, f.srv

		// The slow client: a body of 1,000,000 bytes, 50 bytes every 20 ms (faster than
		// body_min_rate, so it is never cut), until the test is done.
		c, err := net.Dial("tcp", strings.TrimPrefix(fe.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-team\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{\"messages\":[{\"role\":\"user\",\"content\":\"")
		done := make(chan struct{})
		trickled := make(chan struct{})
		go func() {
			defer close(trickled)
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-done:
					return
				case <-tick.C:
					if _, err := c.Write([]byte(strings.Repeat("a", 50))); err != nil {
						return
					}
				}
			}
		}()
		waitFor(t, "the slow body to hold the body memory", func() bool {
			return metricOf(t, srv, "sluice_body_memory_bytes") > 0
		})
		if code := get(t, fe.URL+"/v1/models", "Authorization", "Bearer sk-team").StatusCode; code >= 500 {
			t.Errorf("a plain route while the body memory is full: %d", code)
		}
		// 100 KB: more than the 48 KiB left, and more than the fasthttp engine reads with a header.
		big := `{"model":"claude","max_tokens":10,"messages":[{"role":"user","content":"` + strings.Repeat("b", 100_000) + `"}]}`
		resp := f.post("/v1/messages", big)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e struct {
			Type  string
			Error struct{ Type, Message string }
		}
		if resp.StatusCode != http.StatusServiceUnavailable || json.Unmarshal(body, &e) != nil || e.Type != "error" || e.Error.Type != "overloaded_error" ||
			!strings.Contains(e.Error.Message, "server.body_memory") || resp.Header.Get("Retry-After") != "1" {
			t.Errorf("a usage request with the body memory full: %d %v %s; want 503 in Anthropic's shape with Retry-After 1", resp.StatusCode, resp.Header, body)
		}
		if got := metricOf(t, srv, "sluice_body_memory_refused_total"); got != 1 {
			t.Errorf("sluice_body_memory_refused_total = %v, want 1", got)
		}
		close(done)
		<-trickled
		c.Close()
		waitFor(t, "the slow body's memory given back", func() bool { return metricOf(t, srv, "sluice_body_memory_bytes") == 0 })
		resp = f.post("/v1/messages", big)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("a usage request once the memory is free: %d, want 200", resp.StatusCode)
		}
		if got := f.left("tpm", 100000); got == 100000 {
			t.Errorf("the request that got through charged nothing")
		}
		// A chunked body reserves max_body, and gives back what it did not need once read: all
		// of it at its end.
		req, _ := http.NewRequest(http.MethodPost, fe.URL+"/v1/messages", io.MultiReader(strings.NewReader(big))) // (no length: chunked)
		req.Header.Set("Authorization", "Bearer sk-team")
		req.Header.Set("Content-Type", "application/json")
		resp, err = http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || req.ContentLength != 0 && req.ContentLength != -1 {
			t.Errorf("a chunked usage request: %d, want 200", resp.StatusCode)
		}
		waitFor(t, "the chunked body's memory given back", func() bool { return metricOf(t, srv, "sluice_body_memory_bytes") == 0 })
	})
}

// metricOf is the value of the server's metric name (summed over its series).
func metricOf(t *testing.T, srv *gateway.Server, name string) float64 {
	t.Helper()
	mfs, err := srv.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			total += m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	return total
}

// TestUsageLeftWhileHeld: a request on a usage route held by a leaky bucket whose client leaves
// before it is sent never reaches the upstream: its tokens and dollars are refunded (its
// requests still count), though the route keeps the estimate of a client that leaves once the
// upstream has its request.
func TestUsageLeftWhileHeld(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		f := startUsage(t, engine, nil, func(cfg string) string {
			cfg = strings.Replace(cfg, "policy: [tpm, rpm, streams, budget]", "policy: [tpm, rpm, budget, drip]", 1)
			return strings.Replace(cfg, "policies:\n", "policies:\n  - {name: drip, algorithm: leaky-bucket, limit: 1, period: 5s, burst: 5, counts: requests}\n", 1)
		})
		fe, h := &frontend{f.url}, f.up
		small := `{"model":"gpt-small","max_tokens":100,"messages":[{"role":"user","content":"hello"}]}`
		resp := f.post("/v1/chat/completions", small, "X-Test-Usage", "input=2,output=100")
		resp.Body.Close()
		f.settled(1)
		// The next one is held about 5 s: its client sends it and leaves.
		c, err := net.Dial("tcp", strings.TrimPrefix(fe.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-team\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(small), small)
		waitFor(t, "the second request charged and held", func() bool { return f.left("tpm", 100000) == 100000-102-102 })
		c.Close()
		f.settled(2)
		if tok, usd, req := f.left("tpm", 100000), f.left("budget", 1_000_000), f.left("rpm", 1000); tok != 100000-102 || usd != 1_000_000-402 || req != 998 {
			t.Errorf("after the held request's client left: %d tokens, %d micro-dollars, %d requests left; want %d, %d (refunded), 998 (it still counts)",
				tok, usd, req, 100000-102, 1_000_000-402)
		}
		if h.Count() != 1 {
			t.Errorf("the upstream saw %d requests, want 1", h.Count())
		}
	})
}

// TestUsageInjectsExactly: inject_usage's edit, made in the body's own array, reaches the upstream
// exactly, whether it makes the body longer (stream_options added, in the room read after it) or
// shorter (include_usage false made true), on a small body and on one over 64 KiB.
func TestUsageInjectsExactly(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		got := make(chan []byte, 1)
		up := &upstream{Server: httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			got <- b
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
		}))}
		t.Cleanup(up.Close)
		f := startUsage(t, engine, up, func(cfg string) string {
			return strings.Replace(cfg, "usage: {format: openai}", "usage: {format: openai, inject_usage: true}", 1)
		})
		big := strings.Repeat("x", 100_000)
		for _, c := range []struct{ name, body, want string }{
			{"longer, small", `{"model":"gpt-small","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
				`{"model":"gpt-small","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`},
			{"shorter, small", `{"model":"gpt-small","stream":true,"stream_options":{"include_usage":false},"messages":[{"role":"user","content":"hi"}]}`,
				`{"model":"gpt-small","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`},
			{"longer, large", `{"model":"gpt-small","stream":true,"messages":[{"role":"user","content":"` + big + `"}]}`,
				`{"model":"gpt-small","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"` + big + `"}]}`},
			{"shorter, large", `{"model":"gpt-small","stream":true,"stream_options":{"include_usage":false},"messages":[{"role":"user","content":"` + big + `"}]}`,
				`{"model":"gpt-small","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"` + big + `"}]}`},
		} {
			resp := f.post("/v1/chat/completions", c.body)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s: %d", c.name, resp.StatusCode)
			}
			if b := <-got; string(b) != c.want {
				t.Errorf("%s: the upstream got %d bytes %.120q…, want %d bytes %.120q…", c.name, len(b), b, len(c.want), c.want)
			}
		}
	})
}

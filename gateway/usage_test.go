package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/gateway"
	"github.com/sluicehq/sluice/internal/llmtest"
	"github.com/sluicehq/sluice/internal/redistest"
)

// usageConfig: the team may use 100,000 tokens and $1 (1,000,000 micro-dollars) per 1,000 hours
// (fixed windows no test run straddles: balances are exact), 1,000 requests, 2 streams at once;
// gpt-big has its own 3,000 tokens for each client. Chat completions count total tokens,
// Anthropic's messages output tokens only.
const usageConfig = `
upstream: UPSTREAM
STORE
identity:
  - api_key: {header: Authorization}
  - api_key: {header: X-Api-Key}
policies:
  - {name: tpm, algorithm: fixed-window, limit: 100000, period: 1000h}
  - {name: rpm, algorithm: fixed-window, limit: 1000, period: 1000h, counts: requests}
  - {name: streams, algorithm: concurrency, limit: 2, lease: 1m}
  - {name: budget, algorithm: fixed-window, limit: $1, period: 1000h, counts: usd}
  - {name: big-tpm, algorithm: fixed-window, limit: 3000, period: 1000h}
clients:
  - {name: team, api_key_sha256: [` + "SUM" + `], policy: [tpm, rpm, streams, budget]}
routes:
  - path_prefix: /v1/chat/completions
    usage: {format: openai}
  - path_prefix: /v1/messages
    usage: {format: anthropic, count: output}
models:
  - {name: gpt-small, price: {input: 1, output: 4}}
  - {name: gpt-big, price: {input: 10, cached_input: 1, output: 40}, policy: [big-tpm]}
  - {name: claude, price: {input: 3, output: 15}}
`

// llmFixture is a gateway in front of the fake LLM API, on one store.
type llmFixture struct {
	t    *testing.T
	url  string
	srv  *gateway.Server
	up   *llmtest.Handler
	http *http.Client
}

func startLLM(t *testing.T, engine, store string) *llmFixture {
	h := llmtest.NewHandler()
	up := &upstream{Server: httptest.NewServer(h)}
	t.Cleanup(up.Close)
	storeYAML := "store: {type: memory}"
	if store == "redis" {
		rs := redistest.Start(t)
		storeYAML = fmt.Sprintf("store: {type: redis, addrs: [%s], timeout: 2s}", rs.Addr)
	}
	cfg := strings.ReplaceAll(strings.ReplaceAll(usageConfig, "STORE", storeYAML), "SUM", sum("sk-team"))
	fe, srv := start(t, engine, cfg, up)
	return &llmFixture{t: t, url: fe.URL, srv: srv, up: h, http: &http.Client{Timeout: 30 * time.Second}}
}

// left is what the team has left of policy p (state name name), read from the store.
func (f *llmFixture) left(name string, limit int64) int64 {
	f.t.Helper()
	p := sluice.Policy{Name: name, Algorithm: sluice.FixedWindow, Limit: limit, Period: 1000 * time.Hour}
	d, err := f.srv.Store().Decide(context.Background(), "team", p, 0)
	if err != nil {
		f.t.Fatal(err)
	}
	return d.Remaining
}

// post sends body to path with the team's key (OpenAI's way) and the fake's headers.
func (f *llmFixture) post(path, body string, headers ...string) *http.Response {
	f.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, f.url+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer sk-team")
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := f.http.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	return resp
}

// settled waits until n requests of usage routes have been settled (whatever the outcome).
func (f *llmFixture) settled(n int) {
	f.t.Helper()
	waitFor(f.t, fmt.Sprintf("%d usage requests settled", n), func() bool { return counterSum(f.t, f.srv.Registry(), "sluice_llm_requests_total", nil) >= float64(n) })
}

// counterSum sums the counter name's series whose labels include want.
func counterSum(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for k, v := range want {
				found := false
				for _, l := range m.GetLabel() {
					if l.GetName() == k && l.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue metric
				}
			}
			total += m.GetCounter().GetValue()
		}
	}
	return total
}

// TestUsageSettles: on both engines and on both stores, each request on a usage route is charged
// its estimate up front and settled, once its response has ended, to the usage the response
// reported (JSON and streamed, OpenAI's and Anthropic's), in every unit at once: tokens as the
// route counts them, micro-dollars at the model's price, one request; a response without usage
// (a stream the upstream cut, an OpenAI stream that did not ask for it) keeps its estimate. The
// balances are read from the store after every step and must equal the table's.
func TestUsageSettles(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		for _, store := range []string{"memory", "redis"} {
			t.Run(store, func(t *testing.T) {
				f := startLLM(t, engine, store)
				tokens, usd, requests := int64(100000), int64(1_000_000), int64(1000)
				// "hello" is 5 bytes of prompt: 2 tokens at 4 bytes a token (rounded up).
				const small = `{"model":"gpt-small","max_tokens":100,"messages":[{"role":"user","content":"hello"}]`
				for i, s := range []struct {
					name, path, body string
					headers          []string
					tokens, usd      int64 // what the step costs, once settled
				}{
					{"JSON", "/v1/chat/completions", small + `}`, []string{"X-Test-Usage", "input=120,output=53"}, 173, 120*1 + 53*4},
					{"JSON, cached input", "/v1/chat/completions", strings.Replace(small, "gpt-small", "gpt-big", 1) + `}`,
						[]string{"X-Test-Usage", "input=200,output=10,cached=150"}, 210, 50*10 + 150*1 + 10*40},
					{"stream with usage", "/v1/chat/completions", small + `,"stream":true,"stream_options":{"include_usage":true}}`,
						[]string{"X-Test-Usage", "input=30,output=70", "X-Test-Events", "20"}, 100, 30 + 70*4},
					{"stream without usage: the estimate stands", "/v1/chat/completions", small + `,"stream":true}`,
						[]string{"X-Test-Usage", "input=30,output=70"}, 102, 2*1 + 100*4},
					{"stream cut by the upstream: the estimate stands", "/v1/chat/completions", small + `,"stream":true,"stream_options":{"include_usage":true}}`,
						[]string{"X-Test-Usage", "input=30,output=70", "X-Test-Cut", "2"}, 102, 2*1 + 100*4},
					{"anthropic JSON, output counted", "/v1/messages", `{"model":"claude","max_tokens":300,"messages":[{"role":"user","content":"hello"}]}`,
						[]string{"X-Test-Usage", "input=500,output=77"}, 77, 500*3 + 77*15},
					{"anthropic stream", "/v1/messages", `{"model":"claude","max_tokens":300,"stream":true,"messages":[{"role":"user","content":"hello"}]}`,
						[]string{"X-Test-Usage", "input=40,output=9,cached=10"}, 9, 40*3 + 9*15},
				} {
					resp := f.post(s.path, s.body, s.headers...)
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					f.settled(i + 1)
					tokens, usd, requests = tokens-s.tokens, usd-s.usd, requests-1
					if got := f.left("tpm", 100000); got != tokens {
						t.Errorf("step %d (%s): %d tokens left, want %d", i, s.name, got, tokens)
					}
					if got := f.left("budget", 1_000_000); got != usd {
						t.Errorf("step %d (%s): %d micro-dollars left, want %d", i, s.name, got, usd)
					}
					if got := f.left("rpm", 1000); got != requests {
						t.Errorf("step %d (%s): %d requests left, want %d", i, s.name, got, requests)
					}
				}
				// gpt-big's own limit counted its one request (210 of 3,000), under its own name.
				if got := f.left("big-tpm@gpt-big", 3000); got != 3000-210 {
					t.Errorf("gpt-big's own limit: %d left, want %d", got, 3000-210)
				}
				if got := f.up.Count(); got != 7 {
					t.Errorf("the upstream saw %d requests, want 7", got)
				}
			})
		}
	})
}

// TestUsageClientLeaves: a client that leaves a stream in the middle keeps its estimate (the
// usage never came), and its stream slot is given back — on a no_usage: refund route too: what
// the upstream did decides, and it was producing tokens.
func TestUsageClientLeaves(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		t.Run("estimate", func(t *testing.T) { testUsageClientLeaves(t, startLLM(t, engine, "memory")) })
		t.Run("no_usage refund", func(t *testing.T) { testUsageClientLeaves(t, startRefundLLM(t, engine, nil)) })
	})
}

func testUsageClientLeaves(t *testing.T, f *llmFixture) {
	resp := f.post("/v1/chat/completions", `{"model":"gpt-small","max_tokens":1000,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hello"}]}`,
		"X-Test-Events", "1000", "X-Test-Interval", "5ms", "X-Test-Usage", "input=1,output=1")
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close() // the client leaves after the first event
	f.settled(1)
	if got, want := f.left("tpm", 100000), int64(100000-1002); got != want {
		t.Errorf("after the client left: %d tokens left, want %d (the estimate)", got, want)
	}
	if got, want := f.left("budget", 1_000_000), int64(1_000_000-4002); got != want {
		t.Errorf("after the client left: %d micro-dollars left, want %d (the estimate)", got, want)
	}
	if n := counterSum(t, f.srv.Registry(), "sluice_llm_requests_total", map[string]string{"outcome": "no_usage"}); n != 1 {
		t.Errorf("no_usage requests: %v, want 1", n)
	}
}

// TestUsageRefusedUpFront: parallel streams over the team's limit are refused before they reach
// the model (in OpenAI's error shape, with Retry-After and Retry-After-Ms), and so is a request
// whose estimate does not fit what is left; the model's own limit refuses alone.
func TestUsageRefusedUpFront(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		f := startLLM(t, engine, "memory")
		stream := `{"model":"gpt-small","max_tokens":10,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
		var open []*http.Response
		for range 2 {
			resp := f.post("/v1/chat/completions", stream, "X-Test-Events", "100000", "X-Test-Interval", "10ms")
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("stream: %d", resp.StatusCode)
			}
			open = append(open, resp)
		}
		resp := f.post("/v1/chat/completions", stream)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("a third stream at once: %d, want 429", resp.StatusCode)
		}
		var e struct {
			Error struct {
				Type, Code, Message string
			}
		}
		if err := json.Unmarshal(body, &e); err != nil || e.Error.Type != "rate_limit_exceeded" || e.Error.Code != "rate_limit_exceeded" {
			t.Errorf("refusal body %s: want OpenAI's error with type rate_limit_exceeded (%v)", body, err)
		}
		if resp.Header.Get("Retry-After") == "" || resp.Header.Get("Retry-After-Ms") == "" || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("refusal header %v: want Retry-After, Retry-After-Ms, application/json", resp.Header)
		}
		for _, r := range open {
			r.Body.Close()
		}
		f.settled(2) // (the streams' slots are given back when they end)
		// gpt-big's own 3,000 tokens: an estimate of 2,002 fits, a second does not, though the
		// team's 100,000 would take it.
		big := `{"model":"gpt-big","max_tokens":2000,"messages":[{"role":"user","content":"hello"}]}`
		r1 := f.post("/v1/chat/completions", big, "X-Test-Usage", "input=2,output=1990")
		r1.Body.Close()
		r2 := f.post("/v1/chat/completions", big)
		r2.Body.Close()
		if r1.StatusCode != http.StatusOK || r2.StatusCode != http.StatusTooManyRequests {
			t.Errorf("gpt-big: %d then %d, want 200 then 429 (its own limit)", r1.StatusCode, r2.StatusCode)
		}
		if got := f.up.Count(); got != 3 {
			t.Errorf("the upstream saw %d requests, want 3 (refusals never reach it)", got)
		}
	})
}

// TestUsageBadBodies: a body sluice cannot estimate is answered in the route's shape and
// charges nothing; one over max_body is 413.
func TestUsageBadBodies(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		f := startLLM(t, engine, "memory")
		for _, c := range []struct {
			path, body string
			status     int
			typ        string
		}{
			{"/v1/chat/completions", `{"model":`, 400, "invalid_request_error"},
			{"/v1/chat/completions", `{"model":"gpt-small","max_tokens":-1}`, 400, "invalid_request_error"},
			{"/v1/messages", `[1,2]`, 400, "invalid_request_error"},
			{"/v1/messages", `{"model":"claude","messages":[{"role":"user","content":"` + strings.Repeat("a", 5<<20) + `"}]}`, 413, "request_too_large"},
		} {
			resp := f.post(c.path, c.body)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != c.status || !strings.Contains(string(body), `"type":"`+c.typ+`"`) {
				t.Errorf("%s %.40s: %d %s, want %d with type %s", c.path, c.body, resp.StatusCode, body, c.status, c.typ)
			}
		}
		if got := f.left("tpm", 100000); got != 100000 {
			t.Errorf("%d tokens left, want all: a bad body charges nothing", got)
		}
		if f.up.Count() != 0 {
			t.Errorf("the upstream saw %d requests, want none", f.up.Count())
		}
	})
}

var _ = sync.Mutex{}

// TestUsageWithoutBody: a request without a body on a usage route (a GET of a model list under
// the route's prefix) is forwarded, charged no tokens and no money, and counts as one request.
func TestUsageWithoutBody(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		f := startLLM(t, engine, "memory")
		resp := get(t, f.url+"/v1/messages", "Authorization", "Bearer sk-team")
		resp.Body.Close()
		f.settled(1)
		if f.up.Count() != 1 {
			t.Fatalf("the upstream saw %d requests, want 1 (status %d)", f.up.Count(), resp.StatusCode)
		}
		if tok, usd, req := f.left("tpm", 100000), f.left("budget", 1_000_000), f.left("rpm", 1000); tok != 100000 || usd != 1_000_000 || req != 999 {
			t.Errorf("left: %d tokens, %d micro-dollars, %d requests; want all tokens and money, 999 requests", tok, usd, req)
		}
	})
}

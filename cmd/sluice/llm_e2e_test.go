package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gateway"
	"github.com/sluicehq/sluice/internal/llmtest"
	"github.com/sluicehq/sluice/internal/redistest"
)

// Token quotas for LLM APIs, end to end: `sluice serve` in front of a fake OpenAI and Anthropic
// API (internal/llmtest: real HTTP, JSON and server-sent event streams, the usage each test
// chooses), on the memory store and on real Redis, with the official SDKs (openai and
// @anthropic-ai/sdk under node) as clients. The balances, read back from the store, follow the
// usage the responses reported to the token and the micro-dollar; what the SDKs get through
// sluice is what they get from the API itself, and a refusal is their own RateLimitError, after
// waiting what sluice told them to.

// llmClients are llmConfig's clients and their policies; each one's key is llmKey(name).
var llmClients = [][2]string{
	{"team", "[tpm, budget, streams]"},
	{"crew", "[tpm, streams]"},
	{"intern", "pocket"},
	{"plain", "tpm"},
	{"openai-slots", "one-stream"}, {"anthropic-slots", "one-stream"},
	{"openai-trickle", "trickle"}, {"anthropic-trickle", "trickle"},
}

func llmKey(client string) string { return "sk-e2e-" + client + "-7c1d" }

// llmConfig: tokens and money per 1,000 hours (fixed windows no test run straddles the edge of,
// so that balances are exact), streams at once, and a token bucket of 100 tokens refilled in 2 s
// (50 a second), for a refusal the SDKs can wait out. Chat completions and Anthropic's messages
// count total tokens; completions have inject_usage. gpt-big has its own 3,000 tokens for each
// client. Prices are in dollars per million tokens: $1 is one micro-dollar a token.
func llmConfig(upstreamURL, store string) configFunc {
	var clients strings.Builder
	for _, c := range llmClients {
		fmt.Fprintf(&clients, "  - {name: %s, api_key_sha256: %q, policy: %s}\n", c[0], sha256Hex(llmKey(c[0])), c[1])
	}
	return func(listen, admin string) string {
		return fmt.Sprintf(`listen: %s
admin_listen: %s
upstream: %s
%s
identity:
  - api_key: {header: Authorization}
  - api_key: {header: X-Api-Key}
policies:
  - {name: tpm, algorithm: fixed-window, limit: 100000, period: 1000h}
  - {name: budget, algorithm: fixed-window, limit: $1, period: 1000h, counts: usd}
  - {name: streams, algorithm: concurrency, limit: 2, lease: 1m}
  - {name: big-tpm, algorithm: fixed-window, limit: 3000, period: 1000h}
  - {name: pocket, algorithm: fixed-window, limit: $0.01, period: 1000h, counts: usd}
  - {name: one-stream, algorithm: concurrency, limit: 1, lease: 1m}
  - {name: trickle, algorithm: token-bucket, limit: 100, period: 2s}
clients:
%sroutes:
  - path_prefix: /v1/chat/completions
    usage: {format: openai}
  - path_prefix: /v1/completions
    usage: {format: openai, inject_usage: true}
  - path_prefix: /v1/messages
    usage: {format: anthropic}
models:
  - {name: gpt-small, price: {input: 1, output: 4}}
  - {name: gpt-big, price: {input: 10, cached_input: 1, output: 40}, policy: [big-tpm]}
  - {name: gpt-4o, price: {input: 2.50, cached_input: 1.25, output: 10}}
  - {name: claude, price: {input: 3, output: 15}}
`, listen, admin, upstreamURL, store, clients.String())
	}
}

// llmServe starts sluice on store ("memory" or "redis") in front of a fake LLM API; rs is nil on
// memory.
func llmServe(t *testing.T, store string) (p *sluiceProc, up *llmtest.Server, rs *redistest.Server) {
	up = llmtest.Start(t)
	storeYAML := "store: {type: memory}"
	if store == "redis" {
		rs = redistest.Start(t)
		storeYAML = fmt.Sprintf("store: {type: redis, addrs: [%s], timeout: 2s}", rs.Addr)
	}
	return startSluice(t, t.TempDir(), "sluice.yaml", llmConfig(up.URL, storeYAML)), up, rs
}

// llmHTTP is the client of the tests' own LLM requests: a held stream outlives e2eClient's 10 s.
var llmHTTP = &http.Client{Timeout: time.Minute}

// llmPost sends body to base+path as client, its key in header: Authorization (as a bearer
// token, OpenAI's way) or X-Api-Key (Anthropic's); headers are more (name, value, …): the fake
// API's X-Test-*.
func llmPost(t *testing.T, base, path, body, client, header string, headers ...string) *http.Response {
	t.Helper()
	resp, err := tryLLMPost(base, path, body, client, header, headers...)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// tryLLMPost is llmPost returning its error, for any goroutine.
func tryLLMPost(base, path, body, client, header string, headers ...string) (*http.Response, error) {
	req, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if header == "Authorization" {
		req.Header.Set(header, "Bearer "+llmKey(client))
	} else {
		req.Header.Set(header, llmKey(client))
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return llmHTTP.Do(req)
}

// readAll reads and closes resp's body.
func readAll(t *testing.T, resp *http.Response) []byte {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the answer (%d): %v", resp.StatusCode, err)
	}
	return b
}

// upstreamSaw is how many requests the fake API received from client.
func upstreamSaw(up *llmtest.Server, client string) int {
	n := 0
	for _, r := range up.Requests() {
		if strings.HasSuffix(r.Header.Get("Authorization"), llmKey(client)) || r.Header.Get("X-Api-Key") == llmKey(client) {
			n++
		}
	}
	return n
}

// settledFor waits until n of client's requests on usage routes have been settled.
func settledFor(t *testing.T, p *sluiceProc, client string, n int) {
	t.Helper()
	p.waitMetric(t, "sluice_llm_requests_total", map[string]string{"client": client}, float64(n), 20*time.Second)
}

// llmRefusal checks a refusal in an LLM API's error shape: 429, the error type the SDKs read as a
// rate limit (OpenAI's type and code, or Anthropic's type), policy among the violated ones, and
// Retry-After in seconds beside Retry-After-Ms in milliseconds, which agree; it returns the
// milliseconds.
func llmRefusal(resp *http.Response, body []byte, anthropic bool, policy string) (int64, error) {
	if resp.StatusCode != http.StatusTooManyRequests {
		return 0, fmt.Errorf("status %d, want 429: %s", resp.StatusCode, body)
	}
	var e struct {
		Type  string
		Error struct {
			Type, Code, Message string
			Violated            []string `json:"violated_policies"`
		}
	}
	if err := json.Unmarshal(body, &e); err != nil {
		return 0, fmt.Errorf("body %s: %v", body, err)
	}
	switch {
	case anthropic && (e.Type != "error" || e.Error.Type != "rate_limit_error"):
		return 0, fmt.Errorf("body %s: want Anthropic's rate_limit_error", body)
	case !anthropic && (e.Error.Type != "rate_limit_exceeded" || e.Error.Code != "rate_limit_exceeded"):
		return 0, fmt.Errorf("body %s: want OpenAI's rate_limit_exceeded", body)
	case !reflect.DeepEqual(e.Error.Violated, []string{policy}):
		return 0, fmt.Errorf("body %s: want violated_policies [%s]", body, policy)
	case resp.Header.Get("Content-Type") != "application/json":
		return 0, fmt.Errorf("Content-Type %q", resp.Header.Get("Content-Type"))
	}
	secs, err1 := strconv.ParseInt(resp.Header.Get("Retry-After"), 10, 64)
	ms, err2 := strconv.ParseInt(resp.Header.Get("Retry-After-Ms"), 10, 64)
	if err1 != nil || err2 != nil || ms <= 0 || secs != (ms+999)/1000 {
		return 0, fmt.Errorf("Retry-After %q, Retry-After-Ms %q: want both, the seconds the milliseconds rounded up",
			resp.Header.Get("Retry-After"), resp.Header.Get("Retry-After-Ms"))
	}
	return ms, nil
}

// TestLLMServeBalances: on both stores, every request on a usage route is charged its estimate up
// front and settled to the usage its response reported, in each limit's unit at once (tokens,
// and micro-dollars at the model's price), JSON and streamed, OpenAI's and Anthropic's, the key
// sent either way; a response that reports no usage (a stream that did not ask for it, one the
// upstream cut, one that never reported it, one the client left) keeps its estimate; a
// completions stream that did not ask for its usage is asked for it (inject_usage) and settles
// exactly. The balances, read from the store after every step (POST /v1/check with cost 0, and on
// Redis the state's own string), must be the table's; then /v1/stats and the metrics must show
// the same usage per client and model.
func TestLLMServeBalances(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			p, up, rs := llmServe(t, store)
			// "hello" is 5 bytes of prompt, 2 tokens at 4 bytes a token (rounded up): gpt-small's
			// estimate is 2 + 100 = 102 tokens, 2×1 + 100×4 = 402 micro-dollars; claude's 302.
			const small = `{"model":"gpt-small","max_tokens":100,"messages":[{"role":"user","content":"hello"}]`
			const claude = `{"model":"claude","max_tokens":300,"messages":[{"role":"user","content":"hello"}]`
			const withUsage = `,"stream":true,"stream_options":{"include_usage":true}}`
			const bearer, apiKey = "Authorization", "X-Api-Key"
			tokens, usd := int64(100000), int64(1_000_000)
			for i, s := range []struct {
				name, path, body, header string
				headers                  []string
				leave                    bool  // the client leaves after the first event
				tokens, usd              int64 // what the step costs, once settled
			}{
				{"JSON", "/v1/chat/completions", small + `}`, bearer, []string{"X-Test-Usage", "input=120,output=53"}, false, 173, 120*1 + 53*4},
				{"JSON, cached input, gpt-big", "/v1/chat/completions", strings.Replace(small, "gpt-small", "gpt-big", 1) + `}`, bearer,
					[]string{"X-Test-Usage", "input=200,output=10,cached=150"}, false, 210, 50*10 + 150*1 + 10*40},
				{"stream with usage", "/v1/chat/completions", small + withUsage, bearer,
					[]string{"X-Test-Usage", "input=30,output=70", "X-Test-Events", "20"}, false, 100, 30*1 + 70*4},
				{"stream that did not ask for usage: the estimate stands", "/v1/chat/completions", small + `,"stream":true}`, bearer,
					[]string{"X-Test-Usage", "input=30,output=70"}, false, 102, 402},
				{"stream the upstream cut: the estimate stands", "/v1/chat/completions", small + withUsage, bearer,
					[]string{"X-Test-Usage", "input=30,output=70", "X-Test-Cut", "2"}, false, 102, 402},
				{"stream without usage: the estimate stands", "/v1/chat/completions", small + withUsage, bearer,
					[]string{"X-Test-No-Usage", "1"}, false, 102, 402},
				{"stream the client left: the estimate stands", "/v1/chat/completions", small + withUsage, bearer,
					[]string{"X-Test-Usage", "input=1,output=1", "X-Test-Events", "1000", "X-Test-Interval", "5ms"}, true, 102, 402},
				{"completions stream, usage injected: settled exactly", "/v1/completions", `{"model":"gpt-small","max_tokens":100,"prompt":"hello","stream":true}`, bearer,
					[]string{"X-Test-Usage", "input=30,output=70"}, false, 100, 30*1 + 70*4},
				{"anthropic JSON, x-api-key", "/v1/messages", claude + `}`, apiKey, []string{"X-Test-Usage", "input=500,output=77"}, false, 577, 500*3 + 77*15},
				{"anthropic stream, cache read at the input's price", "/v1/messages", claude + `,"stream":true}`, apiKey,
					[]string{"X-Test-Usage", "input=40,output=9,cached=10"}, false, 49, 40*3 + 9*15},
			} {
				resp := llmPost(t, p.proxy, s.path, s.body, "team", s.header, s.headers...)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("step %d (%s): %d %s", i, s.name, resp.StatusCode, readAll(t, resp))
				}
				cut := slices.Contains(s.headers, "X-Test-Cut")
				switch {
				case s.leave:
					if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
						t.Fatalf("step %d (%s): %v", i, s.name, err)
					}
				case cut: // the client sees the stream cut too
					if _, err := io.Copy(io.Discard, resp.Body); err == nil {
						t.Errorf("step %d (%s): the stream ended well, want it cut", i, s.name)
					}
				default:
					readAll(t, resp)
				}
				resp.Body.Close()
				settledFor(t, p, "team", i+1)
				tokens, usd = tokens-s.tokens, usd-s.usd
				if got := balanceOf(t, p, "team", "tpm"); got != tokens {
					t.Errorf("step %d (%s): %d tokens left, want %d", i, s.name, got, tokens)
				}
				if got := balanceOf(t, p, "team", "budget"); got != usd {
					t.Errorf("step %d (%s): %d micro-dollars left, want %d", i, s.name, got, usd)
				}
				if rs != nil {
					if got := windowCount(t, rs, "rate-limit:{team}:tpm:v2"); got != 100000-tokens {
						t.Errorf("step %d (%s): Redis counts %d tokens, want %d", i, s.name, got, 100000-tokens)
					}
					if got := windowCount(t, rs, "rate-limit:{team}:budget:v2"); got != 1_000_000-usd {
						t.Errorf("step %d (%s): Redis counts %d micro-dollars, want %d", i, s.name, got, 1_000_000-usd)
					}
				}
			}
			reqs := up.Requests()
			if len(reqs) != 10 {
				t.Fatalf("the upstream saw %d requests, want 10", len(reqs))
			}
			if c := reqs[7]; c.Path != "/v1/completions" || !strings.Contains(string(c.Body), `"stream_options":{"include_usage":true}`) {
				t.Errorf("the completions stream reached the upstream as %s %s: want stream_options.include_usage added", c.Path, c.Body)
			}
			if c := reqs[3]; strings.Contains(string(c.Body), "include_usage") {
				t.Errorf("a chat stream reached the upstream as %s: the chat route does not inject usage", c.Body)
			}
			if rs != nil {
				if got := windowCount(t, rs, "rate-limit:{team}:big-tpm@gpt-big:v2"); got != 210 {
					t.Errorf("gpt-big's own limit: Redis counts %d tokens, want 210", got)
				}
			}

			// The operator's view: per client and model, what was reserved and reported.
			want := []gateway.ModelStats{
				{Model: "claude", Requests: 2, Settled: 2, Reserved: 302 * 2, Input: 540, CachedInput: 10, Output: 86, MicroUSD: 2655 + 255},
				{Model: "gpt-big", Requests: 1, Settled: 1, Reserved: 102, Input: 200, CachedInput: 150, Output: 10, MicroUSD: 1050},
				{Model: "gpt-small", Requests: 7, Settled: 3, NoUsage: 4, Reserved: 102 * 7, Input: 120 + 30 + 30, Output: 53 + 70 + 70, MicroUSD: 332 + 310 + 310},
			}
			var got []gateway.ModelStats
			for _, c := range p.stats(t).Clients {
				if c.Client == "team" {
					got = c.LLM
				}
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("/v1/stats llm of team:\n got %+v\nwant %+v", got, want)
			}
			for _, m := range []struct {
				name   string
				labels map[string]string
				want   float64
			}{
				{"sluice_llm_tokens_total", map[string]string{"model": "claude", "kind": "input"}, 540},
				{"sluice_llm_tokens_total", map[string]string{"model": "gpt-big", "kind": "cached_input"}, 150},
				{"sluice_llm_tokens_total", map[string]string{"model": "gpt-small", "kind": "output"}, 193},
				{"sluice_llm_reserved_tokens_total", nil, 604 + 102 + 714},
				{"sluice_llm_cost_microdollars_total", map[string]string{"model": "gpt-small"}, 952},
				{"sluice_llm_cost_microdollars_total", nil, 952 + 1050 + 2910},
				{"sluice_llm_requests_total", map[string]string{"model": "gpt-small", "outcome": "no_usage"}, 4},
				{"sluice_llm_requests_total", map[string]string{"outcome": "settled"}, 6},
			} {
				labels := map[string]string{"client": "team"}
				for k, v := range m.labels {
					labels[k] = v
				}
				if v := p.metric(t, m.name, labels); v != m.want {
					t.Errorf("%s%v = %v, want %v", m.name, labels, v, m.want)
				}
			}
		})
	}
}

// TestLLMServeRefusals: on both stores, requests over a limit are refused up front, in the
// route's error shape, and never reach the upstream: a third stream at once over the client's
// two (whichever header carries its key); a request for gpt-big over the model's own 3,000
// tokens, though the client's own limit would take it (and another model's request still
// passes); and the request that crosses a money budget of $0.01, computed by hand.
func TestLLMServeRefusals(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			p, up, rs := llmServe(t, store)

			t.Run("streams at once", func(t *testing.T) {
				const stream = `{"model":"gpt-small","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"hello"}]}`
				var open []*http.Response
				for range 2 {
					resp := llmPost(t, p.proxy, "/v1/chat/completions", stream, "crew", "Authorization", "X-Test-Events", "100000", "X-Test-Interval", "10ms")
					if resp.StatusCode != http.StatusOK {
						t.Fatalf("a stream: %d %s", resp.StatusCode, readAll(t, resp))
					}
					open = append(open, resp)
				}
				for _, c := range []struct {
					path, body, header string
					anthropic          bool
				}{
					{"/v1/chat/completions", stream, "Authorization", false},
					{"/v1/messages", `{"model":"claude","max_tokens":10,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, "X-Api-Key", true},
				} {
					resp := llmPost(t, p.proxy, c.path, c.body, "crew", c.header)
					ms, err := llmRefusal(resp, readAll(t, resp), c.anthropic, "streams")
					if err != nil {
						t.Errorf("a third stream at once on %s: %v", c.path, err)
					} else if ms > 1000 {
						t.Errorf("a third stream at once: Retry-After-Ms %d, want at most 1000 (a slot frees whenever a stream ends)", ms)
					}
				}
				if n := upstreamSaw(up, "crew"); n != 2 {
					t.Errorf("the upstream saw %d of crew's requests, want the 2 streams", n)
				}
				for _, r := range open {
					r.Body.Close()
				}
				settledFor(t, p, "crew", 2)
				if got := balanceOf(t, p, "crew", "tpm"); got != 100000-2*102 {
					t.Errorf("after the streams: %d tokens left, want %d (their estimates: they were left)", got, 100000-2*102)
				}
			})

			t.Run("the model's own limit", func(t *testing.T) {
				// An estimate of 2 + 2,000 fits gpt-big's 3,000; it settles at 1,992, and a second
				// estimate of 2,002 does not fit the 1,008 left, though crew has 99,796 tokens; the refusal names
				// the model's policy with the model, as /v1/check does.
				big := `{"model":"gpt-big","max_tokens":2000,"messages":[{"role":"user","content":"hello"}]}`
				if resp := llmPost(t, p.proxy, "/v1/chat/completions", big, "crew", "Authorization", "X-Test-Usage", "input=2,output=1990"); resp.StatusCode != http.StatusOK {
					t.Fatalf("gpt-big: %d %s", resp.StatusCode, readAll(t, resp))
				} else {
					readAll(t, resp)
				}
				settledFor(t, p, "crew", 3)
				resp := llmPost(t, p.proxy, "/v1/chat/completions", big, "crew", "Authorization")
				if _, err := llmRefusal(resp, readAll(t, resp), false, "big-tpm@gpt-big"); err != nil {
					t.Errorf("gpt-big over its own limit: %v", err)
				}
				small := strings.Replace(big, "gpt-big", "gpt-small", 1)
				if resp := llmPost(t, p.proxy, "/v1/chat/completions", small, "crew", "Authorization", "X-Test-Usage", "input=2,output=1990"); resp.StatusCode != http.StatusOK {
					t.Errorf("gpt-small after gpt-big's refusal: %d %s, want 200 (the limit is gpt-big's)", resp.StatusCode, readAll(t, resp))
				} else {
					readAll(t, resp)
				}
				settledFor(t, p, "crew", 4)
				if got := balanceOf(t, p, "crew", "tpm"); got != 100000-2*102-2*1992 {
					t.Errorf("crew: %d tokens left, want %d", got, 100000-2*102-2*1992)
				}
				if rs != nil {
					if got := windowCount(t, rs, "rate-limit:{crew}:big-tpm@gpt-big:v2"); got != 1992 {
						t.Errorf("gpt-big's own limit: Redis counts %d tokens, want 1992", got)
					}
				}
				if n := upstreamSaw(up, "crew"); n != 4 {
					t.Errorf("the upstream saw %d of crew's requests, want 4", n)
				}
			})

			t.Run("money", func(t *testing.T) {
				// gpt-4o at $2.50, $1.25 cached and $10 per million tokens. Each request reserves
				// 2 × 2.5 + 100 × 10 = 1,005 micro-dollars and costs (300 - 101) × 2.5 + 101 × 1.25 +
				// 150 × 10 = 2,123.75, rounded up to 2,124. Of $0.01 (10,000), 1,504 are left after
				// four: the fifth fits its estimate and ends in debt (10,620 spent); the sixth is
				// refused.
				body := `{"model":"gpt-4o","max_tokens":100,"messages":[{"role":"user","content":"hello"}]}`
				for i, left := range []int64{7876, 5752, 3628, 1504, 0, -1} {
					resp := llmPost(t, p.proxy, "/v1/chat/completions", body, "intern", "Authorization", "X-Test-Usage", "input=300,cached=101,output=150")
					b := readAll(t, resp)
					if left < 0 {
						if _, err := llmRefusal(resp, b, false, "pocket"); err != nil {
							t.Errorf("request %d: %v", i+1, err)
						}
						break
					}
					if resp.StatusCode != http.StatusOK {
						t.Fatalf("request %d: %d %s, want 200", i+1, resp.StatusCode, b)
					}
					settledFor(t, p, "intern", i+1)
					if got := balanceOf(t, p, "intern", "pocket"); got != left {
						t.Errorf("after request %d: %d micro-dollars left, want %d", i+1, got, left)
					}
				}
				if rs != nil {
					if got := windowCount(t, rs, "rate-limit:{intern}:pocket:v2"); got != 5*2124 {
						t.Errorf("Redis counts %d micro-dollars spent, want %d", got, 5*2124)
					}
				}
				if n := upstreamSaw(up, "intern"); n != 5 {
					t.Errorf("the upstream saw %d of intern's requests, want 5", n)
				}
			})
		})
	}
}

// tap is a reverse proxy between an SDK and sluice that records what sluice answered: the
// status and Retry-After-Ms of each response, in order.
type tap struct {
	URL     string
	mu      sync.Mutex
	answers []tapped
	once    sync.Once
	err     error // before's
}

type tapped struct {
	status int
	ms     int64 // Retry-After-Ms; -1: none
}

// newTap starts a tap in front of target; before, if not nil, runs once before the first request
// is passed on (its error is seen's).
func newTap(t *testing.T, target string, before func() error) *tap {
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	tp := &tap{}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.FlushInterval = -1 // a stream passes event by event
	rp.ModifyResponse = func(r *http.Response) error {
		ms, err := strconv.ParseInt(r.Header.Get("Retry-After-Ms"), 10, 64)
		if err != nil {
			ms = -1
		}
		tp.mu.Lock()
		tp.answers = append(tp.answers, tapped{r.StatusCode, ms})
		tp.mu.Unlock()
		return nil
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if before != nil {
			tp.once.Do(func() {
				err := before()
				tp.mu.Lock()
				tp.err = err
				tp.mu.Unlock()
			})
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	tp.URL = srv.URL
	return tp
}

// seen returns sluice's answers so far, and before's error.
func (tp *tap) seen() ([]tapped, error) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return append([]tapped(nil), tp.answers...), tp.err
}

// settledErr waits until n of client's requests on usage routes have been settled, for any
// goroutine.
func settledErr(p *sluiceProc, client string, n int) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		r, err := tryGet(p.admin, "/metrics")
		if err != nil {
			return err
		}
		if sampleSum(string(r.body), "sluice_llm_requests_total", map[string]string{"client": client}) >= float64(n) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %d requests not settled within 20 s", client, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestLLMServeSDKs: the official SDKs, streaming and not, get through sluice the text and the
// usage they get from the API itself (an OpenAI completions stream on the route that injects
// usage gets its usage as well, though it did not ask); refused, each raises its own
// RateLimitError and retries after waiting at least the Retry-After-Ms sluice sent (seen by a
// proxy between them): over a concurrency limit, whose retry is refused again, and over a token
// bucket, whose retry passes, which shows that sluice's wait is not too short either.
func TestLLMServeSDKs(t *testing.T) {
	t.Parallel()
	llmtest.EnsureNode(t)
	p, up, _ := llmServe(t, "memory")
	for _, sdk := range []string{"openai", "anthropic"} {
		t.Run(sdk, func(t *testing.T) {
			t.Parallel()
			path, header, code := "/v1/chat/completions", "Authorization", "rate_limit_exceeded"
			if sdk == "anthropic" {
				path, header, code = "/v1/messages", "X-Api-Key", "rate_limit_error"
			}

			t.Run("answers unchanged", func(t *testing.T) {
				hdr := map[string]string{"X-Test-Usage": "input=120,output=53,cached=20", "X-Test-Events": "7", "X-Test-Event-Bytes": "5"}
				calls := []llmtest.ClientCall{{SDK: sdk, MaxTokens: 60}, {SDK: sdk, MaxTokens: 60, Stream: true, IncludeUsage: sdk == "openai"}}
				if sdk == "openai" {
					calls = append(calls, llmtest.ClientCall{SDK: sdk, MaxTokens: 60, Stream: true})
				}
				for _, c := range calls {
					c.Headers = hdr
					c.BaseURL, c.APIKey = up.URL, llmKey("plain")
					direct := llmtest.RunClient(t, c)
					c.BaseURL = p.proxy
					via := llmtest.RunClient(t, c)
					if !direct.OK || direct.Text != llmtest.Text(7, 5) {
						t.Fatalf("%+v directly: %+v", c, direct)
					}
					if !via.OK || via.Text != direct.Text || !reflect.DeepEqual(via.Usage, direct.Usage) || via.Attempts != 1 {
						t.Errorf("%+v through sluice: %+v (usage %+v), want text %q and usage %+v as directly", c, via, via.Usage, direct.Text, direct.Usage)
					}
				}
				if sdk == "openai" {
					c := llmtest.ClientCall{SDK: sdk, API: "completions", MaxTokens: 60, Stream: true, BaseURL: p.proxy, APIKey: llmKey("plain"), Headers: hdr}
					r := llmtest.RunClient(t, c)
					want := &llmtest.ClientUsage{PromptTokens: 120, CompletionTokens: 53, TotalTokens: 173, CachedTokens: 20}
					if !r.OK || r.Text != llmtest.Text(7, 5) || !reflect.DeepEqual(r.Usage, want) {
						t.Errorf("a completions stream, usage injected: %+v (usage %+v), want its text and usage %+v", r, r.Usage, want)
					}
				}
			})

			t.Run("refused over a concurrency limit", func(t *testing.T) {
				client := sdk + "-slots"
				body := `{"model":"held","max_tokens":10,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
				held := llmPost(t, p.proxy, path, body, client, header, "X-Test-Events", "100000", "X-Test-Interval", "10ms")
				if held.StatusCode != http.StatusOK {
					t.Fatalf("the held stream: %d %s", held.StatusCode, readAll(t, held))
				}
				defer held.Body.Close()
				tp := newTap(t, p.proxy, nil)
				r := llmtest.RunClient(t, llmtest.ClientCall{SDK: sdk, BaseURL: tp.URL, APIKey: llmKey(client), MaxRetries: 1, MaxTokens: 10})
				seen, _ := tp.seen()
				if r.OK || r.ErrorType != "RateLimitError" || r.ErrorCode != code || r.Status != 429 || r.Attempts != 2 ||
					!reflect.DeepEqual(r.Statuses, []int{429, 429}) || len(seen) != 2 {
					t.Fatalf("got %+v; sluice answered %+v", r, seen)
				}
				if ms := seen[0].ms; ms <= 0 || ms > 1000 || r.Gaps[0] < time.Duration(ms)*time.Millisecond {
					t.Errorf("sluice sent Retry-After-Ms %d (want 1..1000); the SDK retried after %v", ms, r.Gaps[0])
				}
				if n := upstreamSaw(up, client); n != 1 {
					t.Errorf("the upstream saw %d of %s's requests, want the held stream only", n, client)
				}
			})

			t.Run("refused over a token bucket, then passes", func(t *testing.T) {
				// The bucket holds 100 tokens, refilled 50 a second. Just before the SDK's first
				// request goes on (whenever node is ready), a request that used 190 leaves it 90 in
				// debt: the SDK's (3 + 50 tokens reserved) is refused for about 2.9 s, and its retry
				// passes once it has waited what sluice said.
				client := sdk + "-trickle"
				tp := newTap(t, p.proxy, func() error {
					body := `{"model":"drain","max_tokens":50,"messages":[{"role":"user","content":"hello"}]}`
					resp, err := tryLLMPost(p.proxy, path, body, client, header, "X-Test-Usage", "input=40,output=150")
					if err != nil {
						return err
					}
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err != nil || resp.StatusCode != http.StatusOK {
						return fmt.Errorf("the request that drains the bucket: %d %v", resp.StatusCode, err)
					}
					return settledErr(p, client, 1)
				})
				r := llmtest.RunClient(t, llmtest.ClientCall{SDK: sdk, BaseURL: tp.URL, APIKey: llmKey(client), MaxRetries: 1, MaxTokens: 50,
					Headers: map[string]string{"X-Test-Usage": "input=1,output=1"}})
				seen, err := tp.seen()
				if err != nil {
					t.Fatal(err)
				}
				if !r.OK || r.Attempts != 2 || !reflect.DeepEqual(r.Statuses, []int{429, 200}) || len(seen) != 2 {
					t.Fatalf("got %+v; sluice answered %+v", r, seen)
				}
				if ms := seen[0].ms; ms <= 0 || r.Gaps[0] < time.Duration(ms)*time.Millisecond {
					t.Errorf("sluice sent Retry-After-Ms %d; the SDK retried after %v", ms, r.Gaps[0])
				}
				t.Logf("sluice sent Retry-After-Ms %d; the SDK retried after %v", seen[0].ms, r.Gaps[0])
				if n := upstreamSaw(up, client); n != 2 {
					t.Errorf("the upstream saw %d of %s's requests, want 2 (the refusal never reached it)", n, client)
				}
			})
		})
	}
}

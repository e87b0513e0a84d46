package llm

import (
	"bytes"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

// The payloads are the shapes of the providers' API references: bodies and streams as they send
// them, trimmed of nothing that matters to the scan.

const chatJSON = `{
  "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
  "object": "chat.completion",
  "created": 1741569952,
  "model": "gpt-4.1-2025-04-14",
  "choices": [
    {
      "index": 0,
      "message": {
        "role": "assistant",
        "content": "Hello! How can I assist you today? \"usage\": {\"total_tokens\": 9}",
        "refusal": null,
        "annotations": []
      },
      "logprobs": null,
      "finish_reason": "stop"
    }
  ],
  "usage": {
    "prompt_tokens": 1919,
    "completion_tokens": 10,
    "total_tokens": 1929,
    "prompt_tokens_details": {
      "cached_tokens": 1792,
      "audio_tokens": 0
    },
    "completion_tokens_details": {
      "reasoning_tokens": 0,
      "audio_tokens": 0,
      "accepted_prediction_tokens": 0,
      "rejected_prediction_tokens": 0
    }
  },
  "service_tier": "default"
}
`

const completionJSON = `{"id":"cmpl-uqkvlQyYK7bGYrRHQ0eXlWi7","object":"text_completion","created":1589478378,"model":"gpt-3.5-turbo-instruct","system_fingerprint":"fp_44709d6fcb","choices":[{"text":"\n\nThis is indeed a test","index":0,"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}`

const embeddingsJSON = `{"object":"list","data":[{"object":"embedding","embedding":[0.0023064255,-0.009327292,-0.0028842222,1e-05],"index":0}],"model":"text-embedding-ada-002","usage":{"prompt_tokens":8,"total_tokens":8}}`

const responsesJSON = `{"id":"resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b","object":"response","created_at":1741476542,"status":"completed","error":null,"incomplete_details":null,"instructions":null,"max_output_tokens":null,"model":"gpt-4.1-2025-04-14","output":[{"type":"message","id":"msg_67ccd2bf17f0819081ff3bb2cf6508e60bb6a6b452d3795b","status":"completed","role":"assistant","content":[{"type":"output_text","text":"In a peaceful grove beneath a silver moon...","annotations":[]}]}],"parallel_tool_calls":true,"previous_response_id":null,"reasoning":{"effort":null,"summary":null},"store":true,"temperature":1.0,"text":{"format":{"type":"text"}},"tool_choice":"auto","tools":[],"top_p":1.0,"truncation":"disabled","usage":{"input_tokens":36,"input_tokens_details":{"cached_tokens":0},"output_tokens":87,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":123},"user":null,"metadata":{}}`

const chatSSE = `data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null}

data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":53,"total_tokens":62,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}}}

data: [DONE]

`

// chatSSENoUsage is a stream whose request did not set stream_options.include_usage.
const chatSSENoUsage = `data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}

data: [DONE]

`

const responsesSSE = `event: response.created
data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654","object":"response","created_at":1741290958,"status":"in_progress","error":null,"model":"gpt-4.1-2025-04-14","output":[],"usage":null,"user":null,"metadata":{}}}

event: response.output_text.delta
data: {"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","output_index":0,"content_index":0,"delta":"Hi"}

event: response.completed
data: {"type":"response.completed","sequence_number":9,"response":{"id":"resp_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654","object":"response","created_at":1741290958,"status":"completed","error":null,"model":"gpt-4.1-2025-04-14","output":[{"id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hi there! How can I assist you today?","annotations":[]}]}],"usage":{"input_tokens":37,"input_tokens_details":{"cached_tokens":5},"output_tokens":11,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":48},"user":null,"metadata":{}}}

`

const messagesJSON = `{"id":"msg_013Zva2CMHLNnXjNJJKqJ2EF","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"Hi! My name is Claude."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":2095,"output_tokens":503,"cache_creation_input_tokens":100,"cache_read_input_tokens":1000}}`

const messagesSSE = `event: message_start
data: {"type":"message_start","message":{"id":"msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":0,"cache_read_input_tokens":4000,"output_tokens":1}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: ping
data: {"type": "ping"}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"!"}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":9}}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}

event: message_stop
data: {"type":"message_stop"}

`

// messagesSSECut ends after message_start: the input is known, the output is not.
const messagesSSECut = `event: message_start
data: {"type":"message_start","message":{"id":"msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"output_tokens":1}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: error
data: {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}

`

const cohereJSON = `{"response_id":"5b9f3f6b-2c3e-4a2b-9f2b-1e0f0c0d0e0f","text":"LLMs are...","generation_id":"0ac5dd1d-9d48-4b1c-a8b3-3a0e1f9d4a2b","finish_reason":"COMPLETE","meta":{"api_version":{"version":"1"},"billed_units":{"input_tokens":17,"output_tokens":12.5}}}`

const openaiError = `{"error":{"message":"Rate limit reached for gpt-4o in organization org-abc on tokens per min (TPM): Limit 30000, Used 29900, Requested 500.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}`

const anthropicError = `{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}`

func mustPath(t testing.TB, s string) Path {
	t.Helper()
	p, err := ParsePath(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

type payload struct {
	name   string
	format Format
	path   string // Field's
	ctype  string
	body   string
	want   Usage
}

func payloads(t testing.TB) []payload {
	const js, es = "application/json", "text/event-stream; charset=utf-8"
	return []payload{
		{"openai chat", OpenAI, "", js, chatJSON, Usage{1919, 10, 1792, 1929, true}},
		{"openai completion", OpenAI, "", js, completionJSON, Usage{5, 7, 0, 12, true}},
		{"openai embeddings", OpenAI, "", js, embeddingsJSON, Usage{8, 0, 0, 8, true}},
		{"openai responses", OpenAI, "", js, responsesJSON, Usage{36, 87, 0, 123, true}},
		{"openai chat stream", OpenAI, "", es, chatSSE, Usage{9, 53, 0, 62, true}},
		{"openai chat stream without usage", OpenAI, "", es, chatSSENoUsage, Usage{}},
		{"openai responses stream", OpenAI, "", es, responsesSSE, Usage{37, 11, 5, 48, true}},
		{"openai error", OpenAI, "", js, openaiError, Usage{}},
		{"openai stream read as JSON", OpenAI, "", js, chatSSE, Usage{}},
		{"openai body cut short", OpenAI, "", js, chatJSON[:len(chatJSON)-30], Usage{}},
		{"openai garbage after the body", OpenAI, "", js, chatJSON + "}", Usage{}},
		{"anthropic message", Anthropic, "", js, messagesJSON, Usage{3195, 503, 1000, 3698, true}},
		{"anthropic stream", Anthropic, "", es, messagesSSE, Usage{4025, 15, 4000, 4040, true}},
		{"anthropic stream whose message_delta has every count", Anthropic, "", es, strings.Replace(messagesSSE, `"usage":{"output_tokens":15}`, `"usage":{"input_tokens":25,"cache_creation_input_tokens":30,"cache_read_input_tokens":4000,"output_tokens":15}`, 1), Usage{4055, 15, 4000, 4070, true}},
		{"anthropic stream cut after message_start", Anthropic, "", es, messagesSSECut, Usage{}},
		{"anthropic stream without its last empty line", Anthropic, "", es, strings.TrimSuffix(messagesSSE, "\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n") + "\n", Usage{4025, 9, 4000, 4034, true}},
		{"anthropic error", Anthropic, "", js, anthropicError, Usage{}},
		{"anthropic reading openai", Anthropic, "", js, chatJSON, Usage{}},
		{"field in a body", Field, "meta.billed_units.output_tokens", js, cohereJSON, Usage{Total: 13, Found: true}},
		{"field in the last event that has it", Field, "usage.completion_tokens", es, chatSSE, Usage{Total: 53, Found: true}},
		{"field absent", Field, "meta.billed_units.output_tokens", js, chatJSON, Usage{}},
		{"field under an array", Field, "choices.index", js, chatJSON, Usage{}},
		{"empty body", OpenAI, "", js, "", Usage{}},
		{"garbage", OpenAI, "", js, "\x00\xff{\"usage\"", Usage{}},
		{"garbage stream", Anthropic, "", es, "data: {\"usage\":{\"output_tokens\":3}\n\ndata: }}\n\n", Usage{}},
	}
}

func meter(t testing.TB, p payload) *Meter {
	var path Path
	if p.path != "" {
		path = mustPath(t, p.path)
	}
	return NewMeter(p.format, path, p.ctype)
}

// TestMeterSplit reads every payload whole, byte by byte and split in two at every byte, with
// each of the line ends of server-sent events: every reading reports the payload's usage.
func TestMeterSplit(t *testing.T) {
	for _, p := range payloads(t) {
		bodies := []string{p.body}
		if strings.HasPrefix(p.ctype, "text/event-stream") {
			bodies = append(bodies, strings.ReplaceAll(p.body, "\n", "\r\n"), strings.ReplaceAll(p.body, "\n", "\r"), "\xEF\xBB\xBF"+p.body)
		}
		for j, body := range bodies {
			t.Run(fmt.Sprintf("%s/%d", p.name, j), func(t *testing.T) {
				m := meter(t, p)
				m.Write([]byte(body))
				if got := m.Usage(); got != p.want {
					t.Fatalf("whole: got %+v, want %+v", got, p.want)
				}
				m = meter(t, p)
				for i := range len(body) {
					m.Write([]byte{body[i]})
				}
				if got := m.Usage(); got != p.want {
					t.Fatalf("byte by byte: got %+v, want %+v", got, p.want)
				}
				for i := range len(body) + 1 {
					m := meter(t, p)
					if n, err := m.Write([]byte(body[:i])); n != i || err != nil {
						t.Fatalf("Write: %d, %v", n, err)
					}
					m.Write([]byte(body[i:]))
					if got := m.Usage(); got != p.want {
						t.Fatalf("split at %d: got %+v, want %+v", i, got, p.want)
					}
				}
			})
		}
	}
}

// TestMeterSSEFields checks the event-stream grammar the payloads leave out: data spread over
// lines, a "data" line with no colon, comments, other fields, an event without data, and a last
// event never ended.
func TestMeterSSEFields(t *testing.T) {
	for _, c := range []struct {
		name, body string
		want       int64
	}{
		{"multi-line data", "data: {\"usage\":\ndata:{\"total_tokens\": 7}}\n\n", 7},
		{"a bare data line joins with a newline", "data: {\"usage\":\ndata\ndata: {\"total_tokens\": 7}}\n\n", 7},
		{"comments and other fields", ": ping\nid: 3\nretry: 10\nevent: x\ndata: {\"usage\":{\"total_tokens\":4}}\n\n", 4},
		{"datum is not data", "datum: {\"usage\":{\"total_tokens\":4}}\n\n", 0},
		{"an event without data changes nothing", "data: {\"usage\":{\"total_tokens\":4}}\n\nevent: x\n\n\n\n", 4},
		{"the last wins", "data: {\"usage\":{\"total_tokens\":4}}\n\ndata: {\"usage\":{\"total_tokens\":6}}\n\n", 6},
		{"an unended event is not dispatched", "data: {\"usage\":{\"total_tokens\":4}}\n\ndata: {\"usage\":{\"total_tokens\":6}}\n", 4},
		{"two values in one event are garbage", "data: {\"usage\":{\"total_tokens\":4}}\ndata: {}\n\n", 0},
		{"two spaces: the value starts with one", "data:  {\"usage\":{\"total_tokens\":4}}\n\n", 4},
		{"negative, exponent: not counts", "data: {\"usage\":{\"total_tokens\":-4, \"prompt_tokens\": 1e3}}\n\n", 0},
		{"fraction rounds up", "data: {\"usage\":{\"total_tokens\":4.01}}\n\n", 5},
		{"huge number saturates", "data: {\"usage\":{\"total_tokens\":99999999999999999999999}}\n\n", maxCount},
		{"escaped key matches nothing", "data: {\"usage\":{\"total\\u005ftokens\":4}}\n\n", 0},
		{"duplicate keys: the last wins", "data: {\"usage\":{\"total_tokens\":4,\"total_tokens\":5}}\n\n", 5},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := NewMeter(OpenAI, Path{}, "Text/Event-Stream")
			m.Write([]byte(c.body))
			if got := m.Usage(); got.Total != c.want || got.Found != (c.want > 0) {
				t.Fatalf("got %+v, want total %d", got, c.want)
			}
		})
	}
}

// TestMeterDeepNesting: a body nested past what the scan tracks is garbage, and costs no memory.
func TestMeterDeepNesting(t *testing.T) {
	body := `{"usage":{"total_tokens":4},"x":` + strings.Repeat("[", maxNest) + strings.Repeat("]", maxNest) + "}"
	m := NewMeter(OpenAI, Path{}, "application/json")
	m.Write([]byte(body))
	if got := m.Usage(); got.Found {
		t.Fatalf("got %+v, want none", got)
	}
	body = `{"usage":{"total_tokens":4},"x":` + strings.Repeat("[", maxNest-2) + strings.Repeat("]", maxNest-2) + "}"
	m = NewMeter(OpenAI, Path{}, "application/json")
	m.Write([]byte(body))
	if got := m.Usage(); got.Total != 4 {
		t.Fatalf("got %+v, want 4 tokens", got)
	}
}

// chunks returns n chat completion chunks of a typical size (about 200 bytes each).
func chunks(n int) []byte {
	var b bytes.Buffer
	for i := range n {
		fmt.Fprintf(&b, "data: {\"id\":\"chatcmpl-123\",\"object\":\"chat.completion.chunk\",\"created\":1694268190,\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"token %d\"},\"finish_reason\":null}],\"usage\":null}\n\n", i)
	}
	return b.Bytes()
}

const final = "data: {\"id\":\"chatcmpl-123\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":12,\"total_tokens\":21}}\n\ndata: [DONE]\n\n"

// TestMeterMemory feeds a gigabyte of events (an eighth of one under the race detector, which
// makes each byte ten times as slow), and a 64 MiB event, through a Meter: it allocates nothing,
// its heap does not grow, and it finds the usage at their end.
func TestMeterMemory(t *testing.T) {
	block := chunks(20_000) // ~4 MiB
	volume := 1 << 30
	if raceEnabled() {
		volume >>= 3
	}
	m := NewMeter(OpenAI, Path{}, "text/event-stream")
	if a := testing.AllocsPerRun(10, func() { m.Write(block) }); a != 0 {
		t.Fatalf("Write allocates %v times", a)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	total := 0
	for total < volume {
		m.Write(block)
		total += len(block)
	}
	huge := bytes.Repeat([]byte("a"), 64<<20) // one event of 64 MiB, its usage before a long string
	copy(huge, `data: {"usage":{"total_tokens":7},"x":"`)
	m.Write(huge)
	m.Write([]byte("\"}\n\n"))
	if got := m.Usage(); got.Total != 7 {
		t.Fatalf("after the huge event: got %+v, want 7 tokens", got)
	}
	m.Write([]byte(final))
	runtime.ReadMemStats(&after)
	if got := m.Usage(); got != (Usage{9, 12, 0, 21, true}) {
		t.Fatalf("got %+v", got)
	}
	if d := after.TotalAlloc - before.TotalAlloc; d > 64<<20+1<<20 {
		t.Fatalf("%d bytes allocated reading %d bytes (64 MiB of them by the test)", d, total)
	}
	t.Logf("%d MiB in %v", total>>20, time.Since(start))
}

// TestMeterFieldHugeBody: a JSON body of 32 MiB (an embeddings response) is read with no
// allocation, the usage at its end found.
func TestMeterFieldHugeBody(t *testing.T) {
	m := NewMeter(Field, mustPath(t, "usage.prompt_tokens"), "application/json")
	m.Write([]byte(`{"object":"list","data":[{"object":"embedding","index":0,"embedding":[`))
	chunk := bytes.Repeat([]byte("-0.0028842222,"), 1<<16)
	if a := testing.AllocsPerRun(32<<20/len(chunk), func() { m.Write(chunk) }); a != 0 {
		t.Fatalf("Write allocates %v times", a)
	}
	m.Write([]byte(`0.1]}],"model":"text-embedding-3-small","usage":{"prompt_tokens":8,"total_tokens":8}}`))
	if got := m.Usage(); got != (Usage{Total: 8, Found: true}) {
		t.Fatalf("got %+v", got)
	}
}

// FuzzMeter: whatever the bytes, nothing panics, Write allocates nothing, and a split anywhere
// reports what the whole does.
func FuzzMeter(f *testing.F) {
	for _, p := range payloads(f) {
		f.Add([]byte(p.body), uint(len(p.body)/2), uint8(p.format), strings.HasPrefix(p.ctype, "text/event-stream"))
	}
	path := mustPath(f, "usage.total_tokens")
	f.Fuzz(func(t *testing.T, body []byte, at uint, format uint8, stream bool) {
		ct := "application/json"
		if stream {
			ct = "text/event-stream"
		}
		fm := Format(format%3 + 1)
		whole := NewMeter(fm, path, ct)
		if a := testing.AllocsPerRun(1, func() { whole.Write(body) }); a != 0 {
			t.Fatalf("Write allocates %v times", a)
		}
		// AllocsPerRun wrote body twice: read it twice in two halves too.
		split := NewMeter(fm, path, ct)
		i := int(at % uint(len(body)+1))
		for range 2 {
			split.Write(body[:i])
			split.Write(body[i:])
		}
		if a, b := whole.Usage(), split.Usage(); a != b {
			t.Fatalf("whole: %+v, split at %d: %+v", a, i, b)
		}
	})
}

// raceEnabled reports whether this test binary was built with -race.
func raceEnabled() bool {
	bi, _ := debug.ReadBuildInfo()
	for _, s := range bi.Settings {
		if s.Key == "-race" && s.Value == "true" {
			return true
		}
	}
	return false
}

func BenchmarkMeterStream(b *testing.B) {
	stream := append(chunks(1000), final...)
	b.SetBytes(int64(len(stream)))
	for b.Loop() {
		m := NewMeter(OpenAI, Path{}, "text/event-stream")
		m.Write(stream)
		if !m.Usage().Found {
			b.Fatal("no usage")
		}
	}
}

func TestCost(t *testing.T) {
	u := Usage{Input: 1000, Output: 10, CachedInput: 3, Total: 1010, Found: true}
	w := Weights{Input: 1000, CachedInput: 100, Output: 4000}
	for _, c := range []struct {
		name string
		u    Usage
		c    Count
		w    Weights
		want int64
	}{
		{"total", u, CountTotal, w, 1010},
		{"input", u, CountInput, w, 1000},
		{"output", u, CountOutput, w, 10},
		{"weighted rounds up", u, CountWeighted, w, 997 + 1 + 40}, // 997 + 0.3 + 40
		{"weighted exact", Usage{Input: 10, CachedInput: 10, Output: 1, Found: true}, CountWeighted, w, 5},
		{"cached over input", Usage{Input: 1, CachedInput: 10, Found: true}, CountWeighted, w, 1},
		{"not found", Usage{Total: 5}, CountTotal, w, 0},
		{"saturates", Usage{Input: maxCount, Output: maxCount, Found: true}, CountWeighted, Weights{MaxWeight, MaxWeight, MaxWeight}, maxCount},
		{"saturates just", Usage{Output: maxCount/2 + 1, Found: true}, CountWeighted, Weights{Output: 2000}, maxCount},
		{"negative counts are 0", Usage{Input: -5, Output: -5, Total: -5, Found: true}, CountWeighted, w, 0},
		{"weights clamped", Usage{Output: 1, Found: true}, CountWeighted, Weights{Output: -1}, 0},
		{"unknown count", u, Count(9), w, 0},
	} {
		if got := Cost(c.u, c.c, c.w); got != c.want {
			t.Errorf("%s: got %d, want %d", c.name, got, c.want)
		}
	}
}

func TestParse(t *testing.T) {
	for s, want := range map[string]int64{"4": 4000, "0.1": 100, "1.25": 1250, "0": 0, "0.001": 1, "1000000": MaxWeight} {
		if got, err := ParseWeight(s); got != want || err != nil {
			t.Errorf("ParseWeight(%q): %d, %v; want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"", ".5", "1.", "0.0001", "-1", "1e3", "x", "1000000.001", "99999999999999999999"} {
		if _, err := ParseWeight(s); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", s)) {
			t.Errorf("ParseWeight(%q): %v, want an error naming it", s, err)
		}
	}
	for _, s := range []string{"total", "input", "output", "weighted"} {
		if c, err := ParseCount(s); err != nil || c.String() != s {
			t.Errorf("ParseCount(%q): %v, %v", s, c, err)
		}
	}
	if _, err := ParseCount("tokens"); err == nil {
		t.Error("ParseCount(tokens): no error")
	}
	for _, s := range []string{"", "a..b", ".a", "a.", strings.Repeat("k", maxKey+1), strings.Repeat("a.", maxTrack) + "a", `a"b`} {
		if _, err := ParsePath(s); err == nil {
			t.Errorf("ParsePath(%q): no error", s)
		}
	}
	if p := mustPath(t, "meta.billed_units.output_tokens"); p.String() != "meta.billed_units.output_tokens" {
		t.Errorf("String: %q", p)
	}
}

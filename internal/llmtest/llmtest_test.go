package llmtest

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/llm"
)

// post sends body to the server's path with the X-Test-* headers hdr ("Name: value" each).
func post(t *testing.T, s *Server, path, body string, hdr ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for _, h := range hdr {
		k, v, _ := strings.Cut(h, ": ")
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// meter reads the whole body through a Meter of format f, and returns the usage and the body.
// A body cut short is read up to its cut.
func meter(t *testing.T, resp *http.Response, f llm.Format) (llm.Usage, []byte) {
	t.Helper()
	m := llm.NewMeter(f, llm.Path{}, resp.Header.Get("Content-Type"))
	var b bytes.Buffer
	if _, err := io.Copy(io.MultiWriter(m, &b), resp.Body); err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("reading the body: %v", err)
	}
	return m.Usage(), b.Bytes()
}

// event is a server-sent event.
type event struct{ name, data string }

// parseEvents splits a stream into its events (this package writes one data line each).
func parseEvents(t *testing.T, b []byte) []event {
	t.Helper()
	var evs []event
	for _, block := range strings.Split(strings.TrimSuffix(string(b), "\n\n"), "\n\n") {
		var e event
		for _, line := range strings.Split(block, "\n") {
			switch k, v, _ := strings.Cut(line, ": "); k {
			case "event":
				e.name = v
			case "data":
				e.data = v
			default:
				t.Fatalf("line %q in event %q", line, block)
			}
		}
		evs = append(evs, e)
	}
	return evs
}

func decode(t *testing.T, data []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%v in %s", err, data)
	}
}

// TestJSONShapes: each endpoint's JSON body decodes into its provider's shape, with the text and
// the usage asked for, and package llm's Meter reads exactly that usage from it.
func TestJSONShapes(t *testing.T) {
	s := Start(t)
	usage := "X-Test-Usage: input=120,output=53,cached=20"
	want := llm.Usage{Input: 120, Output: 53, CachedInput: 20, Total: 173, Found: true}
	text := Text(7, 3)

	t.Run("chat", func(t *testing.T) {
		resp := post(t, s, "/v1/chat/completions", `{"model":"gpt-x","messages":[{"role":"user","content":"hi"}]}`, usage, "X-Test-Events: 7", "X-Test-Event-Bytes: 3")
		u, body := meter(t, resp, llm.OpenAI)
		var got struct {
			ID, Object, Model string
			Created           int64
			Choices           []struct {
				Index   int
				Message struct{ Role, Content string }
				Finish  string `json:"finish_reason"`
			}
			Usage struct {
				Prompt     int64 `json:"prompt_tokens"`
				Completion int64 `json:"completion_tokens"`
				Total      int64 `json:"total_tokens"`
				Details    struct {
					Cached int64 `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			}
		}
		decode(t, body, &got)
		if got.Object != "chat.completion" || got.Model != "gpt-x" || got.Created != Created || !strings.HasPrefix(got.ID, "chatcmpl-") ||
			len(got.Choices) != 1 || got.Choices[0].Message.Role != "assistant" || got.Choices[0].Message.Content != text || got.Choices[0].Finish != "stop" ||
			got.Usage.Prompt != 120 || got.Usage.Completion != 53 || got.Usage.Total != 173 || got.Usage.Details.Cached != 20 {
			t.Fatalf("body %s", body)
		}
		if u != want {
			t.Fatalf("meter read %+v, want %+v", u, want)
		}
	})
	t.Run("completions", func(t *testing.T) {
		resp := post(t, s, "/v1/completions", `{"model":"m","prompt":"hi"}`, usage, "X-Test-Events: 7", "X-Test-Event-Bytes: 3")
		u, body := meter(t, resp, llm.OpenAI)
		var got struct {
			Object  string
			Choices []struct{ Text string }
		}
		decode(t, body, &got)
		if got.Object != "text_completion" || len(got.Choices) != 1 || got.Choices[0].Text != text || u != want {
			t.Fatalf("body %s, meter %+v", body, u)
		}
	})
	t.Run("embeddings", func(t *testing.T) {
		for _, enc := range []string{"float", "base64"} {
			resp := post(t, s, "/v1/embeddings", `{"model":"e","input":["a","b"],"encoding_format":"`+enc+`"}`, "X-Test-Usage: input=9")
			u, body := meter(t, resp, llm.OpenAI)
			var got struct {
				Object string
				Data   []struct {
					Object    string
					Index     int
					Embedding json.RawMessage
				}
				Usage struct {
					Prompt int64 `json:"prompt_tokens"`
					Total  int64 `json:"total_tokens"`
				}
			}
			decode(t, body, &got)
			if got.Object != "list" || len(got.Data) != 2 || got.Data[1].Index != 1 || got.Usage.Prompt != 9 || got.Usage.Total != 9 {
				t.Fatalf("%s: body %s", enc, body)
			}
			var vec []float32
			if enc == "float" {
				decode(t, got.Data[1].Embedding, &vec)
			} else {
				var s string
				decode(t, got.Data[1].Embedding, &s)
				raw, err := base64.StdEncoding.DecodeString(s)
				if err != nil {
					t.Fatal(err)
				}
				for i := 0; i+4 <= len(raw); i += 4 {
					vec = append(vec, math.Float32frombits(binary.LittleEndian.Uint32(raw[i:])))
				}
			}
			if !reflect.DeepEqual(vec, []float32{2, -0.5, 0.25, 0.125}) {
				t.Fatalf("%s: embedding %v", enc, vec)
			}
			if w := (llm.Usage{Input: 9, Total: 9, Found: true}); u != w {
				t.Fatalf("%s: meter read %+v, want %+v", enc, u, w)
			}
		}
	})
	t.Run("responses", func(t *testing.T) {
		resp := post(t, s, "/v1/responses", `{"model":"m","input":"hi"}`, usage, "X-Test-Events: 7", "X-Test-Event-Bytes: 3")
		u, body := meter(t, resp, llm.OpenAI)
		var got struct {
			Object, Status string
			Output         []struct {
				Type, Role string
				Content    []struct{ Type, Text string }
			}
			Usage struct {
				Input   int64 `json:"input_tokens"`
				Output  int64 `json:"output_tokens"`
				Total   int64 `json:"total_tokens"`
				Details struct {
					Cached int64 `json:"cached_tokens"`
				} `json:"input_tokens_details"`
			}
		}
		decode(t, body, &got)
		if got.Object != "response" || got.Status != "completed" || len(got.Output) != 1 || len(got.Output[0].Content) != 1 ||
			got.Output[0].Content[0].Type != "output_text" || got.Output[0].Content[0].Text != text ||
			got.Usage.Input != 120 || got.Usage.Output != 53 || got.Usage.Total != 173 || got.Usage.Details.Cached != 20 || u != want {
			t.Fatalf("body %s, meter %+v", body, u)
		}
	})
	t.Run("messages", func(t *testing.T) {
		resp := post(t, s, "/v1/messages", `{"model":"claude-x","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`,
			"X-Test-Usage: input=120,output=53,cached=20,write=30", "X-Test-Events: 7", "X-Test-Event-Bytes: 3")
		u, body := meter(t, resp, llm.Anthropic)
		var got struct {
			ID, Type, Role, Model string
			Content               []struct{ Type, Text string }
			Stop                  string `json:"stop_reason"`
			Usage                 struct {
				Input  int64 `json:"input_tokens"`
				Output int64 `json:"output_tokens"`
				Read   int64 `json:"cache_read_input_tokens"`
				Write  int64 `json:"cache_creation_input_tokens"`
			}
		}
		decode(t, body, &got)
		if got.Type != "message" || got.Role != "assistant" || got.Model != "claude-x" || got.Stop != "end_turn" ||
			len(got.Content) != 1 || got.Content[0].Type != "text" || got.Content[0].Text != text ||
			got.Usage.Input != 70 || got.Usage.Output != 53 || got.Usage.Read != 20 || got.Usage.Write != 30 || u != want {
			t.Fatalf("body %s, meter %+v", body, u)
		}
	})
}

// TestDefaultUsage: without X-Test-Usage the usage follows from the request: a quarter of its
// bytes in, its max_tokens (else 16) out.
func TestDefaultUsage(t *testing.T) {
	s := Start(t)
	body := `{"model":"m","max_completion_tokens":40,"messages":[{"role":"user","content":"0123456789"}]}`
	u, _ := meter(t, post(t, s, "/v1/chat/completions", body), llm.OpenAI)
	if w := (llm.Usage{Input: int64(len(body) / 4), Output: 40, Total: int64(len(body)/4) + 40, Found: true}); u != w {
		t.Fatalf("usage %+v, want %+v", u, w)
	}
	u, _ = meter(t, post(t, s, "/v1/messages", `{}`), llm.Anthropic)
	if w := (llm.Usage{Input: 1, Output: DefaultOutput, Total: 1 + DefaultOutput, Found: true}); u != w {
		t.Fatalf("usage %+v, want %+v", u, w)
	}
}

// streamText assembles the text of a stream's content events.
func streamText(t *testing.T, path string, evs []event) string {
	t.Helper()
	var b strings.Builder
	for _, e := range evs {
		if e.data == "[DONE]" {
			continue
		}
		var v struct {
			Type    string
			Delta   json.RawMessage
			Choices []struct {
				Text  string
				Delta struct{ Content string }
			}
		}
		decode(t, []byte(e.data), &v)
		switch path {
		case "/v1/chat/completions", "/v1/completions":
			for _, c := range v.Choices {
				b.WriteString(c.Delta.Content + c.Text)
			}
		case "/v1/responses":
			if v.Type == "response.output_text.delta" {
				var d string
				decode(t, v.Delta, &d)
				b.WriteString(d)
			}
		case "/v1/messages":
			if v.Type == "content_block_delta" {
				var d struct{ Text string }
				decode(t, v.Delta, &d)
				b.WriteString(d.Text)
			}
		}
	}
	return b.String()
}

var streams = []struct {
	path, body string
	format     llm.Format
	names      []string // the events' names, in order, "*" standing for the content events
}{
	{"/v1/chat/completions", `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`, llm.OpenAI, nil},
	{"/v1/completions", `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`, llm.OpenAI, nil},
	{"/v1/responses", `{"model":"m","stream":true}`, llm.OpenAI, []string{"response.created", "response.in_progress",
		"response.output_item.added", "response.content_part.added", "*", "response.output_text.done",
		"response.content_part.done", "response.output_item.done", "response.completed"}},
	{"/v1/messages", `{"model":"m","max_tokens":5,"stream":true}`, llm.Anthropic, []string{"message_start", "content_block_start",
		"ping", "*", "content_block_stop", "message_delta", "message_stop"}},
}

// TestStreams: every stream carries the text asked for in its events, names them as its provider
// does, and parses with package llm's Meter to exactly the usage asked for.
func TestStreams(t *testing.T) {
	s := Start(t)
	want := llm.Usage{Input: 120, Output: 53, CachedInput: 20, Total: 173, Found: true}
	for _, tc := range streams {
		t.Run(tc.path, func(t *testing.T) {
			resp := post(t, s, tc.path, tc.body, "X-Test-Usage: input=120,output=53,cached=20", "X-Test-Events: 1000", "X-Test-Event-Bytes: 30")
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
				t.Fatalf("Content-Type %q", ct)
			}
			u, body := meter(t, resp, tc.format)
			if u != want {
				t.Fatalf("meter read %+v, want %+v", u, want)
			}
			evs := parseEvents(t, body)
			if got := streamText(t, tc.path, evs); got != Text(1000, 30) {
				t.Fatalf("text of %d bytes, want %d", len(got), 1000*30)
			}
			if tc.names == nil {
				if last := evs[len(evs)-1]; last.data != "[DONE]" {
					t.Fatalf("last event %q, want [DONE]", last.data)
				}
				var v struct {
					Choices []any
					Usage   *struct {
						Total int64 `json:"total_tokens"`
					}
				}
				decode(t, []byte(evs[len(evs)-2].data), &v)
				if len(v.Choices) != 0 || v.Usage == nil || v.Usage.Total != 173 {
					t.Fatalf("usage chunk %s", evs[len(evs)-2].data)
				}
				return
			}
			var got []string
			for _, e := range evs {
				var v struct{ Type string }
				decode(t, []byte(e.data), &v)
				if v.Type != e.name {
					t.Fatalf("event %q has type %q", e.name, v.Type)
				}
				n := e.name
				if n == "content_block_delta" || n == "response.output_text.delta" {
					n = "*"
				}
				if len(got) == 0 || n != "*" || got[len(got)-1] != "*" {
					got = append(got, n)
				}
			}
			if !reflect.DeepEqual(got, tc.names) {
				t.Fatalf("events %v, want %v", got, tc.names)
			}
		})
	}
}

// TestNoUsage: a stream cut short, a stream or a body without usage, and an OpenAI stream whose
// request did not ask for its usage all meter to Found false, and the upstream records how each
// ended.
func TestNoUsage(t *testing.T) {
	s := Start(t)
	n := 0
	for _, tc := range streams {
		for _, hdr := range []string{"X-Test-Cut: 3", "X-Test-Cut: 0", "X-Test-No-Usage: 1", "X-Test-Error-After: 3"} {
			resp := post(t, s, tc.path, tc.body, hdr, "X-Test-Usage: input=120,output=53")
			u, body := meter(t, resp, tc.format)
			n++
			end := s.WaitEnds(n)[n-1]
			if u.Found {
				t.Errorf("%s with %s: meter found %+v in %s", tc.path, hdr, u, body)
			}
			switch hdr {
			case "X-Test-Cut: 3":
				if !end.Cut || end.Events != 3 || len(parseEvents(t, body)) != 3 {
					t.Errorf("%s with %s: ended %+v after %q", tc.path, hdr, end, body)
				}
			case "X-Test-Cut: 0":
				if !end.Cut || end.Events != 0 || len(body) != 0 {
					t.Errorf("%s with %s: ended %+v after %q", tc.path, hdr, end, body)
				}
			case "X-Test-Error-After: 3":
				evs := parseEvents(t, body)
				last := evs[len(evs)-1]
				want := `{"error":{"message":"Overloaded","type":"server_error","param":null,"code":null}}`
				if tc.format == llm.Anthropic {
					want = `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`
				}
				if !end.Error || end.Cut || end.Events != 4 || len(evs) != 4 || last.data != want || (last.name == "error") != (tc.format == llm.Anthropic) ||
					resp.StatusCode != http.StatusOK {
					t.Errorf("%s with %s: ended %+v, status %d, after %q", tc.path, hdr, end, resp.StatusCode, body)
				}
			default:
				if end.Cut || end.Gone || bytes.Contains(body, []byte(`_tokens"`)) {
					t.Errorf("%s with %s: ended %+v with %s", tc.path, hdr, end, body)
				}
			}
		}
	}
	for _, tc := range []struct{ path, body, hdr string }{
		{"/v1/chat/completions", `{"stream":true}`, "X-Test-Events: 2"},
		{"/v1/completions", `{"stream":true,"stream_options":{"include_usage":false}}`, "X-Test-Events: 2"},
		{"/v1/chat/completions", `{}`, "X-Test-Cut: 40"},
		{"/v1/chat/completions", `{}`, "X-Test-No-Usage: 1"},
		{"/v1/embeddings", `{"input":"x"}`, "X-Test-No-Usage: 1"},
		{"/v1/responses", `{}`, "X-Test-No-Usage: 1"},
		{"/v1/messages", `{}`, "X-Test-Cut: 100"},
		{"/v1/messages", `{}`, "X-Test-No-Usage: 1"},
	} {
		f := llm.OpenAI
		if tc.path == "/v1/messages" {
			f = llm.Anthropic
		}
		u, body := meter(t, post(t, s, tc.path, tc.body, tc.hdr), f)
		if u.Found || bytes.Contains(body, []byte(`"usage":{`)) {
			t.Errorf("%s %s with %s: meter found %+v in %s", tc.path, tc.body, tc.hdr, u, body)
		}
		if strings.HasPrefix(tc.hdr, "X-Test-Cut") && len(body) != 40 && len(body) != 100 {
			t.Errorf("%s with %s: %d bytes arrived", tc.path, tc.hdr, len(body))
		}
	}
}

// TestErrors: an error is answered in the endpoint's provider's shape and status, with the retry
// headers asked for, and meters to no usage.
func TestErrors(t *testing.T) {
	s := Start(t)
	for _, tc := range []struct {
		path   string
		hdr    []string
		status int
		body   string
	}{
		{"/v1/chat/completions", []string{"X-Test-Error: rate_limit", "X-Test-Retry-After: 2", "X-Test-Retry-After-Ms: 1500"}, 429,
			`{"error":{"message":"Rate limit reached for requests","type":"rate_limit_exceeded","param":null,"code":"rate_limit_exceeded"}}`},
		{"/v1/responses", []string{"X-Test-Status: 500"}, 500,
			`{"error":{"message":"Internal server error","type":"server_error","param":null,"code":null}}`},
		{"/v1/embeddings", []string{"X-Test-Error-After: 2"}, 503, // no stream: the error comes up front
			`{"error":{"message":"Overloaded","type":"server_error","param":null,"code":null}}`},
		{"/v1/embeddings", []string{"X-Test-Error: authentication"}, 401,
			`{"error":{"message":"Invalid API key","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`},
		{"/v1/messages", []string{"X-Test-Error: rate_limit", "X-Test-Retry-After: 2"}, 429,
			`{"type":"error","error":{"type":"rate_limit_error","message":"Rate limit reached for requests"}}`},
		{"/v1/messages", []string{"X-Test-Error: overloaded"}, 529,
			`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`},
		{"/v1/messages", []string{"X-Test-Status: 418", "X-Test-Error: server"}, 418,
			`{"type":"error","error":{"type":"api_error","message":"Internal server error"}}`},
	} {
		resp := post(t, s, tc.path, `{"stream":true}`, tc.hdr...)
		f := llm.OpenAI
		if tc.path == "/v1/messages" {
			f = llm.Anthropic
		}
		u, body := meter(t, resp, f)
		if resp.StatusCode != tc.status || string(body) != tc.body || u.Found || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s %v: %d %s (usage %+v), want %d %s", tc.path, tc.hdr, resp.StatusCode, body, u, tc.status, tc.body)
		}
		for _, h := range tc.hdr {
			for _, k := range []string{"Retry-After", "Retry-After-Ms"} {
				if v, ok := strings.CutPrefix(h, "X-Test-"+k+": "); ok && resp.Header.Get(k) != v {
					t.Errorf("%s %v: %s %q, want %q", tc.path, tc.hdr, k, resp.Header.Get(k), v)
				}
			}
		}
	}
}

// TestBadHeaders: a header that does not parse is a 400 naming it.
func TestBadHeaders(t *testing.T) {
	s := Start(t)
	for _, h := range []string{"X-Test-Usage: input=1,outptu=2", "X-Test-Usage: input=1,cached=2", "X-Test-Usage: input=-1",
		"X-Test-Events: many", "X-Test-Event-Bytes: 0", "X-Test-Cut: -1", "X-Test-Interval: 5", "X-Test-No-Usage: yes",
		"X-Test-Error: teapot", "X-Test-Status: 200"} {
		resp := post(t, s, "/v1/chat/completions", `{}`, h)
		body, _ := io.ReadAll(resp.Body)
		name, _, _ := strings.Cut(h, ":")
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), name) {
			t.Errorf("%s: %d %s", h, resp.StatusCode, body)
		}
	}
	if resp := post(t, s, "/v1/models", `{}`); resp.StatusCode != http.StatusNotFound {
		t.Errorf("/v1/models: %d, want 404", resp.StatusCode)
	}
}

// TestRecords: the upstream records every request it received, headers and body as sent.
func TestRecords(t *testing.T) {
	s := Start(t)
	post(t, s, "/v1/chat/completions", `{"model":"a"}`, "Authorization: Bearer k1")
	post(t, s, "/v1/messages", `{"model":"b"}`, "X-Api-Key: k2", "X-Test-Error: rate_limit")
	reqs := s.Requests()
	if s.Count() != 2 || len(reqs) != 2 ||
		reqs[0].Path != "/v1/chat/completions" || string(reqs[0].Body) != `{"model":"a"}` || reqs[0].Header.Get("Authorization") != "Bearer k1" ||
		reqs[1].Path != "/v1/messages" || string(reqs[1].Body) != `{"model":"b"}` || reqs[1].Header.Get("X-Api-Key") != "k2" {
		t.Fatalf("count %d, requests %+v", s.Count(), reqs)
	}
}

// TestClientGone: a client that leaves mid-stream ends the upstream's answer, which records that
// its client left and how many events it wrote.
func TestClientGone(t *testing.T) {
	s := Start(t)
	for i, tc := range streams {
		resp := post(t, s, tc.path, tc.body, "X-Test-Events: 100000", "X-Test-Interval: 1ms")
		r := bufio.NewReader(resp.Body)
		for range 3 {
			if _, err := r.ReadString('\n'); err != nil {
				t.Fatal(err)
			}
		}
		resp.Body.Close()
		if e := s.WaitEnds(i + 1)[i]; !e.Gone || e.Cut || e.Events == 0 || e.Events >= 100000 || e.Path != tc.path {
			t.Errorf("%s: ended %+v", tc.path, e)
		}
	}
}

package llmtest

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
)

// Created is the creation time every answer reports, in Unix seconds: fixed, so answers are
// deterministic.
const Created = 1767225600

type format int

const (
	openai format = iota
	anthropic
)

var endpoints = map[string]struct {
	format format
	stream bool // answers a stream when asked
	fn     func(*answer, *call)
}{
	"/v1/chat/completions": {openai, true, chat},
	"/v1/completions":      {openai, true, completion},
	"/v1/embeddings":       {openai, false, embeddings},
	"/v1/responses":        {openai, true, responses},
	"/v1/messages":         {anthropic, true, messages},
}

func jsonUnmarshal(b []byte, v any) error {
	if len(bytes.TrimSpace(b)) == 0 {
		return nil
	}
	return json.Unmarshal(b, v)
}

func jsonString(s string) []byte {
	b, _ := json.Marshal(s)
	return b
}

// openaiUsage appends the "usage" member of chat completions and completions, if any.
func (c *call) openaiUsage(b []byte) []byte {
	if c.noUsage {
		return b
	}
	u := c.usage
	return fmt.Appendf(b, `,"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,`+
		`"prompt_tokens_details":{"cached_tokens":%d,"audio_tokens":0},`+
		`"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}`,
		u.Input, u.Output, u.Input+u.Output, u.Cached)
}

// chat answers POST /v1/chat/completions.
func chat(a *answer, c *call) {
	head := fmt.Appendf(nil, `{"id":"chatcmpl-test-%d","object":"chat.completion","created":%d,"model":%s,`, c.seq, Created, c.model)
	if !c.stream {
		b := fmt.Appendf(head, `"choices":[{"index":0,"message":{"role":"assistant","content":"%s","refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"stop"}]`, Text(c.events, c.size))
		a.json(append(c.openaiUsage(b), `,"system_fingerprint":null}`...))
		return
	}
	head = fmt.Appendf(nil, `{"id":"chatcmpl-test-%d","object":"chat.completion.chunk","created":%d,"model":%s,"system_fingerprint":null,"choices":[`, c.seq, Created, c.model)
	tail := "]}"
	if c.include {
		tail = `],"usage":null}`
	}
	var b []byte
	choice := func(delta []byte, finish string) []byte {
		b = append(append(b[:0], head...), `{"index":0,"delta":`...)
		b = append(append(b, delta...), `,"logprobs":null,"finish_reason":`...)
		return append(append(b, finish...), `}`+tail...)
	}
	if !a.event("", choice([]byte(`{"role":"assistant","content":"","refusal":null}`), "null")) {
		return
	}
	var d []byte
	for i := range c.events {
		d = append(c.chunk(append(d[:0], `{"content":"`...), i), `"}`...)
		if !a.event("", choice(d, "null")) {
			return
		}
	}
	if !a.event("", choice([]byte(`{}`), `"stop"`)) {
		return
	}
	openaiStreamEnd(a, c, head)
}

// openaiStreamEnd writes the usage chunk when the request asked for it, then [DONE].
func openaiStreamEnd(a *answer, c *call, head []byte) {
	if c.include && !c.noUsage {
		b := c.openaiUsage(append(append([]byte(nil), head...), ']'))
		if !a.event("", append(b, '}')) {
			return
		}
	}
	a.event("", []byte("[DONE]"))
}

// completion answers POST /v1/completions.
func completion(a *answer, c *call) {
	if !c.stream {
		b := fmt.Appendf(nil, `{"id":"cmpl-test-%d","object":"text_completion","created":%d,"model":%s,"choices":[{"text":"%s","index":0,"logprobs":null,"finish_reason":"stop"}]`,
			c.seq, Created, c.model, Text(c.events, c.size))
		a.json(append(c.openaiUsage(b), `,"system_fingerprint":null}`...))
		return
	}
	head := fmt.Appendf(nil, `{"id":"cmpl-test-%d","object":"text_completion","created":%d,"model":%s,"system_fingerprint":null,"choices":[`, c.seq, Created, c.model)
	tail := "]}"
	if c.include {
		tail = `],"usage":null}`
	}
	var b []byte
	for i := range c.events + 1 {
		b = append(append(b[:0], head...), `{"text":"`...)
		finish := `"stop"`
		if i < c.events {
			b, finish = c.chunk(b, i), "null"
		}
		b = append(append(append(b, `","index":0,"logprobs":null,"finish_reason":`...), finish...), `}`+tail...)
		if !a.event("", b) {
			return
		}
	}
	openaiStreamEnd(a, c, head)
}

// embeddings answers POST /v1/embeddings: one vector of 4 numbers per input.
func embeddings(a *answer, c *call) {
	b := []byte(`{"object":"list","data":[`)
	for i := range c.inputs {
		if i > 0 {
			b = append(b, ',')
		}
		v := [4]float32{float32(i + 1), -0.5, 0.25, 0.125}
		b = fmt.Appendf(b, `{"object":"embedding","index":%d,"embedding":`, i)
		if c.base64 {
			raw := make([]byte, 0, 16)
			for _, f := range v {
				raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(f))
			}
			b = append(append(append(b, '"'), base64.StdEncoding.EncodeToString(raw)...), '"')
		} else {
			b = fmt.Appendf(b, "[%g,%g,%g,%g]", v[0], v[1], v[2], v[3])
		}
		b = append(b, '}')
	}
	b = fmt.Appendf(b, `],"model":%s`, c.model)
	if !c.noUsage {
		b = fmt.Appendf(b, `,"usage":{"prompt_tokens":%d,"total_tokens":%d}`, c.usage.Input, c.usage.Input)
	}
	a.json(append(b, '}'))
}

// responses answers POST /v1/responses (the Responses API).
func responses(a *answer, c *call) {
	id := fmt.Sprintf("resp_test_%d", c.seq)
	msg := fmt.Sprintf("msg_test_%d", c.seq)
	resp := func(b []byte, status string, text []byte) []byte {
		b = fmt.Appendf(b, `{"id":"%s","object":"response","created_at":%d,"status":"%s","error":null,"incomplete_details":null,"model":%s,"output":[`, id, Created, status, c.model)
		if text != nil {
			b = fmt.Appendf(b, `{"type":"message","id":"%s","status":"completed","role":"assistant","content":[{"type":"output_text","text":"%s","annotations":[]}]}`, msg, text)
		}
		b = append(b, `],"parallel_tool_calls":true,"tool_choice":"auto","tools":[],"usage":`...)
		if status != "completed" || c.noUsage {
			return append(b, `null}`...)
		}
		u := c.usage
		return fmt.Appendf(b, `{"input_tokens":%d,"input_tokens_details":{"cached_tokens":%d},"output_tokens":%d,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":%d}}`,
			u.Input, u.Cached, u.Output, u.Input+u.Output)
	}
	text := []byte(Text(c.events, c.size))
	if !c.stream {
		a.json(resp(nil, "completed", text))
		return
	}
	seq := 0
	var b []byte
	ev := func(typ string, format string, args ...any) bool {
		b = fmt.Appendf(b[:0], `{"type":"%s","sequence_number":%d`, typ, seq)
		b = append(fmt.Appendf(b, format, args...), '}')
		seq++
		return a.event(typ, b)
	}
	item := fmt.Sprintf(`"item_id":"%s","output_index":0,"content_index":0`, msg)
	part := func(text []byte) string {
		return fmt.Sprintf(`{"type":"output_text","text":"%s","annotations":[]}`, text)
	}
	if !ev("response.created", `,"response":%s`, resp(nil, "in_progress", nil)) ||
		!ev("response.in_progress", `,"response":%s`, resp(nil, "in_progress", nil)) ||
		!ev("response.output_item.added", `,"output_index":0,"item":{"type":"message","id":"%s","status":"in_progress","role":"assistant","content":[]}`, msg) ||
		!ev("response.content_part.added", `,%s,"part":%s`, item, part([]byte{})) {
		return
	}
	var d []byte
	for i := range c.events {
		d = c.chunk(d[:0], i)
		if !ev("response.output_text.delta", `,%s,"delta":"%s","logprobs":[]`, item, d) {
			return
		}
	}
	if !ev("response.output_text.done", `,%s,"text":"%s","logprobs":[]`, item, text) ||
		!ev("response.content_part.done", `,%s,"part":%s`, item, part(text)) ||
		!ev("response.output_item.done", `,"output_index":0,"item":{"type":"message","id":"%s","status":"completed","role":"assistant","content":[%s]}`, msg, part(text)) {
		return
	}
	ev("response.completed", `,"response":%s`, resp(nil, "completed", text))
}

// anthropicUsage appends Anthropic's usage object with output tokens out.
func (c *call) anthropicUsage(b []byte, out int64) []byte {
	u := c.usage
	return fmt.Appendf(b, `{"input_tokens":%d,"cache_creation_input_tokens":%d,"cache_read_input_tokens":%d,"output_tokens":%d,"service_tier":"standard"}`,
		u.Input-u.Cached-u.Write, u.Write, u.Cached, out)
}

// messages answers POST /v1/messages (Anthropic).
func messages(a *answer, c *call) {
	head := fmt.Appendf(nil, `{"id":"msg_test_%d","type":"message","role":"assistant","model":%s,"content":[`, c.seq, c.model)
	if !c.stream {
		b := fmt.Appendf(head, `{"type":"text","text":"%s"}],"stop_reason":"end_turn","stop_sequence":null`, Text(c.events, c.size))
		if !c.noUsage {
			b = c.anthropicUsage(append(b, `,"usage":`...), c.usage.Output)
		}
		a.json(append(b, '}'))
		return
	}
	b := append(append([]byte(`{"type":"message_start","message":`), head...), `],"stop_reason":null,"stop_sequence":null`...)
	if !c.noUsage {
		b = c.anthropicUsage(append(b, `,"usage":`...), 1)
	}
	if !a.event("message_start", append(b, "}}"...)) ||
		!a.event("content_block_start", []byte(`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)) ||
		!a.event("ping", []byte(`{"type": "ping"}`)) {
		return
	}
	for i := range c.events {
		b = append(c.chunk(append(b[:0], `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"`...), i), `"}}`...)
		if !a.event("content_block_delta", b) {
			return
		}
	}
	if !a.event("content_block_stop", []byte(`{"type":"content_block_stop","index":0}`)) {
		return
	}
	b = append(b[:0], `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null}`...)
	if !c.noUsage {
		b = fmt.Appendf(b, `,"usage":{"output_tokens":%d}`, c.usage.Output)
	}
	if !a.event("message_delta", append(b, '}')) {
		return
	}
	a.event("message_stop", []byte(`{"type":"message_stop"}`))
}

// apiError is an error answer in the endpoint's format.
type apiError struct {
	status                  int
	kind                    string
	retryAfter, retryAfterM string
}

// errorKinds are the errors X-Test-Error names: their status (OpenAI's, Anthropic's) and their
// types (OpenAI's type and code, Anthropic's type).
var errorKinds = map[string]struct {
	status     [2]int
	oType      string
	oCode      string // "" is null
	aType, msg string
}{
	"rate_limit":      {[2]int{429, 429}, "rate_limit_exceeded", "rate_limit_exceeded", "rate_limit_error", "Rate limit reached for requests"},
	"invalid_request": {[2]int{400, 400}, "invalid_request_error", "", "invalid_request_error", "Invalid request"},
	"authentication":  {[2]int{401, 401}, "invalid_request_error", "invalid_api_key", "authentication_error", "Invalid API key"},
	"server":          {[2]int{500, 500}, "server_error", "", "api_error", "Internal server error"},
	"overloaded":      {[2]int{503, 529}, "server_error", "", "overloaded_error", "Overloaded"},
}

// parseError reads X-Test-Error, X-Test-Status and the retry headers; nil: no error asked for.
func parseError(h http.Header) (*apiError, error) {
	kind, st := h.Get("X-Test-Error"), h.Get("X-Test-Status")
	if kind == "" && st == "" {
		return nil, nil
	}
	e := &apiError{kind: kind, retryAfter: h.Get("X-Test-Retry-After"), retryAfterM: h.Get("X-Test-Retry-After-Ms")}
	if kind != "" {
		if _, ok := errorKinds[kind]; !ok {
			return nil, fmt.Errorf("llmtest: X-Test-Error: unknown error %q: want rate_limit, invalid_request, authentication, server or overloaded", kind)
		}
	}
	if st != "" {
		n, err := strconv.Atoi(st)
		if err != nil || n < 400 || n > 599 {
			return nil, fmt.Errorf("llmtest: X-Test-Status: %q is not a status from 400 to 599", st)
		}
		e.status = n
		if kind == "" {
			switch {
			case n == 429:
				e.kind = "rate_limit"
			case n == 401:
				e.kind = "authentication"
			case n == 503 || n == 529:
				e.kind = "overloaded"
			case n >= 500:
				e.kind = "server"
			default:
				e.kind = "invalid_request"
			}
		}
	}
	return e, nil
}

// body returns the error's status and body in format f.
func (e *apiError) body(f format) (int, []byte) {
	k := errorKinds[e.kind]
	status := e.status
	if status == 0 {
		status = k.status[f]
	}
	if f == anthropic {
		return status, fmt.Appendf(nil, `{"type":"error","error":{"type":"%s","message":"%s"}}`, k.aType, k.msg)
	}
	code := "null"
	if k.oCode != "" {
		code = strconv.Quote(k.oCode)
	}
	return status, fmt.Appendf(nil, `{"error":{"message":"%s","type":"%s","param":null,"code":%s}}`, k.msg, k.oType, code)
}

// event returns the error as a stream's event in format f: its name and data.
func (e *apiError) event(f format) (string, []byte) {
	_, b := e.body(f)
	if f == anthropic {
		return "error", b
	}
	return "", b
}

// write writes the error in format f, and returns its status.
func (e *apiError) write(w http.ResponseWriter, f format) int {
	status, b := e.body(f)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if e.retryAfter != "" {
		h.Set("Retry-After", e.retryAfter)
	}
	if e.retryAfterM != "" {
		h.Set("Retry-After-Ms", e.retryAfterM)
	}
	w.WriteHeader(status)
	w.Write(b)
	return status
}

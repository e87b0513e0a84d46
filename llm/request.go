package llm

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"

	"github.com/sluicehq/sluice/internal/sat"
)

// ErrTooLarge is a request body over the limit ParseRequest was given (an HTTP 413).
var ErrTooLarge = errors.New("llm: request body larger than the limit")

// MaxModel is the longest model name ParseRequest accepts, in bytes. A model name becomes part of
// a rate-limit key, so its size is bounded like every other part of one.
const MaxModel = 128

// Defaults of an EstimateRule.
const (
	// DefaultBytesPerToken is the prompt bytes one token stands for: English text runs at about
	// four characters a token in OpenAI's and Anthropic's tokenizers, code and other languages at
	// fewer, so an estimate errs on both sides and the settlement corrects it.
	DefaultBytesPerToken = 4
	// DefaultMediaTokens is what a configuration should reserve for one image, audio or file part:
	// an image of about 1.15 megapixels, the largest Anthropic takes without scaling it down, costs
	// about 1,600 tokens there, and a 1024×1024 image 765 at OpenAI's high detail.
	DefaultMediaTokens = 1600
)

// A Request is what an estimate needs from an LLM API request's body. Which API the body is for
// need not be known: the fields of OpenAI's chat completions, completions, embeddings and
// Responses API and of Anthropic's messages do not clash, and each is read where it is.
type Request struct {
	// Model is the body's "model", at most MaxModel printable ASCII bytes; "" when it names none.
	// It is the client's and is never logged.
	Model string
	// MaxOutput is the most output tokens the request allows for one completion: the largest of
	// max_tokens, max_completion_tokens and max_output_tokens; 0 when none is set.
	MaxOutput int64
	// Choices is how many completions the request asks for (OpenAI's n, or best_of, which is
	// billed in full, whichever is larger); 1 when neither is set.
	Choices int64
	// PromptBytes is the size of the prompt's text: the bytes of its strings as the model reads
	// them (escapes decoded), without the JSON around them. It counts message contents and their
	// text parts (text, tool results, tool calls' arguments, thinking), Anthropic's system,
	// the Responses API's instructions and input, completions' prompt and embeddings' input,
	// and the tool definitions (every key and value of tools and functions: the upstream renders
	// them into the prompt).
	PromptBytes int64
	// PromptTokens is the part of the prompt given as token ids (a completions prompt or an
	// embeddings input of integers): one token each, exactly.
	PromptTokens int64
	// Media is the number of image, audio, video and file parts. Their tokens depend on their
	// resolution or length, not on the size of their encoding (a base64 image is no prompt text),
	// so each is reserved a configured number of tokens instead.
	Media int64
	// Stream is the body's "stream": true.
	Stream bool
	// IncludeUsage is stream_options.include_usage: true, which an OpenAI-style upstream needs to
	// report a stream's usage.
	IncludeUsage bool
}

// ParseRequest reads an LLM API request body of at most limit bytes (limit ≤ 0: no bound). A body
// over the limit is ErrTooLarge; any other error is a bad request, and names the field but never
// its value.
//
// The body's keys are matched exactly and the last of duplicate keys wins, as the providers' own
// JSON parsers do: a body that spells "Model" or repeats "max_tokens" is read as the upstream will
// read it. Fields the estimate does not need are not validated (the upstream does that).
func ParseRequest(body []byte, limit int) (Request, error) {
	if limit > 0 && len(body) > limit {
		return Request{}, ErrTooLarge
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil || m == nil {
		return Request{}, notObject(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Request{}, errors.New("llm: request body: data after the JSON object")
	}

	r := Request{Choices: 1}
	var err error
	if r.Model, err = model(m["model"]); err != nil {
		return Request{}, err
	}
	for _, f := range []string{"max_tokens", "max_completion_tokens", "max_output_tokens"} {
		n, err := count(m, f)
		if err != nil {
			return Request{}, err
		}
		r.MaxOutput = max(r.MaxOutput, n)
	}
	for _, f := range []string{"n", "best_of"} {
		n, err := count(m, f)
		if err != nil {
			return Request{}, err
		}
		r.Choices = max(r.Choices, n)
	}
	if r.Stream, err = flag(m, "stream", "stream"); err != nil {
		return Request{}, err
	}
	switch so := m["stream_options"].(type) {
	case nil:
	case map[string]any:
		if r.IncludeUsage, err = flag(so, "include_usage", "stream_options.include_usage"); err != nil {
			return Request{}, err
		}
	default:
		return Request{}, errors.New(`llm: request body: "stream_options" must be an object`)
	}

	var s size
	for _, f := range []string{"messages", "system", "instructions", "input", "prompt"} {
		s.text(m[f])
	}
	for _, f := range []string{"tools", "functions"} {
		s.all(m[f])
	}
	r.PromptBytes, r.PromptTokens, r.Media = s.bytes, s.tokens, s.media
	return r, nil
}

// notObject is the error of a body that does not decode to a JSON object. It gives the offset of
// a syntax error but not encoding/json's message, which quotes the body.
func notObject(err error) error {
	var syn *json.SyntaxError
	if errors.As(err, &syn) {
		return fmt.Errorf("llm: request body: not JSON (syntax error at byte %d)", syn.Offset)
	}
	return errors.New("llm: request body: not a JSON object")
}

// model reads "model": a string of printable ASCII (a name with a control byte or a multi-byte
// character is no model name any provider has, and would only make odd keys).
func model(v any) (string, error) {
	if v == nil {
		return "", nil
	}
	s, ok := v.(string)
	if !ok {
		return "", errors.New(`llm: request body: "model" must be a string`)
	}
	if len(s) > MaxModel {
		return "", fmt.Errorf(`llm: request body: "model" is longer than %d bytes`, MaxModel)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return "", errors.New(`llm: request body: "model" must be printable ASCII`)
		}
	}
	return s, nil
}

// count reads a whole number of tokens or completions; absent or null is 0. A client that writes
// 100 as 100.0 or 1e2 means 100, and is read so.
func count(m map[string]any, field string) (int64, error) {
	v := m[field]
	if v == nil {
		return 0, nil
	}
	if n, ok := v.(json.Number); ok {
		if i, err := strconv.ParseInt(string(n), 10, 64); err == nil && i >= 0 {
			return i, nil
		}
		if f, err := strconv.ParseFloat(string(n), 64); err == nil && f >= 0 && f <= 1<<53 && f == math.Trunc(f) {
			return int64(f), nil
		}
	}
	return 0, fmt.Errorf("llm: request body: %q must be a whole number from 0 to %d", field, int64(math.MaxInt64))
}

// flag reads a boolean; absent or null is false. name is the field's full name, for the error.
func flag(m map[string]any, field, name string) (bool, error) {
	switch v := m[field].(type) {
	case nil:
		return false, nil
	case bool:
		return v, nil
	}
	return false, fmt.Errorf("llm: request body: %q must be true or false", name)
}

// media are the content part types that are not text: images, audio, video, files and documents
// in OpenAI's, Anthropic's and vLLM's spellings.
var media = map[string]bool{
	"image": true, "image_url": true, "input_image": true,
	"audio": true, "input_audio": true, "video_url": true,
	"file": true, "input_file": true, "document": true,
}

// A size adds up the text of a prompt.
type size struct {
	bytes, tokens, media int64
}

// text adds a prompt's content: a string, a token id, a part, or an array of them (messages,
// content parts, strings, token ids, arrays of token ids). Values of other types add nothing.
func (s *size) text(v any) {
	switch v := v.(type) {
	case string:
		s.bytes += int64(len(v))
	case json.Number:
		s.tokens++
	case []any:
		for _, e := range v {
			s.text(e)
		}
	case map[string]any:
		s.part(v)
	}
}

// part adds a message, a content part or an input item: its media, or the fields that hold text
// the model reads. Ids, roles, names and cache controls are left out: they are a few tokens, and
// which of them an upstream renders is its own business.
func (s *size) part(m map[string]any) {
	if t, _ := m["type"].(string); media[t] {
		s.media++
		return
	}
	for _, f := range []string{"text", "content", "thinking", "arguments", "output", "tool_calls", "function", "function_call"} {
		s.text(m[f])
	}
	if in, ok := m["input"].(map[string]any); ok { // an Anthropic tool_use's arguments
		s.all(in)
	}
}

// all adds the text of a whole JSON value: its keys, strings and numbers as written.
func (s *size) all(v any) {
	switch v := v.(type) {
	case string:
		s.bytes += int64(len(v))
	case json.Number:
		s.bytes += int64(len(v))
	case []any:
		for _, e := range v {
			s.all(e)
		}
	case map[string]any:
		for k, e := range v {
			s.bytes += int64(len(k))
			s.all(e)
		}
	}
}

// An EstimateRule says how many tokens a request reserves before it is sent.
type EstimateRule struct {
	// BytesPerToken is how many bytes of prompt text count as one token, rounded up; ≤ 0 is
	// DefaultBytesPerToken.
	BytesPerToken int64
	// DefaultOutput is the output a request that sets no maximum reserves (per completion).
	DefaultOutput int64
	// MediaTokens is what one image, audio, video or file part reserves (see DefaultMediaTokens).
	MediaTokens int64
	// Max caps an estimate; ≤ 0: no cap.
	Max int64
}

// Estimate is the tokens r reserves: EstimateUsage's total.
func Estimate(r Request, rule EstimateRule) int64 { return EstimateUsage(r, rule).Total }

// EstimateUsage is the usage r reserves, as a Usage (Found), so that it is counted as a
// response's usage is (Cost): its output is its output maximum (or rule.DefaultOutput) for each
// completion it asks for; its input is its prompt: the text's bytes divided by
// rule.BytesPerToken, rounded up, its token ids one each, and its media parts rule.MediaTokens
// each. rule.Max caps the total, the output giving way first. The arithmetic is on integers and
// saturates; negative counts are 0.
//
// No tokenizer is used. An estimate is only a reservation: the charge is settled to the usage the
// upstream reports, so an exact prompt count would change what is held for the length of one
// request, not what is charged. A tokenizer would fit only one family of models (the upstream
// behind an OpenAI-style route may be Llama or Qwen under vLLM), would cost a pass of BPE over
// every prompt on the request path, and none for OpenAI's cl100k or o200k is among the Go
// modules this project can take without loading its vocabulary from the network at run time.
func EstimateUsage(r Request, rule EstimateRule) Usage {
	bpt := rule.BytesPerToken
	if bpt <= 0 {
		bpt = DefaultBytesPerToken
	}
	out := r.MaxOutput
	if out <= 0 {
		out = rule.DefaultOutput
	}
	prompt := max(r.PromptBytes, 0)
	in := prompt / bpt
	if prompt%bpt != 0 {
		in++
	}
	in = sat.Add(in, max(r.PromptTokens, 0))
	in = sat.Add(in, sat.Mul(max(r.Media, 0), max(rule.MediaTokens, 0)))
	o := sat.Mul(max(out, 0), max(r.Choices, 1))
	if rule.Max > 0 {
		in = min(in, rule.Max)
		o = min(o, rule.Max-in)
	}
	return Usage{Input: in, Output: o, Total: sat.Add(in, o), Found: true}
}

// includeUsage is the stream option that makes an OpenAI-style upstream end a stream with a chunk
// that has its usage.
const includeUsage = `"include_usage":true`

// InjectUsage returns body with stream_options.include_usage set to true, for a streamed OpenAI
// chat completions or completions request (one with "stream": true and "messages" or "prompt")
// that does not set it already, and whether it changed anything. Every other byte of the body is
// kept: the option is inserted after "stream" (or into the "stream_options" the body has, or in
// place of its null or false), so other fields keep their order, values and spacing. A body that
// is not such a request, or not a JSON object, is returned as it is, with false.
//
// The Responses API is left alone: it reports a stream's usage anyway, and rejects the option.
// An Anthropic messages request looks like a chat completion and would be changed: call
// InjectUsage only for an upstream of OpenAI's format (Anthropic's reports a stream's usage
// unasked, and rejects fields it does not know).
func InjectUsage(body []byte) ([]byte, bool) {
	top, ok := members(body)
	if !ok {
		return body, false
	}
	st, ok := top["stream"]
	if !ok || string(body[st.start:st.end]) != "true" {
		return body, false
	}
	_, chat := top["messages"]
	_, completion := top["prompt"]
	if !chat && !completion {
		return body, false
	}
	so, ok := top["stream_options"]
	if !ok {
		return splice(body, st.end, st.end, `,"stream_options":{`+includeUsage+`}`), true
	}
	opts := body[so.start:so.end]
	if string(opts) == "null" {
		return splice(body, so.start, so.end, `{`+includeUsage+`}`), true
	}
	inner, ok := members(opts)
	if !ok {
		return body, false
	}
	iu, ok := inner["include_usage"]
	if !ok {
		at, ins := so.start+1, includeUsage
		if len(inner) > 0 {
			ins += ","
		}
		return splice(body, at, at, ins), true
	}
	switch string(opts[iu.start:iu.end]) {
	case "false", "null":
		return splice(body, so.start+iu.start, so.start+iu.end, "true"), true
	}
	return body, false
}

// A span is where a member's value lies in a JSON object's text.
type span struct{ start, end int }

// members gives where the value of each member of the JSON object b lies (the last of duplicate
// keys, as a parser reads them), or false when b is not exactly one JSON object.
func members(b []byte) (map[string]span, bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, false
	}
	m := map[string]span{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, false
		}
		k, _ := t.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, false
		}
		end := int(dec.InputOffset())
		m[k] = span{end - len(v), end}
	}
	if t, err := dec.Token(); err != nil || t != json.Delim('}') {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false
	}
	return m, true
}

// splice is b with b[i:j] replaced by s, in a new slice.
func splice(b []byte, i, j int, s string) []byte {
	out := make([]byte, 0, len(b)-(j-i)+len(s))
	out = append(out, b[:i]...)
	out = append(out, s...)
	return append(out, b[j:]...)
}

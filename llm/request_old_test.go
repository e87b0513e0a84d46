package llm

// The old request side, kept as the oracle the in-place walk is checked against: it decoded the
// body with encoding/json into a map[string]any (ParseRequest) and found the members of an object
// with the decoder's Token API (InjectUsage). It is the code of commit 8610e8b, renamed.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
)

// oldParseRequest is ParseRequest as it was: the body decoded into a map[string]any.
func oldParseRequest(body []byte, limit int) (Request, error) {
	if limit > 0 && len(body) > limit {
		return Request{}, ErrTooLarge
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil || m == nil {
		return Request{}, oldNotObject(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Request{}, errors.New("llm: request body: data after the JSON object")
	}

	r := Request{Choices: 1}
	var err error
	if r.Model, err = oldModel(m["model"]); err != nil {
		return Request{}, err
	}
	for _, f := range []string{"max_tokens", "max_completion_tokens", "max_output_tokens"} {
		n, err := oldCount(m, f)
		if err != nil {
			return Request{}, err
		}
		r.MaxOutput = max(r.MaxOutput, n)
	}
	for _, f := range []string{"n", "best_of"} {
		n, err := oldCount(m, f)
		if err != nil {
			return Request{}, err
		}
		r.Choices = max(r.Choices, n)
	}
	if r.Stream, err = oldFlag(m, "stream", "stream"); err != nil {
		return Request{}, err
	}
	switch so := m["stream_options"].(type) {
	case nil:
	case map[string]any:
		if r.IncludeUsage, err = oldFlag(so, "include_usage", "stream_options.include_usage"); err != nil {
			return Request{}, err
		}
	default:
		return Request{}, errors.New(`llm: request body: "stream_options" must be an object`)
	}

	var s oldSize
	for _, f := range []string{"messages", "system", "instructions", "input", "prompt"} {
		s.text(m[f])
	}
	for _, f := range []string{"tools", "functions"} {
		s.all(m[f])
	}
	r.PromptBytes, r.PromptTokens, r.Media = s.bytes, s.tokens, s.media
	return r, nil
}

// oldNotObject is the error of a body that does not decode to a JSON object. It gives the offset of
// a syntax error but not encoding/json's message, which quotes the body.
func oldNotObject(err error) error {
	var syn *json.SyntaxError
	if errors.As(err, &syn) {
		return fmt.Errorf("llm: request body: not JSON (syntax error at byte %d)", syn.Offset)
	}
	return errors.New("llm: request body: not a JSON object")
}

// oldModel reads "model": a string of printable ASCII (a name with a control byte or a multi-byte
// character is no model name any provider has, and would only make odd keys).
func oldModel(v any) (string, error) {
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

// oldCount reads a whole number of tokens or completions; absent or null is 0. A client that writes
// 100 as 100.0 or 1e2 means 100, and is read so.
func oldCount(m map[string]any, field string) (int64, error) {
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

// oldFlag reads a boolean; absent or null is false. name is the field's full name, for the error.
func oldFlag(m map[string]any, field, name string) (bool, error) {
	switch v := m[field].(type) {
	case nil:
		return false, nil
	case bool:
		return v, nil
	}
	return false, fmt.Errorf("llm: request body: %q must be true or false", name)
}

// An oldSize adds up the text of a prompt.
type oldSize struct {
	bytes, tokens, media int64
}

// text adds a prompt's content: a string, a token id, a part, or an array of them (messages,
// content parts, strings, token ids, arrays of token ids). Values of other types add nothing.
func (s *oldSize) text(v any) {
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
func (s *oldSize) part(m map[string]any) {
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
func (s *oldSize) all(v any) {
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

// oldInjectUsage is InjectUsage as it was: the members found with the decoder's Token API, the
// body spliced into a new one.
func oldInjectUsage(body []byte) ([]byte, bool) {
	top, ok := oldMembers(body)
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
		return oldSplice(body, st.end, st.end, `,"stream_options":{`+includeUsage+`}`), true
	}
	opts := body[so.start:so.end]
	if string(opts) == "null" {
		return oldSplice(body, so.start, so.end, `{`+includeUsage+`}`), true
	}
	inner, ok := oldMembers(opts)
	if !ok {
		return body, false
	}
	iu, ok := inner["include_usage"]
	if !ok {
		at, ins := so.start+1, includeUsage
		if len(inner) > 0 {
			ins += ","
		}
		return oldSplice(body, at, at, ins), true
	}
	switch string(opts[iu.start:iu.end]) {
	case "false", "null":
		return oldSplice(body, so.start+iu.start, so.start+iu.end, "true"), true
	}
	return body, false
}

// An oldSpan is where a member's value lies in a JSON object's text.
type oldSpan struct{ start, end int }

// oldMembers gives where the value of each member of the JSON object b lies (the last of duplicate
// keys, as a parser reads them), or false when b is not exactly one JSON object.
func oldMembers(b []byte) (map[string]oldSpan, bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, false
	}
	m := map[string]oldSpan{}
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
		m[k] = oldSpan{end - len(v), end}
	}
	if t, err := dec.Token(); err != nil || t != json.Delim('}') {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false
	}
	return m, true
}

// oldSplice is b with b[i:j] replaced by s, in a new slice.
func oldSplice(b []byte, i, j int, s string) []byte {
	out := make([]byte, 0, len(b)-(j-i)+len(s))
	out = append(out, b[:i]...)
	out = append(out, s...)
	return append(out, b[j:]...)
}

package llm

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// Request bodies shaped as the providers' API references show them.
const (
	openAIChat = `{
  "model": "gpt-4o",
  "messages": [
    {"role": "developer", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello!"}
  ]
}`
	openAIChatParts = `{
  "model": "gpt-4.1",
  "messages": [
    {
      "role": "user",
      "content": [
        {"type": "text", "text": "What's in this image?"},
        {"type": "image_url", "image_url": {"url": "https://upload.wikimedia.org/wikipedia/commons/thumb/d/dd/Gfp-wisconsin-madison-the-nature-boardwalk.jpg/2560px-Gfp-wisconsin-madison-the-nature-boardwalk.jpg", "detail": "high"}}
      ]
    }
  ],
  "max_completion_tokens": 300
}`
	openAIChatTools = `{
  "model": "gpt-4o-mini",
  "messages": [
    {"role": "user", "content": "What's the weather like in Boston today?"},
    {"role": "assistant", "content": null, "tool_calls": [
      {"id": "call_abc123", "type": "function", "function": {"name": "get_current_weather", "arguments": "{\"location\":\"Boston, MA\"}"}}
    ]},
    {"role": "tool", "tool_call_id": "call_abc123", "content": "{\"temperature\":22}"}
  ],
  "tools": [
    {"type": "function", "function": {"name": "get_current_weather", "parameters": {"type": "object", "required": ["location"], "maxLength": 64}}}
  ],
  "tool_choice": "auto",
  "max_tokens": 50,
  "n": 2
}`
	openAIChatStream = `{"model":"gpt-4o","messages":[{"role":"user","content":"Hello!"}],"stream":true,"stream_options":{"include_usage":true}}`
	openAICompletion = `{
  "model": "gpt-3.5-turbo-instruct",
  "prompt": "Say this is a test",
  "max_tokens": 7,
  "temperature": 0,
  "best_of": 3,
  "n": 2
}`
	openAICompletionIDs = `{"model":"gpt-3.5-turbo-instruct","prompt":[[1135,374,264,1296],[9906]],"max_tokens":16}`
	openAIEmbeddings    = `{
  "input": ["The food was delicious and the waiter...", "Cómo estás"],
  "model": "text-embedding-3-small",
  "encoding_format": "float"
}`
	openAIResponses = `{
  "model": "gpt-4.1",
  "instructions": "Talk like a pirate.",
  "input": [
    {"role": "user", "content": [
      {"type": "input_text", "text": "what is in this image?"},
      {"type": "input_image", "image_url": "data:image/jpeg;base64,/9j/4AAQSkZJRgABAQ"}
    ]},
    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
    {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}
  ],
  "max_output_tokens": 1024,
  "stream": true
}`
	anthropicMessages = `{
  "model": "claude-sonnet-4-5-20250929",
  "max_tokens": 1024,
  "system": [
    {"type": "text", "text": "You are an AI assistant tasked with analyzing literary works.", "cache_control": {"type": "ephemeral"}}
  ],
  "messages": [
    {"role": "user", "content": [
      {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/4AAQSkZJRgABAQAAAQABAAD"}},
      {"type": "text", "text": "Describe this image."}
    ]},
    {"role": "assistant", "content": [
      {"type": "thinking", "thinking": "Let me look.", "signature": "EqQBCgIYAhIM"},
      {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"location": "San Francisco, CA"}}
    ]},
    {"role": "user", "content": [
      {"type": "tool_result", "tool_use_id": "toolu_01", "content": [{"type": "text", "text": "15 degrees"}]}
    ]}
  ],
  "tools": [
    {"name": "get_weather", "input_schema": {"type": "object", "properties": {"location": {"type": "string"}}}}
  ],
  "stream": true
}`
	anthropicSimple = `{"model":"claude-haiku-4-5","max_tokens":256,"system":"Be brief.","messages":[{"role":"user","content":"Hello, Claude"}]}`
)

// sum is the bytes of the strings given.
func sum(s ...string) int64 {
	n := 0
	for _, x := range s {
		n += len(x)
	}
	return int64(n)
}

// TestParseRequestProviders reads each API's request as its reference shows it: the model, the
// output maximum, the choices, the stream flags, and the prompt's text bytes, counted by hand here
// from the strings the model reads (JSON syntax, roles, ids, image data left out; media counted).
func TestParseRequestProviders(t *testing.T) {
	for _, c := range []struct {
		name string
		body string
		want Request
	}{
		{"openai chat", openAIChat, Request{Model: "gpt-4o", Choices: 1,
			PromptBytes: sum("You are a helpful assistant.", "Hello!")}},
		{"openai chat parts", openAIChatParts, Request{Model: "gpt-4.1", MaxOutput: 300, Choices: 1,
			PromptBytes: sum("What's in this image?"), Media: 1}},
		{"openai chat tools", openAIChatTools, Request{Model: "gpt-4o-mini", MaxOutput: 50, Choices: 2,
			PromptBytes: sum("What's the weather like in Boston today?",
				`{"location":"Boston, MA"}`, // the tool call's arguments
				`{"temperature":22}`,        // the tool's result
				// the tool definition, keys and values
				"type", "function", "function", "name", "get_current_weather",
				"parameters", "type", "object", "required", "location", "maxLength", "64")}},
		{"openai chat stream", openAIChatStream, Request{Model: "gpt-4o", Choices: 1,
			PromptBytes: sum("Hello!"), Stream: true, IncludeUsage: true}},
		{"openai completion", openAICompletion, Request{Model: "gpt-3.5-turbo-instruct", MaxOutput: 7, Choices: 3,
			PromptBytes: sum("Say this is a test")}},
		{"openai completion token ids", openAICompletionIDs, Request{Model: "gpt-3.5-turbo-instruct", MaxOutput: 16, Choices: 1,
			PromptTokens: 5}},
		{"openai embeddings", openAIEmbeddings, Request{Model: "text-embedding-3-small", Choices: 1,
			PromptBytes: sum("The food was delicious and the waiter...", "Cómo estás")}},
		{"openai responses", openAIResponses, Request{Model: "gpt-4.1", MaxOutput: 1024, Choices: 1,
			PromptBytes: sum("Talk like a pirate.", "what is in this image?", `{"city":"Paris"}`, "sunny"),
			Media:       1, Stream: true}},
		{"anthropic messages", anthropicMessages, Request{Model: "claude-sonnet-4-5-20250929", MaxOutput: 1024, Choices: 1,
			PromptBytes: sum("You are an AI assistant tasked with analyzing literary works.",
				"Describe this image.", "Let me look.",
				"location", "San Francisco, CA", // the tool use's input
				"15 degrees",
				"name", "get_weather", "input_schema", "type", "object", "properties", "location", "type", "string"),
			Media: 1, Stream: true}},
		{"anthropic simple", anthropicSimple, Request{Model: "claude-haiku-4-5", MaxOutput: 256, Choices: 1,
			PromptBytes: sum("Be brief.", "Hello, Claude")}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseRequest([]byte(c.body), 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("got  %+v\nwant %+v", got, c.want)
			}
		})
	}
}

// TestParseRequestFields covers each field's cases: absent, null, the larger of two maxima, the
// larger of n and best_of, numbers written as floats, escapes decoded before counting, keys
// matched exactly (as the upstream matches them) and the last of duplicate keys winning.
func TestParseRequestFields(t *testing.T) {
	for _, c := range []struct {
		name string
		body string
		want Request
	}{
		{"empty object", `{}`, Request{Choices: 1}},
		{"nulls", `{"model":null,"max_tokens":null,"n":null,"stream":null,"stream_options":null,"messages":null}`, Request{Choices: 1}},
		{"max_tokens and max_completion_tokens: the larger", `{"max_tokens":10,"max_completion_tokens":300}`, Request{MaxOutput: 300, Choices: 1}},
		{"max_completion_tokens and max_tokens: the larger", `{"max_completion_tokens":10,"max_tokens":300}`, Request{MaxOutput: 300, Choices: 1}},
		{"max_output_tokens", `{"max_output_tokens":77}`, Request{MaxOutput: 77, Choices: 1}},
		{"zero max_tokens", `{"max_tokens":0}`, Request{Choices: 1}},
		{"largest max_tokens", `{"max_tokens":9223372036854775807}`, Request{MaxOutput: math.MaxInt64, Choices: 1}},
		{"float max_tokens", `{"max_tokens":100.0}`, Request{MaxOutput: 100, Choices: 1}},
		{"exponent max_tokens", `{"max_tokens":1e3}`, Request{MaxOutput: 1000, Choices: 1}},
		{"n zero is one", `{"n":0}`, Request{Choices: 1}},
		{"best_of over n", `{"n":2,"best_of":5}`, Request{Choices: 5}},
		{"stream false", `{"stream":false,"stream_options":{"include_usage":false}}`, Request{Choices: 1}},
		{"stream_options without include_usage", `{"stream":true,"stream_options":{}}`, Request{Choices: 1, Stream: true}},
		{"escapes decoded", `{"messages":[{"role":"user","content":"\u00e9\n\"x\""}]}`, Request{Choices: 1, PromptBytes: sum("é\n\"x\"")}},
		{"prompt strings", `{"prompt":["ab","cde"]}`, Request{Choices: 1, PromptBytes: 5}},
		{"embeddings token ids", `{"input":[1,2,3]}`, Request{Choices: 1, PromptTokens: 3}},
		{"content of unknown types adds nothing", `{"messages":[{"content":true},{"content":{"type":"refusal","refusal":"no"}},17]}`, Request{Choices: 1, PromptTokens: 1}},
		{"media types", `{"messages":[{"content":[{"type":"input_audio"},{"type":"file"},{"type":"document","source":{"type":"text","data":"long"}},{"type":"video_url"}]}]}`, Request{Choices: 1, Media: 4}},
		{"a media part is media only, whatever else it carries", `{"messages":[{"content":[{"type":"image","text":"alt","content":"x"}]}]}`, Request{Choices: 1, Media: 1}},
		{"legacy functions and function_call", `{"functions":[{"name":"f"}],"messages":[{"role":"assistant","function_call":{"name":"f","arguments":"{}"}}]}`,
			Request{Choices: 1, PromptBytes: sum("name", "f", "{}")}},
		{"keys exact: MODEL and Max_Tokens are not read", `{"model":"a","MODEL":"b","Max_Tokens":5,"Stream":true}`, Request{Model: "a", Choices: 1}},
		{"duplicate keys: the last wins", `{"model":"a","max_tokens":5,"model":"b","max_tokens":7,"stream":true,"stream":false}`, Request{Model: "b", MaxOutput: 7, Choices: 1}},
		{"model of 128 bytes", `{"model":"` + strings.Repeat("m", 128) + `"}`, Request{Model: strings.Repeat("m", 128), Choices: 1}},
		{"model with slash, colon, space", `{"model":"meta-llama/Llama-3.1-8B-Instruct qwen2.5:7b"}`, Request{Model: "meta-llama/Llama-3.1-8B-Instruct qwen2.5:7b", Choices: 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseRequest([]byte(c.body), 0)
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("got  %+v\nwant %+v", got, c.want)
			}
		})
	}
}

// TestParseRequestErrors: every bad body is an error that names what is wrong (the field, or the
// byte of a syntax error) and never quotes the body, so that it can be logged and answered.
func TestParseRequestErrors(t *testing.T) {
	secret := "sk-SECRETmodelname"
	for _, c := range []struct {
		name, body, want string
	}{
		{"empty", ``, "not a JSON object"},
		{"not JSON", `{"model": secret}`, "syntax error at byte 11"},
		{"cut short", `{"model":"` + secret, "not a JSON object"},
		{"array", `[{"model":"x"}]`, "not a JSON object"},
		{"null", `null`, "not a JSON object"},
		{"string", `"` + secret + `"`, "not a JSON object"},
		{"trailing data", `{"model":"x"} {"model":"` + secret + `"}`, "data after the JSON object"},
		{"trailing garbage", `{"model":"x"}` + secret, "data after the JSON object"},
		{"model a number", `{"model":42}`, `"model" must be a string`},
		{"model too long", `{"model":"` + secret + strings.Repeat("x", 129-len(secret)) + `"}`, `"model" is longer than 128 bytes`},
		{"model with a newline", `{"model":"` + secret + `\n"}`, `"model" must be printable ASCII`},
		{"model with a NUL", `{"model":"` + secret + `\u0000"}`, `"model" must be printable ASCII`},
		{"model not ASCII", `{"model":"` + secret + `é"}`, `"model" must be printable ASCII`},
		{"max_tokens negative", `{"max_tokens":-1}`, `"max_tokens" must be a whole number`},
		{"max_tokens a string", `{"max_tokens":"` + secret + `"}`, `"max_tokens" must be a whole number`},
		{"max_tokens fractional", `{"max_tokens":1.5}`, `"max_tokens" must be a whole number`},
		{"max_tokens too large", `{"max_tokens":9223372036854775808}`, `"max_tokens" must be a whole number`},
		{"max_completion_tokens a bool", `{"max_completion_tokens":true}`, `"max_completion_tokens" must be a whole number`},
		{"max_output_tokens an object", `{"max_output_tokens":{}}`, `"max_output_tokens" must be a whole number`},
		{"n negative", `{"n":-2}`, `"n" must be a whole number`},
		{"best_of a string", `{"best_of":"3"}`, `"best_of" must be a whole number`},
		{"stream a string", `{"stream":"true"}`, `"stream" must be true or false`},
		{"stream a number", `{"stream":1}`, `"stream" must be true or false`},
		{"stream_options a string", `{"stream_options":"` + secret + `"}`, `"stream_options" must be an object`},
		{"include_usage a string", `{"stream_options":{"include_usage":"yes"}}`, `"stream_options.include_usage" must be true or false`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseRequest([]byte(c.body), 0)
			if err == nil {
				t.Fatal("no error")
			}
			if errors.Is(err, ErrTooLarge) {
				t.Fatalf("%v is ErrTooLarge", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not say %q", err, c.want)
			}
			if strings.Contains(err.Error(), "SECRET") {
				t.Errorf("error %q quotes the body", err)
			}
		})
	}
}

// TestParseRequestLimit: a body over the limit is ErrTooLarge before it is parsed (even if it is
// not JSON); one of exactly the limit is read; a large prompt is counted exactly.
func TestParseRequestLimit(t *testing.T) {
	prompt := strings.Repeat("lorem ipsum ", 1<<20) // 12 MiB
	body := []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"` + prompt + `"}]}`)

	if _, err := ParseRequest(body, len(body)-1); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("one byte over: %v, want ErrTooLarge", err)
	}
	if _, err := ParseRequest(bytes.Repeat([]byte("x"), 101), 100); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("not JSON and over: %v, want ErrTooLarge", err)
	}
	for _, limit := range []int{len(body), 0, -1} {
		r, err := ParseRequest(body, limit)
		if err != nil {
			t.Fatalf("limit %d: %v", limit, err)
		}
		if r.PromptBytes != int64(len(prompt)) {
			t.Fatalf("limit %d: %d prompt bytes, want %d", limit, r.PromptBytes, len(prompt))
		}
	}
	// A deep nest of arrays is bounded by encoding/json's depth limit, and is no panic.
	deep := `{"messages":` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}`
	if _, err := ParseRequest([]byte(deep), 0); err == nil {
		t.Error("20,000 nested arrays: no error")
	}
}

// TestEstimate: the table of reservations, from the defaults to saturation.
func TestEstimate(t *testing.T) {
	const maxInt = math.MaxInt64
	for _, c := range []struct {
		name string
		r    Request
		rule EstimateRule
		want int64
	}{
		{"nothing", Request{}, EstimateRule{}, 0},
		{"output only", Request{MaxOutput: 100}, EstimateRule{}, 100},
		{"default output when none set", Request{}, EstimateRule{DefaultOutput: 4096}, 4096},
		{"the request's output over the default", Request{MaxOutput: 10}, EstimateRule{DefaultOutput: 4096}, 10},
		{"prompt: 4 bytes a token by default", Request{PromptBytes: 8}, EstimateRule{}, 2},
		{"prompt rounded up", Request{PromptBytes: 9}, EstimateRule{}, 3},
		{"one byte is one token", Request{PromptBytes: 1}, EstimateRule{}, 1},
		{"bytes per token configured", Request{PromptBytes: 10}, EstimateRule{BytesPerToken: 3}, 4},
		{"one byte a token", Request{PromptBytes: 10}, EstimateRule{BytesPerToken: 1}, 10},
		{"negative bytes per token is the default", Request{PromptBytes: 10}, EstimateRule{BytesPerToken: -5}, 3},
		{"token ids one each", Request{PromptTokens: 7, PromptBytes: 4}, EstimateRule{}, 8},
		{"media", Request{Media: 2}, EstimateRule{MediaTokens: DefaultMediaTokens}, 3200},
		{"choices multiply the output", Request{MaxOutput: 50, Choices: 3, PromptBytes: 40}, EstimateRule{}, 160},
		{"choices multiply the default output", Request{Choices: 2}, EstimateRule{DefaultOutput: 100}, 200},
		{"all parts", Request{MaxOutput: 300, Choices: 1, PromptBytes: 401, PromptTokens: 5, Media: 1},
			EstimateRule{MediaTokens: 85}, 300 + 101 + 5 + 85},
		{"capped", Request{MaxOutput: 100000, PromptBytes: 4000}, EstimateRule{Max: 32000}, 32000},
		{"under the cap", Request{MaxOutput: 100, PromptBytes: 4}, EstimateRule{Max: 32000}, 101},
		{"negative counts are zero", Request{MaxOutput: -5, Choices: -1, PromptBytes: -9, PromptTokens: -3, Media: -2},
			EstimateRule{MediaTokens: -7}, 0},
		{"output saturates", Request{MaxOutput: maxInt, Choices: 2}, EstimateRule{}, maxInt},
		{"sum saturates", Request{MaxOutput: maxInt, PromptBytes: maxInt, PromptTokens: maxInt}, EstimateRule{}, maxInt},
		{"media saturates", Request{Media: maxInt}, EstimateRule{MediaTokens: maxInt}, maxInt},
		{"saturated, then capped", Request{MaxOutput: maxInt, Choices: maxInt}, EstimateRule{Max: 1 << 20}, 1 << 20},
		{"largest prompt", Request{PromptBytes: maxInt}, EstimateRule{}, maxInt/4 + 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Estimate(c.r, c.rule); got != c.want {
				t.Errorf("Estimate(%+v, %+v) = %d, want %d", c.r, c.rule, got, c.want)
			}
		})
	}
	// From a parsed body: the Anthropic request reserves its max_tokens, its text and its image.
	r, err := ParseRequest([]byte(anthropicMessages), 0)
	if err != nil {
		t.Fatal(err)
	}
	want := 1024 + (r.PromptBytes+3)/4 + DefaultMediaTokens
	if got := Estimate(r, EstimateRule{MediaTokens: DefaultMediaTokens}); got != want {
		t.Errorf("anthropic messages: %d, want %d", got, want)
	}
}

// TestInjectUsage: each way a body can carry (or not) the option; where it changes, the result
// is exactly the body with the option inserted or set, and reads back as including the usage.
func TestInjectUsage(t *testing.T) {
	for _, c := range []struct {
		name, body, want string // want "": unchanged
	}{
		{"absent", `{"model":"gpt-4o","stream":true,"messages":[]}`,
			`{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true},"messages":[]}`},
		{"absent, spaced, stream last", "{\n  \"messages\": [],\n  \"stream\" :  true\n}",
			"{\n  \"messages\": [],\n  \"stream\" :  true,\"stream_options\":{\"include_usage\":true}\n}"},
		{"completions", `{"prompt":"hi","stream":true}`,
			`{"prompt":"hi","stream":true,"stream_options":{"include_usage":true}}`},
		{"stream_options null", `{"stream":true,"stream_options":null,"messages":[]}`,
			`{"stream":true,"stream_options":{"include_usage":true},"messages":[]}`},
		{"stream_options empty", `{"stream":true,"stream_options":{ },"messages":[]}`,
			`{"stream":true,"stream_options":{"include_usage":true },"messages":[]}`},
		{"stream_options with another option", `{"messages":[],"stream_options":{"include_obfuscation":false},"stream":true}`,
			`{"messages":[],"stream_options":{"include_usage":true,"include_obfuscation":false},"stream":true}`},
		{"include_usage false", `{"stream":true,"messages":[],"stream_options":{"a":1, "include_usage" : false}}`,
			`{"stream":true,"messages":[],"stream_options":{"a":1, "include_usage" : true}}`},
		{"include_usage null", `{"stream":true,"messages":[],"stream_options":{"include_usage":null}}`,
			`{"stream":true,"messages":[],"stream_options":{"include_usage":true}}`},
		{"duplicate stream_options: the last is set", `{"stream":true,"messages":[],"stream_options":{"include_usage":true},"stream_options":{}}`,
			`{"stream":true,"messages":[],"stream_options":{"include_usage":true},"stream_options":{"include_usage":true}}`},
		{"already set", `{"stream":true,"messages":[],"stream_options":{"include_usage":true}}`, ""},
		{"not streamed", `{"stream":false,"messages":[]}`, ""},
		{"stream absent", `{"messages":[]}`, ""},
		{"stream a string", `{"stream":"true","messages":[]}`, ""},
		{"the last stream is false", `{"stream":true,"messages":[],"stream":false}`, ""},
		{"Responses API", `{"model":"gpt-4.1","input":"hi","stream":true}`, ""},
		{"stream_options a string", `{"stream":true,"messages":[],"stream_options":"x"}`, ""},
		{"include_usage a string", `{"stream":true,"messages":[],"stream_options":{"include_usage":"no"}}`, ""},
		{"not JSON", `{"stream":true,"messages":[]`, ""},
		{"trailing data", `{"stream":true,"messages":[]} x`, ""},
		{"an array", `[{"stream":true,"messages":[]}]`, ""},
		{"empty", ``, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, changed := InjectUsage([]byte(c.body))
			if c.want == "" {
				if changed || string(got) != c.body {
					t.Fatalf("changed to %s", got)
				}
				return
			}
			if !changed || string(got) != c.want {
				t.Fatalf("got %s (%v)\nwant %s", got, changed, c.want)
			}
			checkInjected(t, []byte(c.body), got)
		})
	}
	// The bodies of the providers' references: a streamed chat without the option gains it and
	// nothing else; the others are left alone.
	chat := []byte(strings.Replace(openAIChatTools, `"n": 2`, `"n": 2, "stream": true`, 1))
	got, changed := InjectUsage(chat)
	if !changed {
		t.Fatal("streamed chat with tools: unchanged")
	}
	checkInjected(t, chat, got)
	for _, b := range []string{openAIChat, openAIChatStream, openAIResponses, openAIEmbeddings} {
		if _, changed := InjectUsage([]byte(b)); changed {
			t.Errorf("changed %s", b)
		}
	}
}

// checkInjected fails t unless after is before with stream_options.include_usage true and no
// other difference: the same values once parsed, and before's bytes all kept in order.
func checkInjected(t *testing.T, before, after []byte) {
	t.Helper()
	r, err := ParseRequest(after, 0)
	if err != nil {
		t.Fatalf("%s: %v", after, err)
	}
	if !r.Stream || !r.IncludeUsage {
		t.Fatalf("%s reads as %+v", after, r)
	}
	var b, a map[string]any
	if err := json.Unmarshal(before, &b); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(after, &a); err != nil {
		t.Fatal(err)
	}
	so, _ := b["stream_options"].(map[string]any)
	if so == nil {
		so = map[string]any{}
	}
	so["include_usage"] = true
	b["stream_options"] = so
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("%s differs from %s by more than the option", after, before)
	}
	if _, again := InjectUsage(after); again {
		t.Fatalf("%s is changed again", after)
	}
	// Apart from a false or null made true, before is a subsequence of after: nothing was moved.
	kept := bytes.ReplaceAll(bytes.ReplaceAll(before, []byte("false"), nil), []byte("null"), nil)
	i := 0
	for _, c := range after {
		if i < len(kept) && c == kept[i] {
			i++
		}
	}
	if i != len(kept) {
		t.Fatalf("%s does not keep the bytes of %s in order", after, before)
	}
}

// FuzzParseRequest checks that ParseRequest reads every body as the old decoder did
// (request_old_test.go): the same Request, the same error. Each body is read under a limit too,
// and as the body of a streamed chat (for UsageEdit's sake).
func FuzzParseRequest(f *testing.F) {
	for _, b := range append([]string{openAIChat, openAIChatParts, openAIChatTools, openAIChatStream, openAICompletion,
		openAICompletionIDs, openAIEmbeddings, openAIResponses, anthropicMessages, anthropicSimple,
		`{"max_tokens":1e3}`, `{"model":null}`, `[]`, `{"input":[[1,2],[3]]}`}, trickyBodies...) {
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		sameAsOld(t, body, 0)
		sameAsOld(t, body, 1<<16)
		r, err := ParseRequest(body, 1<<16)
		if err != nil {
			return
		}
		if len(r.Model) > MaxModel {
			t.Fatalf("model of %d bytes", len(r.Model))
		}
		for i := 0; i < len(r.Model); i++ {
			if r.Model[i] < 0x20 || r.Model[i] > 0x7e {
				t.Fatalf("model byte %#x", r.Model[i])
			}
		}
		// Decoding never triples text (an invalid byte becomes U+FFFD, three bytes).
		if r.MaxOutput < 0 || r.Choices < 1 || r.PromptBytes < 0 || r.PromptBytes > 3*int64(len(body)) ||
			r.PromptTokens < 0 || r.PromptTokens > int64(len(body)) || r.Media < 0 || r.Media > int64(len(body)) {
			t.Fatalf("%+v from %d bytes", r, len(body))
		}
		if e := Estimate(r, EstimateRule{DefaultOutput: 10, MediaTokens: DefaultMediaTokens, Max: 1 << 20}); e < 0 || e > 1<<20 {
			t.Fatalf("estimate %d", e)
		}
	})
}

// FuzzInjectUsage checks that UsageEdit's edit, applied, is the old InjectUsage's body, and that
// InjectUsage's body reads as including the usage and is not changed again.
func FuzzInjectUsage(f *testing.F) {
	for _, b := range []string{openAIChatStream, `{"stream":true,"messages":[]}`, `{"prompt":"x","stream":true,"stream_options":{}}`,
		`{"stream":true,"messages":[],"stream_options":{"include_usage":false}}`, `{"stream":true,"messages":[],"stream_options":null}`,
		`{"stream":true,"prompt":1,"stream":true}`, `{"stream":true,"messages":[],"stream_options":{"a":[1,{"b":2}]}}`,
		`{"str\u0065am":true,"prompt":"","stream_options":{"include_usage":null,"include_usage":false}}`} {
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		sameAsOld(t, body, 0)
		got, changed := InjectUsage(body)
		if !changed {
			if !bytes.Equal(got, body) {
				t.Fatal("unchanged, but a different body")
			}
			return
		}
		if !json.Valid(got) {
			t.Fatalf("%q became invalid JSON %q", body, got)
		}
		if _, again := InjectUsage(got); again {
			t.Fatalf("%q changed twice", body)
		}
		if r, err := ParseRequest(got, 0); err == nil && (!r.Stream || !r.IncludeUsage) {
			t.Fatalf("%q reads as %+v", got, r)
		}
		// Apply makes the same body, in place when there is room after it, else in a new array
		// (the input untouched).
		e, _ := UsageEdit(body)
		roomy := append(make([]byte, 0, len(body)+64), body...)
		if out := e.Apply(roomy); !bytes.Equal(out, got) || &out[0] != &roomy[0] {
			t.Fatalf("Apply in place made %q, want %q in the same array", out, got)
		}
		tight := slices.Clip(slices.Clone(body))
		if out := e.Apply(tight); !bytes.Equal(out, got) || (e.Len(body) > len(body) && !bytes.Equal(tight, body)) {
			t.Fatalf("Apply without room made %q (input now %q), want %q and, if it grew, the input unchanged", out, tight, got)
		}
	})
}

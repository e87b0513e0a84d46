// Package llm reads the requests and responses of LLM APIs, OpenAI's (chat completions,
// completions, embeddings, the Responses API, and every server that copies them: vLLM, Ollama,
// LiteLLM) and Anthropic's (messages), so that a route can be charged in tokens: an estimate
// reserved up front from the request, settled to the usage the response reports.
//
// The request side (request.go) is a pure function of the body, which it reads where it lies
// and never copies (walk.go: the body the front end buffered is the only copy of it there is):
// ParseRequest reads what the estimate needs (the model, the output maximum, the prompt's size)
// and Estimate turns it into tokens; UsageEdit says where to edit a body to ask an OpenAI-style
// upstream to report a stream's usage, and Edit.Reader sends the edited body from the original's
// bytes and the few inserted (InjectUsage joins them into a new body, for callers that need one).
// The response side reads the usage from a JSON body or from a stream of server-sent events as it
// passes.
//
// Nothing here logs, and no error carries a value taken from the body: a model name or a prompt
// is the client's, and never belongs in a log line.
//
// A Meter is given the response body's bytes as they are copied to the client (it is an
// io.Writer that never fails, never blocks and keeps a fixed few hundred bytes whatever the
// body's size: nothing of the body is held) and, once the body has ended, reports its Usage.
// A JSON body (OpenAI's chat completions, completions, embeddings and Responses API,
// Anthropic's messages) reports its "usage" object; a stream of server-sent events reports the
// usage of its events: OpenAI's final chunk (sent when the request set
// stream_options.include_usage), the "response" of the Responses API's last event, Anthropic's
// message_start and message_delta. Cost turns a Usage into the route's cost: its input, output
// or total tokens, or a weighted sum of them in exact integer arithmetic.
//
// Usage is found only in a whole, well-formed body or event: a body cut short, garbage, or an
// error response (whose body has no usage: OpenAI's {"error": …}, Anthropic's error event)
// reports Found false, and the caller keeps its estimate. A Meter does not look at the status:
// an error response that does report a usage reports it, and the caller decides what it costs.
package llm

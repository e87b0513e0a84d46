// Package llm reads the requests and responses of LLM APIs, OpenAI's (chat completions,
// completions, embeddings, the Responses API, and every server that copies them: vLLM, Ollama,
// LiteLLM) and Anthropic's (messages), so that a route can be charged in tokens: an estimate
// reserved up front from the request, settled to the usage the response reports.
//
// The request side (request.go) is a pure function of the body: ParseRequest reads what the
// estimate needs (the model, the output maximum, the prompt's size) and Estimate turns it into
// tokens; InjectUsage asks an OpenAI-style upstream to report a stream's usage. The response side
// reads the usage from a JSON body or from a stream of server-sent events as it passes.
//
// Nothing here logs, and no error carries a value taken from the body: a model name or a prompt
// is the client's, and never belongs in a log line.
package llm

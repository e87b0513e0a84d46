// Package llmtest is an LLM API for tests: a real HTTP server on a loopback port that answers as
// OpenAI's API (chat completions, completions, embeddings, the Responses API) and Anthropic's
// (messages) answer, in JSON and as server-sent event streams, with the usage, the length, the
// pace and the failures each test chooses. It also runs the official SDKs (the openai and
// @anthropic-ai/sdk packages from npm, pinned in node/package-lock.json) as clients: RunClient
// makes one call with node/client.mjs and returns the text, the usage, the error and the retries
// the SDK saw, so that a test can show that what reaches a real client through sluice is what the
// upstream sent. EnsureNode installs the SDKs (npm ci) when node_modules is missing or stale.
//
// # Endpoints
//
//	POST /v1/chat/completions  OpenAI chat completion; a stream when the body has "stream": true
//	POST /v1/completions       OpenAI (legacy) completion; a stream likewise
//	POST /v1/embeddings        OpenAI embeddings, one per input (base64 when encoding_format asks)
//	POST /v1/responses         OpenAI Responses API; a stream likewise
//	POST /v1/messages          Anthropic message; a stream likewise
//
// An OpenAI chat or completions stream ends with a chunk that carries the usage (and no choices)
// only when the request set stream_options.include_usage, as OpenAI's does; every chunk before it
// then has "usage": null. The Responses API's stream always ends with response.completed, whose
// response has the usage; Anthropic's reports the input in message_start (with output_tokens 1)
// and the cumulative output in message_delta. Each event is written and flushed on its own.
//
// # What the test chooses: request headers
//
// The answer is chosen by headers of the request (a proxy in between forwards them), so a test
// drives the upstream through the proxy with nothing but its client's extra headers:
//
//	X-Test-Usage: input=120,output=53,cached=20,write=5
//	    The usage reported. input is every prompt token (as llm.Usage.Input counts them), cached
//	    the part read from the cache, write the part written to it (Anthropic's
//	    cache_creation_input_tokens; OpenAI reports no such count). Anthropic's input_tokens is
//	    then input - cached - write. Default: input = request body bytes / 4 (at least 1),
//	    output = the body's max_tokens, max_completion_tokens or max_output_tokens, else 16
//	    (embeddings: 0), cached = write = 0.
//	X-Test-Events: 1000       content events in a stream (default 5); the text is Text(events, bytes)
//	X-Test-Event-Bytes: 4096  bytes of text in each content event (default 8)
//	X-Test-Interval: 1ms      pause before each event of a stream (default none)
//	X-Test-Cut: 3             close the connection abruptly after 3 events of a stream (every event
//	                          counts: a role chunk, message_start…), or after 3 bytes of a JSON
//	                          body: no usage, no terminator, a malformed chunked body
//	X-Test-No-Usage: 1        report no usage at all, in the JSON body or in the stream
//	X-Test-Error-After: 3     end a stream after 3 events with an error event (the X-Test-Error
//	                          kind, default overloaded) in the provider's shape: Anthropic's
//	                          "event: error", OpenAI's data: {"error": …}; the status stays 200
//	                          (a JSON answer is the error, up front)
//	X-Test-Error: rate_limit  answer an error in the endpoint's format instead: rate_limit (429),
//	                          invalid_request (400), authentication (401), server (500),
//	                          overloaded (OpenAI 503, Anthropic 529)
//	X-Test-Status: 429        the error's status (the kind follows from it when X-Test-Error is absent)
//	X-Test-Retry-After: 2     sent as the error's Retry-After header, as given (seconds)
//	X-Test-Retry-After-Ms: 300  sent as the error's retry-after-ms header
//
// A header that does not parse is answered 400 in plain text naming the header.
//
// # Errors in the providers' shapes
//
// OpenAI's: {"error": {"message", "type", "param": null, "code"}}, a rate limit being type and
// code "rate_limit_exceeded". Anthropic's: {"type": "error", "error": {"type", "message"}}, a rate
// limit being "rate_limit_error".
//
// # What the SDKs do with Retry-After (openai 6.30.1, @anthropic-ai/sdk 1.15.0)
//
// Both retry 408, 409, 429 and 5xx (x-should-retry: true or false overrides the status), 2 times
// by default (maxRetries). Before a retry both read retry-after-ms first (a float, in
// milliseconds) and, only when it is absent, unparsable or 0, Retry-After (a float of seconds, or
// an HTTP date). Without either they back off 0.5 s × 2^retry, at most 8 s, less up to 25 %
// jitter. They differ in the bounds:
//   - openai waits whatever the headers say, with no cap: a retry-after-ms of 120000 is a
//     two-minute wait (openai 4.x took its backoff instead for any wait of 60 s or more; 6.x
//     does not). A wait of 0 or less retries at once, and one over 2^31-1 ms too (Node's
//     setTimeout fires after 1 ms when its delay overflows).
//   - @anthropic-ai/sdk waits what the headers say only when it is over 0 and at most 2^31-1 ms
//     (about 24.8 days); anything else (0, negative, a date in the past) gets the backoff.
//
// So a gateway that sends retry-after-ms exactly and Retry-After rounded up to whole seconds is
// waited for to the millisecond by both; one that sends only Retry-After costs its clients up to a
// second more each, and one that sends 0 makes the openai SDK retry at once.
//
// # Watching the upstream
//
// Every request is recorded (Requests: path, headers, body; Count), so a test can assert what
// reached the upstream and what never did; every answer's end is recorded too (Ends, WaitEnds: how
// many events it wrote, whether it was cut or its client left), so a test waits on the upstream's
// state rather than sleeping.
package llmtest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// MaxRecorded is how many requests a Handler keeps (the latest): a long benchmark's requests do
// not pile up. Count counts them all.
const MaxRecorded = 10000

// Request is a request the upstream received.
type Request struct {
	Method, Path string
	Header       http.Header
	Body         []byte
}

// End is how an answer ended.
type End struct {
	Path   string
	Status int
	// Events is the number of server-sent events written (0 for a JSON body).
	Events int
	// Cut reports that X-Test-Cut closed the connection.
	Cut bool
	// Gone reports that the client left before the answer's end.
	Gone bool
	// Error reports that the stream ended with an error event (X-Test-Error-After).
	Error bool
}

// Handler is the fake LLM API as an http.Handler (for a benchmark binary that serves it itself);
// Start runs one on a loopback port.
type Handler struct {
	mu      sync.Mutex
	reqs    []Request
	count   int
	ends    []End
	changed chan struct{} // closed, and replaced, when an answer ends
}

// NewHandler returns a Handler that has seen nothing.
func NewHandler() *Handler { return &Handler{changed: make(chan struct{})} }

// Requests returns the requests received, the oldest first (the latest MaxRecorded).
func (h *Handler) Requests() []Request {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Request(nil), h.reqs...)
}

// Count returns the number of requests received.
func (h *Handler) Count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.count
}

// Ends returns how each finished answer ended, in the order they ended.
func (h *Handler) Ends() []End {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]End(nil), h.ends...)
}

// WaitEnds waits until n answers have ended, and returns them all.
func (h *Handler) WaitEnds(ctx context.Context, n int) ([]End, error) {
	for {
		h.mu.Lock()
		ends, ch := append([]End(nil), h.ends...), h.changed
		h.mu.Unlock()
		if len(ends) >= n {
			return ends, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ends, fmt.Errorf("llmtest: %d answers ended, waited for %d: %w", len(ends), n, ctx.Err())
		}
	}
}

func (h *Handler) record(r Request) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.count++
	if len(h.reqs) == MaxRecorded {
		h.reqs = append(h.reqs[:0], h.reqs[1:]...)
	}
	h.reqs = append(h.reqs, r)
	return h.count
}

func (h *Handler) end(e End) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ends = append(h.ends, e)
	close(h.changed)
	h.changed = make(chan struct{})
}

// ServeHTTP answers one request of the endpoints the package doc lists.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "llmtest: reading the body: "+err.Error(), http.StatusBadRequest)
		return
	}
	seq := h.record(Request{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Body: body})
	a := &answer{w: w, ctx: r.Context(), end: End{Path: r.URL.Path, Status: http.StatusOK}, cut: -1, errAfter: -1}
	defer func() { h.end(a.end) }() // also when a cut panics with http.ErrAbortHandler
	write, ok := endpoints[r.URL.Path]
	switch {
	case !ok:
		a.end.Status = http.StatusNotFound
		http.NotFound(w, r)
		return
	case r.Method != http.MethodPost:
		a.end.Status = http.StatusMethodNotAllowed
		http.Error(w, "llmtest: POST only", a.end.Status)
		return
	}
	c, err := parseCall(r.Header, body, seq)
	if err != nil {
		a.end.Status = http.StatusBadRequest
		http.Error(w, err.Error(), a.end.Status)
		return
	}
	a.interval, a.cut = c.interval, c.cut
	c.stream = c.stream && write.stream
	switch {
	case c.err != nil && c.stream && c.errAfter >= 0:
		a.errAfter = c.errAfter
		a.errName, a.errData = c.err.event(write.format)
	case c.err != nil:
		a.end.Status = c.err.write(w, write.format)
		return
	}
	write.fn(a, c)
}

// Server is a Handler served on a loopback port for the length of a test.
type Server struct {
	*Handler
	// URL is the server's base URL, http://127.0.0.1:port, without /v1.
	URL string
	t   testing.TB
	hs  *httptest.Server
}

// Start starts a Server, closed when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	h := NewHandler()
	hs := httptest.NewServer(h)
	s := &Server{Handler: h, URL: hs.URL, t: t, hs: hs}
	t.Cleanup(s.Close)
	return s
}

// Close stops the server, ending the connections still open.
func (s *Server) Close() {
	s.hs.CloseClientConnections()
	s.hs.Close()
}

// WaitEnds waits up to 30 seconds until n answers have ended, and returns them all; it fails the
// test if they do not.
func (s *Server) WaitEnds(n int) []End {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ends, err := s.Handler.WaitEnds(ctx, n)
	if err != nil {
		s.t.Fatalf("%v: %+v", err, ends)
	}
	return ends
}

// Usage is the usage an answer reports.
type Usage struct {
	Input, Output, Cached, Write int64
}

// call is what a request asks of the upstream.
type call struct {
	seq      int
	model    []byte // the request's model as a JSON string
	stream   bool
	include  bool // stream_options.include_usage
	usage    Usage
	noUsage  bool
	events   int
	size     int
	interval time.Duration
	cut      int // -1: none
	err      *apiError
	errAfter int    // -1: none
	pattern  []byte // the text events are cut from (chunk)
	inputs   int    // embeddings: the number of inputs
	base64   bool   // embeddings: encoding_format "base64"
}

// Defaults of a call.
const (
	DefaultEvents    = 5
	DefaultEventSize = 8
	DefaultOutput    = 16
)

func parseCall(h http.Header, body []byte, seq int) (*call, error) {
	c := &call{seq: seq, events: DefaultEvents, size: DefaultEventSize, cut: -1, errAfter: -1}
	var req struct {
		Model         string `json:"model"`
		Stream        bool   `json:"stream"`
		StreamOptions *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
		MaxTokens      int64  `json:"max_tokens"`
		MaxCompletion  int64  `json:"max_completion_tokens"`
		MaxOutput      int64  `json:"max_output_tokens"`
		Input          any    `json:"input"`
		EncodingFormat string `json:"encoding_format"`
	}
	if err := jsonUnmarshal(body, &req); err != nil {
		return nil, fmt.Errorf("llmtest: request body: %v", err)
	}
	c.model = jsonString(req.Model)
	c.stream = req.Stream
	c.include = req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	c.base64 = req.EncodingFormat == "base64"
	c.inputs = 1
	if in, ok := req.Input.([]any); ok && len(in) > 0 {
		if _, tokens := in[0].(float64); !tokens {
			c.inputs = len(in)
		}
	}
	c.usage = Usage{Input: max(int64(len(body))/4, 1), Output: max(req.MaxTokens, req.MaxCompletion, req.MaxOutput)}
	if c.usage.Output == 0 {
		c.usage.Output = DefaultOutput
	}

	num := func(name string, lo int) (int, error) {
		v := h.Get(name)
		n, err := strconv.Atoi(v)
		if err != nil || n < lo {
			return 0, fmt.Errorf("llmtest: %s: %q is not a whole number from %d", name, v, lo)
		}
		return n, nil
	}
	var err error
	if h.Get("X-Test-Usage") != "" {
		if c.usage, err = parseUsage(h.Get("X-Test-Usage")); err != nil {
			return nil, err
		}
	}
	if h.Get("X-Test-Events") != "" {
		if c.events, err = num("X-Test-Events", 0); err != nil {
			return nil, err
		}
	}
	if h.Get("X-Test-Event-Bytes") != "" {
		if c.size, err = num("X-Test-Event-Bytes", 1); err != nil {
			return nil, err
		}
	}
	if h.Get("X-Test-Cut") != "" {
		if c.cut, err = num("X-Test-Cut", 0); err != nil {
			return nil, err
		}
	}
	if v := h.Get("X-Test-Interval"); v != "" {
		if c.interval, err = time.ParseDuration(v); err != nil || c.interval < 0 {
			return nil, fmt.Errorf("llmtest: X-Test-Interval: %q is not a duration such as 1ms", v)
		}
	}
	switch v := h.Get("X-Test-No-Usage"); v {
	case "", "0", "false":
	case "1", "true":
		c.noUsage = true
	default:
		return nil, fmt.Errorf("llmtest: X-Test-No-Usage: %q is not 1 or 0", v)
	}
	if h.Get("X-Test-Error-After") != "" {
		if c.errAfter, err = num("X-Test-Error-After", 0); err != nil {
			return nil, err
		}
	}
	if c.err, err = parseError(h); err != nil {
		return nil, err
	}
	if c.err == nil && c.errAfter >= 0 {
		c.err = &apiError{kind: "overloaded"}
	}
	return c, nil
}

// parseUsage parses "input=120,output=53,cached=20,write=5" (any of them, in any order; those
// left out are 0).
func parseUsage(s string) (Usage, error) {
	var u Usage
	for _, kv := range strings.Split(s, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(kv), "=")
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return Usage{}, fmt.Errorf("llmtest: X-Test-Usage: %q: want name=count, a count from 0", kv)
		}
		switch k {
		case "input":
			u.Input = n
		case "output":
			u.Output = n
		case "cached":
			u.Cached = n
		case "write":
			u.Write = n
		default:
			return Usage{}, fmt.Errorf("llmtest: X-Test-Usage: unknown count %q: want input, output, cached or write", k)
		}
	}
	if u.Cached+u.Write > u.Input {
		return Usage{}, fmt.Errorf("llmtest: X-Test-Usage: cached + write (%d) is more than input (%d)", u.Cached+u.Write, u.Input)
	}
	return u, nil
}

// Text is the completion an answer of n events of size bytes each writes: letters and spaces,
// the same for every format, so a test knows the text its client must assemble.
func Text(n, size int) string {
	c := call{size: size}
	var b []byte
	for i := range n {
		b = c.chunk(b, i)
	}
	return string(b)
}

const alphabet = "abcdefghijklmnopqrstuvwxyz "

// chunk appends the text of event i to b: size bytes of the alphabet repeated, from the i-th
// letter. It needs no escaping in JSON, and costs a copy: a stream of a gigabyte is cheap to write.
func (c *call) chunk(b []byte, i int) []byte {
	if c.pattern == nil {
		c.pattern = bytes.Repeat([]byte(alphabet), c.size/len(alphabet)+2)
	}
	o := i % len(alphabet)
	return append(b, c.pattern[o:o+c.size]...)
}

// answer writes an answer: a JSON body, or a stream of events flushed one by one, cut as the
// call says.
type answer struct {
	w        http.ResponseWriter
	ctx      context.Context
	interval time.Duration
	cut      int
	errAfter int // the events before the error event; -1: none
	errName  string
	errData  []byte
	end      End
	buf      []byte
}

// json writes a whole JSON body, or its first cut bytes before closing the connection.
func (a *answer) json(body []byte) {
	h := a.w.Header()
	h.Set("Content-Type", "application/json")
	if a.cut < 0 {
		h.Set("Content-Length", strconv.Itoa(len(body)))
		a.w.Write(body)
		return
	}
	a.w.WriteHeader(http.StatusOK)
	a.w.Write(body[:min(a.cut, len(body))])
	a.abort()
}

// abort flushes what is written and closes the connection without ending the body.
func (a *answer) abort() {
	http.NewResponseController(a.w).Flush()
	a.end.Cut = true
	panic(http.ErrAbortHandler)
}

// event writes one server-sent event (name "": a data line only) and flushes it. It reports false
// when the client has left: the caller stops.
func (a *answer) event(name string, data []byte) bool {
	if a.end.Events == 0 {
		h := a.w.Header()
		h.Set("Content-Type", "text/event-stream; charset=utf-8")
		h.Set("Cache-Control", "no-cache")
	}
	if a.end.Events == a.cut {
		if a.end.Events == 0 {
			a.w.WriteHeader(http.StatusOK)
		}
		a.abort()
	}
	if a.end.Events == a.errAfter {
		a.errAfter = -1
		a.end.Error = a.event(a.errName, a.errData)
		return false
	}
	if a.interval > 0 {
		t := time.NewTimer(a.interval)
		select {
		case <-t.C:
		case <-a.ctx.Done():
			t.Stop()
		}
	}
	if a.ctx.Err() != nil {
		a.end.Gone = true
		return false
	}
	b := a.buf[:0]
	if name != "" {
		b = append(append(append(b, "event: "...), name...), '\n')
	}
	b = append(append(append(b, "data: "...), data...), "\n\n"...)
	a.buf = b
	_, err := a.w.Write(b)
	if err == nil {
		err = http.NewResponseController(a.w).Flush()
	}
	if err != nil {
		a.end.Gone = true
		return false
	}
	a.end.Events++
	return true
}

package llm

import (
	"fmt"
	"math/bits"
	"strings"

	"github.com/sluicehq/sluice/internal/sat"
)

// Usage is the tokens a response reports, as its provider counts them.
type Usage struct {
	// Input is every token of the prompt, cached or not: OpenAI's prompt_tokens (or the
	// Responses API's input_tokens); Anthropic's input_tokens + cache_read_input_tokens +
	// cache_creation_input_tokens (Anthropic's input_tokens counts only the tokens that were
	// neither read from nor written to its cache).
	Input int64
	// Output is the tokens generated, reasoning included: completion_tokens or output_tokens.
	Output int64
	// CachedInput is the part of Input read from the provider's prompt cache: OpenAI's
	// prompt_tokens_details.cached_tokens (input_tokens_details.cached_tokens), Anthropic's
	// cache_read_input_tokens. Tokens written to Anthropic's cache count as plain input: they
	// are billed at least as input is, and a cost weighing them as cheap reads would undercount.
	CachedInput int64
	// Total is the total_tokens the response reports, else Input + Output. For the Field
	// format it is the field's value, and the other counts are zero.
	Total int64
	// Found reports that the response reported its final usage. A stream that ends before it
	// (Anthropic's message_start reports the input, but only a message_delta the output) has
	// none.
	Found bool
}

// Format is the shape of the responses whose usage is read.
type Format int

const (
	// OpenAI is the OpenAI API and its imitators (vLLM, Ollama, LiteLLM…): the top-level
	// "usage" of a body or an event, or the "usage" of the "response" of an event of the
	// Responses API (response.completed).
	OpenAI Format = iota + 1
	// Anthropic is Anthropic's Messages API: the top-level "usage" of a body or of a
	// message_delta event (cumulative: the last one wins), with the "message.usage" of the
	// message_start event for the counts a message_delta leaves out.
	Anthropic
	// Field is a number at a configured Path, in the body or in the last event that has it.
	// It is the Usage's Total (its other counts are zero): its Count is CountTotal.
	Field
)

// Slots of the OpenAI format's numbers.
const (
	oIn = iota
	oOut
	oTotal
	oCached
)

// Slots of the Anthropic format's numbers.
const (
	aIn = iota
	aOut
	aRead
	aWrite
)

var (
	openaiPaths = trie([]string{"usage", "response.usage"}, true, map[string]int{
		"prompt_tokens":                       oIn,
		"input_tokens":                        oIn,
		"completion_tokens":                   oOut,
		"output_tokens":                       oOut,
		"total_tokens":                        oTotal,
		"prompt_tokens_details.cached_tokens": oCached,
		"input_tokens_details.cached_tokens":  oCached,
	}, nil)
	anthropicUsage = map[string]int{
		"input_tokens":                aIn,
		"output_tokens":               aOut,
		"cache_read_input_tokens":     aRead,
		"cache_creation_input_tokens": aWrite,
	}
	anthropicPaths = trie([]string{"usage"}, true, anthropicUsage,
		trie([]string{"message.usage"}, false, anthropicUsage, nil))
)

// Meter reads the usage a response body reports as the body passes. Its methods are for one
// goroutine at a time.
type Meter struct {
	format Format
	stream bool
	sc     scan
	ev     events
	got    found // the usage of the events dispatched
}

// NewMeter returns a Meter of a response in format f (field: the Path of the Field format)
// whose Content-Type is contentType: text/event-stream is read as server-sent events, anything
// else as one JSON value.
func NewMeter(f Format, field Path, contentType string) *Meter {
	m := &Meter{format: f, stream: isEventStream(contentType)}
	switch f {
	case OpenAI:
		m.sc.root = openaiPaths
	case Anthropic:
		m.sc.root = anthropicPaths
	case Field:
		m.sc.root = field.root
	}
	m.sc.reset()
	return m
}

func isEventStream(contentType string) bool {
	t, _, _ := strings.Cut(contentType, ";")
	return strings.EqualFold(strings.TrimSpace(t), "text/event-stream")
}

// Write reads p, the body's next bytes. It keeps nothing of p and always returns len(p), nil.
func (m *Meter) Write(p []byte) (int, error) {
	if m.stream {
		m.ev.write(p, m)
	} else {
		m.sc.write(p)
	}
	return len(p), nil
}

// Usage returns the usage the body reported, once it has ended.
func (m *Meter) Usage() Usage {
	g := m.got
	if !m.stream {
		g = found{}
		if m.sc.end() {
			g = m.sc.got
		}
	}
	if !g.final {
		return Usage{}
	}
	v := g.vals
	var u Usage
	switch m.format {
	case OpenAI:
		u = Usage{Input: v[oIn], Output: v[oOut], CachedInput: v[oCached], Total: v[oTotal]}
		if g.seen&(1<<oTotal) == 0 {
			u.Total = addCount(u.Input, u.Output)
		}
	case Anthropic:
		in := addCount(addCount(v[aIn], v[aRead]), v[aWrite])
		u = Usage{Input: in, Output: v[aOut], CachedInput: v[aRead], Total: addCount(in, v[aOut])}
	case Field:
		u.Total = v[0]
	}
	u.Found = true
	return u
}

// addCount adds token counts, saturating at 2^53.
func addCount(a, b int64) int64 { return min(sat.Add(a, b), maxCount) }

// Count is which tokens are a response's cost.
type Count int

const (
	CountTotal    Count = iota // Usage.Total
	CountInput                 // Usage.Input
	CountOutput                // Usage.Output
	CountWeighted              // Weights' sum of the input, cached input and output tokens
)

var countNames = [...]string{CountTotal: "total", CountInput: "input", CountOutput: "output", CountWeighted: "weighted"}

func (c Count) String() string {
	if c < 0 || int(c) >= len(countNames) {
		return fmt.Sprintf("Count(%d)", int(c))
	}
	return countNames[c]
}

// ParseCount parses "total", "input", "output" or "weighted".
func ParseCount(s string) (Count, error) {
	for c, n := range countNames {
		if s == n {
			return Count(c), nil
		}
	}
	return 0, fmt.Errorf("unknown count %q: want total, input, output or weighted", s)
}

// Weights are the weights of CountWeighted, in thousandths: 4000 counts a token 4 times, 100
// counts it a tenth. Input weighs the input tokens not read from the cache.
type Weights struct {
	Input, CachedInput, Output int64
}

// MaxWeight is the largest weight, in thousandths: a token counted a million times.
const MaxWeight = 1_000_000_000

// ParseWeight parses a weight written in decimal with at most three decimals ("4", "0.1",
// "1.25"), into thousandths.
func ParseWeight(s string) (int64, error) {
	in, frac, dot := strings.Cut(s, ".")
	if in == "" || len(frac) > 3 || dot && frac == "" {
		return 0, fmt.Errorf("weight %q: want a decimal number with at most 3 decimals, e.g. 4 or 0.1", s)
	}
	var w int64
	for _, d := range in + (frac + "000")[:3] {
		if d < '0' || d > '9' {
			return 0, fmt.Errorf("weight %q: want a decimal number with at most 3 decimals, e.g. 4 or 0.1", s)
		}
		if w = w*10 + int64(d-'0'); w > MaxWeight {
			return 0, fmt.Errorf("weight %q: at most %d", s, MaxWeight/1000)
		}
	}
	return w, nil
}

// Cost returns u's cost counted as c says (w: the weights of CountWeighted), in 0..2^53: a
// weighted sum is exact (in 128 bits) and rounded up, and any cost over 2^53 is 2^53. A Usage
// not Found costs 0: the caller keeps its estimate. Weights are clamped to 0..MaxWeight.
func Cost(u Usage, c Count, w Weights) int64 {
	if !u.Found {
		return 0
	}
	clamp := func(n, hi int64) uint64 { return uint64(min(max(n, 0), hi)) }
	switch c {
	case CountTotal:
		return int64(clamp(u.Total, maxCount))
	case CountInput:
		return int64(clamp(u.Input, maxCount))
	case CountOutput:
		return int64(clamp(u.Output, maxCount))
	case CountWeighted:
	default:
		return 0
	}
	cached := clamp(u.CachedInput, maxCount)
	uncached := clamp(u.Input, maxCount) - min(cached, clamp(u.Input, maxCount))
	var hi, lo uint64
	for _, t := range [...][2]uint64{
		{uncached, clamp(w.Input, MaxWeight)},
		{cached, clamp(w.CachedInput, MaxWeight)},
		{clamp(u.Output, maxCount), clamp(w.Output, MaxWeight)},
	} {
		h, l := bits.Mul64(t[0], t[1])
		var carry uint64
		lo, carry = bits.Add64(lo, l, 0)
		hi += h + carry
	}
	if hi >= 1000 {
		return maxCount
	}
	q, r := bits.Div64(hi, lo, 1000)
	if r > 0 {
		q++
	}
	return int64(min(q, maxCount))
}

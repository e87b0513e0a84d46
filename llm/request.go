package llm

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"unsafe"

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
//
// The body is read where it lies, in one pass, and nothing of it is copied (walk.go): what
// ParseRequest allocates is the model's name and, for tools and functions, a few words for each
// key of the object being read. Its result and its errors are those of decoding the body with
// encoding/json into a map[string]any and reading that, which it did before: the same syntax
// errors at the same bytes (a body nested more than 10,000 deep is one), strings counted as they
// decode (escapes decoded, a lone surrogate or an invalid UTF-8 byte as U+FFFD), numbers as
// written.
func ParseRequest(body []byte, limit int) (Request, error) {
	if limit > 0 && len(body) > limit {
		return Request{}, ErrTooLarge
	}
	w := newWalker(body)
	i := w.ws(0)
	if i < len(body) && body[i] == '{' {
		i, _ = w.object(i, cTop)
	} else {
		w.value(i, cSkip) // a syntax error is one; a whole value is not an object
		w.fail = cmp.Or(w.fail, -1)
	}
	switch {
	case w.fail > 0:
		return Request{}, fmt.Errorf("llm: request body: not JSON (syntax error at byte %d)", w.fail)
	case w.fail < 0:
		return Request{}, errors.New("llm: request body: not a JSON object")
	case w.ws(i) != len(body):
		return Request{}, errors.New("llm: request body: data after the JSON object")
	}

	r := Request{Choices: 1}
	var err error
	if r.Model, err = w.model(); err != nil {
		return Request{}, err
	}
	for _, f := range [...]int{fMaxTokens, fMaxCompletionTokens, fMaxOutputTokens} {
		n, err := w.count(f)
		if err != nil {
			return Request{}, err
		}
		r.MaxOutput = max(r.MaxOutput, n)
	}
	for _, f := range [...]int{fN, fBestOf} {
		n, err := w.count(f)
		if err != nil {
			return Request{}, err
		}
		r.Choices = max(r.Choices, n)
	}
	if r.Stream, err = flag(body, w.top[fStream].at, "stream"); err != nil {
		return Request{}, err
	}
	switch so := w.top[fStreamOptions]; {
	case so.at < 0 || body[so.at] == 'n':
	case body[so.at] == '{':
		if r.IncludeUsage, err = flag(body, so.iu, "stream_options.include_usage"); err != nil {
			return Request{}, err
		}
	default:
		return Request{}, errors.New(`llm: request body: "stream_options" must be an object`)
	}

	var s size
	for _, f := range w.top[fMessages:] { // the fields of the prompt's text, last of the fields
		s.add(f.n)
	}
	r.PromptBytes, r.PromptTokens, r.Media = s.bytes, s.tokens, s.media
	return r, nil
}

// model reads "model": a string of printable ASCII (a name with a control byte or a multi-byte
// character is no model name any provider has, and would only make odd keys).
func (w *walker) model() (string, error) {
	at := w.top[fModel].at
	if at < 0 || w.b[at] == 'n' {
		return "", nil
	}
	if w.b[at] != '"' {
		return "", errors.New(`llm: request body: "model" must be a string`)
	}
	end, n, plain := w.str(at)
	if n > MaxModel {
		return "", fmt.Errorf(`llm: request body: "model" is longer than %d bytes`, MaxModel)
	}
	var buf [MaxModel]byte
	s := w.b[at+1 : end-1]
	if !plain {
		s = buf[:unquote(buf[:], s)]
	}
	for _, c := range s {
		if c < 0x20 || c > 0x7e {
			return "", errors.New(`llm: request body: "model" must be printable ASCII`)
		}
	}
	return string(s), nil
}

// count reads a whole number of tokens or completions; absent or null is 0. A client that writes
// 100 as 100.0 or 1e2 means 100, and is read so (a number is read as strconv reads its text:
// ParseInt, else ParseFloat's nearest float64, as when it was decoded as a json.Number).
func (w *walker) count(f int) (int64, error) {
	at, end := w.top[f].at, w.top[f].end
	if at < 0 || w.b[at] == 'n' {
		return 0, nil
	}
	if c := w.b[at]; c == '-' || isDigit(c) {
		num := w.b[at:end]
		// An integer of more than 20 bytes is out of ParseInt's range: it is not given one, whose
		// error would copy it.
		if len(num) <= 20 && bytes.IndexAny(num, ".eE") < 0 {
			if i, err := strconv.ParseInt(string(num), 10, 64); err == nil && i >= 0 {
				return i, nil
			}
		}
		// A number of 10^17 or more is over 2^53 however it rounds: it is not given to
		// ParseFloat, whose error (if it overflowed) would copy it. Nor is the number copied to
		// be given: strconv keeps nothing of the string it reads.
		if magnitude(num) < 18 {
			f, err := strconv.ParseFloat(unsafe.String(unsafe.SliceData(num), len(num)), 64)
			if err == nil && f >= 0 && f <= 1<<53 && f == math.Trunc(f) {
				return int64(f), nil
			}
		}
	}
	return 0, fmt.Errorf("llm: request body: %q must be a whole number from 0 to %d", fieldNames[f], int64(math.MaxInt64))
}

// fieldNames are the count fields' keys, for their errors.
var fieldNames = [nFields]string{
	fMaxTokens: "max_tokens", fMaxCompletionTokens: "max_completion_tokens", fMaxOutputTokens: "max_output_tokens",
	fN: "n", fBestOf: "best_of",
}

// magnitude is the decimal exponent e of the valid JSON number num, 10^(e-1) ≤ |num| < 10^e
// (its exponent saturated at ±10^9; -10^9 for zero).
func magnitude(num []byte) int {
	const lim = 1_000_000_000
	i, e, lead, seen := 0, 0, 0, false // e: the integer's digits; lead: the zeros before the first other digit
	if num[0] == '-' {
		i++
	}
	digit := func(c byte) {
		if !seen {
			if c == '0' {
				lead++
			} else {
				seen = true
			}
		}
	}
	for ; i < len(num) && isDigit(num[i]); i++ {
		e++
		digit(num[i])
	}
	if i < len(num) && num[i] == '.' {
		for i++; i < len(num) && isDigit(num[i]); i++ {
			digit(num[i])
		}
	}
	if !seen {
		return -lim
	}
	e -= lead
	if i < len(num) { // e or E, then the exponent
		sign := 1
		switch i++; num[i] {
		case '-':
			sign = -1
			i++
		case '+':
			i++
		}
		x := 0
		for ; i < len(num); i++ {
			if x < lim {
				x = x*10 + int(num[i]-'0')
			}
		}
		e += sign * min(x, lim)
	}
	return e
}

// flag reads the boolean at b[at]; absent (at < 0) or null is false. name is the field's full
// name, for the error.
func flag(b []byte, at int, name string) (bool, error) {
	if at < 0 {
		return false, nil
	}
	switch b[at] {
	case 'n', 'f':
		return false, nil
	case 't':
		return true, nil
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

// A size adds up the text of a prompt, as the old decoder's map was read: text (a prompt's
// content: a string's decoded bytes, a token id, a part, or an array of them) and part (a message,
// content part or input item: one medium, or the fields that hold text the model reads: text,
// content, thinking, arguments, output, tool_calls, function, function_call, and an Anthropic
// tool_use's input object whole) for messages, system, instructions, input and prompt; all (every
// key, string and number as written) for tools and functions. Ids, roles, names and cache
// controls are left out: they are a few tokens, and which of them an upstream renders is its own
// business.
type size struct {
	bytes, tokens, media int64
}

func (s *size) add(t size) {
	s.bytes += t.bytes
	s.tokens += t.tokens
	s.media += t.media
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

// An Edit of a body replaces its bytes [Start, End) with Insert (0 ≤ Start ≤ End ≤ the body's
// length): the body it makes is body[:Start] + Insert + body[End:], which Reader gives without
// joining them.
type Edit struct {
	Start, End int
	Insert     string
}

// Len is the length of the body e makes of body.
func (e Edit) Len(body []byte) int { return len(body) - (e.End - e.Start) + len(e.Insert) }

// Apply returns the body e makes of body, in body's own array when its capacity holds the
// result (a caller that reads a body with room to spare after it edits it without a copy), else
// in a new one. body's bytes from e.Start on are overwritten when it is edited in place.
func (e Edit) Apply(body []byte) []byte {
	n := e.Len(body)
	if n > cap(body) {
		out := make([]byte, 0, n)
		out = append(out, body[:e.Start]...)
		out = append(out, e.Insert...)
		return append(out, body[e.End:]...)
	}
	tail := len(body) - e.End
	out := body[:max(n, len(body))]
	copy(out[e.Start+len(e.Insert):], body[e.End:e.End+tail]) // (copy moves overlapping bytes right)
	copy(out[e.Start:], e.Insert)
	return out[:n]
}

// Reader reads the body e makes of body, from body's own bytes and e.Insert: nothing is copied
// into a new body, nor through a buffer by io.Copy (the reader is an io.WriterTo, which writes
// the three parts in turn). body must not change while it is read.
func (e Edit) Reader(body []byte) io.Reader { return &editReader{body: body, e: e} }

// An editReader reads the body an Edit makes.
type editReader struct {
	body []byte
	e    Edit
	off  int // the bytes of the edited body read
}

// rest returns the rest of the part of the edited body the reader is in: of the body before the
// edit, of the insert, or of the body after it; both empty at the end.
func (r *editReader) rest() ([]byte, string) {
	e, n := r.e, r.off
	switch {
	case n < e.Start:
		return r.body[n:e.Start], ""
	case n < e.Start+len(e.Insert):
		return nil, e.Insert[n-e.Start:]
	}
	return r.body[e.End+n-e.Start-len(e.Insert):], ""
}

func (r *editReader) Read(p []byte) (int, error) {
	total := 0
	for len(p) > 0 {
		b, s := r.rest()
		if len(b) == 0 && s == "" {
			break
		}
		n := copy(p, b)
		if s != "" {
			n = copy(p, s)
		}
		r.off += n
		total += n
		p = p[n:]
	}
	if total == 0 && r.off == r.e.Len(r.body) {
		return 0, io.EOF
	}
	return total, nil
}

func (r *editReader) WriteTo(w io.Writer) (int64, error) {
	var total int64
	for {
		b, s := r.rest()
		var n int
		var err error
		switch {
		case len(b) > 0:
			n, err = w.Write(b)
			if n < len(b) && err == nil {
				err = io.ErrShortWrite
			}
		case s != "":
			n, err = io.WriteString(w, s)
			if n < len(s) && err == nil {
				err = io.ErrShortWrite
			}
		default:
			return total, nil
		}
		r.off += n
		total += int64(n)
		if err != nil {
			return total, err
		}
	}
}

// UsageEdit returns the edit that sets stream_options.include_usage to true in body, for a
// streamed OpenAI chat completions or completions request (one with "stream": true and "messages"
// or "prompt") that does not set it already, and true; else false. Every other byte of the body is
// kept: the option is inserted after "stream" (`,"stream_options":{"include_usage":true}`), or
// into the "stream_options" object the body has (first, followed by a comma if it has members), or
// in place of a stream_options of null, or of an include_usage of false or null. Keys are compared
// decoded and the last of duplicates is the one read and edited. A body that is not one JSON object
// (whitespace around it aside) is no such request; nor is one whose stream_options is not an
// object or null, or whose include_usage is anything but false, null or absent. Its rules are the
// old InjectUsage's, which read the body with encoding/json's Token API: so the nesting of each
// value in the body's object may be 10,000 deep, not counting the object.
//
// The Responses API is left alone: it reports a stream's usage anyway, and rejects the option.
// An Anthropic messages request looks like a chat completion and would be changed: call
// UsageEdit only for an upstream of OpenAI's format (Anthropic's reports a stream's usage
// unasked, and rejects fields it does not know).
//
// The body is walked in place (walk.go), and nothing is allocated.
func UsageEdit(body []byte) (Edit, bool) {
	w := newWalker(body)
	w.edit = true
	i := w.ws(0)
	if i >= len(body) || body[i] != '{' {
		return Edit{}, false
	}
	if i, _ = w.object(i, cTop); w.fail != 0 || w.ws(i) != len(body) {
		return Edit{}, false
	}
	st := w.top[fStream]
	if st.at < 0 || string(body[st.at:st.end]) != "true" {
		return Edit{}, false
	}
	if w.top[fMessages].at < 0 && w.top[fPrompt].at < 0 {
		return Edit{}, false
	}
	so := w.top[fStreamOptions]
	switch {
	case so.at < 0:
		return Edit{st.end, st.end, `,"stream_options":{` + includeUsage + `}`}, true
	case body[so.at] == 'n':
		return Edit{so.at, so.end, `{` + includeUsage + `}`}, true
	case body[so.at] != '{':
		return Edit{}, false
	case so.iu < 0 && so.members > 0:
		return Edit{so.at + 1, so.at + 1, includeUsage + ","}, true
	case so.iu < 0:
		return Edit{so.at + 1, so.at + 1, includeUsage}, true
	case body[so.iu] == 'f' || body[so.iu] == 'n':
		return Edit{so.iu, so.iuEnd, "true"}, true
	}
	return Edit{}, false
}

// InjectUsage returns body with stream_options.include_usage set to true, as UsageEdit says, in
// a new slice, and true; or body itself and false if UsageEdit has no edit. A caller that can
// send the body in pieces should use UsageEdit and Edit.Reader instead, which copy nothing.
func InjectUsage(body []byte) ([]byte, bool) {
	e, ok := UsageEdit(body)
	if !ok {
		return body, false
	}
	out := make([]byte, 0, e.Len(body))
	out = append(out, body[:e.Start]...)
	out = append(out, e.Insert...)
	return append(out, body[e.End:]...), true
}

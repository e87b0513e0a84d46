package llm

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"slices"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// THE REQUEST WALK. A request body is read where it lies: walk checks its bytes against the JSON
// grammar exactly as encoding/json's scanner does (the same first bad byte, the same nesting limit)
// and adds up the sizes ParseRequest wants as it goes, in one pass, copying nothing of the body: a
// string's decoded length is computed, not decoded into a buffer. What encoding/json would make of
// the body as a map[string]any is kept: the last of duplicate keys wins at every level (a member's
// size is counted when its object ends, and only the last of its key's), keys are compared
// decoded, and a string counts the bytes encoding/json decodes it to (escapes decoded, a lone
// surrogate or an invalid UTF-8 byte as U+FFFD, three bytes).

// maxDepth is encoding/json's limit on nesting: an array or object opened deeper is a syntax error.
const maxDepth = 10000

// What a value is read for: how it adds to the size of the object holding it.
const (
	cSkip   = iota // checked only
	cText          // prompt text (see size): strings, token ids, arrays of them, parts
	cAll           // every key, string and number as written (of duplicate keys, the last)
	cAllObj        // an object is cAll, anything else adds nothing (an Anthropic tool_use's input)
	cOpts          // stream_options: its include_usage is noted
	cTop           // the body's object: the fields of a Request
)

// The fields of the body's object that a Request is read from.
const (
	fModel = iota
	fMaxTokens
	fMaxCompletionTokens
	fMaxOutputTokens
	fN
	fBestOf
	fStream
	fStreamOptions
	fMessages
	fSystem
	fInstructions
	fInput
	fPrompt
	fTools
	fFunctions
	nFields
)

// topField is the field the body's key k names, or -1.
func topField(k []byte) int {
	switch string(k) {
	case "model":
		return fModel
	case "max_tokens":
		return fMaxTokens
	case "max_completion_tokens":
		return fMaxCompletionTokens
	case "max_output_tokens":
		return fMaxOutputTokens
	case "n":
		return fN
	case "best_of":
		return fBestOf
	case "stream":
		return fStream
	case "stream_options":
		return fStreamOptions
	case "messages":
		return fMessages
	case "system":
		return fSystem
	case "instructions":
		return fInstructions
	case "input":
		return fInput
	case "prompt":
		return fPrompt
	case "tools":
		return fTools
	case "functions":
		return fFunctions
	}
	return -1
}

// topCtx is what each field's value is read for.
var topCtx = [nFields]int{
	fStreamOptions: cOpts,
	fMessages:      cText, fSystem: cText, fInstructions: cText, fInput: cText, fPrompt: cText,
	fTools: cAll, fFunctions: cAll,
}

// The fields of a part (a message, content part or input item) that hold its text, with its type
// and an Anthropic tool_use's input.
const (
	pText = iota
	pContent
	pThinking
	pArguments
	pOutput
	pToolCalls
	pFunction
	pFunctionCall
	pInput
	nPart
	pType = nPart
)

// partField is the part's field the key k names, or -1.
func partField(k []byte) int {
	switch string(k) {
	case "type":
		return pType
	case "text":
		return pText
	case "content":
		return pContent
	case "thinking":
		return pThinking
	case "arguments":
		return pArguments
	case "output":
		return pOutput
	case "tool_calls":
		return pToolCalls
	case "function":
		return pFunction
	case "function_call":
		return pFunctionCall
	case "input":
		return pInput
	}
	return -1
}

// A field is where the last of a key's values lies, and what it adds up to.
type field struct {
	at, end int  // the value's bytes; at < 0: the key is absent
	n       size // its size, in the field's context
	// Of a stream_options object: where its last include_usage's value lies (iu < 0: it has
	// none), and how many members it has.
	iu, iuEnd, members int
}

// An entry is a member of an object read in the cAll context, until its object ends.
type entry struct {
	k0, k1 int   // the key's bytes between its quotes
	plain  bool  // the key's bytes are its decoded text
	n      int64 // the size of the key and its value
}

// compactAt is how many members of an object in the cAll context are held before the earlier of
// duplicate keys are dropped (and then twice as many as are left): a body cannot make the walk
// hold more entries than compactAt or twice its objects' distinct keys.
const compactAt = 256

// A walker walks a body once. It is kept on the caller's stack; it allocates only when an object
// read in the cAll context has members (its entries).
type walker struct {
	b []byte
	// fail: 0, none; > 0, a syntax error at b[fail-1] (fail is its offset as encoding/json
	// gives it); -1, the body ended inside a value.
	fail  int
	depth int
	// edit: UsageEdit's rules, those of the decoder's Token API its old version used: the
	// depth of each value of the body's object is counted from that value. No size is added up:
	// only where the fields lie (and stream_options' include_usage) is noted.
	edit bool
	top  [nFields]field // cTop: the body's fields
	opts field          // cOpts: the stream_options object that ended last
	ents []entry        // cAll: the members of the objects open, innermost last
}

func newWalker(b []byte) walker {
	w := walker{b: b}
	for i := range w.top {
		w.top[i].at = -1
	}
	return w
}

// syntax notes a syntax error at byte i (unless one was found before) and returns len(b), where
// every loop of the walk ends.
func (w *walker) syntax(i int) int {
	if w.fail == 0 {
		w.fail = i + 1
	}
	return len(w.b)
}

// short notes that the body ended inside a value.
func (w *walker) short() int {
	if w.fail == 0 {
		w.fail = -1
	}
	return len(w.b)
}

// ws is the index of the first byte from i that is not JSON whitespace.
func (w *walker) ws(i int) int {
	for i < len(w.b) && isSpace(w.b[i]) {
		i++
	}
	return i
}

// value walks the value that begins at b[i] and returns the index after it and its size in
// context ctx.
func (w *walker) value(i, ctx int) (int, size) {
	b := w.b
	if i >= len(b) {
		return w.short(), size{}
	}
	switch c := b[i]; {
	case c == '"':
		j, n, _ := w.str(i)
		if ctx == cText || ctx == cAll {
			return j, size{bytes: n}
		}
		return j, size{}
	case c == '{':
		return w.object(i, ctx)
	case c == '[':
		return w.array(i, ctx)
	case c == '-' || '0' <= c && c <= '9':
		j := w.num(i)
		switch ctx {
		case cText:
			return j, size{tokens: 1}
		case cAll:
			return j, size{bytes: int64(j - i)}
		}
		return j, size{}
	case c == 't':
		return w.lit(i, "true"), size{}
	case c == 'f':
		return w.lit(i, "false"), size{}
	case c == 'n':
		return w.lit(i, "null"), size{}
	}
	return w.syntax(i), size{}
}

// lit walks the literal s at b[i] (whose first byte is s[0]).
func (w *walker) lit(i int, s string) int {
	for k := 1; k < len(s); k++ {
		if i+k >= len(w.b) {
			return w.short()
		}
		if w.b[i+k] != s[k] {
			return w.syntax(i + k)
		}
	}
	return i + len(s)
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func (w *walker) digits(j int) int {
	for j < len(w.b) && isDigit(w.b[j]) {
		j++
	}
	return j
}

// num walks the number at b[i]: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?, ended by the first
// byte that cannot continue it.
func (w *walker) num(i int) int {
	b := w.b
	j := i
	if b[j] == '-' {
		j++
	}
	if j >= len(b) {
		return w.short()
	}
	switch {
	case b[j] == '0':
		j++
	case isDigit(b[j]):
		j = w.digits(j + 1)
	default:
		return w.syntax(j)
	}
	if j < len(b) && b[j] == '.' {
		if j++; j >= len(b) {
			return w.short()
		}
		if !isDigit(b[j]) {
			return w.syntax(j)
		}
		j = w.digits(j + 1)
	}
	if j < len(b) && (b[j] == 'e' || b[j] == 'E') {
		if j++; j < len(b) && (b[j] == '+' || b[j] == '-') {
			j++
		}
		if j >= len(b) {
			return w.short()
		}
		if !isDigit(b[j]) {
			return w.syntax(j)
		}
		j = w.digits(j + 1)
	}
	return j
}

// strPlain marks the bytes a string's text is mostly made of: those that stand for themselves
// and are one byte of UTF-8 (ASCII but the controls, the quote and the backslash).
var strPlain = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return
}()

// str walks the string whose opening quote is at b[i]. It returns the index after its closing
// quote, the length encoding/json decodes it to, and whether it is plain: without escapes and
// valid UTF-8, so that its bytes are its decoded text.
func (w *walker) str(i int) (int, int64, bool) {
	b := w.b
	j := i + 1
	var n int64
	plain := true
	for {
		k := j
		// Eight bytes at a time while none is a quote, a backslash, a control or not ASCII.
		for k+8 <= len(b) && !special8(b[k:k+8]) {
			k += 8
		}
		for k < len(b) && strPlain[b[k]] {
			k++
		}
		n += int64(k - j)
		if j = k; j >= len(b) {
			return w.short(), n, plain
		}
		switch c := b[j]; {
		case c == '"':
			return j + 1, n, plain
		case c == '\\':
			plain = false
			var m int
			if j, m = w.escape(j); m < 0 {
				return len(b), n, plain
			}
			n += int64(m)
		case c < 0x20:
			return w.syntax(j), n, plain
		default:
			r, size := utf8.DecodeRune(b[j:])
			if r == utf8.RuneError && size == 1 {
				n += 3 // U+FFFD in its place
				plain = false
			} else {
				n += int64(size)
			}
			j += size
		}
	}
}

// special8 reports whether any of the eight bytes of p is a quote, a backslash, a control
// or not ASCII.
func special8(p []byte) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	v := binary.LittleEndian.Uint64(p)
	zero := func(x uint64) uint64 { return (x - ones) &^ x & highs } // a byte of x is 0
	q, bs := v^(ones*'"'), v^(ones*'\\')
	return (v&highs)|((v-ones*0x20)&^v&highs)|zero(q)|zero(bs) != 0
}

// escape walks the escape at b[j] (a backslash) in a string, and returns the index after it and
// the length it decodes to (-1: not an escape, the walk has failed). A \u escape of a high
// surrogate followed by one of a low surrogate is one character, four bytes; a surrogate
// otherwise is U+FFFD, as encoding/json decodes it.
func (w *walker) escape(j int) (int, int) {
	b := w.b
	if j+1 >= len(b) {
		return w.short(), -1
	}
	switch b[j+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return j + 2, 1
	case 'u':
	default:
		return w.syntax(j + 1), -1
	}
	var r rune
	for k := j + 2; k < j+6; k++ {
		if k >= len(b) {
			return w.short(), -1
		}
		d := unhex(b[k])
		if d < 0 {
			return w.syntax(k), -1
		}
		r = r<<4 | d
	}
	j += 6
	if !utf16.IsSurrogate(r) {
		return j, utf8.RuneLen(r)
	}
	if r2 := getu4(b[j:]); utf16.DecodeRune(r, r2) != unicode.ReplacementChar {
		return j + 6, 4
	}
	return j, 3
}

func unhex(c byte) rune {
	switch {
	case '0' <= c && c <= '9':
		return rune(c - '0')
	case 'a' <= c && c <= 'f':
		return rune(c - 'a' + 10)
	case 'A' <= c && c <= 'F':
		return rune(c - 'A' + 10)
	}
	return -1
}

// getu4 is the character of the \uXXXX escape that s begins with, or -1.
func getu4(s []byte) rune {
	if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
		return -1
	}
	var r rune
	for _, c := range s[2:6] {
		d := unhex(c)
		if d < 0 {
			return -1
		}
		r = r<<4 | d
	}
	return r
}

// array walks the array at b[i]; its elements are read in ctx if it is text or all.
func (w *walker) array(i, ctx int) (int, size) {
	if w.depth++; w.depth > maxDepth {
		return w.syntax(i), size{}
	}
	ectx := cSkip
	if ctx == cText || ctx == cAll {
		ectx = ctx
	}
	b := w.b
	var s size
	j := w.ws(i + 1)
	if j < len(b) && b[j] == ']' {
		w.depth--
		return j + 1, s
	}
	for {
		var e size
		j, e = w.value(j, ectx)
		s.add(e)
		if j = w.ws(j); j >= len(b) {
			return w.short(), s
		}
		switch b[j] {
		case ',':
			j = w.ws(j + 1)
		case ']':
			w.depth--
			return j + 1, s
		default:
			return w.syntax(j), s
		}
	}
}

// object walks the object at b[i]. In ctx cText it is a part (size.part): a media part counts
// one medium and nothing else; another counts its text fields. In cAll and cAllObj every key and
// value counts once (the last of duplicates). In cOpts its include_usage is noted in w.opts, in
// cTop its fields in w.top.
func (w *walker) object(i, ctx int) (int, size) {
	if w.depth++; w.depth > maxDepth {
		return w.syntax(i), size{}
	}
	b := w.b
	var (
		s      size
		part   [nPart]size // cText: the last value of each text field
		medium bool        // cText: the last type is a media type
		start  = len(w.ents)
		limit  = start + compactAt
		opts   = field{iu: -1}
		keyBuf [32]byte
	)
	j := w.ws(i + 1)
	if j < len(b) && b[j] == '}' {
		j++
	} else {
		for {
			if j >= len(b) {
				return w.short(), s
			}
			if b[j] != '"' {
				return w.syntax(j), s
			}
			k := j
			var kn int64
			var kplain bool
			if j, kn, kplain = w.str(j); w.fail != 0 {
				return len(b), s
			}
			key := b[k+1 : j-1]
			if j = w.ws(j); j >= len(b) {
				return w.short(), s
			}
			if b[j] != ':' {
				return w.syntax(j), s
			}
			j = w.ws(j + 1)

			slot, vctx := -1, cSkip
			switch ctx {
			case cText:
				if slot = partField(decoded(key, kn, kplain, &keyBuf)); slot >= 0 && slot < nPart {
					vctx = cText
					if slot == pInput {
						vctx = cAllObj
					}
				}
			case cAll, cAllObj:
				vctx = cAll
			case cOpts:
				if string(decoded(key, kn, kplain, &keyBuf)) == "include_usage" {
					slot = 0
				}
			case cTop:
				if slot = topField(decoded(key, kn, kplain, &keyBuf)); slot >= 0 {
					vctx = topCtx[slot]
					if w.edit && vctx != cOpts {
						vctx = cSkip
					}
				}
			}

			v := j
			var vs size
			if ctx == cTop && w.edit {
				depth := w.depth
				w.depth = 0
				j, vs = w.value(j, vctx)
				w.depth = depth
			} else {
				j, vs = w.value(j, vctx)
			}
			if w.fail != 0 {
				return len(b), s
			}

			switch ctx {
			case cText:
				if slot == pType {
					medium = w.isMedia(v)
				} else if slot >= 0 {
					part[slot] = vs
				}
			case cAll, cAllObj:
				w.ents = append(w.ents, entry{k0: k + 1, k1: k + 1 + len(key), plain: kplain, n: kn + vs.bytes})
				if len(w.ents) >= limit {
					limit = start + max(compactAt, 2*(w.compact(start)-start))
				}
			case cOpts:
				opts.members++
				if slot == 0 {
					opts.iu, opts.iuEnd = v, j
				}
			case cTop:
				if slot >= 0 {
					f := &w.top[slot]
					f.at, f.end, f.n = v, j, vs
					if slot == fStreamOptions {
						f.iu, f.iuEnd, f.members = -1, 0, 0
						if b[v] == '{' {
							f.iu, f.iuEnd, f.members = w.opts.iu, w.opts.iuEnd, w.opts.members
						}
					}
				}
			}

			if j = w.ws(j); j >= len(b) {
				return w.short(), s
			}
			if b[j] == '}' {
				j++
				break
			}
			if b[j] != ',' {
				return w.syntax(j), s
			}
			j = w.ws(j + 1)
		}
	}
	w.depth--
	switch ctx {
	case cText:
		if medium {
			return j, size{media: 1}
		}
		for _, p := range part {
			s.add(p)
		}
	case cAll, cAllObj:
		w.compact(start)
		for _, e := range w.ents[start:] {
			s.bytes += e.n
		}
		w.ents = w.ents[:start]
	case cOpts:
		w.opts = opts
	}
	return j, s
}

// isMedia reports whether the value at b[v] is a string naming a media type.
func (w *walker) isMedia(v int) bool {
	if w.b[v] != '"' {
		return false
	}
	var buf [32]byte
	j, n, plain := w.str(v)
	return media[string(decoded(w.b[v+1:j-1], n, plain, &buf))]
}

// compact sorts the entries of the object whose first is ents[start] by key and drops each but
// the last of duplicate keys. It returns the entries' new length.
func (w *walker) compact(start int) int {
	e := w.ents[start:]
	if len(e) < 2 {
		return len(w.ents)
	}
	b := w.b
	slices.SortFunc(e, func(x, y entry) int {
		if c := cmpKeys(b, x, y); c != 0 {
			return c
		}
		return cmp.Compare(x.k0, y.k0)
	})
	out := 0
	for i := range e {
		if i+1 < len(e) && cmpKeys(b, e[i], e[i+1]) == 0 {
			continue // a later member has the same key
		}
		e[out] = e[i]
		out++
	}
	w.ents = w.ents[:start+out]
	return len(w.ents)
}

// cmpKeys compares the keys of x and y decoded.
func cmpKeys(b []byte, x, y entry) int {
	if x.plain && y.plain {
		return bytes.Compare(b[x.k0:x.k1], b[y.k0:y.k1])
	}
	return cmpDecoded(b[x.k0:x.k1], b[y.k0:y.k1])
}

// THE DECODED TEXT of a string the walk has checked: short strings (keys, types, the model) are
// decoded to be compared, into a buffer of the caller's.

// replacement is U+FFFD, what encoding/json puts in place of a byte that is not UTF-8 and of a
// lone surrogate.
var replacement = []byte(string(utf8.RuneError))

// An unquoter gives the decoded text of the bytes of a valid JSON string between its quotes, a
// piece at a time.
type unquoter struct {
	s   []byte
	i   int // the bytes of s read
	buf [utf8.UTFMax]byte
}

// next returns the next piece of the decoded text (of s, or of u.buf until the next call), or
// nil at its end.
func (u *unquoter) next() []byte {
	if u.i >= len(u.s) {
		return nil
	}
	s := u.s[u.i:]
	switch c := s[0]; {
	case c == '\\':
		if s[1] != 'u' {
			u.i += 2
			u.buf[0] = unescape[s[1]]
			return u.buf[:1]
		}
		r, n := getu4(s), 6
		if utf16.IsSurrogate(r) {
			if d := utf16.DecodeRune(r, getu4(s[6:])); d != unicode.ReplacementChar {
				r, n = d, 12
			} else {
				r = unicode.ReplacementChar
			}
		}
		u.i += n
		return u.buf[:utf8.EncodeRune(u.buf[:], r)]
	case c < utf8.RuneSelf:
		n := 1
		for n < len(s) && s[n] < utf8.RuneSelf && s[n] != '\\' {
			n++
		}
		u.i += n
		return s[:n]
	default:
		r, n := utf8.DecodeRune(s)
		u.i += n
		if r == utf8.RuneError && n == 1 {
			return replacement
		}
		return s[:n]
	}
}

// unescape is the byte each one-byte escape stands for.
var unescape = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

// decoded is the text of the string whose bytes between its quotes are s (n: its decoded length;
// plain: s is its text), decoded into buf if it has to be; nil if it is longer than buf, which
// is longer than any key or type it is compared with.
func decoded(s []byte, n int64, plain bool, buf *[32]byte) []byte {
	if plain {
		return s
	}
	if n > int64(len(buf)) {
		return nil
	}
	return buf[:unquote(buf[:], s)]
}

// unquote writes the decoded text of a valid JSON string's bytes between its quotes, s, to dst,
// which must hold it, and returns its length.
func unquote(dst, s []byte) int {
	n := 0
	u := unquoter{s: s}
	for p := u.next(); p != nil; p = u.next() {
		n += copy(dst[n:], p)
	}
	return n
}

// cmpDecoded compares the decoded texts of two valid JSON strings' bytes between their quotes.
func cmpDecoded(a, b []byte) int {
	ua, ub := unquoter{s: a}, unquoter{s: b}
	var pa, pb []byte
	for {
		if len(pa) == 0 {
			pa = ua.next()
		}
		if len(pb) == 0 {
			pb = ub.next()
		}
		if len(pa) == 0 || len(pb) == 0 {
			return cmp.Compare(len(pa), len(pb))
		}
		n := min(len(pa), len(pb))
		if c := bytes.Compare(pa[:n], pb[:n]); c != 0 {
			return c
		}
		pa, pb = pa[n:], pb[n:]
	}
}

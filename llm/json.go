package llm

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
)

// THE JSON SCAN. A body or an event is never held: scan reads its bytes as they pass, checks
// that they form one JSON value (RFC 8259) and notes the numbers found at the paths a trie asks
// for. Its memory is fixed (a key of at most maxKey bytes, containers nested at most maxNest
// deep), so a body of any size costs the same; a key longer than maxKey or one written with
// escapes matches no path, and a value nested deeper than maxNest is given up as garbage.

const (
	maxKey   = 64      // the longest key a path can name
	maxNest  = 512     // the deepest nesting scanned; deeper is garbage
	maxTrack = 16      // the deepest object whose keys are matched against the trie
	maxCount = 1 << 53 // the largest number of tokens; more saturates
)

// A node of a trie of paths: the keys below it, and the slot a number found at it fills.
type node struct {
	keys  []string
	next  []*node
	slot  int  // index in the scan's values; -1: none
	final bool // the number found here is the response's final usage
}

func (n *node) child(k []byte) *node {
	for i, s := range n.keys {
		if string(k) == s {
			return n.next[i]
		}
	}
	return nil
}

// add adds the path of keys to the trie under n, ending in slot.
func (n *node) add(path []string, slot int, final bool) {
	for _, k := range path {
		c := n.child([]byte(k))
		if c == nil {
			c = &node{slot: -1}
			n.keys = append(n.keys, k)
			n.next = append(n.next, c)
		}
		n = c
	}
	n.slot, n.final = slot, final
}

// trie builds a trie from paths ("a.b.c") to slots, each path under every prefix given.
func trie(prefixes []string, final bool, paths map[string]int, into *node) *node {
	if into == nil {
		into = &node{slot: -1}
	}
	for _, pre := range prefixes {
		for p, slot := range paths {
			into.add(strings.Split(strings.TrimPrefix(pre+"."+p, "."), "."), slot, final)
		}
	}
	return into
}

// Path is a parsed JSON path of object keys, "meta.billed_units.output_tokens": what ParsePath
// returns for the Field format.
type Path struct {
	s    string
	root *node
}

// String returns the path as written.
func (p Path) String() string { return p.s }

// ParsePath parses a path of object keys separated by dots. Keys are matched exactly, byte for
// byte; a path cannot enter an array (an element has no key), nor name a key containing a dot.
func ParsePath(s string) (Path, error) {
	if s == "" {
		return Path{}, errors.New("empty path: want object keys separated by dots, e.g. usage.total_tokens")
	}
	keys := strings.Split(s, ".")
	if len(keys) > maxTrack {
		return Path{}, fmt.Errorf("path %q has %d keys: at most %d", s, len(keys), maxTrack)
	}
	for i, k := range keys {
		switch {
		case k == "":
			return Path{}, fmt.Errorf("path %q: key %d is empty", s, i+1)
		case len(k) > maxKey:
			return Path{}, fmt.Errorf("path %q: key %d is longer than %d bytes", s, i+1, maxKey)
		case strings.ContainsAny(k, "\"\\"):
			return Path{}, fmt.Errorf("path %q: key %d contains a quote or a backslash", s, i+1)
		}
	}
	root := &node{slot: -1}
	root.add(keys, 0, true)
	return Path{s: s, root: root}, nil
}

// The scan's states: what the next byte may be.
const (
	sValue      = iota // a value
	sValueOrEnd        // a value or ']' (an array just opened)
	sKey               // '"' opening a key (after a comma)
	sKeyOrEnd          // '"' or '}' (an object just opened)
	sColon             // ':' after a key
	sAfter             // ',' or the container's end, after a value
	sString            // in a string
	sEscape            // after a backslash in a string
	sHex               // in the four hex digits of \u (hex counts them)
	sNumber            // in a number (num holds its parts)
	sLiteral           // in true, false or null (lit is the rest expected)
	sDone              // after the top-level value: only whitespace
	sBad               // not JSON (or nested too deep): nothing more is read
)

// The parts of a number: where its grammar has got to.
const (
	nMinus = iota // after '-'
	nZero         // integer part "0"
	nInt          // in the integer part
	nDot          // after '.'
	nFrac         // in the fraction
	nE            // after 'e'
	nESign        // after the exponent's sign
	nExp          // in the exponent
)

// scan is the incremental JSON scan of one value, noting the numbers that the trie's paths name.
type scan struct {
	root  *node
	state int
	depth int                  // containers open
	arr   [maxNest / 64]uint64 // bit d: the container at depth d is an array
	at    [maxTrack + 1]*node  // at[d]: the trie node of the object at depth d (nil: none)
	key   [maxKey]byte
	klen  int   // bytes of key; maxKey+1: too long or escaped, matches nothing
	isKey bool  // the string scanned is a key
	cur   *node // the node the value being scanned sits at (nil: none)
	hex   int
	lit   string
	num   int   // the part of the number
	n     int64 // the number's integer part, saturated
	frac  bool  // the fraction has a non-zero digit: round up
	exp   bool  // the number has an exponent: not a count of tokens

	got found // the numbers found
}

// found is the numbers found at a trie's slots.
type found struct {
	vals  [8]int64
	seen  uint8 // bit i: vals[i] was found
	final bool  // a final path was found
}

// merge adds g to f: a number found in both is g's, the later.
func (f *found) merge(g *found) {
	for i := range g.vals {
		if g.seen&(1<<i) != 0 {
			f.vals[i] = g.vals[i]
		}
	}
	f.seen |= g.seen
	f.final = f.final || g.final
}

func (s *scan) reset() {
	s.state, s.depth, s.klen, s.cur = sValue, 0, 0, s.root
	s.got = found{}
}

func (s *scan) isArr() bool { return s.arr[s.depth/64]&(1<<(s.depth%64)) != 0 }

// open enters a container (the value at s.cur).
func (s *scan) open(array bool) {
	s.depth++
	if s.depth >= maxNest {
		s.state = sBad
		return
	}
	bit := uint64(1) << (s.depth % 64)
	if array {
		s.arr[s.depth/64] |= bit
		s.state = sValueOrEnd
	} else {
		s.arr[s.depth/64] &^= bit
		s.state = sKeyOrEnd
	}
	if s.depth <= maxTrack {
		if array {
			s.at[s.depth] = nil
		} else {
			s.at[s.depth] = s.cur
		}
	}
	s.cur = nil
}

// close leaves the container at the top, which must be an array or not as the byte says.
func (s *scan) close(array bool) {
	if s.depth == 0 || s.isArr() != array {
		s.state = sBad
		return
	}
	s.depth--
	s.ended()
}

// ended follows the end of a value.
func (s *scan) ended() {
	if s.depth == 0 {
		s.state = sDone
	} else {
		s.state = sAfter
	}
}

// number notes the number just ended at s.cur if the trie wants it and it is a count.
func (s *scan) number() {
	c := s.cur
	if c == nil || c.slot < 0 || s.exp || s.num == nMinus {
		return
	}
	n := s.n
	if s.frac && n < maxCount {
		n++
	}
	s.got.vals[c.slot] = n
	s.got.seen |= 1 << c.slot
	s.got.final = s.got.final || c.final
}

func isSpace(b byte) bool { return b == ' ' || b == '\t' || b == '\n' || b == '\r' }

// write scans p, the value's next bytes.
func (s *scan) write(p []byte) {
	for i := 0; i < len(p); i++ {
		b := p[i]
		switch s.state {
		case sBad:
			return
		case sDone:
			if !isSpace(b) {
				s.state = sBad
			}
		case sString:
			// Most of a body is strings: jump to their end.
			q := bytes.IndexByte(p[i:], '"')
			if q < 0 {
				q = len(p) - i
			}
			if e := bytes.IndexByte(p[i:i+q], '\\'); e >= 0 {
				q = e
			}
			if s.isKey {
				s.keyBytes(p[i : i+q])
			}
			i += q
			if i == len(p) {
				return
			}
			if p[i] == '\\' {
				s.state = sEscape
				s.klen = maxKey + 1 // an escaped key matches no path
				continue
			}
			s.stringEnd()
		case sEscape:
			switch b {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.state = sString
			case 'u':
				s.state, s.hex = sHex, 0
			default:
				s.state = sBad
			}
		case sHex:
			if !('0' <= b && b <= '9' || 'a' <= b && b <= 'f' || 'A' <= b && b <= 'F') {
				s.state = sBad
			} else if s.hex++; s.hex == 4 {
				s.state = sString
			}
		case sNumber:
			if s.digit(b) {
				continue
			}
			if s.num == nMinus || s.num == nDot || s.num == nE || s.num == nESign {
				s.state = sBad
				return
			}
			s.number()
			s.ended()
			i-- // b follows the number
		case sLiteral:
			if b != s.lit[0] {
				s.state = sBad
				return
			}
			if s.lit = s.lit[1:]; s.lit == "" {
				s.ended()
			}
		default:
			if !isSpace(b) {
				s.token(b)
			}
		}
	}
}

// keyBytes adds k to the key being scanned.
func (s *scan) keyBytes(k []byte) {
	if s.klen+len(k) > maxKey {
		s.klen = maxKey + 1 // too long (or not kept): matches no path
		return
	}
	s.klen += copy(s.key[s.klen:], k)
}

// stringEnd follows a string's closing quote.
func (s *scan) stringEnd() {
	if !s.isKey {
		s.ended()
		return
	}
	s.state, s.cur = sColon, nil
	if s.klen <= maxKey {
		s.cur = s.at[s.depth].child(s.key[:s.klen])
	}
}

// digit takes b as the number's next byte if it can be one.
func (s *scan) digit(b byte) bool {
	d := '0' <= b && b <= '9'
	switch {
	case d && (s.num == nMinus || s.num == nInt):
		if s.num == nMinus && b == '0' {
			s.num = nZero
			return true
		}
		s.num = nInt
		if s.n < maxCount {
			s.n = min(s.n*10+int64(b-'0'), maxCount)
		}
	case d && (s.num == nDot || s.num == nFrac):
		s.num = nFrac
		s.frac = s.frac || b != '0'
	case d && (s.num == nE || s.num == nESign || s.num == nExp):
		s.num = nExp
	case b == '.' && (s.num == nZero || s.num == nInt):
		s.num = nDot
	case (b == 'e' || b == 'E') && (s.num == nZero || s.num == nInt || s.num == nFrac):
		s.num, s.exp = nE, true
	case (b == '-' || b == '+') && s.num == nE:
		s.num = nESign
	default:
		return false
	}
	return true
}

// token takes b, not whitespace, in a state between tokens.
func (s *scan) token(b byte) {
	switch s.state {
	case sKeyOrEnd:
		if b == '}' {
			s.close(false)
			return
		}
		fallthrough
	case sKey:
		if b != '"' {
			s.state = sBad
			return
		}
		s.state, s.isKey, s.klen = sString, true, 0
		if s.depth > maxTrack || s.at[s.depth] == nil {
			s.klen = maxKey + 1 // no path goes through this object: its keys are not kept
		}
	case sColon:
		if b != ':' {
			s.state = sBad
			return
		}
		s.state = sValue
	case sAfter:
		switch {
		case b == ',' && s.isArr():
			s.state, s.cur = sValue, nil
		case b == ',':
			s.state = sKey
		case b == ']' || b == '}':
			s.close(b == ']')
		default:
			s.state = sBad
		}
	case sValueOrEnd:
		if b == ']' {
			s.close(true)
			return
		}
		fallthrough
	case sValue:
		s.value(b)
	}
}

// value takes b, the first byte of a value.
func (s *scan) value(b byte) {
	switch {
	case b == '{' || b == '[':
		s.open(b == '[')
	case b == '"':
		s.state, s.isKey = sString, false
	case b == '-' || '0' <= b && b <= '9':
		s.state, s.num, s.n, s.frac, s.exp = sNumber, nMinus, 0, false, false
		s.digit(b)
		if b == '-' {
			s.cur = nil // negative: not a count
		}
	case b == 't':
		s.state, s.lit = sLiteral, "rue"
	case b == 'f':
		s.state, s.lit = sLiteral, "alse"
	case b == 'n':
		s.state, s.lit = sLiteral, "ull"
	default:
		s.state = sBad
	}
}

// end ends the value's bytes: a number at the top level ends there. It reports whether the
// bytes were one whole JSON value.
func (s *scan) end() bool {
	if s.state == sNumber && s.depth == 0 {
		s.write(lf) // whitespace
	}
	return s.state == sDone
}

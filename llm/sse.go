package llm

import "bytes"

// SERVER-SENT EVENTS. A stream is read as the HTML standard's event-stream parser reads it
// (lines ended by CRLF, LF or CR; "field: value" with one leading space dropped; comments from
// ':'; an event dispatched by an empty line; a leading byte order mark dropped), but keeping
// nothing of an event: the bytes of its data lines go to a fresh JSON scan as they pass (joined
// by LF, as the standard joins them), and the event counts only if, at its empty line, they
// were one whole JSON value. So OpenAI's "data: [DONE]" counts for nothing, an event of any size
// costs no memory, and an event cut off by the stream's end is not dispatched, as the standard
// says. Event names ("event: message_delta") are not read: each format's paths tell its events
// apart by their data alone.

// The states of a line.
const (
	lStart = iota // at the start of a line
	lName         // in a field's name
	lSpace        // after "data:": a space is dropped
	lData         // in a data field's value: the event's JSON
	lSkip         // in a line that is not data: skipped to its end
)

var bom, lf = []byte("\xEF\xBB\xBF"), []byte("\n")

// events is the state of an event stream between writes.
type events struct {
	state int
	name  int  // bytes of the field's name that spell "data" so far; -1: another name
	cr    bool // the last byte was CR: a LF next ends no other line
	lines int  // data lines of the event
	bom   int  // bytes of a leading byte order mark dropped; -1: past the start
}

// write reads p, the stream's next bytes: data lines go to m's scan, and each event that ends
// is committed to m.
func (e *events) write(p []byte, m *Meter) {
	sc := &m.sc
	for i := 0; i < len(p); i++ {
		b := p[i]
		if e.bom >= 0 {
			if b == bom[e.bom] {
				if e.bom++; e.bom == len(bom) {
					e.bom = -1
				}
				continue
			}
			e.bom = -1
		}
		if e.cr && b == '\n' {
			e.cr = false
			continue
		}
		e.cr = b == '\r'
		if b == '\r' || b == '\n' {
			e.lineEnd(m)
			continue
		}
		switch e.state {
		case lStart:
			e.state, e.name = lName, 0
			fallthrough
		case lName:
			switch {
			case b == ':' && e.name == len("data"):
				e.state = lSpace
				e.dataLine(sc)
			case b == ':':
				e.state = lSkip
			case e.name >= 0 && e.name < len("data") && b == "data"[e.name]:
				e.name++
			default:
				e.name = -1
			}
		case lSpace:
			e.state = lData
			if b == ' ' {
				continue
			}
			fallthrough
		case lData:
			// A JSON value cannot hold a raw CR or LF but as whitespace: find the line's end
			// first, and give the scan the whole of the line up to it at once.
			q := len(p) - i
			if n := bytes.IndexByte(p[i:], '\n'); n >= 0 {
				q = n
			}
			if n := bytes.IndexByte(p[i:i+q], '\r'); n >= 0 {
				q = n
			}
			sc.write(p[i : i+q])
			i += q - 1
		case lSkip:
		}
	}
}

// dataLine starts a data line: after the event's first, the LF joining them.
func (e *events) dataLine(sc *scan) {
	if e.lines++; e.lines > 1 {
		sc.write(lf)
	}
}

// lineEnd ends a line: an empty one dispatches the event.
func (e *events) lineEnd(m *Meter) {
	sc := &m.sc
	switch {
	case e.state == lStart:
		if e.lines > 0 && sc.end() {
			m.got.merge(&sc.got)
		}
		e.lines = 0
		sc.reset()
	case e.state == lName && e.name == len("data"):
		e.dataLine(sc) // "data" alone: a data line with an empty value
	}
	e.state = lStart
}

package sim

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// MaxTraceBytes bounds the size of a trace that ParseTrace reads.
const MaxTraceBytes = 256 << 20

// ParseTrace reads requests from a CSV trace. The first line is a header naming the columns, in
// any order: t_ms (required), key and cost (optional); other columns are an error.
//
//	t_ms,key,cost
//	0,alice,1
//	12.5,bob,5
//	12.5,alice,
//
// t_ms is the request's virtual time in milliseconds since the start: a non-negative decimal with
// up to 3 decimals (so exact to the µs; it is parsed as text, never as a float), at most
// MaxTimeMicros. Lines must be in time order (equal times are fine). key defaults to DefaultKey
// when the column is absent or the value empty; cost to 1. A cost is an integer ≥ 0 (0 peeks).
// Fields are trimmed of spaces and may be quoted as in RFC 4180. Blank lines and lines starting
// with '#' are skipped. A trace holds at most MaxRequests requests and MaxTraceBytes bytes.
//
// Every error names the line: `trace line 7: t_ms "1.2345" has more than 3 decimals`.
func ParseTrace(r io.Reader) ([]Request, error) {
	return parseTrace(r, MaxRequests, MaxTraceBytes)
}

// Trace is what a trace says: its requests, and what it knows of them beyond their cost.
type Trace struct {
	Requests []Request
	// Actual are the real costs of the requests, for Options.Actual: nil if the trace has no
	// actual column, else one per request, NoActual where empty.
	Actual []int64
	// Durations are how long their responses lasted, in µs, for Options.Durations: nil if the
	// trace has no duration_ms column, else one per request (0 where empty).
	Durations []int64
}

// ReadTrace is ParseTrace for a trace that may also say what each request really cost and how
// long its response lasted (an LLM gateway's log: cost is the estimate charged up front, actual
// the tokens the response reported, duration_ms how long it streamed):
//
//	t_ms,key,cost,actual,duration_ms
//	0,team,4500,1300,8200
//	2000,team,4500,900,3150.5
//
// actual is an integer in 0..2^53, or empty if not known. duration_ms is milliseconds with up to
// 3 decimals, like t_ms, or empty for 0 (served at once); t_ms + duration_ms is at most
// MaxTimeMicros.
func ReadTrace(r io.Reader) (Trace, error) {
	var tr Trace
	err := parseTraceInto(r, MaxRequests, MaxTraceBytes, &tr, true)
	return tr, err
}

// parseTrace is ParseTrace with its bounds as arguments, so that tests can reach them.
func parseTrace(r io.Reader, maxRequests int, maxBytes int64) ([]Request, error) {
	var tr Trace
	err := parseTraceInto(r, maxRequests, maxBytes, &tr, false)
	return tr.Requests, err
}

// parseTraceInto reads a trace into tr: ParseTrace's columns, and with all ReadTrace's.
func parseTraceInto(r io.Reader, maxRequests int, maxBytes int64, tr *Trace, all bool) error {
	cr := csv.NewReader(&boundedReader{r: r, left: maxBytes, max: maxBytes})
	cr.FieldsPerRecord = -1 // checked here, with a clearer message
	cr.Comment = '#'
	cr.ReuseRecord = true

	readErr := func(err error) error {
		var pe *csv.ParseError
		switch {
		case errors.Is(err, errTraceTooLarge):
			return err
		case errors.As(err, &pe) && pe.StartLine != pe.Line:
			return fmt.Errorf("trace line %d: %v (in the record that runs on to line %d)", pe.StartLine, pe.Err, pe.Line)
		case errors.As(err, &pe):
			return fmt.Errorf("trace line %d: %v", pe.Line, pe.Err)
		}
		return fmt.Errorf("trace: %w", err)
	}

	header, err := cr.Read()
	if err == io.EOF {
		return errors.New("trace is empty: want a CSV header line such as t_ms,key,cost")
	}
	if err != nil {
		return readErr(err)
	}
	header = slices.Clone(header) // the reader reuses its record
	headerLine, _ := cr.FieldPos(0)
	cols := map[string]int{"t_ms": -1, "key": -1, "cost": -1}
	optional := "key and cost"
	if all {
		cols["actual"], cols["duration_ms"] = -1, -1
		optional = "key, cost, actual and duration_ms"
	}
	for i, name := range header {
		name = strings.ToLower(strings.TrimSpace(strings.TrimPrefix(name, "\ufeff")))
		at, known := cols[name]
		switch {
		case !known:
			return fmt.Errorf("trace line %d: unknown column %q (the first line is a header of t_ms and optionally %s)", headerLine, name, optional)
		case at >= 0:
			return fmt.Errorf("trace line %d: column %q appears twice", headerLine, name)
		}
		cols[name] = i
	}
	if cols["t_ms"] < 0 {
		return fmt.Errorf("trace line %d: the header has no t_ms column (want t_ms and optionally key and cost)", headerLine)
	}
	width := len(header)

	keys := map[string]string{} // interned, so that a long trace holds each key once
	var prev int64
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return readErr(err)
		}
		line, _ := cr.FieldPos(0)
		blank := true
		for i := range rec {
			rec[i] = strings.TrimSpace(rec[i])
			blank = blank && rec[i] == ""
		}
		if blank {
			continue
		}
		bad := func(format string, args ...any) error {
			return fmt.Errorf("trace line %d: %s", line, fmt.Sprintf(format, args...))
		}
		if len(rec) != width {
			return bad("%d fields, want %d like the header (%s)", len(rec), width, strings.Join(header, ","))
		}
		if len(tr.Requests) == maxRequests {
			return bad("more than %d requests (the most one simulation takes)", maxRequests)
		}
		rq := Request{Key: DefaultKey, Cost: 1}
		tms := rec[cols["t_ms"]]
		if tms == "" {
			return bad("t_ms is empty")
		}
		rq.TMicros, err = parseThousandths(tms, MaxTimeMicros)
		if err != nil {
			return bad("t_ms %q %v", tms, err)
		}
		if rq.TMicros < prev {
			return bad("t_ms %s is before the previous line's %s (lines must be in time order)", tms, FormatMillis(prev))
		}
		prev = rq.TMicros
		if i := cols["key"]; i >= 0 && rec[i] != "" {
			k, ok := keys[rec[i]]
			if !ok {
				k = strings.Clone(rec[i])
				keys[k] = k
			}
			rq.Key = k
		}
		if i := cols["cost"]; i >= 0 && rec[i] != "" {
			rq.Cost, err = strconv.ParseInt(rec[i], 10, 64)
			if err != nil || rq.Cost < 0 {
				return bad("cost %q is not a whole number ≥ 0", rec[i])
			}
		}
		if i, ok := cols["actual"]; ok && i >= 0 {
			a := NoActual
			if rec[i] != "" {
				a, err = strconv.ParseInt(rec[i], 10, 64)
				if err != nil || a < 0 || a > 1<<53 {
					return bad("actual %q is not a whole number in 0..2^53", rec[i])
				}
			}
			tr.Actual = append(tr.Actual, a)
		}
		if i, ok := cols["duration_ms"]; ok && i >= 0 {
			var d int64
			if rec[i] != "" {
				d, err = parseThousandths(rec[i], MaxTimeMicros-rq.TMicros)
				if err != nil {
					return bad("duration_ms %q %v", rec[i], err)
				}
			}
			tr.Durations = append(tr.Durations, d)
		}
		tr.Requests = append(tr.Requests, rq)
	}
	return nil
}

// errTraceTooLarge is wrapped by the error of a trace larger than its bound.
var errTraceTooLarge = errors.New("trace is too large")

// boundedReader reads at most max bytes of r, then fails with errTraceTooLarge.
type boundedReader struct {
	r         io.Reader
	left, max int64
}

func (b *boundedReader) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// One byte more tells a trace of exactly the bound from a larger one.
		var one [1]byte
		if n, err := b.r.Read(one[:]); n == 0 {
			return 0, err
		}
		return 0, fmt.Errorf("%w: more than %d MiB (the most one simulation reads)", errTraceTooLarge, max(1, b.max>>20))
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}

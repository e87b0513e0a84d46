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

// ParseSettledTrace is ParseTrace for a trace that may also have an actual column: each
// request's real cost, known once it has been served (its cost being the estimate charged up
// front), an integer in 0..2^53, or empty if not known. It returns the real costs for Options.Actual:
// nil if the trace has no actual column, else one per request, NoActual where empty.
//
//	t_ms,key,cost,actual
//	0,alice,1000,250
//	100,alice,1000,4000
func ParseSettledTrace(r io.Reader) ([]Request, []int64, error) {
	var actual []int64
	reqs, err := parseTraceActual(r, MaxRequests, MaxTraceBytes, &actual)
	return reqs, actual, err
}

// parseTrace is ParseTrace with its bounds as arguments, so that tests can reach them.
func parseTrace(r io.Reader, maxRequests int, maxBytes int64) ([]Request, error) {
	return parseTraceActual(r, maxRequests, maxBytes, nil)
}

// parseTraceActual is parseTrace that also reads an actual column into *actual, if actual is not
// nil (*actual stays nil if the trace has none).
func parseTraceActual(r io.Reader, maxRequests int, maxBytes int64, actual *[]int64) ([]Request, error) {
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
		return nil, errors.New("trace is empty: want a CSV header line such as t_ms,key,cost")
	}
	if err != nil {
		return nil, readErr(err)
	}
	header = slices.Clone(header) // the reader reuses its record
	headerLine, _ := cr.FieldPos(0)
	cols := map[string]int{"t_ms": -1, "key": -1, "cost": -1}
	if actual != nil {
		cols["actual"] = -1
	}
	for i, name := range header {
		name = strings.ToLower(strings.TrimSpace(strings.TrimPrefix(name, "\ufeff")))
		at, known := cols[name]
		switch {
		case !known:
			return nil, fmt.Errorf("trace line %d: unknown column %q (the first line is a header of t_ms and optionally key and cost)", headerLine, name)
		case at >= 0:
			return nil, fmt.Errorf("trace line %d: column %q appears twice", headerLine, name)
		}
		cols[name] = i
	}
	if cols["t_ms"] < 0 {
		return nil, fmt.Errorf("trace line %d: the header has no t_ms column (want t_ms and optionally key and cost)", headerLine)
	}
	width := len(header)

	var reqs []Request
	keys := map[string]string{} // interned, so that a long trace holds each key once
	var prev int64
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, readErr(err)
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
			return nil, bad("%d fields, want %d like the header (%s)", len(rec), width, strings.Join(header, ","))
		}
		if len(reqs) == maxRequests {
			return nil, bad("more than %d requests (the most one simulation takes)", maxRequests)
		}
		rq := Request{Key: DefaultKey, Cost: 1}
		tms := rec[cols["t_ms"]]
		if tms == "" {
			return nil, bad("t_ms is empty")
		}
		rq.TMicros, err = parseThousandths(tms, MaxTimeMicros)
		if err != nil {
			return nil, bad("t_ms %q %v", tms, err)
		}
		if rq.TMicros < prev {
			return nil, bad("t_ms %s is before the previous line's %s (lines must be in time order)", tms, FormatMillis(prev))
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
				return nil, bad("cost %q is not a whole number ≥ 0", rec[i])
			}
		}
		if i, ok := cols["actual"]; ok && i >= 0 {
			a := NoActual
			if rec[i] != "" {
				a, err = strconv.ParseInt(rec[i], 10, 64)
				if err != nil || a < 0 || a > 1<<53 {
					return nil, bad("actual %q is not a whole number in 0..2^53", rec[i])
				}
			}
			*actual = append(*actual, a)
		}
		reqs = append(reqs, rq)
	}
	return reqs, nil
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

package config

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Error is one problem in a configuration file, located by line and column. Its text reads
//
//	sluice.yaml:14:30: policies[2] "gold": burst -5 must be ≥ 0
//
// file, line, column (both 1-based; left out when unknown), where in the document (left out at
// the top level), and what is wrong, starting with the field.
type Error struct {
	File   string // the file's name as given to Load or Parse
	Line   int    // 1-based; 0 when unknown
	Column int    // 1-based; 0 when unknown
	Path   string // the enclosing item, e.g. `policies[2] "gold"`, `store`; "" at the top level
	Msg    string // what is wrong, starting with the field: "burst -5 must be ≥ 0"
	Err    error  // the cause, if any: sluice.ErrInvalidPolicy, fs.ErrNotExist, ...
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(e.Line))
		if e.Column > 0 {
			b.WriteByte(':')
			b.WriteString(strconv.Itoa(e.Column))
		}
	}
	b.WriteString(": ")
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap returns the cause, so that errors.Is(err, sluice.ErrInvalidPolicy) and the like work.
func (e *Error) Unwrap() error { return e.Err }

// Errors is every problem found in one file, sorted by line and column, so that an operator can
// fix a file in one go. Its text is one Error a line. Load and Parse return it (as an error) when
// there is at least one problem; errors.As finds it, and errors.Is looks into each Error.
type Errors []*Error

func (es Errors) Error() string {
	var b strings.Builder
	for i, e := range es {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(e.Error())
	}
	return b.String()
}

// Unwrap returns the Errors one by one, for errors.Is and errors.As.
func (es Errors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

// sorted returns es in order of line and column (stable: one place's problems keep the order they
// were found in), without repeats: a field merged into several mappings (YAML's <<) is reported
// once.
func (es Errors) sorted() Errors {
	slices.SortStableFunc(es, func(a, b *Error) int {
		return cmp.Or(cmp.Compare(a.Line, b.Line), cmp.Compare(a.Column, b.Column))
	})
	out := es[:0]
	seen := make(map[string]bool, len(es))
	for _, e := range es {
		if s := e.Error(); !seen[s] {
			seen[s] = true
			out = append(out, e)
		}
	}
	if len(out) > maxErrors {
		more := &Error{File: out[0].File, Line: out[maxErrors].Line, Msg: fmt.Sprintf("and %d more problems from here on", len(out)-maxErrors)}
		out = append(out[:maxErrors], more)
	}
	return out
}

// maxErrors bounds the problems reported for one file: past it, a file is more likely broken
// as a whole (a wrong indentation) than in as many places, and the first ones say why.
const maxErrors = 100

package envoyconf

import (
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// The reference service reads its files with a YAML 1.1 library, which types an unquoted scalar
// differently from YAML 1.2 (yaml.v3): yes, no, on, off, y and n are booleans, 0777 is octal,
// 1_000 is an integer. The files are walked here as yaml.v3 nodes, for their positions, and each
// scalar is typed by resolve below, as that library types it, so that a file means what it
// meant there: shadow_mode: yes is true, and value: 1.5 is refused as it is there.

// kind is a scalar's type after resolution.
type kind uint8

const (
	kString kind = iota // a string (a timestamp too: the library hands those out as strings)
	kNull
	kBool
	kInt   // fits an int64
	kUint  // above the int64 range: the reference refuses it everywhere but in metadata
	kFloat // the reference refuses it everywhere but in metadata
)

// scalar is one resolved scalar.
type scalar struct {
	kind kind
	b    bool
	i    int64
	u    uint64
	f    float64
}

// resolve types a scalar node as the YAML 1.1 library does. ok is false for an explicitly
// tagged scalar that is not of its tag (!!int abc), which the library refuses.
func resolve(n *yaml.Node) (s scalar, ok bool) {
	tagged := n.Style&yaml.TaggedStyle != 0
	quoted := n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle|yaml.LiteralStyle|yaml.FoldedStyle) != 0
	if !tagged {
		if quoted {
			return scalar{kind: kString}, true
		}
		return resolvePlain(n.Value, true), true
	}
	tag := n.ShortTag()
	switch tag {
	case "!!str", "!!binary":
		return scalar{kind: kString}, true
	case "!!bool", "!!int", "!!float", "!!null", "!!timestamp":
	default:
		return scalar{kind: kString}, true // a tag of the file's own: the text as written
	}
	s = resolvePlain(n.Value, tag == "!!timestamp")
	got := map[kind]string{kString: "!!str", kNull: "!!null", kBool: "!!bool", kInt: "!!int", kUint: "!!int", kFloat: "!!float"}[s.kind]
	switch {
	case got == tag:
		return s, true
	case tag == "!!float" && s.kind == kInt:
		return scalar{kind: kFloat, f: float64(s.i)}, true
	case tag == "!!float" && s.kind == kUint:
		return scalar{kind: kFloat, f: float64(s.u)}, true
	case tag == "!!timestamp" && s.kind == kString && isTimestamp(n.Value):
		return s, true
	}
	return s, false
}

var yamlStyleFloat = regexp.MustCompile(`^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`)

// resolvePlain types an unquoted, untagged scalar. timestamps: a date-like value is a string (as
// the library returns one) rather than a number.
func resolvePlain(in string, timestamps bool) scalar {
	switch in {
	case "y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON":
		return scalar{kind: kBool, b: true}
	case "n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF":
		return scalar{kind: kBool}
	case "", "~", "null", "Null", "NULL":
		return scalar{kind: kNull}
	case ".nan", ".NaN", ".NAN":
		return scalar{kind: kFloat, f: math.NaN()}
	case ".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF":
		return scalar{kind: kFloat, f: math.Inf(1)}
	case "-.inf", "-.Inf", "-.INF":
		return scalar{kind: kFloat, f: math.Inf(-1)}
	}
	switch c := in[0]; {
	case c == '.':
		if f, err := strconv.ParseFloat(in, 64); err == nil {
			return scalar{kind: kFloat, f: f}
		}
	case c == '+' || c == '-' || ('0' <= c && c <= '9'):
		if timestamps && isTimestamp(in) {
			return scalar{kind: kString}
		}
		plain := strings.ReplaceAll(in, "_", "")
		if i, err := strconv.ParseInt(plain, 0, 64); err == nil {
			return scalar{kind: kInt, i: i}
		}
		if u, err := strconv.ParseUint(plain, 0, 64); err == nil {
			return scalar{kind: kUint, u: u}
		}
		if yamlStyleFloat.MatchString(plain) {
			if f, err := strconv.ParseFloat(plain, 64); err == nil {
				return scalar{kind: kFloat, f: f}
			}
		}
	}
	return scalar{kind: kString}
}

// isTimestamp reports a value the library reads as a timestamp (it starts with four digits and
// a '-', and parses as one of its formats).
func isTimestamp(s string) bool {
	i := 0
	for ; i < len(s) && '0' <= s[i] && s[i] <= '9'; i++ {
	}
	if i != 4 || i == len(s) || s[i] != '-' {
		return false
	}
	for _, f := range []string{"2006-1-2T15:4:5.999999999Z07:00", "2006-1-2t15:4:5.999999999Z07:00", "2006-1-2 15:4:5.999999999", "2006-1-2"} {
		if _, err := time.Parse(f, s); err == nil {
			return true
		}
	}
	return false
}

// text is how the library prints a resolved scalar that it was given as a map key (metadata's
// nested keys are so printed): the value, not the spelling ("0x10" is "16", "yes" is "true").
func (s scalar) text(written string) string {
	switch s.kind {
	case kNull:
		return "<nil>"
	case kBool:
		return strconv.FormatBool(s.b)
	case kInt:
		return strconv.FormatInt(s.i, 10)
	case kUint:
		return strconv.FormatUint(s.u, 10)
	case kFloat:
		return strconv.FormatFloat(s.f, 'g', -1, 64)
	}
	return written
}

// value is the scalar as a plain Go value, for metadata.
func (s scalar) value(written string) any {
	switch s.kind {
	case kNull:
		return nil
	case kBool:
		return s.b
	case kInt:
		return s.i
	case kUint:
		return s.u
	case kFloat:
		return s.f
	}
	return written
}

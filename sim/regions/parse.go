package regions

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/sim"
)

// OptionError is an option at fault, named as `sluice simulate`'s flag ("ledger-latency") and
// the browser's regions page's query key, with the text it was given as ("" when the message
// says it) and what is wrong. Run's and Text.Apply's errors are OptionErrors.
type OptionError struct {
	Field, Text, Message string
}

func (e *OptionError) Error() string { return "regions: " + e.Message }

// Flag is the error as the command line says it: "--ledger-latency fast: want Go durations ...".
func (e *OptionError) Flag() string {
	if e.Text == "" {
		return "--" + e.Field + ": " + e.Message
	}
	return "--" + e.Field + " " + e.Text + ": " + e.Message
}

func optionErr(field, format string, args ...any) error {
	return &OptionError{Field: field, Message: fmt.Sprintf(format, args...)}
}

// Text is the options that are read from text, as `sluice simulate --regions` and the regions
// page take them: one home for both.
type Text struct {
	Regions    string   // "eu,us,ap"
	Traffic    string   // each region's own pattern: "eu: 70/s for 1m; us: 20/s for 1m"
	Latency    string   // "50ms" or "50ms-150ms"
	Partitions []string // "eu@30s-60s" each
	Flushes    []string // "90s" each
}

// Apply reads t into o: its regions, requests, latency, partitions and flushes. The error is an
// *OptionError.
func (t Text) Apply(o *Options) error {
	o.Regions = nil
	for _, name := range strings.Split(t.Regions, ",") {
		o.Regions = append(o.Regions, strings.TrimSpace(name))
	}
	if strings.TrimSpace(t.Traffic) == "" {
		return optionErr("traffic", `each region's pattern is needed (e.g. "%s: 10/s for 1m")`, o.Regions[0])
	}
	var err error
	if o.Requests, err = sim.ParseClientTraffic(t.Traffic); err != nil {
		return &OptionError{Field: "traffic", Message: err.Error()}
	}
	o.LatencyMin, o.LatencyMax = 0, 0
	if t.Latency != "" {
		if o.LatencyMin, o.LatencyMax, err = ParseSpan(t.Latency, true); err != nil {
			return &OptionError{Field: "ledger-latency", Text: t.Latency, Message: err.Error()}
		}
	}
	o.Partitions = nil
	for _, text := range t.Partitions {
		name, span, ok := strings.Cut(text, "@")
		if !ok {
			return &OptionError{Field: "partition", Text: text, Message: "want REGION@FROM-TO (eu@30s-60s)"}
		}
		from, to, err := ParseSpan(span, false)
		if err != nil {
			return &OptionError{Field: "partition", Text: text, Message: err.Error()}
		}
		o.Partitions = append(o.Partitions, Partition{Region: strings.TrimSpace(name), From: from, To: to})
	}
	o.Flushes = nil
	for _, text := range t.Flushes {
		d, err := time.ParseDuration(strings.TrimSpace(text))
		if err != nil || d < 0 {
			return &OptionError{Field: "flush-ledger", Text: text, Message: "want a virtual time such as 90s or 1m30s"}
		}
		o.Flushes = append(o.Flushes, d)
	}
	return nil
}

// ParseSpan reads "FROM-TO" (Go durations, FROM < TO), or with one a single "D" as D-D.
func ParseSpan(s string, one bool) (from, to time.Duration, err error) {
	a, b, ok := strings.Cut(s, "-")
	if !ok && one {
		b = a
	}
	if !ok && !one {
		return 0, 0, errors.New("want FROM-TO, two Go durations (30s-60s)")
	}
	if from, err = time.ParseDuration(strings.TrimSpace(a)); err == nil {
		to, err = time.ParseDuration(strings.TrimSpace(b))
	}
	switch {
	case err != nil:
		return 0, 0, errors.New("want Go durations such as 50ms, 30s or 1m")
	case from < 0 || to < from || (!one && to == from):
		return 0, 0, fmt.Errorf("%s before %s: want 0 ≤ FROM < TO", strconv.Quote(a), strconv.Quote(b))
	}
	return from, to, nil
}

// QueryKeys are the keys of a query string that ParseQuery reads: `sluice simulate`'s flags of
// the regions mode, without their dashes' prefix. partition and flush-ledger take several values,
// repeated or separated by commas.
var QueryKeys = []string{"regions", "traffic", "algorithm", "limit", "period", "burst", "refresh", "lease", "ledger-latency",
	"floor", "safe-share", "ledger-algorithm", "partition", "flush-ledger", "draw"}

// ParseQuery reads a simulation from a URL query string whose keys are QueryKeys, with the
// command line's defaults (ledger-algorithm fair, draw 1, floor 1/(2·regions) as serve's) and
// its checks; Run checks the rest.
// The errors are *OptionErrors, one per field at fault.
func ParseQuery(query string) (Options, []error) {
	var o Options
	q, err := url.ParseQuery(strings.TrimPrefix(query, "?"))
	if err != nil {
		return o, []error{optionErr("", "the query string: %v", err)}
	}
	for k := range q {
		if !slices.Contains(QueryKeys, k) {
			return o, []error{optionErr(k, "%s is not an option of the regions mode", k)}
		}
	}
	var errs []error
	get := func(k string) string { return strings.TrimSpace(q.Get(k)) }
	bad := func(k, format string, args ...any) {
		errs = append(errs, &OptionError{Field: k, Message: fmt.Sprintf(format, args...)})
	}
	duration := func(k string, to *time.Duration, required bool) {
		s := get(k)
		if s == "" {
			if required {
				bad(k, "is needed: a duration such as 1s, 500ms or 1m")
			}
			return
		}
		d, err := time.ParseDuration(s)
		switch {
		case err != nil:
			bad(k, "want a duration such as 1s, 500ms or 1m")
		case d <= 0:
			bad(k, "%s: must be > 0", s)
		default:
			*to = d
		}
	}
	integer := func(k string, to *int64, required bool) {
		s := get(k)
		if s == "" {
			if required {
				bad(k, "is needed: a whole number")
			}
			return
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			bad(k, "%q: want a whole number ≥ 0", s)
			return
		}
		*to = n
	}
	fraction := func(k string, to *float64) {
		if s := get(k); s != "" {
			f, err := strconv.ParseFloat(s, 64)
			if err != nil {
				bad(k, "%q: want a fraction of the limit such as 0.05", s)
				return
			}
			*to = f
		}
	}

	if get("regions") == "" {
		bad("regions", "name the regions, separated by commas (eu,us,ap)")
	}
	if a, err := sluice.ParseAlgorithm(get("algorithm")); err != nil {
		bad("algorithm", "%v", err)
	} else {
		o.Policy.Algorithm = a
	}
	integer("limit", &o.Policy.Limit, true)
	duration("period", &o.Policy.Period, true)
	integer("burst", &o.Policy.Burst, false)
	duration("refresh", &o.Refresh, false)
	duration("lease", &o.Lease, false)
	fraction("floor", &o.Floor)
	fraction("safe-share", &o.SafeShare)
	o.Algorithm = get("ledger-algorithm")
	o.Draw = 1
	if s := get("draw"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			bad("draw", "%q: want a whole number ≥ 0", s)
		}
		o.Draw = n
	}
	if get("regions") != "" {
		t := Text{Regions: get("regions"), Traffic: get("traffic"), Latency: get("ledger-latency"),
			Partitions: list(q["partition"]), Flushes: list(q["flush-ledger"])}
		if err := t.Apply(&o); err != nil {
			errs = append(errs, err)
		} else if get("floor") == "" {
			o.Floor = config.DefaultFloor(len(o.Regions)) // sluice serve's
		}
	}
	if len(errs) > 0 {
		return o, errs
	}
	if o.Policy.Burst != 0 && !sim.TakesBurst(o.Policy.Algorithm) {
		return o, []error{optionErr("burst", "%d: %v takes no burst (only token-bucket does here)", o.Policy.Burst, o.Policy.Algorithm)}
	}
	return o, nil
}

// list splits each value at commas and drops the empty ones.
func list(values []string) []string {
	var out []string
	for _, v := range values {
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
	}
	return out
}

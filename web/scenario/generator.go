package scenario

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/sim"
)

// Generator describes traffic the way people think of it — a steady rate, and a burst at some
// moment — and writes it as a pattern, so that the page's traffic is always a pattern that
// `sluice simulate --traffic` takes as well.
type Generator struct {
	Rate      string        // steady requests a second, a decimal with up to 3 decimals ("5", "0.5"); "0": none
	Duration  time.Duration // how long the traffic lasts, burst included
	BurstSize int64         // requests in the burst; 0: none
	BurstAt   time.Duration // when the burst starts
	BurstOver time.Duration // how long the burst lasts; 0: all at once
}

// The generator's query keys (the page's form posts them to the WebAssembly side as a query).
const (
	GenRate      = "rate"
	GenDuration  = "duration"
	GenBurstSize = "burst_size"
	GenBurstAt   = "burst_at"
	GenBurstOver = "burst_over"
)

// ParseGenerator reads a Generator from a query string of the Gen* keys.
func ParseGenerator(query string) (Generator, Errors) {
	values, err := url.ParseQuery(strings.TrimPrefix(query, "?"))
	if err != nil {
		return Generator{}, Errors{{"", fmt.Sprintf("malformed query: %v", err)}}
	}
	var g Generator
	var errs Errors
	get := func(k string) string { return strings.TrimSpace(values.Get(k)) }
	duration := func(key string, dst *time.Duration) {
		text := get(key)
		if text == "" || text == "0" {
			return
		}
		d, msg := parseDuration(text, 0)
		if msg != "" {
			errs = append(errs, FieldError{key, msg})
		}
		*dst = d
	}
	g.Rate = get(GenRate)
	if g.Rate == "" {
		g.Rate = "0"
	}
	duration(GenDuration, &g.Duration)
	duration(GenBurstAt, &g.BurstAt)
	duration(GenBurstOver, &g.BurstOver)
	if text := get(GenBurstSize); text != "" {
		n, msg := parseCount(text, 0)
		if msg != "" {
			errs = append(errs, FieldError{GenBurstSize, msg})
		}
		g.BurstSize = n
	}
	return g, errs
}

// Pattern writes g as a traffic pattern: the steady rate until the burst, the burst ("N in D",
// or "N at once"), and the steady rate again until Duration. The steady rate pauses during a
// burst spread over time, as in "5/s for 10s; 40 in 1s; 5/s for 10s". The errors name the
// generator's fields.
func (g Generator) Pattern() (string, Errors) {
	rate := strings.TrimSpace(g.Rate)
	steady := rate != "" && strings.Trim(rate, "0.") != ""
	if steady {
		// Checked by the parser the command line uses, so the messages are the same.
		if _, err := sim.ParseTraffic(rate + "/s for 1s"); err != nil {
			msg := err.Error()
			if _, after, ok := strings.Cut(msg, ": "); ok {
				msg = after
			}
			return "", Errors{{GenRate, msg}}
		}
	}
	var segs []string
	steadyFor := func(d time.Duration) {
		switch {
		case d <= 0:
		case steady:
			segs = append(segs, fmt.Sprintf("%s/s for %s", rate, formatDuration(d)))
		default:
			segs = append(segs, "idle "+formatDuration(d))
		}
	}
	switch {
	case g.BurstSize == 0 && !steady:
		return "", Errors{{GenRate, "no traffic: give a steady rate, a burst, or both"}}
	case g.BurstSize == 0 && g.Duration <= 0:
		return "", Errors{{GenDuration, "must be > 0 for a steady rate"}}
	case g.BurstSize == 0:
		steadyFor(g.Duration)
	case g.Duration > 0 && g.BurstAt+g.BurstOver > g.Duration:
		return "", Errors{{GenBurstAt, fmt.Sprintf("the burst (at %s, over %s) ends after the traffic's %s",
			formatDuration(g.BurstAt), formatDuration(g.BurstOver), formatDuration(g.Duration))}}
	default:
		steadyFor(g.BurstAt)
		if g.BurstOver > 0 {
			segs = append(segs, fmt.Sprintf("%d in %s", g.BurstSize, formatDuration(g.BurstOver)))
		} else {
			segs = append(segs, strconv.FormatInt(g.BurstSize, 10)+" at once")
		}
		if steady {
			steadyFor(g.Duration - g.BurstAt - g.BurstOver)
		}
	}
	pattern := strings.Join(segs, "; ")
	if _, err := sim.ParseTraffic(pattern); err != nil {
		return "", Errors{{"", err.Error()}}
	}
	return pattern, nil
}

package scenario

import (
	"encoding/json"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/sim"
)

// The page reads the JSON below. Times in the plots' arrays are whole µs ("_us"): exact as
// JavaScript numbers (sim.MaxTimeMicros is 2^53). Summaries and policies are in the output
// schema of `sluice simulate --format json` (package sim), written by the same code.
//
//	{"query": "traffic=...",           the scenario's canonical query string
//	 "commands": ["sluice simulate ..."], the command lines that give the same summaries
//	 "requests": 140, "width_us": 100000, "buckets": 290, "end_us": 29000000,
//	 "start": "2026-03-28T00:00:00+01:00",   with a start (or a calendar) only
//	 "start_local": "Sat 2026-03-28 ...",   the clock's 0 as a person reads it (Scenario.Instant)
//	 "calendar": "day", "time_zone": "Europe/Berlin",  with a calendar only
//	 "windows": [{"start_us": 0, "end_us": 86400000000, "label": "Sat 2026-03-28, 24h",
//	              "short": "Sat 28", "length": "24h"}, ...],
//	 "actual": "1-20",                       with real costs only
//	 "instances": 3, "store": "shared",      with a fleet only, and of its options those set:
//	 "balance": "random", "draw": 7, "store_latency_us": 2000,
//	 "outage": {"from_us": 20000000, "to_us": 40000000, "on_error": "local"},
//	 "changes": [{"t_us": 4000000, "text": "t=4s,limit=8"}, ...],  with changes only
//	 "clients": ["buggy", "normal"],         when the traffic names clients (ClientsJSON)
//	 "runs": [{"algorithm": "fixed-window",   (with a calendar: fixed-window and sliding-window only)
//	           "policy": {"algorithm": ..., "limit": ..., "period_ms": ..., "burst": ...},
//	                     (with a calendar: "calendar" and "time_zone" instead of "period_ms")
//	           "description": "At most 5 in each 1s window; ...", "capacity": 5,
//	           "phases": [{"t_us": 4000000, "limit": 8, "burst": 10, "capacity": 10,   with changes only:
//	                       "description": "..."}, ...],       the policy from each change on
//	           "offered": [...], "allowed": [...], "refused": [...], "delayed": [...], "max_delay_us": [...],
//	           "level": [...], "drain_us": [...], "ceiling": [...],  (one more entry: sampled at the boundaries)
//	           "summary": {...}}, ...]}
//
// and, when the scenario cannot run, {"errors": [{"field": "limit", "message": "..."}, ...]}.

// JSON writes the result for the page (see above).
func (r *Result) JSON() []byte {
	b := make([]byte, 0, 4096+len(r.Runs)*r.Buckets*24)
	b = append(b, `{"query":`...)
	b = appendString(b, r.Scenario.Encode())
	b = append(b, `,"commands":[`...)
	for i, c := range r.Scenario.Commands() {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, c)
	}
	b = append(b, `],"requests":`...)
	b = strconv.AppendInt(b, int64(len(r.Requests)), 10)
	b = append(b, `,"width_us":`...)
	b = strconv.AppendInt(b, r.WidthMicros, 10)
	b = append(b, `,"buckets":`...)
	b = strconv.AppendInt(b, int64(r.Buckets), 10)
	b = append(b, `,"end_us":`...)
	b = strconv.AppendInt(b, r.EndMicros(), 10)
	sc := &r.Scenario
	if !sc.Start.IsZero() {
		b = append(b, `,"start":`...)
		b = appendString(b, formatStart(sc.Start))
		b = append(b, `,"start_local":`...)
		b = appendString(b, sc.Instant(0))
	}
	if sc.Calendar != sluice.NoCalendar {
		b = append(b, `,"calendar":"`...)
		b = append(b, sc.Calendar.String()...)
		b = append(b, `","time_zone":`...)
		b = appendString(b, sc.Location.String())
		b = append(b, `,"windows":[`...)
		for i, w := range r.Windows {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"start_us":`...)
			b = strconv.AppendInt(b, w.StartMicros, 10)
			b = append(b, `,"end_us":`...)
			b = strconv.AppendInt(b, w.EndMicros, 10)
			b = append(b, `,"label":`...)
			b = appendString(b, w.Label)
			b = append(b, `,"short":`...)
			b = appendString(b, w.Short)
			b = append(b, `,"length":`...)
			b = appendString(b, sim.FormatDuration(w.EndMicros-w.StartMicros))
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	if sc.Actual.Set {
		b = append(b, `,"actual":`...)
		b = appendString(b, sc.Actual.String())
	}
	if sc.Instances > 1 {
		b = append(b, `,"instances":`...)
		b = strconv.AppendInt(b, int64(sc.Instances), 10)
		b = append(b, `,"store":"`...)
		b = append(b, sc.Stores.String()...)
		b = append(b, '"')
		if sc.Balance == sim.Random {
			b = append(b, `,"balance":"random","draw":`...)
			b = strconv.AppendUint(b, sc.Draw, 10)
		}
		if sc.StoreLatency > 0 {
			b = append(b, `,"store_latency_us":`...)
			b = strconv.AppendInt(b, sc.StoreLatency.Microseconds(), 10)
		}
		if o := sc.Outage; o != nil {
			b = append(b, `,"outage":{"from_us":`...)
			b = strconv.AppendInt(b, o.FromMicros, 10)
			b = append(b, `,"to_us":`...)
			b = strconv.AppendInt(b, o.ToMicros, 10)
			b = append(b, `,"on_error":"`...)
			b = append(b, sim.FailureModeName(o.OnError)...)
			b = append(b, `"}`...)
		}
	}
	if sc.Changes != nil {
		b = append(b, `,"changes":[`...)
		for i, c := range sc.Changes {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"t_us":`...)
			b = strconv.AppendInt(b, c.TMicros, 10)
			b = append(b, `,"text":`...)
			b = appendString(b, c.String())
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	if r.Clients != nil {
		b = append(b, `,"clients":[`...)
		for i, key := range r.Clients {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, key)
		}
		b = append(b, ']')
	}
	b = append(b, `,"runs":[`...)
	for i, run := range r.Runs {
		if i > 0 {
			b = append(b, ',')
		}
		p := run.Policy
		b = append(b, `{"algorithm":"`...)
		b = append(b, p.Algorithm.String()...)
		b = append(b, `","policy":{"algorithm":"`...)
		b = append(b, p.Algorithm.String()...)
		b = append(b, `","limit":`...)
		b = strconv.AppendInt(b, p.Limit, 10)
		if p.Calendar != sluice.NoCalendar {
			// As `sluice simulate --format json` names a calendar policy.
			b = append(b, `,"calendar":"`...)
			b = append(b, p.Calendar.String()...)
			b = append(b, `","time_zone":`...)
			b = appendString(b, p.Location.String())
		} else {
			b = append(b, `,"period_ms":`...)
			b = append(b, sim.FormatMillis(p.PeriodMicros())...)
		}
		b = append(b, `,"burst":`...)
		b = strconv.AppendInt(b, p.Burst, 10)
		b = append(b, `},"description":`...)
		b = appendString(b, Describe(p))
		b = append(b, `,"capacity":`...)
		b = strconv.AppendInt(b, run.Capacity, 10)
		if sc.Changes != nil {
			// The policy from each change on, for the card of a live run to say what runs now.
			b = append(b, `,"phases":[`...)
			for j, c := range sc.Changes {
				if j > 0 {
					b = append(b, ',')
				}
				p = c.Apply(p)
				b = append(b, `{"t_us":`...)
				b = strconv.AppendInt(b, c.TMicros, 10)
				b = append(b, `,"limit":`...)
				b = strconv.AppendInt(b, p.Limit, 10)
				b = append(b, `,"burst":`...)
				b = strconv.AppendInt(b, p.Burst, 10)
				b = append(b, `,"capacity":`...)
				b = strconv.AppendInt(b, p.Capacity(), 10)
				b = append(b, `,"description":`...)
				b = appendString(b, Describe(p))
				b = append(b, '}')
			}
			b = append(b, ']')
		}
		for _, a := range []struct {
			key    string
			values []int64
		}{
			{"offered", run.Offered}, {"allowed", run.Allowed}, {"refused", run.Refused}, {"delayed", run.Delayed},
			{"max_delay_us", run.MaxDelayMicros}, {"level", run.Level}, {"drain_us", run.DrainMicros}, {"ceiling", run.Ceiling},
		} {
			b = append(b, `,"`...)
			b = append(b, a.key...)
			b = append(b, `":`...)
			b = appendInts(b, a.values)
		}
		b = append(b, `,"summary":`...)
		b = appendSummary(b, run.Summary)
		b = append(b, '}')
	}
	return append(b, "]}"...)
}

// SummariesJSON writes, as a JSON array, each run's summary of the requests in the first k
// buckets (k from 0, nothing yet, to Buckets, the whole run): the page's summary table while the
// virtual clock runs. Out-of-range k are clamped.
func (r *Result) SummariesJSON(k int) []byte {
	k = min(max(k, 0), r.Buckets)
	b := []byte{'['}
	for i, run := range r.Runs {
		if i > 0 {
			b = append(b, ',')
		}
		var s sim.Summary
		if k > 0 {
			s = run.Cumulative[k-1]
		}
		b = appendSummary(b, s)
	}
	return append(b, ']')
}

// Trace writes the requests as a CSV trace that `sluice simulate --trace` reads: t_ms,key,cost,
// and with real costs an actual column (sim.ReadTrace).
func (r *Result) Trace() []byte {
	var b strings.Builder
	b.Grow(len(r.Requests) * 16)
	b.WriteString("t_ms,key,cost")
	if r.Actual != nil {
		b.WriteString(",actual")
	}
	b.WriteByte('\n')
	for i, rq := range r.Requests {
		b.WriteString(sim.FormatMillis(rq.TMicros))
		b.WriteByte(',')
		b.WriteString(rq.Key) // a pattern's key, sim.DefaultKey or a client's name (letters, digits, _ . -): no quoting needed
		b.WriteByte(',')
		b.WriteString(strconv.FormatInt(rq.Cost, 10))
		if r.Actual != nil {
			b.WriteByte(',')
			b.WriteString(strconv.FormatInt(r.Actual[i], 10))
		}
		b.WriteByte('\n')
	}
	return []byte(b.String())
}

// JSON writes {"errors":[{"field":..,"message":..},...]}.
func (e Errors) JSON() []byte {
	b := []byte(`{"errors":[`)
	for i, fe := range e {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"field":`...)
		b = appendString(b, fe.Field)
		b = append(b, `,"message":`...)
		b = appendString(b, fe.Message)
		b = append(b, '}')
	}
	return append(b, "]}"...)
}

// PresetsJSON writes Presets as a JSON array of {"name","title","description","query"}.
func PresetsJSON() []byte {
	b := []byte{'['}
	for i, p := range Presets {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"name":`...)
		b = appendString(b, p.Name)
		b = append(b, `,"title":`...)
		b = appendString(b, p.Title)
		b = append(b, `,"description":`...)
		b = appendString(b, p.Description)
		b = append(b, `,"query":`...)
		b = appendString(b, p.Query)
		b = append(b, '}')
	}
	return append(b, ']')
}

func appendInts(b []byte, vs []int64) []byte {
	b = append(b, '[')
	for i, v := range vs {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, v, 10)
	}
	return append(b, ']')
}

// appendSummary writes s as sim.Summary.MarshalJSON does: the very bytes of
// `sluice simulate --format json`.
func appendSummary(b []byte, s sim.Summary) []byte {
	j, err := s.MarshalJSON()
	if err != nil {
		panic("scenario: a summary does not marshal: " + err.Error()) // plain integers: it cannot fail
	}
	return append(b, j...)
}

func appendString(b []byte, s string) []byte {
	j, err := json.Marshal(s)
	if err != nil {
		panic("scenario: a string does not marshal: " + err.Error()) // json.Marshal of a string cannot fail
	}
	return append(b, j...)
}

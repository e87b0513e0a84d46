package main

import (
	"bufio"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/sim"
)

// timelineRows bounds the rows of the table's timeline.
const timelineRows = 60

// simulation is one `sluice simulate`: its policies (one, or five with --compare) run in turn
// over the same requests. The CSV and JSON writers stream each run's rows as they are decided,
// so that a long simulation is never held in memory.
type simulation struct {
	policies []sluice.Policy
	reqs     []sim.Request
	source   string // where reqs came from, for people: a pattern or "trace FILE"
	compare  bool
	fleet    *sim.Fleet // --local-budget: the one policy on a fleet of instances spending budgets
	stores   bool       // --store: the fleet is of separate or shared stores, totalled per instance and client
	start    time.Time  // --start: the instant the virtual clock's 0 stands for (zero: Unix time 0)
	local    bool       // --start or --calendar: show each row's local time (and calendar window)
	actual   []int64    // the trace's real costs (its actual column); nil: none
	// durations are the trace's responses' durations in µs (its duration_ms column); nil: none
	durations []int64
	changes   []sim.Change // --change: the policy's changes while it runs
}

// options are the simulation's sim.Options, with the fleet f (may be nil).
func (s *simulation) options(f *sim.Fleet) sim.Options {
	return sim.Options{Start: s.start, Fleet: f, Actual: s.actual, Durations: s.durations, Changes: s.changes}
}

// calendar reports whether the policies count by the calendar (all or none do).
func (s *simulation) calendar() bool { return s.policies[0].Calendar != sluice.NoCalendar }

// localTime is the local time of virtual time t, as RFC 3339 exact to the µs.
func (s *simulation) localTime(t int64) string {
	return s.options(nil).Instant(&s.policies[0], t).Format(rfc3339Micro)
}

// windowStart is the local start of the calendar window holding virtual time t.
func (s *simulation) windowStart(t int64) string {
	o := s.options(nil)
	ws, _, _ := o.Window(&s.policies[0], t)
	return o.Instant(&s.policies[0], ws).Format(rfc3339Micro)
}

const rfc3339Micro = "2006-01-02T15:04:05.999999Z07:00"

// localFields are the CSV columns (and JSON keys) that --start or --calendar add.
func (s *simulation) localFields() []string {
	switch {
	case s.calendar():
		return []string{"time", "window"}
	case s.local:
		return []string{"time"}
	}
	return nil
}

// localValues are r's values of localFields.
func (s *simulation) localValues(r sim.Row) []string {
	switch {
	case s.calendar():
		return []string{s.localTime(r.TMicros), s.windowStart(r.TMicros)}
	case s.local:
		return []string{s.localTime(r.TMicros)}
	}
	return nil
}

// simRun is one run of the table: a label, its policy, and its fleet (nil: decided exactly).
type simRun struct {
	label  string
	policy sluice.Policy
	fleet  *sim.Fleet
}

// runs are the table's runs: each policy, or with a fleet the policy decided exactly beside the
// same on the fleet.
func (s *simulation) runs() []simRun {
	if s.stores && s.compare { // each algorithm on the fleet
		rs := make([]simRun, len(s.policies))
		for i, p := range s.policies {
			rs[i] = simRun{p.Algorithm.String(), p, s.fleet}
		}
		return rs
	}
	if s.stores {
		return []simRun{{"one instance", s.policies[0], nil}, {fleetLabel(*s.fleet), s.policies[0], s.fleet}}
	}
	if s.fleet != nil {
		p := s.policies[0]
		return []simRun{{"exact", p, nil}, {fmt.Sprintf("%d × budget %d", s.fleet.Instances, s.fleet.Budget.Size), p, s.fleet}}
	}
	rs := make([]simRun, len(s.policies))
	for i, p := range s.policies {
		rs[i] = simRun{p.Algorithm.String(), p, nil}
	}
	return rs
}

// simulate decides s's requests under p, on the fleet f if not nil.
func (s *simulation) simulate(p sluice.Policy, f *sim.Fleet, emit func(sim.Row) error) (sim.Summary, error) {
	return s.options(f).Simulate(p, s.reqs, emit)
}

func (s *simulation) write(w io.Writer, format string) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	var err error
	switch format {
	case "csv":
		err = s.writeCSV(bw)
	case "json":
		err = s.writeJSON(bw)
	default:
		err = s.writeTable(bw)
	}
	if err != nil {
		return err
	}
	return bw.Flush()
}

func (s *simulation) writeCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	header := sim.CSVHeader()
	if s.compare {
		header = append([]string{"algorithm"}, header...)
	}
	if s.fleet != nil {
		header = append(header, "instance")
	}
	header = append(header, s.localFields()...)
	if s.actual != nil {
		header = append(header, sim.SettledCSVHeader()...)
	}
	if s.durations != nil {
		header = append(header, sim.StreamCSVHeader()...)
	}
	outage := s.fleet != nil && s.fleet.Outage != nil
	if outage {
		header = append(header, "fallback")
	}
	latency := s.fleet != nil && s.fleet.StoreLatency > 0
	if latency {
		header = append(header, "latency_ms")
	}
	if err := cw.Write(header); err != nil {
		return err
	}
	for _, p := range s.policies {
		name := p.Algorithm.String()
		_, err := s.simulate(p, s.fleet, func(r sim.Row) error {
			rec := r.CSVRecord()
			if s.compare {
				rec = append([]string{name}, rec...)
			}
			if s.fleet != nil {
				rec = append(rec, itoa(int64(r.Instance)))
			}
			rec = append(rec, s.localValues(r)...)
			if s.actual != nil {
				rec = append(rec, r.SettledCSVRecord()...)
			}
			if s.durations != nil {
				rec = append(rec, r.StreamCSVRecord()...)
			}
			if outage {
				rec = append(rec, r.Fallback)
			}
			if latency {
				rec = append(rec, sim.FormatMillis(r.LatencyMicros))
			}
			return cw.Write(rec)
		})
		if err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// policyJSON is how JSON output names a policy.
type policyJSON struct {
	Algorithm string      `json:"algorithm"`
	Limit     int64       `json:"limit"`
	PeriodMs  json.Number `json:"period_ms,omitempty"` // none with a calendar
	Calendar  string      `json:"calendar,omitempty"`
	TimeZone  string      `json:"time_zone,omitempty"`
	Burst     int64       `json:"burst"`
}

func newPolicyJSON(p sluice.Policy) policyJSON {
	if p.Calendar != sluice.NoCalendar {
		return policyJSON{Algorithm: p.Algorithm.String(), Limit: p.Limit, Calendar: p.Calendar.String(), TimeZone: p.Location.String(), Burst: p.Burst}
	}
	return policyJSON{Algorithm: p.Algorithm.String(), Limit: p.Limit, PeriodMs: json.Number(sim.FormatMillis(p.PeriodMicros())), Burst: p.Burst}
}

// fleetJSON is how JSON output names a fleet.
type fleetJSON struct {
	Instances   int `json:"instances"`
	LocalBudget *struct {
		Size     int64       `json:"size"`
		MaxAgeMs json.Number `json:"max_age_ms"`
	} `json:"local_budget,omitempty"` // none with --store and no --local-budget
	Store   string      `json:"store,omitempty"`   // --store: separate or shared
	Balance string      `json:"balance,omitempty"` // --store: round-robin or random
	Draw    *uint64     `json:"draw,omitempty"`    // --balance random
	Outage  *outageJSON `json:"outage,omitempty"`
	// --store-latency, if > 0
	StoreLatencyMs json.Number `json:"store_latency_ms,omitempty"`
}

type outageJSON struct {
	FromMs  json.Number `json:"from_ms"`
	ToMs    json.Number `json:"to_ms"`
	OnError string      `json:"on_error"` // open, closed or local
}

func newFleetJSON(f sim.Fleet, stores bool) fleetJSON {
	j := fleetJSON{Instances: f.Instances}
	if f.Budget != (sluice.LocalBudget{}) {
		j.LocalBudget = &struct {
			Size     int64       `json:"size"`
			MaxAgeMs json.Number `json:"max_age_ms"`
		}{f.Budget.Size, json.Number(sim.FormatMillis(f.Budget.MaxAge.Microseconds()))}
	}
	if stores {
		j.Store, j.Balance = f.Stores.String(), f.Balance.String()
		if f.Balance == sim.Random {
			j.Draw = &f.Draw
		}
		if f.StoreLatency > 0 {
			j.StoreLatencyMs = json.Number(sim.FormatMillis(f.StoreLatency.Microseconds()))
		}
		if o := f.Outage; o != nil {
			j.Outage = &outageJSON{json.Number(sim.FormatMillis(o.FromMicros)), json.Number(sim.FormatMillis(o.ToMicros)), sim.FailureModeName(o.OnError)}
		}
	}
	return j
}

// streamsJSON is a run's "streams", with durations: the most responses one key had running and
// the most their estimates held, the settlements that left their key waiting, the longest wait.
type streamsJSON struct {
	MaxInFlight int64       `json:"max_in_flight"`
	MaxReserved int64       `json:"max_reserved"`
	Waits       int64       `json:"waits"`
	MaxWaitMs   json.Number `json:"max_wait_ms"`
}

// writeJSON writes one JSON document, one request per line:
//
//	{"policy":{...},"requests":[{...},...],"summary":{...}}
//	{"policy":{...},"fleet":{...},"requests":[{...,"instance":1},...],"summary":{...}}  (--local-budget)
//	{"runs":[{"algorithm":"...","policy":{...},"requests":[...],"summary":{...}},...]}  (--compare)
//	{"policy":{...},"fleet":{...,"store":"separate"},"requests":[...],"summary":{...},
//	 "per_instance":[{"instance":1,"summary":{...}},...],"per_client":[{"key":"buggy","summary":{...}},...]}  (--store)
//	{"policy":{...},"requests":[...],"summary":{...},"streams":{...}}  (durations: --workload, a duration_ms column)
func (s *simulation) writeJSON(w *bufio.Writer) error {
	put := func(v any) error {
		b, err := json.Marshal(v)
		if err == nil {
			_, err = w.Write(b)
		}
		return err
	}
	run := func(p sluice.Policy) error {
		if s.compare {
			w.WriteString(`{"algorithm":`)
			put(p.Algorithm.String())
			w.WriteString(`,`)
		} else {
			w.WriteString(`{`)
		}
		if !s.start.IsZero() && !s.compare {
			w.WriteString(`"start":`)
			put(s.start.Format(rfc3339Micro))
			w.WriteString(`,`)
		}
		w.WriteString(`"policy":`)
		put(newPolicyJSON(p))
		if s.fleet != nil {
			w.WriteString(`,"fleet":`)
			put(newFleetJSON(*s.fleet, s.stores))
		}
		var bd *sim.Breakdown
		if s.stores {
			bd = sim.NewBreakdown(s.fleet.Instances)
		}
		w.WriteString(`,"requests":[`)
		sep := "\n"
		fields := s.localFields()
		sum, err := s.simulate(p, s.fleet, func(r sim.Row) error {
			if bd != nil {
				bd.Add(r)
			}
			w.WriteString(sep)
			sep = ",\n"
			if fields == nil {
				return put(r)
			}
			b, err := json.Marshal(r)
			if err != nil {
				return err
			}
			w.Write(b[:len(b)-1]) // the row's object, without its closing brace
			for i, v := range s.localValues(r) {
				fmt.Fprintf(w, ",%q:", fields[i])
				put(v)
			}
			_, err = w.WriteString("}")
			return err
		})
		if err != nil {
			return err
		}
		w.WriteString("\n],\"summary\":")
		if err := put(sum); err != nil {
			return err
		}
		if sum.Streams {
			w.WriteString(`,"streams":`)
			if err := put(streamsJSON{sum.MaxInFlight, sum.MaxReserved, sum.Waits, json.Number(sim.FormatMillis(sum.MaxWaitMicros))}); err != nil {
				return err
			}
		}
		if bd != nil {
			w.WriteString(`,"per_instance":`)
			put(perInstanceJSON(bd))
			w.WriteString(`,"per_client":`)
			if err := put(perClientJSON(bd)); err != nil {
				return err
			}
		}
		_, err = w.WriteString("}")
		return err
	}
	if !s.compare {
		if err := run(s.policies[0]); err != nil {
			return err
		}
		_, err := w.WriteString("\n")
		return err
	}
	w.WriteString(`{`)
	if !s.start.IsZero() {
		w.WriteString(`"start":`)
		put(s.start.Format(rfc3339Micro))
		w.WriteString(`,`)
	}
	w.WriteString(`"runs":[`)
	for i, p := range s.policies {
		if i > 0 {
			w.WriteString(",")
		}
		w.WriteString("\n")
		if err := run(p); err != nil {
			return err
		}
	}
	_, err := w.WriteString("\n]}\n")
	return err
}

// writeTable writes the simulation for people: what ran on what, a timeline, and the summaries.
func (s *simulation) writeTable(w io.Writer) error {
	runs := s.runs()
	timelines := make([]*sim.Timeline, len(runs))
	sums := make([]sim.Summary, len(runs))
	breakdowns := make([]*sim.Breakdown, len(runs)) // with a fleet: each run's per instance and per client
	for i, r := range runs {
		tl := sim.NewTimeline(s.reqs, timelineRows)
		var bd *sim.Breakdown
		switch {
		case r.fleet != nil:
			bd = sim.NewBreakdown(r.fleet.Instances)
		case s.stores: // the instance alone, beside the fleet in the per-client table
			bd = sim.NewBreakdown(0)
		}
		breakdowns[i] = bd
		sum, err := s.simulate(r.policy, r.fleet, func(row sim.Row) error {
			tl.Add(row)
			if bd != nil {
				bd.Add(row)
			}
			return nil
		})
		if err != nil {
			return err
		}
		timelines[i], sums[i] = tl, sum
	}
	several := len(runs) > 1

	p := s.policies[0]
	switch {
	case s.compare && s.calendar():
		fmt.Fprintf(w, "sluice simulate --compare: limit %d per %s: fixed-window and sliding-window only (the other algorithms have no calendar)\n", p.Limit, p.CalendarIn())
	case s.compare:
		fmt.Fprintf(w, "sluice simulate --compare: limit %d per %s, %s\n", p.Limit, sim.FormatDuration(p.PeriodMicros()), compareBurst(p.Limit, s.policies))
	default:
		burst, per := "", p.CalendarIn()
		if sim.TakesBurst(p.Algorithm) {
			burst = fmt.Sprintf(", burst %d", p.Burst)
		}
		if per == "" {
			per = sim.FormatDuration(p.PeriodMicros())
		}
		fmt.Fprintf(w, "sluice simulate: %v, limit %d per %s%s\n", p.Algorithm, p.Limit, per, burst)
		fmt.Fprintf(w, "policy: %s\n", describe(p))
	}
	for _, c := range s.changes {
		fmt.Fprintf(w, "change: %s\n", c)
	}
	if s.local {
		fmt.Fprintf(w, "start: t=0 is %s\n", s.options(nil).Instant(&p, 0).Format("Mon 2006-01-02 15:04:05.999999 -07:00 (MST)"))
	}
	if s.stores {
		s.describeFleet(w)
	} else if f := s.fleet; f != nil {
		fmt.Fprintf(w, "fleet: %d instances sharing one store, requests dealt in turn; each takes budgets of %d from the store, spent for at most %s%s\n",
			f.Instances, f.Budget.Size, sim.FormatDuration(f.Budget.MaxAge.Microseconds()), windowEnd(p))
	}
	fmt.Fprintf(w, "traffic: %s (%s)\n\n", s.source, describeRequests(s.reqs))

	// The timeline: the time column, offered, then per policy allowed, and refused and delayed
	// where they have a count.
	first := timelines[0]
	groups := []*group{{name: "per " + sim.FormatDuration(first.WidthMicros)}, {}}
	t := groups[0].add("t", false)
	offered := groups[1].add("offered", false)
	for _, b := range first.Buckets {
		t.cells = append(t.cells, sim.FormatDuration(b.StartMicros))
		offered.cells = append(offered.cells, itoa(b.Offered))
	}
	if s.local {
		// Each row's local time, and where a calendar window begins.
		lt := groups[0].add("local time", true)
		var win *column
		if s.calendar() {
			win = groups[0].add("window", true)
		}
		for i, b := range first.Buckets {
			lt.cells = append(lt.cells, s.options(nil).Instant(&p, b.StartMicros).Format("Mon 2006-01-02 15:04:05 -07:00"))
			if win != nil {
				win.cells = append(win.cells, s.windowsBegun(b.StartMicros, b.StartMicros+first.WidthMicros, i == 0))
			}
		}
	}
	for i, tl := range timelines {
		g := groups[1] // one run: its columns follow offered
		if several {
			g = &group{name: runs[i].label}
			groups = append(groups, g)
		}
		g.column("allowed", tl, func(b sim.Bucket) string { return itoa(b.Allowed) })
		if sums[i].Refused > 0 || !several {
			g.column("refused", tl, func(b sim.Bucket) string { return itoa(b.Refused) })
		}
		if sums[i].Delayed > 0 {
			g.column("delayed", tl, func(b sim.Bucket) string { return itoa(b.Delayed) })
			if !several {
				g.column("max delay", tl, func(b sim.Bucket) string { return sim.FormatDuration(b.MaxDelayMicros) })
			}
		}
	}
	writeColumns(w, groups, 1)

	// The summaries, one line per policy.
	fmt.Fprintln(w)
	summary := []summaryColumn{
		{"offered", func(s sim.Summary) string { return itoa(s.Offered) }},
		{"allowed", func(s sim.Summary) string { return itoa(s.Allowed) }},
		{"%", func(s sim.Summary) string {
			return fmt.Sprintf("%.1f%%", 100*float64(s.Allowed)/float64(max(1, s.Offered)))
		}},
		{"refused", func(s sim.Summary) string { return itoa(s.Refused) }},
		{"delayed", func(s sim.Summary) string { return itoa(s.Delayed) }},
		{"max delay", func(s sim.Summary) string { return sim.FormatDuration(s.MaxDelayMicros) }},
	}
	for _, sum := range sums {
		if sum.Never > 0 {
			summary = append(summary, summaryColumn{"never fit", func(s sim.Summary) string { return itoa(s.Never) }})
			break
		}
	}
	if s.actual != nil { // the trace's real costs: what the approved ones were estimated at, and cost
		summary = append(summary, summaryColumn{"settled", func(s sim.Summary) string { return itoa(s.Settled) }},
			summaryColumn{"estimated", func(s sim.Summary) string { return itoa(s.SettledCost) }},
			summaryColumn{"actual", func(s sim.Summary) string { return itoa(s.ActualCost) }})
	}
	if s.durations != nil { // what running responses held, and the waits settlements left
		summary = append(summary, summaryColumn{"max in flight", func(s sim.Summary) string { return itoa(s.MaxInFlight) }},
			summaryColumn{"max reserved", func(s sim.Summary) string { return itoa(s.MaxReserved) }},
			summaryColumn{"waits", func(s sim.Summary) string { return itoa(s.Waits) }},
			summaryColumn{"max wait", func(s sim.Summary) string { return sim.FormatDuration(s.MaxWaitMicros) }})
	}
	sg := []*group{{}, {}}
	head := "algorithm"
	if s.fleet != nil {
		head = "run"
	}
	name := sg[0].add(head, true)
	for _, r := range runs {
		name.cells = append(name.cells, r.label)
	}
	for _, c := range summary {
		col := sg[1].add(c.head, false)
		for _, sum := range sums {
			col.cells = append(col.cells, c.cell(sum))
		}
	}
	writeColumns(w, sg, 2)
	if s.stores {
		s.writeBreakdown(w, runs, breakdowns, sums[len(sums)-1])
	} else if s.fleet != nil {
		fmt.Fprintf(w, "\nallowed per instance:")
		for i, sum := range breakdowns[len(runs)-1].Instances { // the budgeted run, beside the exact one
			fmt.Fprintf(w, " %d: %d", i+1, sum.Allowed)
		}
		fmt.Fprintf(w, "\nbound with budgets: %s\n", budgetBound(p, *s.fleet))
	}
	for _, sum := range sums {
		if sum.Delayed > 0 {
			fmt.Fprintln(w, "\ndelayed: allowed, but held back (leaky bucket) until the queue ahead has drained")
			break
		}
	}
	return nil
}

// windowsBegun says which calendar windows begin in the virtual times [from, to): the latest of
// them ("new day 2026-03-29, 23h"), with how many began if several; on the first row, the window
// it is in even if it began before.
func (s *simulation) windowsBegun(from, to int64, first bool) string {
	o, p := s.options(nil), &s.policies[0]
	start, end, _ := o.Window(p, to-1)
	if start < from && !first {
		return ""
	}
	n := 0
	for ws := start; ws >= from; n++ { // count back to the first window begun in the bucket
		ws, _, _ = o.Window(p, ws-1)
	}
	label := fmt.Sprintf("%s %s, %s", p.Calendar, windowName(p.Calendar, o.Instant(p, start)), sim.FormatDuration(end-start))
	switch {
	case n == 0: // the first row, in a window begun before it
		return label
	case n == 1:
		return "new " + label
	}
	return fmt.Sprintf("%d new windows, the last %s", n, label)
}

// windowName names the calendar window starting at local time t: 2026-03-29, the week of
// 2026-12-28 (ISO week 53), 2028-02, 2027.
func windowName(c sluice.Calendar, t time.Time) string { return sim.WindowName(c, t, "2006-01-02") }

// windowEnd says, for the window algorithms, that a budget also ends with its window.
func windowEnd(p sluice.Policy) string {
	if p.Algorithm == sluice.FixedWindow || p.Algorithm == sluice.SlidingWindow {
		return " and never beyond the end of the window it was counted in"
	}
	return ""
}

// budgetBound states what a fleet's budgets may admit under p (see sluice.LocalBudget).
func budgetBound(p sluice.Policy, f sim.Fleet) string {
	if p.Algorithm == sluice.TokenBucket {
		r := sim.FormatDuration(p.PeriodMicros())
		extra := min(float64(p.Limit)*f.Budget.MaxAge.Seconds()/p.Period.Seconds(), float64(int64(f.Instances)*f.Budget.Size))
		return fmt.Sprintf("over any interval T, at most %d + %d per %s × T, as exact, plus up to min(rate × max_age, instances × size) = %.0f more",
			p.Capacity(), p.Limit, r, extra)
	}
	return fmt.Sprintf("at most %d in any one window, as exact (units are counted in the window they are spent in); unspent units expire, so budgets may admit fewer", p.Limit)
}

// summaryColumn is a column of the summary table: its heading, and its cell for one run.
type summaryColumn struct {
	head string
	cell func(sim.Summary) string
}

// compareBurst says where --compare's burst went.
func compareBurst(limit int64, ps []sluice.Policy) string {
	var burst int64
	for _, p := range ps {
		if sim.TakesBurst(p.Algorithm) {
			burst = p.Burst
		}
	}
	if burst == 0 {
		return fmt.Sprintf("burst 0 (token-bucket: %d tokens, leaky-bucket: no queue)", limit)
	}
	return fmt.Sprintf("burst %d (token-bucket and leaky-bucket only)", burst)
}

// describe says what a policy does, in words.
func describe(p sluice.Policy) string {
	if p.Calendar != sluice.NoCalendar {
		from := map[sluice.Calendar]string{sluice.Day: "from local midnight to midnight", sluice.Week: "ISO weeks, from Monday 00:00",
			sluice.Month: "from the 1st at 00:00", sluice.Year: "from 1 January 00:00"}[p.Calendar]
		if p.Algorithm == sluice.SlidingWindow {
			return fmt.Sprintf("at most %d per %s (%s), the previous window weighted by the share of the current one still to run", p.Limit, p.CalendarIn(), from)
		}
		return fmt.Sprintf("at most %d in each %s (%s)", p.Limit, p.CalendarIn(), from)
	}
	per := sim.FormatDuration(p.PeriodMicros())
	switch p.Algorithm {
	case sluice.FixedWindow:
		return fmt.Sprintf("at most %d in each %s window, windows aligned to t=0", p.Limit, per)
	case sluice.SlidingLog:
		return fmt.Sprintf("at most %d in any %s", p.Limit, per)
	case sluice.SlidingWindow:
		return fmt.Sprintf("at most %d per %s, the previous window weighted by its overlap", p.Limit, per)
	case sluice.TokenBucket:
		return fmt.Sprintf("a bucket of %s, refilled %d per %s", plural(p.Capacity(), "token"), p.Limit, per)
	case sluice.LeakyBucket:
		if p.Burst == 0 {
			return fmt.Sprintf("a queue drained %d per %s, with no room to wait", p.Limit, per)
		}
		return fmt.Sprintf("a queue drained %d per %s, with room for %d waiting", p.Limit, per, p.Burst)
	}
	return ""
}

// describeRequests says how many requests, when, from how many keys, at what cost.
func describeRequests(reqs []sim.Request) string {
	keys := map[string]bool{}
	var cost int64
	for _, r := range reqs {
		keys[r.Key] = true
		cost += r.Cost
	}
	d := fmt.Sprintf("%d requests from %s to %s", len(reqs), sim.FormatDuration(reqs[0].TMicros), sim.FormatDuration(reqs[len(reqs)-1].TMicros))
	if len(keys) == 1 {
		d += fmt.Sprintf(", key %q", reqs[0].Key)
	} else {
		d += fmt.Sprintf(", %d keys", len(keys))
	}
	if cost != int64(len(reqs)) {
		d += fmt.Sprintf(", total cost %d", cost)
	}
	return d
}

// A group is a run of columns under one heading; a column is a heading over cells.
type group struct {
	name    string
	columns []*column
}

type column struct {
	head  string
	left  bool // left-aligned; numbers are right-aligned
	cells []string
	width int
}

func (g *group) add(head string, left bool) *column {
	c := &column{head: head, left: left}
	g.columns = append(g.columns, c)
	return c
}

// column adds a column with one cell per bucket of tl.
func (g *group) column(head string, tl *sim.Timeline, cell func(sim.Bucket) string) {
	c := g.add(head, false)
	for _, b := range tl.Buckets {
		c.cells = append(c.cells, cell(b))
	}
}

// writeColumns writes groups side by side: a line of group names (if any), a line of column
// headings, then the cells. Columns within a group are inGap spaces apart, groups two.
func writeColumns(w io.Writer, groups []*group, inGap int) {
	const groupGap = 2
	named := false
	rows := 0
	for _, g := range groups {
		named = named || g.name != ""
		width := -inGap
		for _, c := range g.columns {
			c.width = utf8.RuneCountInString(c.head)
			for _, s := range c.cells {
				c.width = max(c.width, utf8.RuneCountInString(s))
			}
			rows = max(rows, len(c.cells))
			width += c.width + inGap
		}
		if extra := utf8.RuneCountInString(g.name) - width; extra > 0 && len(g.columns) > 0 {
			g.columns[0].width += extra // a name wider than its columns widens the first one
		}
	}
	line := func(cell func(g *group, c *column, first bool) string) {
		var b strings.Builder
		for gi, g := range groups {
			for ci, c := range g.columns {
				switch {
				case gi > 0 && ci == 0:
					b.WriteString(strings.Repeat(" ", groupGap))
				case ci > 0:
					b.WriteString(strings.Repeat(" ", inGap))
				}
				b.WriteString(cell(g, c, ci == 0))
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
	pad := func(s string, width int, left bool) string {
		n := width - utf8.RuneCountInString(s)
		if n <= 0 {
			return s
		}
		if left {
			return s + strings.Repeat(" ", n)
		}
		return strings.Repeat(" ", n) + s
	}
	if named {
		// Each group's name, right-aligned over the group's columns (the time column's name,
		// on the left, is left-aligned).
		var b strings.Builder
		for gi, g := range groups {
			width := -inGap
			for _, c := range g.columns {
				width += c.width + inGap
			}
			if gi > 0 {
				b.WriteString(strings.Repeat(" ", groupGap))
			}
			b.WriteString(pad(g.name, width, gi == 0))
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
	line(func(_ *group, c *column, _ bool) string { return pad(c.head, c.width, c.left) })
	for r := range rows {
		line(func(_ *group, c *column, _ bool) string {
			s := ""
			if r < len(c.cells) {
				s = c.cells[r]
			}
			return pad(s, c.width, c.left)
		})
	}
}

func itoa(n int64) string { return fmt.Sprint(n) }

// plural writes "1 token", "2 tokens".
func plural(n int64, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

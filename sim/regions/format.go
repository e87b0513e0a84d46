package regions

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/sim"
)

// Flags names a row's flags, space-separated: cut (its link to the ledger), safe-share, learning,
// floor; "" for none.
func (r Row) Flags() string {
	var f []string
	for _, x := range []struct {
		on   bool
		name string
	}{{r.Cut, "cut"}, {r.Safe, "safe-share"}, {r.Learning, "learning"}, {r.Floor, "floor"}} {
		if x.on {
			f = append(f, x.name)
		}
	}
	return strings.Join(f, " ")
}

// BoundText states the bound the simulation checked, with its numbers, and whether it held
// (docs/design.md, "The worst case of each failure").
func (res *Result) BoundText() string {
	o := res.Options
	L := strconv.FormatInt(res.Limit, 10)
	base, baseText := res.Limit, "L = "+L
	if o.Policy.Algorithm == algorithm.TokenBucket {
		c := o.Policy.Capacity()
		base, baseText = res.Limit+c, fmt.Sprintf("C + L·P/P = %d + %s = %d", c, L, res.Limit+c)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "bound: worldwide admitted per %s window ≤ %s while the ledger is reachable", sim.FormatDuration(o.Policy.Period.Microseconds()), baseText)
	if len(o.Flushes) > 0 {
		b.WriteString(" and after a flush (learning mode)")
	}
	if len(o.Partitions) > 0 {
		extra := max(0, res.Safe-res.Floor)
		fmt.Fprintf(&b, "; with k regions cut off in the window or the one before ≤ %s + k·max(0, S − F) = %d + k·max(0, %d − %d) = %d + k·%d",
			strings.SplitN(baseText, " = ", 2)[0], base, res.Safe, res.Floor, base, extra)
	}
	var over []string
	for _, w := range res.Windows {
		if !w.Held {
			over = append(over, fmt.Sprintf("%s (%d > %d)", sim.FormatDuration(w.StartMicros), w.Admitted, w.Bound))
		}
	}
	if len(over) == 0 {
		fmt.Fprintf(&b, ": held in all %d windows", len(res.Windows))
	} else {
		fmt.Fprintf(&b, ": NOT held in the windows from %s", strings.Join(over, ", "))
	}
	return b.String()
}

// WriteTable writes the simulation for people: the setup, the timeline per refresh interval and
// region, the windows worldwide, and the bound.
func (res *Result) WriteTable(out io.Writer) error {
	o := res.Options
	p := o.Policy
	latency := sim.FormatDuration(o.LatencyMin.Microseconds())
	if o.LatencyMax != o.LatencyMin {
		latency += "-" + sim.FormatDuration(o.LatencyMax.Microseconds())
	}
	fmt.Fprintf(out, "global policy: %s, %d per %s worldwide across %d regions (%s)\n", p.Algorithm, p.Limit, sim.FormatDuration(p.Period.Microseconds()),
		len(o.Regions), strings.Join(o.Regions, ", "))
	fmt.Fprintf(out, "ledger: %s share, floor F = %d, safe share S = %d, lease %s, hold %s; refresh every %s, latency to the ledger %s each way (drawn from %d)\n",
		o.Algorithm, res.Floor, res.Safe, sim.FormatDuration(res.Lease.Microseconds()), sim.FormatDuration(res.Hold.Microseconds()),
		sim.FormatDuration(res.RefreshMicros), latency, o.Draw)
	for _, x := range o.Partitions {
		fmt.Fprintf(out, "partition: %s cut off from the ledger %s-%s\n", x.Region, sim.FormatDuration(x.From.Microseconds()), sim.FormatDuration(x.To.Microseconds()))
	}
	for _, f := range o.Flushes {
		fmt.Fprintf(out, "flush: the ledger's state is lost at %s\n", sim.FormatDuration(f.Microseconds()))
	}
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "t\tregion\twant\tallotment\toffered\tadmitted\trefused\t\tflags")
	for i, r := range res.Rows {
		t := ""
		if i == 0 || res.Rows[i-1].StartMicros != r.StartMicros {
			t = sim.FormatDuration(r.StartMicros)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t\t%s\n", t, r.Region, r.Want, r.Allotment, r.Offered, r.Admitted, r.Refused, r.Flags())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "window\t%s\tworldwide\tbound\t\theld\n", strings.Join(o.Regions, "\t"))
	for _, w := range res.Windows {
		per := make([]string, len(w.PerRegion))
		for i, n := range w.PerRegion {
			per[i] = strconv.FormatInt(n, 10)
		}
		held := "yes"
		if !w.Held {
			held = "NO"
		}
		if w.Cut > 0 {
			held += fmt.Sprintf(" (%d cut off)", w.Cut)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t\t%s\n", sim.FormatDuration(w.StartMicros), strings.Join(per, "\t"), w.Admitted, w.Bound, held)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out)
	_, err := fmt.Fprintln(out, res.BoundText())
	return err
}

// CSVHeader is the CSV output's header: one row per refresh interval and region.
func CSVHeader() []string {
	return []string{"t_ms", "region", "want", "allotment", "offered", "admitted", "refused", "cut", "safe_share", "learning", "floor"}
}

// CSVRecord is r as a CSV row.
func (r Row) CSVRecord() []string {
	b := strconv.FormatBool
	return []string{sim.FormatMillis(r.StartMicros), r.Region, strconv.FormatInt(r.Want, 10), strconv.FormatInt(r.Allotment, 10),
		strconv.FormatInt(r.Offered, 10), strconv.FormatInt(r.Admitted, 10), strconv.FormatInt(r.Refused, 10),
		b(r.Cut), b(r.Safe), b(r.Learning), b(r.Floor)}
}

type rowJSON struct {
	T         json.Number `json:"t_ms"`
	Region    string      `json:"region"`
	Want      int64       `json:"want"`
	Allotment int64       `json:"allotment"`
	Offered   int64       `json:"offered"`
	Admitted  int64       `json:"admitted"`
	Refused   int64       `json:"refused"`
	Cut       bool        `json:"cut"`
	Safe      bool        `json:"safe_share"`
	Learning  bool        `json:"learning"`
	Floor     bool        `json:"floor"`
}

type windowJSON struct {
	T         json.Number `json:"t_ms"`
	Admitted  int64       `json:"admitted"`
	PerRegion []int64     `json:"per_region"`
	Bound     int64       `json:"bound"`
	Cut       int         `json:"cut_off"`
	Held      bool        `json:"held"`
}

type partitionJSON struct {
	Region string      `json:"region"`
	From   json.Number `json:"from_ms"`
	To     json.Number `json:"to_ms"`
}

// MarshalJSON is the JSON output: {"policy":{...},"ledger":{...},"regions":[...],
// "partitions":[...],"flushes_ms":[...],"timeline":[...],"windows":[...],"summary":{...}}.
func (res *Result) MarshalJSON() ([]byte, error) {
	o := res.Options
	ms := func(us int64) json.Number { return json.Number(sim.FormatMillis(us)) }
	v := struct {
		Policy struct {
			Algorithm string      `json:"algorithm"`
			Limit     int64       `json:"limit"`
			Period    json.Number `json:"period_ms"`
			Burst     int64       `json:"burst,omitempty"`
		} `json:"policy"`
		Ledger struct {
			Algorithm  string      `json:"algorithm"`
			Floor      int64       `json:"floor"`
			Safe       int64       `json:"safe_share"`
			Lease      json.Number `json:"lease_ms"`
			Hold       json.Number `json:"hold_ms"`
			Refresh    json.Number `json:"refresh_ms"`
			LatencyMin json.Number `json:"latency_min_ms"`
			LatencyMax json.Number `json:"latency_max_ms"`
			Draw       uint64      `json:"draw"`
		} `json:"ledger"`
		Regions    []string        `json:"regions"`
		Partitions []partitionJSON `json:"partitions"`
		Flushes    []json.Number   `json:"flushes_ms"`
		Timeline   []rowJSON       `json:"timeline"`
		Windows    []windowJSON    `json:"windows"`
		Summary    struct {
			Held    bool   `json:"held"`
			Bound   string `json:"bound"`
			Grants  int    `json:"grants"`
			Failed  int    `json:"failed_refreshes"`
			Windows int    `json:"windows"`
		} `json:"summary"`
	}{Regions: o.Regions, Partitions: []partitionJSON{}, Flushes: []json.Number{}}
	v.Policy.Algorithm, v.Policy.Limit, v.Policy.Period, v.Policy.Burst = o.Policy.Algorithm.String(), o.Policy.Limit, ms(o.Policy.Period.Microseconds()), o.Policy.Burst
	l := &v.Ledger
	l.Algorithm, l.Floor, l.Safe, l.Lease, l.Hold, l.Refresh = o.Algorithm, res.Floor, res.Safe, ms(res.Lease.Microseconds()), ms(res.Hold.Microseconds()), ms(res.RefreshMicros)
	l.LatencyMin, l.LatencyMax, l.Draw = ms(o.LatencyMin.Microseconds()), ms(o.LatencyMax.Microseconds()), o.Draw
	for _, x := range o.Partitions {
		v.Partitions = append(v.Partitions, partitionJSON{x.Region, ms(x.From.Microseconds()), ms(x.To.Microseconds())})
	}
	for _, f := range o.Flushes {
		v.Flushes = append(v.Flushes, ms(f.Microseconds()))
	}
	for _, r := range res.Rows {
		v.Timeline = append(v.Timeline, rowJSON{ms(r.StartMicros), r.Region, r.Want, r.Allotment, r.Offered, r.Admitted, r.Refused, r.Cut, r.Safe, r.Learning, r.Floor})
	}
	for _, w := range res.Windows {
		v.Windows = append(v.Windows, windowJSON{ms(w.StartMicros), w.Admitted, w.PerRegion, w.Bound, w.Cut, w.Held})
	}
	v.Summary.Held, v.Summary.Bound, v.Summary.Grants, v.Summary.Failed, v.Summary.Windows = res.Held, res.BoundText(), res.Grants, res.Failed, len(res.Windows)
	return json.Marshal(v)
}

package envoys

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/sluicehq/sluice/sim"
)

// AssignedText is the row's assignment: "400/1m ×80" (a token bucket of 400 per period holding
// 80), deny_all, allow_all, or "-" (none in force).
func (r Row) AssignedText(periodMicros int64) string {
	switch {
	case r.Assigned == -1:
		return "deny_all"
	case r.Assigned == -2:
		return "allow_all"
	case r.Assigned > 0:
		return fmt.Sprintf("%d/%s ×%d", r.Assigned, sim.FormatDuration(periodMicros), r.MaxTokens)
	}
	return "-"
}

func (o *Options) period() string { return sim.FormatDuration(o.Period.Microseconds()) }

// BoundText states the bounds the simulation checked, with their numbers, and whether they held.
func (res *Result) BoundText() string {
	o := res.Options
	var b strings.Builder
	lo, hi := int64(-1), int64(0)
	var over, rlsOver []string
	for _, w := range res.Windows {
		if lo < 0 || w.Tokens < lo {
			lo = w.Tokens
		}
		hi = max(hi, w.Tokens)
		if !w.Held {
			over = append(over, fmt.Sprintf("%s (%d > %d)", sim.FormatDuration(w.StartMicros), w.Assigned, w.Bound))
		}
		if !w.RLSHeld {
			rlsOver = append(rlsOver, fmt.Sprintf("%s (%d > %d)", sim.FormatDuration(w.StartMicros), w.RLSAdmitted-w.RLSOpen, w.RLSBound))
		}
	}
	tokens := strconv.FormatInt(max(lo, 0), 10)
	if hi != lo {
		tokens = fmt.Sprintf("%d…%d", lo, hi)
	}
	held := func(bad []string) string {
		if len(bad) == 0 {
			return fmt.Sprintf("held in all %d windows", len(res.Windows))
		}
		return "NOT held in the windows from " + strings.Join(bad, ", ")
	}
	fmt.Fprintf(&b, "bound: RLQS admitted under assignments per %s window ≤ L·W/P + Σ max_tokens of the buckets held or built in it = %d + %s: %s; RLS admitted by the store per window ≤ B + L = %d + %d = %d: %s",
		o.period(), o.Limit, tokens, held(over), o.Burst, o.Limit, o.Burst+o.Limit, held(rlsOver))
	return b.String()
}

// CallsText compares the calls to the service.
func (res *Result) CallsText() string {
	pct := "-"
	if res.RLSCalls > 0 {
		pct = strconv.FormatFloat(100*float64(res.RLQSCalls)/float64(res.RLSCalls), 'f', 2, 64) + "%"
	}
	down := ""
	if res.RLSDown > 0 {
		down = fmt.Sprintf(", %d of them unanswered while it was down", res.RLSDown)
	}
	return fmt.Sprintf("calls to the service: RLQS %d (%d reports, %d responses, on %d streams); RLS %d (one per request%s): RLQS made %s of RLS's calls",
		res.RLQSCalls, res.Reports, res.Responses, res.Streams, res.RLSCalls, down, pct)
}

// WriteTable writes the simulation for people: the setup, the timeline per report interval and
// Envoy, the windows, the totals, the calls and the bounds.
func (res *Result) WriteTable(out io.Writer) error {
	o := res.Options
	lat := sim.FormatDuration(o.Latency.Microseconds())
	fmt.Fprintf(out, "RLQS: %d Envoys (%s) on one bucket {name: api}: %d per %s, burst %d, split %s by demand; reports every %s, assignment TTL %s, latency %s each way; no_assignment %s, expired %s\n",
		len(o.Envoys), strings.Join(o.Envoys, ", "), o.Limit, o.period(), o.Burst, o.Algorithm, sim.FormatDuration(res.IntervalMicros),
		sim.FormatDuration(o.TTL.Microseconds()), lat, o.NoAssignment, o.Expired)
	fmt.Fprintf(out, "RLS: the same requests to sluice one by one: token-bucket %d per %s, burst %d, memory store, latency %s each way\n",
		o.Limit, o.period(), o.Burst, lat)
	if o.KillAt > 0 {
		fmt.Fprintf(out, "kill: the service dies at %s (streams break, its memory ledgers are lost; RLS requests are admitted, failure_mode_deny false)", sim.FormatDuration(o.KillAt.Microseconds()))
		if o.RestartAt > 0 {
			fmt.Fprintf(out, "; it restarts at %s", sim.FormatDuration(o.RestartAt.Microseconds()))
		}
		fmt.Fprintln(out)
	}
	fmt.Fprintln(out)
	P := o.Period.Microseconds()
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "t\tenvoy\toffered\trlqs admitted\tof them fallback\trls admitted\t\tstate\tassignment\treports\tresponses\t")
	for i, r := range res.Rows {
		t := ""
		if i == 0 || res.Rows[i-1].StartMicros != r.StartMicros {
			t = sim.FormatDuration(r.StartMicros)
		}
		st := r.State
		if st == "" {
			st = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t\t%s\t%s\t%d\t%d\t\n", t, r.Envoy, r.Offered, r.Admitted, r.Fallback, r.RLSAdmitted, st, r.AssignedText(P), r.Reports, r.Responses)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "window\toffered\trlqs admitted\tunder assignments\tbuckets built\tΣ max_tokens\tbound\theld\t\trls admitted\tbound\theld\t")
	yes := func(b bool) string {
		if b {
			return "yes"
		}
		return "NO"
	}
	for _, w := range res.Windows {
		rls := yes(w.RLSHeld)
		if w.RLSOpen > 0 {
			rls += fmt.Sprintf(" (+%d unasked)", w.RLSOpen)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t\t%d\t%d\t%s\t\n", sim.FormatDuration(w.StartMicros), w.Offered, w.Admitted, w.Assigned, w.Built, w.Tokens, w.Bound, yes(w.Held),
			w.RLSAdmitted, w.RLSBound, rls)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out)
	fmt.Fprintf(out, "totals: offered %d; RLQS admitted %d (%d without an active assignment); RLS admitted %d\n", res.Offered, res.Admitted, res.Fallback, res.RLSAdmitted)
	fmt.Fprintln(out, res.CallsText())
	_, err := fmt.Fprintln(out, res.BoundText())
	return err
}

// CSVHeader is the CSV output's header: one row per report interval and Envoy.
func CSVHeader() []string {
	return []string{"t_ms", "envoy", "offered", "rlqs_admitted", "rlqs_fallback", "rls_admitted", "state", "assigned", "max_tokens", "reports", "responses"}
}

// CSVRecord is r as a CSV row (assigned: the rate per period; -1 deny_all, -2 allow_all).
func (r Row) CSVRecord() []string {
	i := func(n int64) string { return strconv.FormatInt(n, 10) }
	return []string{sim.FormatMillis(r.StartMicros), r.Envoy, i(r.Offered), i(r.Admitted), i(r.Fallback), i(r.RLSAdmitted), r.State,
		i(r.Assigned), i(r.MaxTokens), i(r.Reports), i(r.Responses)}
}

type rowJSON struct {
	T           json.Number `json:"t_ms"`
	Envoy       string      `json:"envoy"`
	Offered     int64       `json:"offered"`
	Admitted    int64       `json:"rlqs_admitted"`
	Fallback    int64       `json:"rlqs_fallback"`
	RLSAdmitted int64       `json:"rls_admitted"`
	State       string      `json:"state"`
	Assignment  string      `json:"assignment"`
	Assigned    int64       `json:"assigned"`
	MaxTokens   int64       `json:"max_tokens"`
	Reports     int64       `json:"reports"`
	Responses   int64       `json:"responses"`
}

type windowJSON struct {
	T           json.Number `json:"t_ms"`
	Offered     int64       `json:"offered"`
	Admitted    int64       `json:"rlqs_admitted"`
	Assigned    int64       `json:"rlqs_under_assignments"`
	Fallback    int64       `json:"rlqs_fallback"`
	Built       int64       `json:"buckets_built"`
	Tokens      int64       `json:"max_tokens"`
	Bound       int64       `json:"bound"`
	Held        bool        `json:"held"`
	RLSAdmitted int64       `json:"rls_admitted"`
	RLSOpen     int64       `json:"rls_admitted_while_down"`
	RLSBound    int64       `json:"rls_bound"`
	RLSHeld     bool        `json:"rls_held"`
}

// MarshalJSON is the JSON output: {"rlqs":{...},"rls":{...},"envoys":[...],"timeline":[...],
// "windows":[...],"summary":{...}}.
func (res *Result) MarshalJSON() ([]byte, error) {
	o := res.Options
	ms := func(us int64) json.Number { return json.Number(sim.FormatMillis(us)) }
	type rlqsJSON struct {
		Limit          int64       `json:"limit"`
		Period         json.Number `json:"period_ms"`
		Burst          int64       `json:"burst"`
		Algorithm      string      `json:"algorithm"`
		ReportInterval json.Number `json:"report_interval_ms"`
		TTL            json.Number `json:"assignment_ttl_ms"`
		Latency        json.Number `json:"latency_ms"`
		NoAssignment   string      `json:"no_assignment"`
		Expired        string      `json:"expired"`
		KillAt         json.Number `json:"kill_at_ms,omitempty"`
		RestartAt      json.Number `json:"restart_at_ms,omitempty"`
	}
	type rlsJSON struct {
		Algorithm string      `json:"algorithm"`
		Limit     int64       `json:"limit"`
		Period    json.Number `json:"period_ms"`
		Burst     int64       `json:"burst"`
	}
	type summaryJSON struct {
		Offered     int64  `json:"offered"`
		Admitted    int64  `json:"rlqs_admitted"`
		Fallback    int64  `json:"rlqs_fallback"`
		RLSAdmitted int64  `json:"rls_admitted"`
		Reports     int64  `json:"rlqs_reports"`
		Responses   int64  `json:"rlqs_responses"`
		Streams     int64  `json:"rlqs_streams"`
		RLQSCalls   int64  `json:"rlqs_calls"`
		RLSCalls    int64  `json:"rls_calls"`
		RLSDown     int64  `json:"rls_calls_unanswered"`
		Held        bool   `json:"held"`
		RLSHeld     bool   `json:"rls_held"`
		Windows     int    `json:"windows"`
		Calls       string `json:"calls"`
		Bound       string `json:"bound"`
	}
	v := struct {
		RLQS     rlqsJSON     `json:"rlqs"`
		RLS      rlsJSON      `json:"rls"`
		Envoys   []string     `json:"envoys"`
		Timeline []rowJSON    `json:"timeline"`
		Windows  []windowJSON `json:"windows"`
		Summary  summaryJSON  `json:"summary"`
	}{Envoys: o.Envoys, Timeline: []rowJSON{}, Windows: []windowJSON{}}
	v.RLQS = rlqsJSON{o.Limit, ms(o.Period.Microseconds()), o.Burst, o.Algorithm, ms(res.IntervalMicros), ms(o.TTL.Microseconds()),
		ms(o.Latency.Microseconds()), string(o.NoAssignment), string(o.Expired), "", ""}
	if o.KillAt > 0 {
		v.RLQS.KillAt = ms(o.KillAt.Microseconds())
	}
	if o.RestartAt > 0 {
		v.RLQS.RestartAt = ms(o.RestartAt.Microseconds())
	}
	v.RLS = rlsJSON{"token-bucket", o.Limit, ms(o.Period.Microseconds()), o.Burst}
	P := o.Period.Microseconds()
	for _, r := range res.Rows {
		v.Timeline = append(v.Timeline, rowJSON{ms(r.StartMicros), r.Envoy, r.Offered, r.Admitted, r.Fallback, r.RLSAdmitted, r.State,
			r.AssignedText(P), r.Assigned, r.MaxTokens, r.Reports, r.Responses})
	}
	for _, w := range res.Windows {
		v.Windows = append(v.Windows, windowJSON{ms(w.StartMicros), w.Offered, w.Admitted, w.Assigned, w.Fallback, w.Built, w.Tokens, w.Bound, w.Held,
			w.RLSAdmitted, w.RLSOpen, w.RLSBound, w.RLSHeld})
	}
	v.Summary = summaryJSON{res.Offered, res.Admitted, res.Fallback, res.RLSAdmitted, res.Reports, res.Responses, res.Streams,
		res.RLQSCalls, res.RLSCalls, res.RLSDown, res.Held, res.RLSHeld, len(res.Windows), res.CallsText(), res.BoundText()}
	return json.Marshal(v)
}

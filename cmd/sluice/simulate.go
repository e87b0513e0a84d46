package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/sim"
	"github.com/spf13/cobra"
)

const simulateLong = `Run sluice's real limiter (the memory store and sluice.Limiter) on a virtual clock that
starts at 0, a window boundary, and show what it decides for each request. Nothing sleeps.

Policy: --limit N requests per --period D under --algorithm, or all five with --compare:
  fixed-window    at most N in each window of D, windows aligned to t=0
  sliding-log     at most N in any D
  sliding-window  at most N per D, the previous window weighted by its overlap with the last D
  token-bucket    a bucket of --burst tokens (0: N), refilled N per D
  leaky-bucket    a queue drained N per D with room for --burst waiting (0: none): it delays
                  requests while the queue has room, and refuses them only when it is full
--limit and --period (or --calendar, below) are required, but for a --workload's own. Only the two buckets take a --burst:
with --compare, the window algorithms run without it.

Calendar quotas, --calendar day|week|month|year instead of --period: fixed-window or
sliding-window counting by local midnights (ISO weeks from Monday, months from the 1st, years
from 1 January) in --time-zone NAME (an IANA zone, default UTC), through daylight-saving
changes: a day may last 23 or 25 hours. --compare with --calendar compares fixed-window and
sliding-window only: the other three algorithms have no calendar.
--start TIME (RFC 3339, e.g. 2026-03-28T23:00:00+01:00) is the instant the virtual clock's 0
stands for (default 1970-01-01T00:00:00Z): the traffic's times and a trace's t_ms count from
it. With --start or --calendar the output shows each row's local time (in the calendar's zone,
else --start's offset), and the calendar windows: the table marks the rows where a new window
begins, CSV and JSON add the fields time and window (the start of the row's calendar window).

Changes while it runs, --change t=D,limit=N,burst=N (repeated; limit or burst or both): from
virtual time D on, the policy has those numbers (with --compare, every algorithm's limit and
the buckets' burst), as a configuration reload would give it: a changed limit or burst keeps
what each key has used (a window's count, a bucket's units in use), taken over at D itself even
when no request comes then. The browser page's live mode records its changes so. One instance only (not with --instances, --store or
--local-budget).

Traffic, exactly one of:
  --traffic PATTERN  segments separated by ";", each starting where the previous one ended:
                       R/s for D   R requests a second for D, evenly spaced, the first at once
                                   (the i-th at floor(i/R s); R may have 3 decimals: 0.5/s)
                       N in D      N requests evenly spaced over D (the i-th at floor(i·D/N))
                       N at once   N requests at the same instant
                       idle D      no requests for D
                       R/min, R/h  R a minute or an hour (300/min for 5m)
                     D is a Go duration (10s, 1m30s, 250ms). Every request has key "k" and
                     cost 1; a simulation takes at most 1000000 requests.
                     Several clients: a segment that starts with NAME: begins that client's own
                     pattern at 0, its key NAME ("buggy: 600/min for 1m; normal: 20/min for 1m").
  --trace FILE       CSV with a header naming its columns: t_ms (required), key, cost, actual,
                     duration_ms. t_ms is milliseconds since the start with up to 3 decimals, in
                     time order; key defaults to "k", cost to 1 (0 peeks). actual, if given, is
                     the request's real cost, known once it was served (cost is then the
                     estimate charged up front): an approved request is settled with it at once,
                     the extra charged beyond the limit if need be, the rest refunded.
                     duration_ms, if given, is how long its response lasted (a model's streamed
                     answer; up to 3 decimals, empty for 0): an approved request then holds its
                     estimate until its response ends, and is settled then, before any request
                     at that instant — an LLM gateway's log replayed. Blank and #-comment lines
                     are skipped. "-" reads standard input.
  --workload NAME    a built-in LLM workload, its requests with estimates, real usage and
                     durations as a trace's, and its policy the default of --limit and --period:
                       llm-team  a team's key at 100,000 tokens a minute, for 5 minutes: 20
                                 chat requests a minute estimated at 4,500 tokens (max_tokens
                                 4,000 and the prompt), really 800-2,000, streaming 2-20 s; at
                                 2m an agent opens 30 streams at once; at 3m30s a long
                                 document estimated at 24,000 really uses 120,000 (40 s)

Local budgets, --local-budget N: the policy also runs on --instances instances (default 1)
sharing one store, the requests dealt to them in turn, each taking N units from the store at
once and spending them itself for at most --budget-max-age (default --period, or the calendar
window; for the window algorithms never beyond the window they were counted in), as sluice
serve does with a policy's local_budget. The table shows it beside the exact run, the approvals
per instance and the bound; CSV and JSON give the budgeted run with an instance column (a
"fleet" object in JSON). fixed-window, sliding-window and token-bucket take budgets;
sliding-log and leaky-bucket do not.

A fleet, --instances N --store separate|shared: the policy also runs on N instances behind a
load balancer, each with its own memory store (separate: each counts only the requests it sees,
as store: memory on several instances) or all on one store (shared: as on Redis), beside one
instance alone. --balance round-robin (default) deals the requests in turn, random to an
instance drawn from --draw N (default 1). The table ends with what passed to the backend per
instance and per client; JSON adds "per_instance":[{"instance":1,"summary":{...}},...] and
"per_client":[{"key":"buggy","summary":{...}},...]. With --store shared only:
  --store-latency D   each call to the store is a round trip of D: decisions are the same, and
                      each row's latency_ms says how much later it reaches the backend (a
                      --local-budget unit spent locally waits for none); the summary adds
                      max_latency_ms and total_latency_ms
  --outage FROM-TO    the store fails from one virtual time to the other (1m-2m), and each
                      instance answers with --on-error: open admits, closed (default) refuses
                      with no Retry-After, local decides on its own memory with 1/N of the
                      policy; those rows have a fallback field (open, local, closed), the
                      summary a "fallback" object counting them
--local-budget with --store shared spends budgets from the shared store. --compare with --store
runs every algorithm on the fleet (as the browser page's Instances and Store fields do).
` + simulateRegionsHelp + simulateEnvoysHelp + `
Output, --format:
  table  (default) for people: the policy, a timeline of offered, allowed, refused and delayed
         requests per second (wider buckets when the traffic is longer than a minute, at most
         60 rows; a column shows only when it has a count), and a summary per algorithm.
  csv    one row per request: t_ms,key,cost,allowed,remaining,retry_after_ms,delay_ms.
         --compare puts an algorithm column first, the rows of each algorithm in turn.
  json   {"policy":{...},"requests":[...],"summary":{...}} (and "streams":{...} with
         durations); --compare:
         {"runs":[{"algorithm":"fixed-window","policy":{...},"requests":[...],"summary":{...}},...]}

Fields (CSV columns and JSON keys alike; times in milliseconds, exact to the µs):
  t_ms            the request's virtual time
  key, cost       the request's client and cost
  allowed         true or false
  remaining       requests of cost 1 that could still pass at t_ms, after this one
  retry_after_ms  0 when allowed; when refused, the exact wait until the same request would
                  pass; -1 when its cost can never fit the policy
  delay_ms        how long an allowed request is held before it is served (leaky bucket)
  time            with --start or --calendar: the request's local time (RFC 3339)
  window          with --calendar: the local start of the calendar window it counted in
  instance        with --local-budget or --store: the instance that decided it, from 1
  fallback        with --outage: open, local or closed when the store was down, else empty
  latency_ms      with --store-latency: the request's wait for the shared store
  actual, balance with a trace's actual column: the real cost, and the remaining after the
                  settlement (never below 0: a client in debt is refused until it is paid off)
  end_ms          with durations (a duration_ms column, --workload): when the response ended
                  and the request was settled (its t_ms if refused: it had no response)
  in_flight,      with durations: the key's responses running once the request was decided
  reserved        (it included, if allowed), and the estimates they hold
  wait_ms         with durations: if the settlement left the key nothing, how long a request
                  of cost 1 had to wait then (an underestimate settled beyond the limit keeps
                  the balance below zero this long); 0 with --local-budget or --store
  policy          {"algorithm","limit","period_ms","burst"}, or with --calendar
                  {"algorithm","limit","calendar","time_zone","burst"}; with --start, "start"
                  beside it
  summary         offered, allowed, refused (offered - allowed, never included), delayed
                  (allowed with delay_ms > 0), never (cost can never fit), offered_cost,
                  allowed_cost, max_delay_ms, total_delay_ms; with actual costs also settled
                  (approved requests settled), settled_cost (their estimates), actual_cost
  streams         with durations, beside the summary: max_in_flight and max_reserved (the
                  most responses a key had running, and their estimates), waits (settlements
                  that left a wait_ms), max_wait_ms

Bad flags or input print one line on stderr and exit with code 2.`

const simulateExample = `  sluice simulate --compare --limit 5 --period 1s --burst 40 \
      --traffic "5/s for 10s; 40 in 1s; 5/s for 10s"
  sluice simulate --algorithm leaky-bucket --limit 5 --period 1s --burst 10 \
      --traffic "30 at once" --format csv
  sluice simulate --algorithm sliding-log --limit 100 --period 1m --trace requests.csv --format json
  sluice simulate --compare --workload llm-team
  sluice simulate --algorithm token-bucket --limit 100000 --period 1m --trace llm-log.csv --format csv
  sluice simulate --compare --limit 10 --calendar day --time-zone Europe/Berlin \
      --start 2026-03-28T22:00:00+01:00 --traffic "12 in 1h; idle 1h; 12 in 1h"
  sluice simulate --algorithm fixed-window --limit 100 --period 1m --instances 3 --store separate \
      --traffic "buggy: 600/min for 1m; normal: 20/min for 1m"
  sluice simulate --algorithm fixed-window --limit 100 --period 1m --instances 3 --store shared \
      --outage 1m-2m --on-error local --traffic "buggy: 5/s for 3m; normal: 20/min for 3m"` + simulateRegionsExample + simulateEnvoysExample

type simulateOptions struct {
	algorithm string
	limit     int64
	period    durationValue
	burst     int64
	traffic   string
	trace     string
	compare   bool
	format    string
	instances int64
	budget    int64
	maxAge    durationValue
	calendar  string
	timeZone  string
	start     string
	workload  string
	actual    []int64 // read with --trace or --workload: the real costs (nil: none)
	durations []int64 // read with --trace or --workload: the responses' durations in µs (nil: none)
	stores    string  // --store: separate or shared (see simulate_fleet.go)
	balance   string
	draw      uint64
	changes   []string // --change, as typed
	outage    string
	onError   string
	latency   durationValue
	regions   regionsFlags // --regions and its flags (simulate_regions.go)
	envoys    envoysFlags  // --envoys and its flags (simulate_envoys.go)
}

func newSimulateCommand(stdin io.Reader) *cobra.Command {
	var o simulateOptions
	cmd := &cobra.Command{
		Use:     "simulate [flags] (--traffic PATTERN | --trace FILE | --workload NAME)",
		Short:   "Show what a rate-limit policy decides for given traffic, on a virtual clock",
		Long:    simulateLong,
		Example: simulateExample,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("simulate takes no arguments, got %q (quote a pattern that has spaces: --traffic \"5/s for 10s\")", args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.run(cmd, stdin)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.algorithm, "algorithm", "", "the `NAME` of the algorithm (see above); required unless --compare")
	f.Var(int64Value{&o.limit}, "limit", "`N` requests (cost units) per period, > 0; required")
	f.Var(&o.period, "period", "the period `D` of the limit, a Go duration ≥ 1ms (1s, 500ms, 1m); required unless --calendar")
	f.StringVar(&o.calendar, "calendar", "", "count by the calendar `NAME` instead of --period: day, week, month or year (fixed-window and sliding-window)")
	f.StringVar(&o.timeZone, "time-zone", "", "with --calendar: the IANA time zone `NAME` of its days (default UTC), e.g. Europe/Berlin")
	f.StringVar(&o.start, "start", "", "the `TIME` the virtual clock starts at, RFC 3339 (default 1970-01-01T00:00:00Z)")
	f.Var(int64Value{&o.burst}, "burst", "token-bucket capacity or leaky-bucket queue room `N` (default 0: see above)")
	f.StringVar(&o.traffic, "traffic", "", "a traffic `PATTERN` such as \"5/s for 10s; 40 in 1s\" (see above)")
	f.StringVar(&o.trace, "trace", "", "a CSV trace `FILE` (see above); - reads standard input")
	f.StringVar(&o.workload, "workload", "", "a built-in LLM workload `NAME`: "+strings.Join(sim.WorkloadNames(), ", ")+" (see above)")
	f.BoolVar(&o.compare, "compare", false, "run all five algorithms with the same limit, period and burst")
	f.Var(int64Value{&o.budget}, "local-budget", "spend local budgets of `N` units taken from the shared store, beside the exact run (see above)")
	f.Var(int64Value{&o.instances}, "instances", "with --local-budget or --store: `N` instances (default 1)")
	f.Var(&o.maxAge, "budget-max-age", "with --local-budget: how long a budget may be spent from, a Go duration `D` ≥ 1ms (default --period, or the calendar window)")
	f.StringVar(&o.stores, "store", "", "run --instances instances behind a load balancer, each with its own memory store (`MODE` separate) or sharing one (shared)")
	f.StringVar(&o.balance, "balance", "round-robin", "with --store: how the load balancer deals the requests, `HOW`: round-robin or random")
	f.Uint64Var(&o.draw, "draw", 1, "with --balance random: the `N` its choices are drawn from; with --regions, the latencies")
	f.Var(&o.latency, "store-latency", "with --store shared: each call's round trip to the store, a Go duration `D` (e.g. 2ms): how much later requests reach the backend")
	f.StringVar(&o.outage, "outage", "", "with --store shared: the store fails from one virtual time to another, `FROM-TO` (Go durations: 1m-2m)")
	f.StringVar(&o.onError, "on-error", "closed", "with --outage: what each instance does while the store is down, `MODE` open, closed or local")
	f.StringArrayVar(&o.changes, "change", nil, "change the limit or the burst at a virtual time, `t=D,limit=N,burst=N` (repeat it; see above)")
	f.StringVar(&o.format, "format", "table", "the output `FORMAT`: table, csv or json")
	o.regions.add(cmd)
	o.envoys.add(cmd)
	f.SortFlags = false
	return cmd
}

// run checks the flags, reads the traffic, and writes the simulation in the chosen format.
func (o *simulateOptions) run(cmd *cobra.Command, stdin io.Reader) error {
	flags := cmd.Flags()
	if err := checkEnvoysFlags(flags.Changed); err != nil {
		return err
	}
	if flags.Changed("envoys") {
		switch o.format {
		case "table", "csv", "json":
		default:
			return fmt.Errorf("--format %s: want table, csv or json", o.format)
		}
		return o.runEnvoys(cmd)
	}
	if err := checkRegionsFlags(flags.Changed); err != nil {
		return err
	}
	changed, err := o.workloadPolicy(flags.Changed)
	if err != nil {
		return err
	}
	policies, err := o.policies(changed)
	if err != nil {
		return err
	}
	switch o.format {
	case "table", "csv", "json":
	default:
		return fmt.Errorf("--format %s: want table, csv or json", o.format)
	}
	if flags.Changed("regions") {
		return o.runRegions(cmd, policies[0])
	}
	reqs, source, err := o.requests(changed, stdin)
	if err != nil {
		return err
	}
	fleet, err := o.fleet(flags.Changed, policies)
	if err != nil {
		return err
	}
	start, err := o.startTime(flags.Changed)
	if err != nil {
		return err
	}
	changes, err := o.policyChanges(policies, fleet != nil)
	if err != nil {
		return err
	}
	out := &simulation{changes: changes, policies: policies, reqs: reqs, source: source, compare: o.compare, fleet: fleet, stores: flags.Changed("store"), actual: o.actual, durations: o.durations,
		start: start, local: flags.Changed("start") || flags.Changed("calendar")}
	if err := out.write(cmd.OutOrStdout(), o.format); err != nil {
		return failure{err}
	}
	return nil
}

// policyChanges returns the changes of --change in time order, each checked against every
// policy it changes (after the changes before it); not with a fleet, whose instances it does
// not reach.
func (o *simulateOptions) policyChanges(policies []sluice.Policy, fleet bool) ([]sim.Change, error) {
	if len(o.changes) > 0 && fleet {
		return nil, errors.New("--change applies to one instance: not with --instances, --store or --local-budget")
	}
	var cs []sim.Change
	for _, text := range o.changes {
		c, err := sim.ParseChange(text)
		if err != nil {
			return nil, fmt.Errorf("--change %s", err)
		}
		cs = append(cs, c)
	}
	slices.SortStableFunc(cs, func(a, b sim.Change) int { return cmp.Compare(a.TMicros, b.TMicros) })
	for _, p := range policies {
		for _, c := range cs {
			if p = c.Apply(p); p.Validate() != nil {
				return nil, fmt.Errorf("--change %s: %v: %v", c, p.Algorithm, p.Validate())
			}
		}
	}
	return cs, nil
}

// workloadPolicy gives --limit and --period a --workload's policy where they are not given,
// and returns changed as if they had been.
func (o *simulateOptions) workloadPolicy(changed func(string) bool) (func(string) bool, error) {
	if !changed("workload") {
		return changed, nil
	}
	w, ok := sim.WorkloadNamed(o.workload)
	if !ok {
		return nil, fmt.Errorf("--workload %s: want one of %s", o.workload, strings.Join(sim.WorkloadNames(), ", "))
	}
	if !changed("limit") {
		o.limit = w.Limit
	}
	if !changed("period") && !changed("calendar") {
		o.period = durationValue{w.Period, w.Period.String()}
	}
	return func(f string) bool {
		return changed(f) || f == "limit" || f == "period" && !changed("calendar")
	}, nil
}

// policies returns the policies to run (one, or five with --compare), checked flag by flag so
// that an error names the flag as typed.
func (o *simulateOptions) policies(changed func(string) bool) ([]sluice.Policy, error) {
	switch {
	case !changed("limit"):
		return nil, errors.New("--limit is required: the requests allowed per --period (e.g. --limit 5 --period 1s)")
	case o.limit <= 0:
		return nil, fmt.Errorf("--limit %d: must be > 0", o.limit)
	case o.limit > algorithm.MaxLimit:
		return nil, fmt.Errorf("--limit %d: must be ≤ 2^53 (%d)", o.limit, int64(algorithm.MaxLimit))
	case changed("calendar") || changed("time-zone"):
		return o.calendarPolicies(changed)
	case !changed("period"):
		return nil, errors.New("--period is required: the period of --limit, a Go duration such as 1s, 500ms or 1m (or --calendar day, week, month or year)")
	case o.period.d < algorithm.MinPeriod:
		return nil, fmt.Errorf("--period %s: must be ≥ 1ms", o.period.text)
	case o.period.d%time.Microsecond != 0:
		return nil, fmt.Errorf("--period %s: must be a whole number of microseconds", o.period.text)
	case o.burst < 0:
		return nil, fmt.Errorf("--burst %d: must be ≥ 0", o.burst)
	}
	var ps []sluice.Policy
	if o.compare {
		if changed("algorithm") {
			return nil, fmt.Errorf("--algorithm %s and --compare exclude each other: --compare runs all five algorithms", o.algorithm)
		}
		ps = sim.ComparePolicies(o.limit, o.period.d, o.burst)
	} else {
		if !changed("algorithm") {
			return nil, errors.New("--algorithm is required (fixed-window, sliding-log, sliding-window, token-bucket or leaky-bucket), or --compare to run them all")
		}
		a, err := sluice.ParseAlgorithm(o.algorithm)
		if err != nil {
			return nil, fmt.Errorf("--algorithm %s: %v", o.algorithm, err)
		}
		if a == sluice.Concurrency {
			return nil, errors.New("--algorithm concurrency: the simulator's requests take no time, so none is ever in flight; it runs the five rate algorithms")
		}
		if o.burst != 0 && !sim.TakesBurst(a) {
			return nil, fmt.Errorf("--burst %d: %v takes no burst (only token-bucket and leaky-bucket do)", o.burst, a)
		}
		ps = []sluice.Policy{{Algorithm: a, Limit: o.limit, Period: o.period.d, Burst: o.burst}}
	}
	for _, p := range ps {
		named := p
		named.Name = p.Algorithm.String() // only so that the message names it
		if err := named.Validate(); err != nil {
			return nil, err
		}
	}
	return ps, nil
}

// calendarPolicies returns the policies of --calendar and --time-zone (fixed-window or
// sliding-window; both with --compare), checked flag by flag; --limit is checked already.
func (o *simulateOptions) calendarPolicies(changed func(string) bool) ([]sluice.Policy, error) {
	if !changed("calendar") {
		return nil, fmt.Errorf("--time-zone %s needs --calendar: a period's windows are the same in every zone", o.timeZone)
	}
	c, err := sluice.ParseCalendar(o.calendar)
	if err != nil {
		return nil, fmt.Errorf("--calendar %s: want day, week, month or year", o.calendar)
	}
	if changed("period") {
		return nil, fmt.Errorf("--calendar %s and --period %s exclude each other: a calendar window's length is the calendar's", o.calendar, o.period.text)
	}
	var loc *time.Location
	if changed("time-zone") {
		if o.timeZone == "" || o.timeZone == "Local" {
			return nil, fmt.Errorf("--time-zone %q: want a zone name such as Europe/Berlin, America/New_York or UTC", o.timeZone)
		}
		if loc, err = time.LoadLocation(o.timeZone); err != nil {
			return nil, fmt.Errorf("--time-zone %s: not a known IANA time zone (e.g. Europe/Berlin, America/New_York, UTC)", o.timeZone)
		}
	}
	if o.compare {
		if changed("algorithm") {
			return nil, fmt.Errorf("--algorithm %s and --compare exclude each other: --compare runs fixed-window and sliding-window, the algorithms with a calendar", o.algorithm)
		}
		if o.burst != 0 {
			return nil, fmt.Errorf("--burst %d: with --calendar, --compare runs fixed-window and sliding-window, which take no burst", o.burst)
		}
		return sim.CalendarPolicies(o.limit, c, loc), nil
	}
	if !changed("algorithm") {
		return nil, errors.New("--algorithm is required (fixed-window or sliding-window, which count by the calendar), or --compare to run both")
	}
	a, err := sluice.ParseAlgorithm(o.algorithm)
	if err != nil {
		return nil, fmt.Errorf("--algorithm %s: %v", o.algorithm, err)
	}
	if a != sluice.FixedWindow && a != sluice.SlidingWindow {
		return nil, fmt.Errorf("--calendar %s: %v has no calendar (only fixed-window and sliding-window count by the calendar)", o.calendar, a)
	}
	if o.burst != 0 {
		return nil, fmt.Errorf("--burst %d: %v takes no burst (only token-bucket and leaky-bucket do)", o.burst, a)
	}
	p := sluice.Policy{Algorithm: a, Limit: o.limit, Calendar: c, Location: loc}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return []sluice.Policy{p}, nil
}

// instanceCount returns --instances, checked (1 without it).
func (o *simulateOptions) instanceCount(changed func(string) bool) (int, error) {
	if !changed("instances") {
		return 1, nil
	}
	if o.instances < 1 || o.instances > sim.MaxInstances {
		return 0, fmt.Errorf("--instances %d: must be from 1 to %d", o.instances, sim.MaxInstances)
	}
	return int(o.instances), nil
}

// startTime returns the instant of --start (zero without it: Unix time 0).
func (o *simulateOptions) startTime(changed func(string) bool) (time.Time, error) {
	if !changed("start") {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, o.start)
	if err != nil {
		return time.Time{}, fmt.Errorf("--start %s: want an RFC 3339 time such as 2026-03-28T23:00:00+01:00", o.start)
	}
	if t.Nanosecond()%1000 != 0 {
		return time.Time{}, fmt.Errorf("--start %s: must be a whole number of microseconds", o.start)
	}
	return t, nil
}

// fleet returns the fleet of --local-budget, --instances and --budget-max-age (nil without
// --local-budget), checked flag by flag.
func (o *simulateOptions) fleet(changed func(string) bool, policies []sluice.Policy) (*sim.Fleet, error) {
	if changed("store") {
		return o.storeFleet(changed, policies)
	}
	for _, f := range []string{"balance", "draw", "store-latency", "outage", "on-error"} {
		if changed(f) {
			return nil, fmt.Errorf("--%s needs --store separate or shared: it is about a fleet of instances behind a load balancer", f)
		}
	}
	return o.budgetFleet(changed, policies)
}

// budgetFleet returns the fleet of --local-budget, --instances and --budget-max-age (nil without
// --local-budget), checked flag by flag.
func (o *simulateOptions) budgetFleet(changed func(string) bool, policies []sluice.Policy) (*sim.Fleet, error) {
	if !changed("local-budget") {
		for _, f := range []string{"instances", "budget-max-age"} {
			if changed(f) {
				return nil, fmt.Errorf("--%s needs --local-budget (or --store): instances sharing one store without budgets decide exactly as one", f)
			}
		}
		return nil, nil
	}
	if o.compare {
		return nil, errors.New("--local-budget and --compare exclude each other: give one --algorithm (fixed-window, sliding-window or token-bucket)")
	}
	p := policies[0]
	f := sim.Fleet{Instances: 1, Budget: sluice.LocalBudget{Size: o.budget, MaxAge: p.Period}}
	if p.Calendar != sluice.NoCalendar {
		// A budget never outlives its window anyway: by default, only that bounds it.
		f.Budget.MaxAge = longestWindow[p.Calendar]
	}
	var err error
	if f.Instances, err = o.instanceCount(changed); err != nil {
		return nil, err
	}
	if changed("budget-max-age") {
		if o.maxAge.d < time.Millisecond {
			return nil, fmt.Errorf("--budget-max-age %s: must be ≥ 1ms", o.maxAge.text)
		}
		f.Budget.MaxAge = o.maxAge.d
	}
	switch {
	case o.budget < 1:
		return nil, fmt.Errorf("--local-budget %d: must be > 0", o.budget)
	case o.budget > p.Capacity():
		return nil, fmt.Errorf("--local-budget %d: must be ≤ the policy's capacity %d (its limit, or a token bucket's burst)", o.budget, p.Capacity())
	}
	if err := f.Budget.Validate(p); err != nil {
		return nil, fmt.Errorf("--local-budget: %s", strings.TrimPrefix(err.Error(), sluice.ErrInvalidPolicy.Error()+": policy: "))
	}
	return &f, nil
}

// requests reads the traffic of --traffic or --trace, and describes where it came from.
func (o *simulateOptions) requests(changed func(string) bool, stdin io.Reader) ([]sim.Request, string, error) {
	switch {
	case changed("traffic") && changed("trace"), changed("workload") && (changed("traffic") || changed("trace")):
		return nil, "", errors.New("--traffic, --trace and --workload exclude each other: give one")
	case changed("workload"):
		w, _ := sim.WorkloadNamed(o.workload) // known: workloadPolicy checked it
		tr := w.Trace()
		o.actual, o.durations = tr.Actual, tr.Durations
		return tr.Requests, "workload " + w.Name + ": " + w.Description, nil
	case changed("traffic"):
		reqs, err := sim.ParseClientTraffic(o.traffic)
		if err != nil {
			return nil, "", err
		}
		if len(reqs) == 0 {
			return nil, "", fmt.Errorf("--traffic %q makes no requests", o.traffic)
		}
		return reqs, sim.NormalizePattern(o.traffic), nil
	case changed("trace"):
		var r io.Reader = stdin
		name := "standard input"
		if o.trace != "-" {
			f, err := os.Open(o.trace)
			if err != nil {
				return nil, "", fmt.Errorf("--trace: %v", err)
			}
			defer f.Close()
			r, name = f, o.trace
		}
		if r == nil {
			return nil, "", errors.New("--trace -: no standard input")
		}
		tr, err := sim.ReadTrace(r)
		o.actual, o.durations = tr.Actual, tr.Durations // nil: the trace has no such column
		if err != nil {
			return nil, "", err
		}
		reqs := tr.Requests
		if len(reqs) == 0 {
			return nil, "", fmt.Errorf("--trace %s: the trace has no requests", o.trace)
		}
		return reqs, "trace " + name, nil
	}
	return nil, "", errors.New(`want --traffic PATTERN, --trace FILE or --workload NAME (e.g. --traffic "5/s for 10s; 40 in 1s")`)
}

// int64Value is a flag holding a whole number, with a short error message.
type int64Value struct{ n *int64 }

func (v int64Value) String() string {
	if v.n == nil {
		return "0"
	}
	return strconv.FormatInt(*v.n, 10)
}

func (v int64Value) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return errors.New("want a whole number")
	}
	*v.n = n
	return nil
}

func (int64Value) Type() string { return "int" }

// durationValue is a flag holding a duration, and the text it was given as, so that errors
// quote what was typed.
type durationValue struct {
	d    time.Duration
	text string
}

func (v *durationValue) String() string {
	if v.text == "" {
		return ""
	}
	return v.text
}

func (v *durationValue) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return errors.New("want a duration such as 1s, 500ms or 1m")
	}
	v.d, v.text = d, s
	return nil
}

func (*durationValue) Type() string { return "duration" }

// longestWindow is the longest window of each calendar in any zone (a day of 25 hours, a leap
// year's): a local budget's default max_age, so that only the window's end bounds it.
var longestWindow = map[sluice.Calendar]time.Duration{
	sluice.Day: 25 * time.Hour, sluice.Week: 7*24*time.Hour + time.Hour,
	sluice.Month: 31*24*time.Hour + time.Hour, sluice.Year: 366*24*time.Hour + time.Hour,
}

package main

import (
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/sim/envoys"
)

// The Envoys mode of simulate (--envoys): Envoys on the Rate Limit Quota Service beside the same
// Envoys on per-request RLS, on the same traffic (package sim/envoys).
const simulateEnvoysHelp = `
Envoys, --envoys N (or names, e1,e2,e3): N Envoys with the rate_limit_quota filter on sluice's
Rate Limit Quota Service (RLQS, rls.quota; docs/envoy.md, "Quota by demand: RLQS"), beside the
same Envoys asking sluice per request (RLS), on the same --traffic. One bucket rule, --limit per
--period (whole seconds), --burst tokens in all (default the limit): on RLQS, each Envoy decides
its requests locally from a token bucket the service assigns it, reports its usage every
--report-interval, and the service splits the limit between the Envoys by their demand; on RLS,
every request is decided by sluice's memory store under a token bucket of the same numbers.
The --traffic is one pattern every Envoy makes, or each Envoy's own ("e1: 30/s for 2m; e2: 10/s
for 2m"); a demand that moves makes the assignments follow it. --algorithm does not apply.
  --report-interval D    how often each Envoy reports (default 5s, Envoy's fixed timer)
  --assignment-ttl D     an assignment's time to live (default 3 report intervals; ≥ 2)
  --envoy-latency D      the one-way latency between an Envoy and sluice, on every report,
                         response and RLS request (at most a quarter report interval and 1s)
  --no-assignment B      the Envoys' no_assignment_behavior: allow (default, Envoy's) or deny
  --expired B            their expired_assignment_behavior: no-assignment (default: back to
                         no_assignment_behavior), allow, deny or reuse (reuse_last_assignment)
  --ledger-algorithm A   the service's split: fair (default) or proportional
  --kill-at T            the service dies at virtual time T: the streams break and its memory
                         ledgers are lost; the Envoys' assignments expire after their TTL (RLS
                         requests meanwhile are admitted: failure_mode_deny false)
  --restart-at T         the service comes back at T (after --kill-at): a new ledger learns for
                         a TTL and a second before it hands out quota
The output is per report interval and Envoy: the requests offered, admitted on RLQS (of them
without an active assignment: a new bucket's first request, or the no-assignment or expired
behaviour), admitted on RLS, the Envoy's bucket state and assignment at the interval's end (its
rate per period × its token bucket's size), and the reports it sent and responses it got. Then,
per window of --period: the offered, RLQS admitted and those under assignments, Σ max_tokens of
the token buckets held at the window's start or built in it, the bound L + Σ max_tokens, and RLS
admitted beside its bound B + L. Then the totals, the calls to the service (RLQS: reports and
responses; RLS: one per request), and the last line states both bounds with their numbers and
whether they held in every window. CSV: one row per interval and Envoy,
t_ms,envoy,offered,rlqs_admitted,rlqs_fallback,rls_admitted,state,assigned,max_tokens,reports,
responses; JSON: {"rlqs":{...},"rls":{...},"envoys":[...],"timeline":[...],"windows":[...],
"summary":{"held":true,"rls_held":true,"rlqs_calls":..,"rls_calls":..,"bound":"...",...}}.
`

const simulateEnvoysExample = `
  sluice simulate --envoys 3 --limit 1800 --period 1m --burst 300 --envoy-latency 10ms \
      --traffic "e1: 30/s for 2m; 5/s for 2m; e2: 10/s for 4m; e3: 5/s for 2m; 30/s for 2m"`

// envoysFlags are simulate's flags of the Envoys mode.
type envoysFlags struct {
	envoys       string
	interval     durationValue
	ttl          durationValue
	latency      durationValue
	noAssignment string
	expired      string
	killAt       durationValue
	restartAt    durationValue
}

func (e *envoysFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&e.envoys, "envoys", "", "simulate `N` Envoys (or names e1,e2) on RLQS beside per-request RLS (see above)")
	f.Var(&e.interval, "report-interval", "with --envoys: each Envoy's report interval `D` (default 5s)")
	f.Var(&e.ttl, "assignment-ttl", "with --envoys: an assignment's time to live `D` (default 3 report intervals)")
	f.Var(&e.latency, "envoy-latency", "with --envoys: the one-way latency `D` between an Envoy and sluice")
	f.StringVar(&e.noAssignment, "no-assignment", "allow", "with --envoys: no_assignment_behavior `B`, allow or deny")
	f.StringVar(&e.expired, "expired", "no-assignment", "with --envoys: expired_assignment_behavior `B`, no-assignment, allow, deny or reuse")
	f.Var(&e.killAt, "kill-at", "with --envoys: the service dies at virtual time `T`")
	f.Var(&e.restartAt, "restart-at", "with --envoys: the service restarts at virtual time `T`")
}

// envoysOnly are the flags that only the Envoys mode takes; envoysNot those it does not.
var (
	envoysOnly = []string{"report-interval", "assignment-ttl", "envoy-latency", "no-assignment", "expired", "kill-at", "restart-at"}
	envoysNot  = append([]string{"regions", "algorithm", "refresh", "lease", "ledger-latency", "floor", "safe-share", "partition",
		"flush-ledger", "draw"}, regionsNot...)
)

// checkEnvoysFlags answers an error naming a flag used in the wrong mode.
func checkEnvoysFlags(changed func(string) bool) error {
	if changed("envoys") {
		for _, f := range envoysNot {
			if changed(f) {
				return fmt.Errorf("--%s does not apply with --envoys", f)
			}
		}
		return nil
	}
	for _, f := range envoysOnly {
		if changed(f) {
			return fmt.Errorf("--%s applies with --envoys only", f)
		}
	}
	return nil
}

// runEnvoys runs the Envoys mode: the rule of --limit, --period and --burst, the Envoys'
// --traffic.
func (o *simulateOptions) runEnvoys(cmd *cobra.Command) error {
	e := &o.envoys
	changed := cmd.Flags().Changed
	switch {
	case !changed("limit"):
		return errors.New("--limit is required: the requests the bucket admits per --period, across the Envoys (e.g. --limit 1800 --period 1m)")
	case !changed("period"):
		return errors.New("--period is required: the period of --limit, in whole seconds (e.g. 1m)")
	case !changed("traffic"):
		return errors.New(`--envoys needs --traffic: one pattern every Envoy makes ("10/s for 1m"), or each Envoy's own ("e1: 10/s for 1m; e2: 5/s for 1m")`)
	case o.burst < 0:
		return fmt.Errorf("--burst %d: must be > 0", o.burst)
	}
	for _, d := range []struct {
		name string
		v    durationValue
		zero bool // 0 is allowed
	}{{"report-interval", e.interval, false}, {"assignment-ttl", e.ttl, false}, {"envoy-latency", e.latency, true},
		{"kill-at", e.killAt, false}, {"restart-at", e.restartAt, false}} {
		if changed(d.name) && (d.v.d < 0 || (d.v.d == 0 && !d.zero)) {
			return fmt.Errorf("--%s %s: must be > 0", d.name, d.v.text)
		}
	}
	if changed("burst") && o.burst == 0 {
		return errors.New("--burst 0: must be > 0 (default: the limit)")
	}
	na, ok := envoys.ParseBehavior(e.noAssignment, false)
	if !ok {
		return fmt.Errorf("--no-assignment %s: want allow or deny", e.noAssignment)
	}
	ex, ok := envoys.ParseBehavior(e.expired, true)
	if !ok {
		return fmt.Errorf("--expired %s: want no-assignment, allow, deny or reuse", e.expired)
	}
	names, err := envoys.Names(e.envoys)
	if err != nil {
		return errors.New(err.(*envoys.OptionError).Flag())
	}
	reqs, err := envoys.Traffic(o.traffic, names)
	if err != nil {
		return errors.New(err.(*envoys.OptionError).Flag())
	}
	opts := envoys.Options{Envoys: names, Requests: reqs, Limit: o.limit, Period: o.period.d, Burst: o.burst,
		ReportInterval: e.interval.d, TTL: e.ttl.d, Algorithm: o.regions.algorithm, Latency: e.latency.d,
		NoAssignment: na, Expired: ex, KillAt: e.killAt.d, RestartAt: e.restartAt.d}
	res, err := envoys.Run(opts)
	if err != nil {
		var oe *envoys.OptionError
		if errors.As(err, &oe) {
			return fmt.Errorf("--%s: %s", oe.Field, oe.Message)
		}
		return fmt.Errorf("--envoys: %v", strings.TrimPrefix(err.Error(), "envoys: "))
	}
	out := cmd.OutOrStdout()
	switch o.format {
	case "csv":
		w := csv.NewWriter(out)
		_ = w.Write(envoys.CSVHeader())
		for _, row := range res.Rows {
			_ = w.Write(row.CSVRecord())
		}
		w.Flush()
		err = w.Error()
	case "json":
		err = json.NewEncoder(out).Encode(res)
	default:
		err = res.WriteTable(out)
	}
	if err != nil {
		return failure{err}
	}
	return nil
}

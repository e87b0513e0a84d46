package main

import (
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/sim/regions"
)

// The regions mode of simulate (--regions): a global policy across regions, each enforcing its
// allotment from a ledger over a link with a latency (package sim/regions).
const simulateRegionsHelp = `
Regions, --regions eu,us,ap: a global policy (global: true) of --limit per --period worldwide
across those regions, as sluice serve runs it with a region section (docs/design.md, "Limits
across regions: the ledger"): each region decides its own requests on its own store, enforcing
its allotment, which its refresher takes from the ledger every --refresh; the ledger splits the
limit by the regions' demand. The --traffic names each region's own pattern, the region as the
client ("eu: 70/s for 1m; 10/s for 1m; us: 20/s for 2m; ap: 10/s for 1m; 70/s for 1m"); a
demand that moves makes the allotments follow it. fixed-window, sliding-window or token-bucket.
  --refresh D            each region's refresh interval (default 5s)
  --lease D              how long a grant holds without a refresh (default 3 refreshes; ≥ 2)
  --ledger-latency D     the one-way latency to the ledger, or MIN-MAX (50ms-150ms): each
                         message draws its own from --draw (at most a quarter refresh)
  --floor F              what a region enforces before its first grant, the least it keeps, as
                         a fraction of the limit (0 … 1/regions; default 1/(2·regions), as
                         sluice serve's region.floor)
  --safe-share F         what a region cut off enforces once its lease ran out, a fraction of
                         the limit (0 … 1; default the floor)
  --ledger-algorithm A   the ledger's split: fair (default) or proportional
  --partition R@FROM-TO  region R is cut off from the ledger from one virtual time to another
                         (eu@30s-60s; repeat it): it keeps its lease, then the safe share
  --flush-ledger T       the ledger loses its state at virtual time T (repeat it): it learns
                         for a lease and the hold, handing out no new quota
  --draw N               the number the latencies are drawn from (default 1): the same N,
                         the same output
The output is per refresh interval and region: the demand last reported (want, per period;
while cut off, the report it could not deliver), the allotment enforced at the interval's end,
the requests offered, admitted and refused in it, and flags (cut: its link was cut; safe-share:
its lease ran out; learning: its grant came from a ledger whose state is new, at the start or
after a flush; floor: no grant yet). Then, per window of --period, what every region admitted,
the worldwide sum and its bound: the limit L while the ledger is reachable or learning (a
bucket: its capacity C + L), plus k·max(0, S − F) for the k regions cut off in the window or the
one before; the last line states the bound with its numbers and whether it held in every
window. CSV: one row per interval and region,
t_ms,region,want,allotment,offered,admitted,refused,cut,safe_share,learning,floor; JSON:
{"policy":{...},"ledger":{...},"regions":[...],"partitions":[...],"flushes_ms":[...],
"timeline":[...],"windows":[{"t_ms":0,"admitted":..,"per_region":[..],"bound":..,"cut_off":0,
"held":true},...],"summary":{"held":true,"bound":"...",...}}.
`

const simulateRegionsExample = `
  sluice simulate --regions eu,us,ap --algorithm fixed-window --limit 6000 --period 1m \
      --ledger-latency 50ms-150ms --partition eu@2m30s-3m30s --flush-ledger 4m30s \
      --traffic "eu: 70/s for 2m; 10/s for 4m; us: 20/s for 6m; ap: 10/s for 2m; 70/s for 4m"`

// regionsFlags are simulate's flags of the regions mode.
type regionsFlags struct {
	regions    string
	refresh    durationValue
	lease      durationValue
	latency    string
	floor      float64
	safe       float64
	algorithm  string
	partitions []string
	flushes    []string
}

func (r *regionsFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&r.regions, "regions", "", "simulate a global policy across the regions `NAMES` (eu,us,ap), each its own --traffic client (see above)")
	f.Var(&r.refresh, "refresh", "with --regions: each region's refresh interval `D` (default 5s)")
	f.Var(&r.lease, "lease", "with --regions: a grant's lease `D` (default 3 refreshes)")
	f.StringVar(&r.latency, "ledger-latency", "", "with --regions: the one-way latency to the ledger, `D` or MIN-MAX (50ms-150ms)")
	f.Float64Var(&r.floor, "floor", 0, "with --regions: a region's floor, a fraction `F` of the limit (0 … 1/regions; default 1/(2·regions), as serve's)")
	f.Float64Var(&r.safe, "safe-share", 0, "with --regions: the safe share of a region cut off, a fraction `F` of the limit (default the floor)")
	f.StringVar(&r.algorithm, "ledger-algorithm", "fair", "with --regions or --envoys: the ledger's split, `NAME` fair or proportional")
	f.StringArrayVar(&r.partitions, "partition", nil, "with --regions: cut region R off the ledger, `R@FROM-TO` (eu@30s-60s; repeat it)")
	f.StringArrayVar(&r.flushes, "flush-ledger", nil, "with --regions: the ledger loses its state at virtual time `T` (repeat it)")
}

// regionsOnly are the flags that only the regions mode takes; regionsNot those it does not.
var (
	regionsOnly = []string{"refresh", "lease", "ledger-latency", "floor", "safe-share", "ledger-algorithm", "partition", "flush-ledger"}
	regionsNot  = []string{"compare", "trace", "workload", "calendar", "time-zone", "start", "local-budget", "instances", "budget-max-age",
		"store", "balance", "store-latency", "outage", "on-error", "change"}
)

// checkRegionsFlags answers an error naming a flag used in the wrong mode.
func checkRegionsFlags(changed func(string) bool) error {
	if changed("regions") {
		for _, f := range regionsNot {
			if changed(f) {
				return fmt.Errorf("--%s does not apply with --regions", f)
			}
		}
		return nil
	}
	for _, f := range regionsOnly {
		if changed(f) {
			return fmt.Errorf("--%s applies with --regions only", f)
		}
	}
	return nil
}

// runRegions runs the regions mode: the policy of --algorithm, --limit, --period and --burst
// (policies checked them), the regions' --traffic.
func (o *simulateOptions) runRegions(cmd *cobra.Command, p sluice.Policy) error {
	r := &o.regions
	opts := regions.Options{Policy: p, Refresh: r.refresh.d, Lease: r.lease.d, Floor: r.floor, SafeShare: r.safe, Algorithm: r.algorithm, Draw: o.draw}
	changed := cmd.Flags().Changed
	switch {
	case !changed("traffic"):
		name, _, _ := strings.Cut(r.regions, ",")
		return fmt.Errorf(`--regions needs --traffic with each region's pattern (e.g. --traffic "%s: 10/s for 1m")`, strings.TrimSpace(name))
	case changed("refresh") && r.refresh.d <= 0:
		return fmt.Errorf("--refresh %s: must be > 0", r.refresh.text)
	case changed("lease") && r.lease.d <= 0:
		return fmt.Errorf("--lease %s: must be > 0", r.lease.text)
	}
	text := regions.Text{Regions: r.regions, Traffic: o.traffic, Latency: r.latency, Partitions: r.partitions, Flushes: r.flushes}
	if err := text.Apply(&opts); err != nil {
		return errors.New(err.(*regions.OptionError).Flag())
	}
	if !changed("floor") {
		opts.Floor = config.DefaultFloor(len(opts.Regions)) // serve's
	}
	res, err := regions.Run(opts)
	if err != nil {
		return fmt.Errorf("--regions: %v", strings.TrimPrefix(err.Error(), "regions: "))
	}
	out := cmd.OutOrStdout()
	switch o.format {
	case "csv":
		w := csv.NewWriter(out)
		_ = w.Write(regions.CSVHeader())
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

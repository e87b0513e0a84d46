#!/usr/bin/env bash
# The limits-across-regions benchmark (issue 34): sluice's global policy beside the same policy
# per region and beside Gubernator's GLOBAL behaviour, in the same harness and traffic
# (bench/regionsload, internal/regiontest):
#
#   bash scripts/bench-regions.sh
#   ROUNDS=5 WINDOWS=6 bash scripts/bench-regions.sh     # longer
#   FROM=dir bash scripts/bench-regions.sh               # the table again from a kept run
#
# What runs, for each target, in every round:
#   - three regions on loopback; for sluice each has its own redis-server and two `sluice serve`
#     (go build ./cmd/sluice) pooled on it, and reaches the ledger's redis-server through a
#     netfault link of its own adding 50–150 ms each way (uniform), refresh 500ms, lease 2s,
#     floor 0.1; for Gubernator v2.13.0 (built as internal/peertest does, three instances, GLOBAL)
#     each instance advertises a netfault link with the same 50–150 ms to its peers, so the
#     instances' calls to each other cross the same latency;
#   - one policy: a fixed window of LIMIT (300) per PERIOD (3s), key_by: [] (one counter);
#   - the load: twice the limit a period, split 70/20/10 between the regions for WARMUP (3)
#     windows and WINDOWS (4) measured ones, then 10/20/70 for WINDOWS more (measured); each
#     region's requests go to its own instances in turn (sluice) or to its own instance (Gubernator,
#     then to the upstream if admitted); 4 senders a region, paced.
#   The targets: global (sluice, global: true), region (sluice, the same policy without global:
#   each region enforces LIMIT itself, the same processes and path without the ledger — the
#   latency baseline; the world then admits what the demands allow), gubernator.
#
# Rounds: ROUNDS (3) interleaved rounds of global, region, gubernator. The table gives, per
# target, the most admitted worldwide in any measured window (over all rounds) and its ratio to
# the limit, how many measured windows admitted more than the limit, the mean admissions a window
# over the limit (the share used; above 100% what passed it), and the medians over the rounds of the time the
# target adds to a request (p50 and p99 of every request through it, less the median of direct calls
# to the upstream made meanwhile: their median, 10 a second being too few for their own p99);
# then p99(global)/p99(region), the goal ≤ 1.1×.
# Everything shares the machine's CPUs: run it on an otherwise idle machine (the load average
# before and after is printed). REGIONS_OUT=dir keeps every round's JSON line and run.txt there.
set -euo pipefail
KEEP_OUT=${REGIONS_OUT:-}
. "$(dirname "$0")/bench-lib.sh" # log, die, $work (removed on exit)
cd "$(dirname "$0")/.."
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
	export PATH="/usr/local/go/bin:$PATH"
fi

ROUNDS=${ROUNDS:-3}
LIMIT=${LIMIT:-300}
PERIOD=${PERIOD:-3s}
WARMUP=${WARMUP:-3}
WINDOWS=${WINDOWS:-4}
TARGETS=${TARGETS:-global region gubernator}

# table DIR prints the table from DIR's TARGET.json (one JSON line a round) and run.txt.
table() {
	local dir=$1
	echo
	cat "$dir/run.txt" 2>/dev/null || echo "(no run.txt in $dir)"
	echo
	python3 - "$dir" <<'EOF'
import json, os, statistics, sys
d = sys.argv[1]
rows, p99 = [], {}
names = {"global": "sluice, `global: true`", "region": "sluice, region-only (each region `L`)", "gubernator": "Gubernator v2.13.0, GLOBAL"}
for t in ["global", "region", "gubernator"]:
    f = os.path.join(d, t + ".json")
    if not os.path.exists(f):
        continue
    rs = [json.loads(l) for l in open(f) if l.strip()]
    if not rs:
        continue
    most = max(r["max"] for r in rs)
    limit = rs[0]["limit"]
    med = lambda k: statistics.median(r[k] for r in rs)
    # added: a quantile of the requests through the target less the direct calls' median
    for r in rs:
        r["added_p50_us"] = max(0, r["p50_us"] - r["direct_p50_us"])
        r["added_p99_us"] = max(0, r["p99_us"] - r["direct_p50_us"])
    p99[t] = med("added_p99_us")
    errs = sum(r["errors"] for r in rs)
    ws = [n for r in rs for n in r["world"]]
    over = sum(1 for n in ws if n > limit)
    rows.append(f"| {names[t]} | {len(rs)} | {most} / {limit} ({most/limit:.2f}×) | {over} of {len(ws)} | {100*med('used'):.1f}% | "
                f"{med('added_p50_us')/1000:.2f} ms | {med('added_p99_us')/1000:.2f} ms | {errs} |")
print("| target | rounds | most admitted worldwide in a window / L | windows over L | admitted a window / L (mean; median of rounds) | adds p50 | adds p99 | errors |")
print("|---|---|---|---|---|---|---|---|")
print("\n".join(rows))
if "global" in p99 and "region" in p99 and p99["region"] > 0:
    r = p99["global"] / p99["region"]
    print(f"\np99 added, global / region-only: {r:.2f}× (goal ≤ 1.1×: {'met' if r <= 1.1 else 'not met'})")
EOF
}

if [ -n "${FROM:-}" ]; then
	table "$FROM"
	exit 0
fi

command -v redis-server >/dev/null || die "redis-server is needed"
log "building sluice and bench/regionsload"
go build -o "$work/sluice" ./cmd/sluice
go build -o "$work/regionsload" ./bench/regionsload
load_before=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)
for round in $(seq "$ROUNDS"); do
	for t in $TARGETS; do
		log "round $round/$ROUNDS: $t"
		"$work/regionsload" -target "$t" -bin "$work/sluice" -limit "$LIMIT" -period "$PERIOD" \
			-warmup "$WARMUP" -windows "$WINDOWS" >>"$work/$t.json" 2>>"$work/$t.log" ||
			{ tail -20 "$work/$t.log" >&2; die "regionsload -target $t failed"; }
		tail -1 "$work/$t.log" >&2
	done
done
cpu=$(awk -F': *' '/^model name/ {print $2; exit}' /proc/cpuinfo 2>/dev/null || true)
{
	echo "Command: ROUNDS=$ROUNDS LIMIT=$LIMIT PERIOD=$PERIOD WARMUP=$WARMUP WINDOWS=$WINDOWS bash scripts/bench-regions.sh"
	echo "Machine: $(nproc) CPUs, ${cpu:-unknown CPU}; $(uname -sr); $(go version | cut -d' ' -f3); redis $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p');" \
		"load average before: $load_before, after: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)."
} >"$work/run.txt"
table "$work"

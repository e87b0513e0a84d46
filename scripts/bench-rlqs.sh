#!/usr/bin/env bash
# Envoy's quota service (RLQS) against per-request RLS (issue 35): the same traffic decided by
# Envoys on sluice's Rate Limit Quota Service (StreamRateLimitQuotas: each Envoy decides locally
# from a token bucket assignment and reports its usage every report interval) and by a call per
# request to a rate limit service (ShouldRateLimit: sluice's and envoyproxy/ratelimit's), on one
# Redis; what each decision costs the service.
#
#   bash scripts/bench-rlqs.sh
#   ROUNDS=5 RATE=10000 bash scripts/bench-rlqs.sh     # more rounds; RLQS at a fixed rate
#   FROM=dir bash scripts/bench-rlqs.sh                # the tables again from a kept run
#
# What runs:
#   - one redis-server on a free loopback port, flushed (FLUSHALL) before every round;
#   - envoyproxy/ratelimit, built and run as scripts/bench-rls.sh does (internal/peertest's pinned
#     version, its throughput advice, stats and local cache off; PEER_ENV="K=V ..." adds settings);
#   - sluice serve (go build ./cmd/sluice) with store: {type: redis} on that Redis and rls: with
#     both envoy_config (the same file as the peer's) and quota, on one gRPC listener;
#   - the limit, the same in both protocols: VALUES (10) users, LIMIT (500) a second each.
#       RLS: the Envoy file's rule {key: user, rate_limit: {unit: second, requests_per_unit:
#            LIMIT}} (value-less: one counter per user), each decision one ShouldRateLimit of the
#            descriptor [{user, value-I}] (bench/rlsload, as is);
#       RLQS: rls.quota's rule {name: api, match: {name: api, user: "*"}, limit: LIMIT,
#            period: 1s} (one bucket per user, its limit split between the Envoys that report it),
#            each decision one Decide of the bucket id {name: api, user: value-I} by one of
#            ENVOYS (10) simulated Envoys (bench/rlqsload: internal/rlqstest Filters, in the load
#            generator's process, each one stream), reporting every REPORT_INTERVAL (1s; Envoy's
#            filter reports every 5s: at 5s the service does a fifth of the work shown here).
#     I is drawn uniformly; at R decisions a second, about 1 − VALUES·LIMIT/R are refused.
#
# Rounds: ROUNDS (3) interleaved rounds, each of four targets, Redis flushed before each:
#   rls-peer    rlsload against envoyproxy/ratelimit: CONCURRENCY (64) callers on CONNS (1)
#               connection(s), a closed loop (each call as soon as the last is answered);
#   rls-sluice  the same against sluice;
#   rlqs        rlqsload against sluice at the same offered rate as this round's rls-sluice measured
#               (RATE=match, the default; RATE=N fixes it): the same traffic, paced;
#   rlqs-max    rlqsload as fast as the Envoys decide (a closed loop of CONCURRENCY callers): the
#               decisions/s are the load generator's own ceiling, the service is not on the path.
# then MEMORY_ROUNDS (1) of rls-sluice-memory and rlqs-memory (the same rate) against sluice on its
# memory store (store: {type: memory}: the quota's ledgers in memory too). Each is WARMUP (2s)
# then DURATION (10s); an RLQS warm-up lasts until every Envoy holds an assignment for each of its
# buckets (a new ledger is in learning mode for the assignment's time to live and a second, in
# which the Envoys allow all, Envoy's no_assignment_behavior by default), then 2s more (rlqsload
# -settle: an assignment's token bucket starts full, and that burst is not the steady rate).
#
# The table gives each target's medians over its rounds: decisions/s, admitted/s, the refused
# share (and the one the limit implies at that rate), the CPU time (utime+stime of
# /proc/PID/stat over the measured window, read by the load generators' -cpu) of the server per
# decision and per admitted request, of Redis and of the load generator per decision, and the
# calls to the service per 1000 decisions (RLS: one a decision; RLQS: the Envoys' reports); then
# the ratios. /proc/PID/stat counts in 10 ms ticks: the server's CPU over an RLQS round is a few
# ticks, printed beside the table in ms.
# The load generator shares the CPUs with the servers and Redis (the Envoys of RLQS are in it:
# their decisions are its CPU, not the service's): run it on an otherwise idle machine (the load
# average before and after is printed). RLQS_OUT=dir keeps every round's JSON line, the run's
# description and the servers' logs there.
set -euo pipefail
KEEP_OUT=${RLQS_OUT:-}
. "$(dirname "$0")/bench-lib.sh" # log, die, $work and $pids (stopped on exit), stop, free_port
cd "$(dirname "$0")/.."
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
	export PATH="/usr/local/go/bin:$PATH"
fi
export PATH="$PATH:/usr/sbin:/sbin"

ROUNDS=${ROUNDS:-3}
MEMORY_ROUNDS=${MEMORY_ROUNDS:-1}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-2s}
CONCURRENCY=${CONCURRENCY:-64}
CONNS=${CONNS:-1}
ENVOYS=${ENVOYS:-10}
VALUES=${VALUES:-10}
LIMIT=${LIMIT:-500}
REPORT_INTERVAL=${REPORT_INTERVAL:-1s}
RATE=${RATE:-match}
PEER_ENV=${PEER_ENV:-}
DOMAIN=rlqs_bench

# tables DIR prints the tables from the rounds' JSON lines in DIR (NAME.json, one line a round)
# and the run's description (DIR/run.txt).
tables() {
	local dir=$1
	echo
	cat "$dir/run.txt" 2>/dev/null || echo "(no run.txt in $dir: the run is not described)"
	echo
	python3 - "$dir" <<'EOF'
import json, os, statistics, sys

work = sys.argv[1]
labels = {
    "rlqs": "sluice, RLQS, Redis, the same rate as sluice's RLS",
    "rlqs-max": "sluice, RLQS, Redis, as fast as the Envoys go",
    "rls-sluice": "sluice, RLS, Redis",
    "rls-peer": "envoyproxy/ratelimit, RLS, Redis",
    "rlqs-memory": "sluice, RLQS, memory store, the same rate as sluice's RLS",
    "rls-sluice-memory": "sluice, RLS, memory store",
}
limit = None
rows = {}
for name in labels:
    path = os.path.join(work, name + ".json")
    if not os.path.exists(path):
        continue
    runs = [json.loads(l) for l in open(path) if l.strip()]
    if not runs:
        continue
    rlqs = name.startswith("rlqs")
    if rlqs and name != "rlqs-max" and runs[0].get("rate_mode", "match") != "match":
        labels[name] = labels[name].replace("the same rate as sluice's RLS", "%.0f decisions/s offered" % runs[0]["rate_offered"])
    # Each round's figures, one form for both load generators.
    per = []
    for r in runs:
        d = r["decisions"]
        admitted = r["admitted"] if rlqs else r["ok"]
        cpu = r.get("cpu_us_per_decision", {})
        f = dict(rps=r["decisions_per_s"], aps=admitted / r["duration_s"], refused=(d - admitted) / max(d, 1),
                 calls=r["calls_per_1000_decisions"] if rlqs else 1000.0,
                 server=cpu.get("server"), redis=cpu.get("redis"), load=cpu.get("load"),
                 server_adm=cpu["server"] * d / admitted if "server" in cpu and admitted else None,
                 server_ms=r.get("cpu_ms", {}).get("server"),
                 per_report=1000 * r["cpu_ms"]["server"] / r["reports"] if rlqs and "server" in r.get("cpu_ms", {}) and r["reports"] else None)
        per.append(f)
        if r.get("limit_per_value_s"):
            limit = (r["values"], r["limit_per_value_s"])
    def med(k):
        v = [f[k] for f in per if f[k] is not None]
        return statistics.median(v) if v else None
    rows[name] = dict(rounds=len(runs), **{k: med(k) for k in per[0]},
                      errors=sum(r.get("errors", 0) for r in runs),
                      dropped=sum(r.get("reports_dropped", 0) for r in runs),
                      unsteady=sum(1 for r in runs if rlqs and not r.get("steady", True)),
                      streams=max((r.get("streams", 0) - r.get("envoys", 0) for r in runs), default=0) if rlqs else 0,
                      each=" ".join("%.0f" % f["rps"] for f in per))
us = lambda v: "—" if v is None else ("%.3f µs" % v if v < 1 else "%.1f µs" % v)
def expected(rps):
    # The share of refusals the limit implies at this rate, uniform values: 1 − V·L/R.
    return "" if limit is None or not rps else " (limit: %.1f %%)" % (100 * max(0.0, 1 - limit[0] * limit[1] / rps))
print("| target | rounds | decisions/s | admitted/s | refused | server CPU per decision | server CPU per admitted request | Redis CPU per decision | load generator CPU per decision | calls to the service per 1000 decisions | each round's decisions/s |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
for name, r in rows.items():
    print("| %s | %d | %.0f | %.0f | %.1f %%%s | %s | %s | %s | %s | %s | %s |" % (
        labels[name], r["rounds"], r["rps"], r["aps"], 100 * r["refused"], expected(r["rps"]), us(r["server"]),
        us(r["server_adm"]), us(r["redis"]), us(r["load"]), "%.0f" % r["calls"] if r["calls"] >= 10 else "%.3f" % r["calls"], r["each"]))

def ratio(a, b, k):
    x, y = rows[a][k], rows[b][k]
    return None if x is None or not y else x / y
def times(v):
    # Below 0.1, as a fraction: 1/170 reads better than 0.01×.
    if v is None:
        return "—"
    return "%.2f×" % v if v >= 0.1 else "1/%.0f" % (1 / v) if v > 0 else "0×"
pairs = [("rlqs", "rls-sluice"), ("rlqs", "rls-peer"), ("rlqs-max", "rls-sluice"), ("rlqs-max", "rls-peer"),
         ("rls-sluice", "rls-peer"), ("rlqs-memory", "rls-sluice-memory")]
pairs = [(a, b) for a, b in pairs if a in rows and b in rows]
if pairs:
    print()
    print("| ratio | decisions/s | admitted/s | server CPU per decision | server CPU per admitted request | Redis CPU per decision | calls to the service per decision |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for a, b in pairs:
        print("| %s / %s | %s |" % (labels[a], labels[b], " | ".join(
            "—" if a.endswith("memory") and k == "redis" else times(ratio(a, b, k))
            for k in ("rps", "aps", "server", "server_adm", "redis", "calls"))))
notes = [(labels[n], r["server_ms"], r["per_report"]) for n, r in rows.items() if n.startswith("rlqs") and r["server_ms"] is not None]
if notes:
    print()
    print("The server's CPU time over an RLQS round's measured window, and per report the Envoys sent in it (medians; "
          "/proc/PID/stat counts 10 ms ticks): " +
          "; ".join("%s: %.0f ms, %s a report" % (l, ms, us(pr)) for l, ms, pr in notes) + ".")
# RLQS: the most admitted in a whole second of the clock inside a measured window, beside the
# limit (a changed assignment is a token bucket that starts full, so a second can pass it), and
# each round's count of changed assignments.
peaks = []
for name in rows:
    if not name.startswith("rlqs"):
        continue
    most, changed = None, []
    for r in (json.loads(l) for l in open(os.path.join(work, name + ".json")) if l.strip()):
        if "assignments_changed" in r:
            changed.append(r["assignments_changed"])
        if "admitted_each_s" not in r or "start_unix_s" not in r:
            continue
        first = int(r["start_unix_s"])
        begin, end = r["start_unix_s"] + r["warmup_s"], r["start_unix_s"] + r["warmup_s"] + r["duration_s"]
        for i, n in enumerate(r["admitted_each_s"]):
            if first + i >= begin and first + i + 1 <= end:
                most = n if most is None else max(most, n)
    if most is not None and limit:
        peaks.append("%s: %d (%.2f× the limit; assignments changed in a window: %s)" % (
            labels[name], most, most / (limit[0] * limit[1]), " ".join(str(c) for c in changed) or "—"))
if peaks:
    print()
    print("The most admitted in a second of an RLQS round's measured window: " + "; ".join(peaks) + ".")
for name, r in rows.items():
    if r["errors"]:
        print("\nWarning: %s: %d errors (see rlsload's first error above)." % (labels[name], r["errors"]))
    if r["dropped"]:
        print("\nWarning: %s: %d reports dropped (a stream could not be opened or sent on)." % (labels[name], r["dropped"]))
    if r["unsteady"]:
        print("\nWarning: %s: in %d round(s) some Envoy held no assignment when the measurement began (WARMUP too short?)." % (labels[name], r["unsteady"]))
    if r["streams"] > 0:
        print("\nWarning: %s: %d more streams than Envoys in a round: a stream broke." % (labels[name], r["streams"]))
EOF
}

# FROM=dir prints the tables again from a run kept with RLQS_OUT=dir, measuring nothing.
if [ -n "${FROM:-}" ]; then
	[ -d "$FROM" ] || die "FROM=$FROM: no such directory (a run's RLQS_OUT)"
	command -v python3 >/dev/null 2>&1 || die "python3 is needed"
	tables "$FROM"
	exit 0
fi

for tool in go redis-server redis-cli python3; do
	command -v "$tool" >/dev/null 2>&1 || die "$tool is needed (redis-server and redis-cli: apt-get install redis-server)"
done
for n in "$ROUNDS" "$MEMORY_ROUNDS" "$CONCURRENCY" "$CONNS" "$ENVOYS" "$VALUES" "$LIMIT"; do
	[[ $n =~ ^[0-9]+$ ]] || die "ROUNDS, MEMORY_ROUNDS, CONCURRENCY, CONNS, ENVOYS, VALUES and LIMIT are whole numbers (got $n)"
done
[[ $RATE == match || $RATE =~ ^[0-9]+$ ]] || die "RATE=$RATE: match (the rate sluice's RLS reached in the same round) or decisions a second"

load_before=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)

# 1. Build: the load generators, sluice, and the peer at the tests' pinned version.
log "building bench/rlsload, bench/rlqsload and sluice"
go build -o "$work/rlsload" ./bench/rlsload
go build -o "$work/rlqsload" ./bench/rlqsload
go build -o "$work/sluice" ./cmd/sluice
version=$(sed -n 's/^\tVersion *= *"\(.*\)"$/\1/p' internal/peertest/peertest.go)
[ -n "$version" ] || die "no Version in internal/peertest/peertest.go"
peer_pkg=github.com/envoyproxy/ratelimit/src/service_cmd
peer_bin="${XDG_CACHE_HOME:-$HOME/.cache}/sluice-peertest/$version/service_cmd"
if [ ! -s "$peer_bin" ]; then
	log "building the peer: go install $peer_pkg@$version"
	mkdir -p "$(dirname "$peer_bin")"
	tmp=$(mktemp -d "$(dirname "$peer_bin")/build-XXXXXX")
	(cd "$tmp" && GOBIN="$tmp" GOWORK=off GOFLAGS=-buildvcs=false go install "$peer_pkg@$version") ||
		die "building the peer failed; it needs the Go module proxy ($(go env GOPROXY))"
	mv "$tmp/service_cmd" "$peer_bin"
	rm -rf "$tmp"
fi

# 2. One Redis.
redis_port=$(free_port)
redis-server --bind 127.0.0.1 --port "$redis_port" --save "" --appendonly no --daemonize no \
	--logfile "$work/redis.log" --dir "$work" >/dev/null 2>&1 &
redis_pid=$!
pids+=("$redis_pid")
deadline=$((SECONDS + 15))
until [ "$(redis-cli -h 127.0.0.1 -p "$redis_port" ping 2>/dev/null)" = PONG ]; do
	kill -0 "$redis_pid" 2>/dev/null || { cat "$work/redis.log" >&2; die "redis-server exited"; }
	((SECONDS < deadline)) || die "redis-server did not answer within 15s"
	sleep 0.05
done

# 3. The Envoy rate limit configuration both RLS servers load: LIMIT a second per user.
mkdir -p "$work/peer/runtime/ratelimit/config"
envoy_file="$work/peer/runtime/ratelimit/config/bench.yaml"
cat >"$envoy_file" <<EOF
domain: $DOMAIN
descriptors:
  # One counter per user, as rls.quota's rule has one bucket per user.
  - key: user
    rate_limit: {unit: second, requests_per_unit: $LIMIT}
EOF

# wait_ready ADDR PID LOG [rlqs] waits until the server at ADDR answers a ShouldRateLimit
# (rlsload -probe), and with rlqs its quota service too (rlqsload -probe), failing with its log if
# it exits or does not within 20s.
wait_ready() {
	local addr=$1 pid=$2 logfile=$3 rlqs=${4:-} deadline=$((SECONDS + 20))
	until "$work/rlsload" -probe -addr "$addr" -domain "$DOMAIN" -key user -ready 500ms 2>"$work/probe.err" &&
		{ [ -z "$rlqs" ] || "$work/rlqsload" -probe -addr "$addr" -domain "$DOMAIN" -ready 500ms 2>"$work/probe.err"; }; do
		if ! kill -0 "$pid" 2>/dev/null; then
			cat "$logfile" >&2
			die "the server for $addr exited"
		fi
		if ((SECONDS >= deadline)); then
			cat "$work/probe.err" "$logfile" >&2
			die "the server on $addr did not answer within 20s"
		fi
	done
}

# 4. The peer.
start_peer # (bench-lib.sh) sets peer_addr and peer_pid

# 5. sluice. start_sluice NAME STORE writes $work/NAME.yaml (the store line given) and starts
# sluice serve on it, RLS and RLQS on one listener; it sets sluice_pid and sluice_addr.
start_sluice() {
	local name=$1 store=$2
	sluice_addr=127.0.0.1:$(free_port)
	cat >"$work/$name.yaml" <<EOF
listen: 127.0.0.1:$(free_port)
admin_listen: ""
upstream: http://127.0.0.1:9
store: $store
rls:
  listen: $sluice_addr
  envoy_config: [$envoy_file]
  quota:
    domain: $DOMAIN
    report_interval: $REPORT_INTERVAL
    buckets:
      - {name: api, match: {name: api, user: "*"}, limit: $LIMIT, period: 1s}
EOF
	log "starting sluice ($name) on $sluice_addr"
	"$work/sluice" serve --config "$work/$name.yaml" --watch 0 >"$work/$name.log" 2>&1 &
	sluice_pid=$!
	pids+=("$sluice_pid")
	wait_ready "$sluice_addr" "$sluice_pid" "$work/$name.log" rlqs
}
start_sluice sluice-redis "{type: redis, addrs: [127.0.0.1:$redis_port]}"

# 6. Rounds. Each flushes Redis and appends its JSON line to $work/NAME.json; the load generators
# also read the CPU time of the server (PID), of Redis and their own over the measured window.
# last_rps is the decisions/s of the latest RLS round (RATE=match).
last_rps=0
measure_rls() {
	local name=$1 addr=$2 pid=$3 line
	redis-cli -h 127.0.0.1 -p "$redis_port" flushall >/dev/null
	log "measuring $name ($addr): warm-up $WARMUP, then $DURATION"
	line=$("$work/rlsload" -addr "$addr" -domain "$DOMAIN" -key user -values "$VALUES" \
		-concurrency "$CONCURRENCY" -conns "$CONNS" -duration "$DURATION" -warmup "$WARMUP" -label "$name" \
		-cpu "server=$pid,redis=$redis_pid,load=self" \
		2> >(sed 's/^/  /' >&2))
	# The limit, for the table's expected refusals.
	line=${line%\}}",\"limit_per_value_s\":$LIMIT}"
	echo "$line" >>"$work/$name.json"
	last_rps=$(python3 -c 'import json,sys; print(round(json.loads(sys.argv[1])["decisions_per_s"]))' "$line")
}
measure_rlqs() {
	local name=$1 addr=$2 pid=$3 rate=$4 line
	redis-cli -h 127.0.0.1 -p "$redis_port" flushall >/dev/null
	log "measuring $name ($addr, $([ "$rate" = 0 ] && echo "closed loop" || echo "$rate decisions/s")): warm-up $WARMUP and until assigned, then $DURATION"
	line=$("$work/rlqsload" -addr "$addr" -domain "$DOMAIN" -name api -key user -values "$VALUES" \
		-envoys "$ENVOYS" -concurrency "$CONCURRENCY" -rate "$rate" -report-interval "$REPORT_INTERVAL" \
		-duration "$DURATION" -warmup "$WARMUP" -label "$name" \
		-cpu "server=$pid,redis=$redis_pid,load=self" \
		2> >(sed 's/^/  /' >&2))
	# The limit, and whether the rate was the RLS round's (RATE=match) or fixed, for the table.
	line=${line%\}}",\"limit_per_value_s\":$LIMIT,\"rate_mode\":\"$([ "$RATE" = match ] && echo match || echo fixed)\"}"
	echo "$line" >>"$work/$name.json"
}
rate_of() { if [ "$RATE" = match ]; then echo "$last_rps"; else echo "$RATE"; fi; }
for round in $(seq "$ROUNDS"); do
	log "round $round"
	measure_rls rls-peer "$peer_addr" "$peer_pid"
	measure_rls rls-sluice "$sluice_addr" "$sluice_pid"
	measure_rlqs rlqs "$sluice_addr" "$sluice_pid" "$(rate_of)"
	measure_rlqs rlqs-max "$sluice_addr" "$sluice_pid" 0
done
stop "$peer_pid"
stop "$sluice_pid"
if ((MEMORY_ROUNDS > 0)); then
	start_sluice sluice-memory "{type: memory}"
	for round in $(seq "$MEMORY_ROUNDS"); do
		measure_rls rls-sluice-memory "$sluice_addr" "$sluice_pid"
		measure_rlqs rlqs-memory "$sluice_addr" "$sluice_pid" "$(rate_of)"
	done
	stop "$sluice_pid"
fi
stop "$redis_pid"

# 7. The tables: medians per target, and the ratios; what the run was is kept in run.txt.
cpu=$(awk -F': *' '/^model name/ {print $2; exit}' /proc/cpuinfo 2>/dev/null || true)
{
	echo "### Envoy's quota service (RLQS) against per-request RLS: $VALUES users at $LIMIT/s each; RLS $CONCURRENCY callers on $CONNS gRPC connection(s); RLQS $ENVOYS Envoys reporting every $REPORT_INTERVAL, $CONCURRENCY callers, rate ${RATE}; warm-up $WARMUP, $DURATION per round; medians"
	echo
	echo "Command: ROUNDS=$ROUNDS MEMORY_ROUNDS=$MEMORY_ROUNDS DURATION=$DURATION WARMUP=$WARMUP CONCURRENCY=$CONCURRENCY CONNS=$CONNS ENVOYS=$ENVOYS VALUES=$VALUES LIMIT=$LIMIT REPORT_INTERVAL=$REPORT_INTERVAL RATE=$RATE${PEER_ENV:+ PEER_ENV=\"$PEER_ENV\"} bash scripts/bench-rlqs.sh"
	echo
	echo "Machine: $(nproc) CPUs, ${cpu:-unknown CPU}; $(uname -sr); $(go version | cut -d' ' -f3); redis $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p');" \
		"envoyproxy/ratelimit $version. The load generator (and in it the RLQS rounds' Envoys), the servers and Redis share the CPUs;" \
		"load average before: $load_before, after: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)."
} >"$work/run.txt"
tables "$work"

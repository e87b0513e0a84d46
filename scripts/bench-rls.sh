#!/usr/bin/env bash
# The rate limit service benchmark: sluice's Envoy RLS (envoy.service.ratelimit.v3) beside
# envoyproxy/ratelimit, the reference implementation, on the same machine, the same Redis and the
# same Envoy configuration, driven by the same load generator (bench/rlsload).
#
#   bash scripts/bench-rls.sh                  # both servers
#   SKIP_SLUICE=1 bash scripts/bench-rls.sh    # the peer alone (until sluice serves rls:)
#
# What runs:
#   - one redis-server on a free loopback port, flushed (FLUSHALL) before every round;
#   - the peer, built by `go install` at internal/peertest's pinned Version into the same cache as
#     the tests' (os.UserCacheDir()/sluice-peertest/<version>/service_cmd), run as its README
#     recommends for throughput: REDIS_PIPELINE_WINDOW=150us (its "optimal performance" advice; at
#     this version its source applies the window to Redis Cluster only, so on one Redis it is a
#     no-op), its default pool of 10 Redis connections (REDIS_POOL_SIZE), LOG_LEVEL=warn (its
#     default), USE_STATSD=false and DISABLE_STATS=true (no statsd to send to), its local cache
#     off, GOMAXPROCS left to Go (all CPUs). PEER_ENV="K=V ..." adds or overrides settings;
#   - sluice serve (go build ./cmd/sluice) with store: {type: redis, addrs: [that Redis]} and
#     rls: {listen: ..., envoy_config: [the same file]}, its HTTP listener on a free port in front
#     of a dummy upstream (http://127.0.0.1:9: no HTTP request is sent), no admin listener;
#   - the Envoy configuration (one domain, two value-less rules, so one counter per value):
#       client: 1,000,000 per second — the main rounds: nothing is ever refused (at ~10k
#               decisions/s over 10,000 values each value sees ~1 a second), so both servers do
#               the same work, a Redis round trip per decision;
#       capped: 1 per second — the refusal rounds: a value's second hit within a second is
#               refused, so about a third of the decisions are OVER_LIMIT at ~10k/s (more, the
#               faster the server: at λ hits per value and second, 1 − (1 − e^−λ)/λ are refused).
#
# Rounds: ROUNDS (5) interleaved rounds of peer, sluice, peer, sluice, ... on `client`, the first
# REFUSE_ROUNDS (3) of them followed by the same on `capped`; then MEMORY_ROUNDS (1) of sluice on
# its memory store (store: {type: memory}), and FLOOR_ROUNDS (1) of bench/rlsnull, reported separately.
# rlsnull is the floor: a gRPC server with sluice's settings that answers OK to every descriptor and
# decides nothing, so its CPU per call is what grpc-go, HTTP/2 and protobuf cost any Go rate limit
# service under this load (the reference is built on the same gRPC library). Each round is rlsload with WARMUP (2s) then
# DURATION (10s), CONCURRENCY (64) callers on CONNS (1) gRPC connection(s), VALUES (10000)
# distinct values drawn uniformly. The table gives each target's medians over its rounds: decisions/s,
# latencies, and the CPU time per decision of the server, of Redis and of the load generator (each
# process's utime+stime from /proc/PID/stat over the measured window, divided by the decisions
# rlsload counted in it: rlsload -cpu); then the ratios sluice / peer of each, and the goals
# for the Envoy service (server CPU per decision ≤ 0.33× the peer's, decisions/s ≥ 2×, p99 lower),
# met or not. On 2 CPUs shared with Redis and the load generator, decisions/s depend on what those
# cost too; the server's CPU per decision is what a deployment pays for the server itself.
# RLS_OUT=dir keeps every round's JSON line, the run's description and the servers' logs there;
# FROM=dir prints the tables again from such a directory, measuring nothing.
# The load generator shares the CPUs with the servers and Redis: run it on an otherwise idle
# machine (the load average before and after is printed).
set -euo pipefail
KEEP_OUT=${RLS_OUT:-}
. "$(dirname "$0")/bench-lib.sh" # log, die, $work and $pids (stopped on exit), stop, free_port, wait_http
cd "$(dirname "$0")/.."
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
	export PATH="/usr/local/go/bin:$PATH"
fi
export PATH="$PATH:/usr/sbin:/sbin"

ROUNDS=${ROUNDS:-5}
REFUSE_ROUNDS=${REFUSE_ROUNDS:-3}
MEMORY_ROUNDS=${MEMORY_ROUNDS:-1}
FLOOR_ROUNDS=${FLOOR_ROUNDS:-1}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-2s}
CONCURRENCY=${CONCURRENCY:-64}
CONNS=${CONNS:-1}
VALUES=${VALUES:-10000}
SKIP_SLUICE=${SKIP_SLUICE:-0}
PEER_ENV=${PEER_ENV:-}
DOMAIN=rls_bench

# tables DIR prints the tables from the rounds' JSON lines in DIR (NAME.json, one line a round) and
# the run's description (DIR/run.txt): medians per target, the ratios sluice / peer, the goals.
tables() {
	local dir=$1
	echo
	cat "$dir/run.txt" 2>/dev/null || echo "(no run.txt in $dir: the run is not described)"
	echo
	python3 - "$dir" <<'EOF'
import json, os, statistics, sys

work = sys.argv[1]
labels = {
    "peer": "envoyproxy/ratelimit, Redis, never refusing",
    "sluice": "sluice, Redis, never refusing",
    "peer-refusing": "envoyproxy/ratelimit, Redis, 1/s per value",
    "sluice-refusing": "sluice, Redis, 1/s per value",
    "sluice-memory": "sluice, memory store, never refusing",
    "floor": "floor: grpc-go answering OK, no decision",
}
rows = {}
for name in labels:
    path = os.path.join(work, name + ".json")
    if not os.path.exists(path):
        continue
    runs = [json.loads(l) for l in open(path) if l.strip()]
    med = lambda k: statistics.median(r[k] for r in runs)
    # CPU time per decision of a process (server, redis, rlsload): the median of the rounds that
    # measured it, None if none did.
    def cpu(proc):
        v = [r["cpu_us_per_decision"][proc] for r in runs if proc in r.get("cpu_us_per_decision", {})]
        return statistics.median(v) if v else None
    total = sum(r["decisions"] for r in runs)
    rows[name] = dict(
        rounds=len(runs), rps=med("decisions_per_s"), p50=med("p50_ms"), p90=med("p90_ms"),
        p99=med("p99_ms"), max=max(r["max_ms"] for r in runs),
        server=cpu("server"), redis=cpu("redis"), load=cpu("rlsload"),
        ok=sum(r["ok"] for r in runs), over=sum(r["over_limit"] for r in runs),
        errors=sum(r["errors"] for r in runs), total=total,
        each=" ".join("%.0f" % r["decisions_per_s"] for r in runs))
us = lambda v: "—" if v is None else "%.1f µs" % v
print("| target | rounds | decisions/s | p50 | p90 | p99 | max | server CPU per decision | Redis CPU per decision | load generator CPU per decision | OK | OVER_LIMIT | errors | each round's decisions/s |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
for name, r in rows.items():
    print("| %s | %d | %.0f | %.2f ms | %.2f ms | %.2f ms | %.2f ms | %s | %s | %s | %d | %d (%.1f %%) | %d | %s |" % (
        labels[name], r["rounds"], r["rps"], r["p50"], r["p90"], r["p99"], r["max"], us(r["server"]), us(r["redis"]),
        us(r["load"]), r["ok"], r["over"], 100.0 * r["over"] / max(r["total"], 1), r["errors"], r["each"]))

def ratio(a, b, k):
    x, y = rows[a][k], rows[b][k]
    return None if x is None or not y else x / y
times = lambda v: "—" if v is None else "%.2f×" % v
pairs = [("sluice", "peer"), ("sluice-refusing", "peer-refusing"), ("sluice-memory", "peer"), ("floor", "peer")]
pairs = [(a, b) for a, b in pairs if a in rows and b in rows]
if pairs:
    print()
    print("| ratio | decisions/s | p50 | p99 | server CPU per decision | Redis CPU per decision |")
    print("|---|---:|---:|---:|---:|---:|")
    for a, b in pairs:
        # (On the memory store and the floor, Redis only answers the probe: no ratio of its CPU.)
        print("| %s / %s | %s |" % (labels[a], labels[b], " | ".join(
            "—" if a in ("sluice-memory", "floor") and k == "redis" else times(ratio(a, b, k))
            for k in ("rps", "p50", "p99", "server", "redis"))))
# The goals, on Redis, each pair sluice / peer of the same rounds.
goals = [("server CPU per decision ≤ 0.33× the peer's", "server", lambda v: v <= 0.33),
         ("decisions/s ≥ 2× the peer's", "rps", lambda v: v >= 2),
         ("p99 lower than the peer's", "p99", lambda v: v < 1)]
cols = [(a, b) for a, b in pairs if a not in ("sluice-memory", "floor")]
if cols:
    print()
    # Columns by the rounds' load: "never refusing", "1/s per value" (sluice / peer, both on Redis).
    print("| goal (sluice / envoyproxy/ratelimit, both on Redis) | " + " | ".join(
        "%s | met" % labels[a].split(", ")[-1] for a, b in cols) + " |")
    print("|---|" + "---:|---|" * len(cols))
    for text, k, ok in goals:
        cells = []
        for a, b in cols:
            v = ratio(a, b, k)
            cells += [times(v), "—" if v is None else ("**met**" if ok(v) else "not met")]
        print("| %s | %s |" % (text, " | ".join(cells)))
if "floor" in rows and "peer" in rows and rows["floor"]["server"] and rows["peer"]["server"]:
    f, p = rows["floor"]["server"], rows["peer"]["server"]
    print()
    print("The floor: grpc-go answering OK and deciding nothing costs %.1f µs of CPU per call, %.2f× the peer's "
          "%.1f µs per decision; a third of the peer's is %.1f µs, %s." % (
              f, f / p, p, p / 3, "%.1f µs less than the floor" % (f - p / 3) if f > p / 3
              else "%.1f µs above the floor for matching, the store and the answer" % (p / 3 - f)))
for name, r in rows.items():
    if r["errors"]:
        print("\nWarning: %s: %d errors of %d decisions (see rlsload's first error above)." % (labels[name], r["errors"], r["total"]))
    if not name.endswith("refusing") and r["over"]:
        print("\nWarning: %s refused %d of %d decisions; nothing should be." % (labels[name], r["over"], r["total"]))
EOF
}

# FROM=dir prints the tables again from a run kept with RLS_OUT=dir, measuring nothing.
if [ -n "${FROM:-}" ]; then
	[ -d "$FROM" ] || die "FROM=$FROM: no such directory (a run's RLS_OUT)"
	command -v python3 >/dev/null 2>&1 || die "python3 is needed"
	tables "$FROM"
	exit 0
fi

for tool in go redis-server redis-cli python3; do
	command -v "$tool" >/dev/null 2>&1 || die "$tool is needed (redis-server and redis-cli: apt-get install redis-server)"
done
for n in "$ROUNDS" "$REFUSE_ROUNDS" "$MEMORY_ROUNDS" "$FLOOR_ROUNDS" "$CONCURRENCY" "$CONNS" "$VALUES"; do
	[[ $n =~ ^[0-9]+$ ]] || die "ROUNDS, REFUSE_ROUNDS, MEMORY_ROUNDS, FLOOR_ROUNDS, CONCURRENCY, CONNS and VALUES are whole numbers (got $n)"
done

load_before=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)

# 1. Build: the load generator, sluice, and the peer at the tests' pinned version.
log "building bench/rlsload"
go build -o "$work/rlsload" ./bench/rlsload
go build -o "$work/rlsnull" ./bench/rlsnull
if [ "$SKIP_SLUICE" != 1 ]; then
	log "building sluice"
	go build -o "$work/sluice" ./cmd/sluice
fi
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

# 3. The Envoy configuration both servers load.
mkdir -p "$work/peer/runtime/ratelimit/config"
envoy_file="$work/peer/runtime/ratelimit/config/bench.yaml"
cat >"$envoy_file" <<EOF
domain: $DOMAIN
descriptors:
  # The main rounds: never refused.
  - key: client
    rate_limit: {unit: second, requests_per_unit: 1000000}
  # The refusal rounds: a value's second hit within a second is refused.
  - key: capped
    rate_limit: {unit: second, requests_per_unit: 1}
EOF

# wait_ready ADDR PID LOG waits (rlsload -probe: the gRPC health service, then one decision)
# until the server at ADDR answers, failing with its log if it exits or does not within 20s.
wait_ready() {
	local addr=$1 pid=$2 logfile=$3 deadline=$((SECONDS + 20))
	until "$work/rlsload" -probe -addr "$addr" -domain "$DOMAIN" -key client -ready 500ms 2>"$work/probe.err"; do
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
# sluice serve on it; it sets sluice_pid and sluice_addr.
start_sluice() {
	local name=$1 store=$2 grpc_port
	grpc_port=$(free_port)
	sluice_addr=127.0.0.1:$grpc_port
	cat >"$work/$name.yaml" <<EOF
listen: 127.0.0.1:$(free_port)
admin_listen: ""
upstream: http://127.0.0.1:9
store: $store
rls:
  listen: $sluice_addr
  envoy_config: [$envoy_file]
EOF
	log "starting sluice ($name) on $sluice_addr"
	"$work/sluice" serve --config "$work/$name.yaml" --watch 0 >"$work/$name.log" 2>&1 &
	sluice_pid=$!
	pids+=("$sluice_pid")
	wait_ready "$sluice_addr" "$sluice_pid" "$work/$name.log"
}
if [ "$SKIP_SLUICE" != 1 ]; then
	start_sluice sluice-redis "{type: redis, addrs: [127.0.0.1:$redis_port]}"
fi

# 6. Rounds. measure NAME ADDR KEY PID flushes Redis and runs one round, appending its JSON line to
# $work/NAME.json; rlsload also reads the CPU time of the server (PID), of Redis and its own over
# the measured window (-cpu), per decision.
measure() {
	local name=$1 addr=$2 key=$3 pid=$4 line
	redis-cli -h 127.0.0.1 -p "$redis_port" flushall >/dev/null
	log "measuring $name ($addr, key $key): warm-up $WARMUP, then $DURATION"
	line=$("$work/rlsload" -addr "$addr" -domain "$DOMAIN" -key "$key" -values "$VALUES" \
		-concurrency "$CONCURRENCY" -conns "$CONNS" -duration "$DURATION" -warmup "$WARMUP" -label "$name" \
		-cpu "server=$pid,redis=$redis_pid,rlsload=self" \
		2> >(sed 's/^/  /' >&2))
	echo "$line" >>"$work/$name.json"
}
targets=(peer)
[ "$SKIP_SLUICE" = 1 ] || targets+=(sluice)
# The refusal rounds go between the main ones (the first REFUSE_ROUNDS rounds have one each), so
# that a noisy spell on this shared machine touches every target alike.
for round in $(seq "$((ROUNDS > REFUSE_ROUNDS ? ROUNDS : REFUSE_ROUNDS))"); do
	log "round $round"
	if ((round <= ROUNDS)); then
		measure peer "$peer_addr" client "$peer_pid"
		[ "$SKIP_SLUICE" = 1 ] || measure sluice "$sluice_addr" client "$sluice_pid"
	fi
	if ((round <= REFUSE_ROUNDS)); then
		measure peer-refusing "$peer_addr" capped "$peer_pid"
		[ "$SKIP_SLUICE" = 1 ] || measure sluice-refusing "$sluice_addr" capped "$sluice_pid"
	fi
done
stop "$peer_pid"
if [ "$SKIP_SLUICE" != 1 ]; then
	stop "$sluice_pid"
	if ((MEMORY_ROUNDS > 0)); then
		start_sluice sluice-memory "{type: memory}"
		for round in $(seq "$MEMORY_ROUNDS"); do
			measure sluice-memory "$sluice_addr" client "$sluice_pid"
		done
		stop "$sluice_pid"
	fi
fi
if ((FLOOR_ROUNDS > 0)); then
	floor_addr=127.0.0.1:$(free_port)
	log "starting the floor (bench/rlsnull) on $floor_addr"
	"$work/rlsnull" -listen "$floor_addr" >"$work/floor.log" 2>&1 &
	floor_pid=$!
	pids+=("$floor_pid")
	wait_ready "$floor_addr" "$floor_pid" "$work/floor.log"
	for round in $(seq "$FLOOR_ROUNDS"); do
		measure floor "$floor_addr" client "$floor_pid"
	done
	stop "$floor_pid"
fi
stop "$redis_pid"

# 7. The tables: medians per target, and sluice / peer; what the run was is kept in run.txt.
cpu=$(awk -F': *' '/^model name/ {print $2; exit}' /proc/cpuinfo 2>/dev/null || true)
{
	echo "### Envoy RLS: rlsload, $CONCURRENCY callers on $CONNS gRPC connection(s), $VALUES values, warm-up $WARMUP, $DURATION per round; medians"
	echo
	echo "Machine: $(nproc) CPUs, ${cpu:-unknown CPU}; $(uname -sr); $(go version | cut -d' ' -f3); redis $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p');" \
		"envoyproxy/ratelimit $version${PEER_ENV:+ with $PEER_ENV}. The load generator, the servers and Redis share the CPUs;" \
		"load average before: $load_before, after: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)."
} >"$work/run.txt"
tables "$work"

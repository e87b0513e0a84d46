#!/usr/bin/env bash
# The LLM streaming benchmark: what sluice serve costs a streamed chat completion on a usage route
# (routes[].usage: {format: openai}: the response is metered as it is copied to the client, and
# the request settled to the usage it reports), in ONE run, on loopback only, beside
#   direct: the same stream fetched from the upstream straight;
#   plain:  the same stream through sluice serve on a route without usage (a token bucket counting
#           requests): the proxy's own cost, so that usage − plain is what the metering costs.
# The upstream is the tests' fake OpenAI API (internal/llmtest, served by bench/llmstream): each
# stream is a role chunk, EVENTS (1000) content chunks of EVENT_BYTES (8) bytes of text each (an
# OpenAI chunk of about 230 bytes, as a token or two of text makes), a finish chunk, the usage
# chunk (stream_options.include_usage) and [DONE], each event written and flushed on its own, as
# fast as it can (INTERVAL, e.g. 20ms, paces them instead: the upstream pauses before each event,
# the first included, as a model generating tokens does).
# Both sluice serve processes (memory store, a limit that never refuses) run for the whole run.
#
# 1. Streams: ROUNDS (5) interleaved rounds (each round's order rotated); in each, every target
#    serves STREAMS (200) streams one after another over one keep-alive connection (after 10 not
#    counted), and bench/llmstream times each one's first event and end, and reads sluice's CPU
#    time (utime + stime of /proc/<pid>/stat, in ticks of 10 ms) before and after. The table gives
#    the medians over the rounds of each round's p50 and p99.
# 2. Memory: one stream of BIG_MB (1024) MiB of text in events of BIG_EVENT_BYTES (4096) through
#    each target, read at full speed, sluice's VmRSS sampled every 10 ms; on the usage route, the
#    usage must then be settled exactly: sluice_llm_tokens_total (its /metrics) grows by the
#    stream's usage, and sluice_llm_requests_total{outcome="settled"} by one. BIG_MB=0 skips it.
#
#   bash scripts/bench-llm.sh
#   ROUNDS=3 STREAMS=50 BIG_MB=64 bash scripts/bench-llm.sh     # a quick look
#
# LLM_OUT=dir keeps every round's JSON line and the servers' logs there. The client, the upstream
# and sluice share the CPUs: run it on an otherwise idle machine (the load average before and after
# is printed).
set -euo pipefail
KEEP_OUT=${LLM_OUT:-}
. "$(dirname "$0")/bench-lib.sh" # log, die, $work and $pids (stopped on exit), stop, free_port, wait_http
cd "$(dirname "$0")/.."
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
	export PATH="/usr/local/go/bin:$PATH"
fi

ROUNDS=${ROUNDS:-5}
STREAMS=${STREAMS:-200}
EVENTS=${EVENTS:-1000}
EVENT_BYTES=${EVENT_BYTES:-8}
INTERVAL=${INTERVAL:-0s}
BIG_MB=${BIG_MB:-1024}
BIG_EVENT_BYTES=${BIG_EVENT_BYTES:-4096}
KEY=bench-key-0123456789
HASH=$(printf %s "$KEY" | sha256sum | cut -d' ' -f1)

for tool in go curl python3; do
	command -v "$tool" >/dev/null 2>&1 || die "$tool is needed"
done
for n in "$ROUNDS" "$STREAMS" "$EVENTS" "$EVENT_BYTES" "$BIG_MB" "$BIG_EVENT_BYTES"; do
	[[ $n =~ ^[0-9]+$ ]] || die "ROUNDS, STREAMS, EVENTS, EVENT_BYTES, BIG_MB and BIG_EVENT_BYTES are whole numbers (got $n)"
done
((ROUNDS >= 1 && STREAMS >= 1 && EVENT_BYTES >= 1 && BIG_EVENT_BYTES >= 1)) ||
	die "ROUNDS, STREAMS, EVENT_BYTES and BIG_EVENT_BYTES are at least 1"
[[ $INTERVAL =~ ^[0-9]+(\.[0-9]+)?(ns|us|ms|s)$ ]] || die "INTERVAL=$INTERVAL: want a duration such as 0s, 500us or 20ms"

load_before=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)

# 1. Build, and start the upstream and both sluice serve processes.
log "building sluice and bench/llmstream"
go build -o "$work/sluice" ./cmd/sluice
go build -o "$work/llmstream" ./bench/llmstream

up_port=$(free_port)
upstream_url="http://127.0.0.1:$up_port"
"$work/llmstream" upstream -listen "127.0.0.1:$up_port" >"$work/upstream.log" 2>&1 &
pids+=($!)
wait_http "$upstream_url/" "$!" "$work/upstream.log"

declare -A url pid metrics
url[direct]=$upstream_url

# start_sluice NAME [YAML...] writes $work/NAME.yaml (the upstream, the memory store, the client
# by its API key in Authorization, a token bucket that never refuses, and the lines given) and
# starts sluice serve on it, with an admin listener for its metrics.
start_sluice() {
	local name=$1 port admin
	shift
	port=$(free_port) admin=$(free_port)
	cat >"$work/$name.yaml" <<EOF
listen: 127.0.0.1:$port
admin_listen: 127.0.0.1:$admin
upstream: $upstream_url
store: {type: memory}
identity:
  - api_key: {header: Authorization}
policies:
  - {name: open, algorithm: token-bucket, limit: 1000000000, period: 1s}
clients:
  - {name: bench, api_key_sha256: $HASH, policy: open}
EOF
	printf '%s\n' "$@" >>"$work/$name.yaml"
	"$work/sluice" serve --config "$work/$name.yaml" --watch 0 >"$work/$name.log" 2>&1 &
	pids+=($!)
	pid[$name]=$! url[$name]="http://127.0.0.1:$port" metrics[$name]="http://127.0.0.1:$admin/metrics"
	wait_http "${url[$name]}/" "${pid[$name]}" "$work/$name.log"
}
start_sluice usage "routes:" "  - {path_prefix: /v1/chat/completions, usage: {format: openai}}"
start_sluice plain

# 2. Streams, in interleaved rounds.
targets=(direct usage plain)
for round in $(seq "$ROUNDS"); do
	log "round $round of $ROUNDS: $STREAMS streams of $EVENTS events per target"
	for i in "${!targets[@]}"; do
		t=${targets[$(((i + round - 1) % ${#targets[@]}))]}
		"$work/llmstream" streams -url "${url[$t]}" -key "$KEY" -label "$t" -n "$STREAMS" \
			-events "$EVENTS" -event-bytes "$EVENT_BYTES" -interval "$INTERVAL" ${pid[$t]:+-pid "${pid[$t]}"} >>"$work/streams-$t.json"
		log "  $(tail -1 "$work/streams-$t.json")"
	done
done

# 3. One big stream through each target.
if ((BIG_MB > 0)); then
	for t in direct plain usage; do
		log "one stream of $BIG_MB MiB in events of $BIG_EVENT_BYTES bytes: $t"
		settle=() # the usage route's settlement, read from its metrics
		[ "$t" = usage ] && settle=(-metrics "${metrics[usage]}")
		"$work/llmstream" big -url "${url[$t]}" -key "$KEY" -label "$t" -mb "$BIG_MB" -event-bytes "$BIG_EVENT_BYTES" \
			${pid[$t]:+-pid "${pid[$t]}"} "${settle[@]}" >"$work/big-$t.json"
		log "  $(cat "$work/big-$t.json")"
	done
fi

# 4. The tables.
cpu=$(awk -F': *' '/^model name/ {print $2; exit}' /proc/cpuinfo 2>/dev/null || true)
echo
echo "### LLM streams through sluice serve: medians of $ROUNDS interleaved rounds"
echo
echo "Machine: $(nproc) CPUs, ${cpu:-unknown CPU}; $(uname -sr); $(go version | cut -d' ' -f3)." \
	"The client, the upstream and sluice share the CPUs; load average before the run: $load_before," \
	"after: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)."
echo "Command: \`ROUNDS=$ROUNDS STREAMS=$STREAMS EVENTS=$EVENTS EVENT_BYTES=$EVENT_BYTES INTERVAL=$INTERVAL BIG_MB=$BIG_MB BIG_EVENT_BYTES=$BIG_EVENT_BYTES bash scripts/bench-llm.sh\`."
echo
python3 - "$work" "$BIG_MB" "$INTERVAL" <<'EOF'
import json, os, statistics, sys

work, big_mb, interval = sys.argv[1], int(sys.argv[2]), sys.argv[3]
labels = {
    "direct": "upstream straight",
    "plain": "sluice serve, a route without usage",
    "usage": "sluice serve, a usage route (openai)",
}
rows = {}
for name in labels:
    path = os.path.join(work, "streams-%s.json" % name)
    runs = [json.loads(l) for l in open(path) if l.strip()]
    med = lambda k: statistics.median(r[k] for r in runs)
    rows[name] = {k: med(k) for k in ("first_p50_ms", "first_p99_ms", "total_p50_ms", "total_p99_ms", "cpu_ms_per_stream", "bytes_per_stream")}
    rows[name]["streams"] = sum(r["streams"] for r in runs)
    rows[name]["events"] = runs[0]["events"]
d = rows["direct"]
print("Streams: %d content events each (%.0f bytes per stream), %s, one stream at a time; %d streams per target in all." % (
    d["events"], d["bytes_per_stream"], "written as fast as the upstream can" if interval in ("0", "0s") else "the upstream pausing %s before each event" % interval, d["streams"]))
print()
print("| target | first event p50 | p99 | added p50 | added p99 | whole stream p50 | p99 | sluice CPU per stream |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for name, r in rows.items():
    added = "— | —" if name == "direct" else "%+.3f ms | %+.3f ms" % (r["first_p50_ms"] - d["first_p50_ms"], r["first_p99_ms"] - d["first_p99_ms"])
    cpu = "—" if r["cpu_ms_per_stream"] < 0 else "%.2f ms" % r["cpu_ms_per_stream"]
    print("| %s | %.3f ms | %.3f ms | %s | %.2f ms | %.2f ms | %s |" % (
        labels[name], r["first_p50_ms"], r["first_p99_ms"], added, r["total_p50_ms"], r["total_p99_ms"], cpu))
u, p = rows["usage"], rows["plain"]
added = u["first_p50_ms"] - d["first_p50_ms"]
print()
print("| figure | value | goal | met |")
print("|---|---:|---|---|")
print("| first event, added at p50 by the usage route | %+.3f ms | ≤ 1 ms | %s |" % (added, "yes" if added <= 1 else "no"))
print("| metering's CPU per stream (usage − plain) | %+.2f ms (%+.2f µs per event) | | |" % (
    u["cpu_ms_per_stream"] - p["cpu_ms_per_stream"], 1000 * (u["cpu_ms_per_stream"] - p["cpu_ms_per_stream"]) / max(u["events"], 1)))
print("| whole stream, usage route / upstream straight | %.2f× | | |" % (u["total_p50_ms"] / d["total_p50_ms"]))

if big_mb > 0:
    big = {n: json.load(open(os.path.join(work, "big-%s.json" % n))) for n in ("direct", "plain", "usage")}
    b = big["usage"]
    print()
    print("One stream of %d MiB of text (%d events of %d bytes; %.0f MiB on the wire), read at full speed; sluice's VmRSS sampled every 10 ms (%d samples on the usage route):" % (
        big_mb, b["events"], (big_mb << 20) // b["events"], b["bytes"] / 2**20, b["rss_samples"]))
    print()
    print("| target | MiB/s | sluice CPU | RSS before | max RSS during | RSS after | usage settled exactly |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name in ("direct", "plain", "usage"):
        r = big[name]
        mib = lambda k: "—" if r[k] < 0 else "%.1f MiB" % (r[k] / 1024)
        settled = "—" if r["settled"] is None else ("yes" if r["settled"] else "NO")
        if r["settled"] is not None:
            settled += " (input %d, output %d tokens)" % (r["input_tokens"], r["output_tokens"])
        print("| %s | %.0f | %s | %s | %s | %s | %s |" % (labels[name], r["mib_per_s"],
            "—" if r["cpu_s"] < 0 else "%.2f s" % r["cpu_s"], mib("rss_start_kib"), mib("rss_max_kib"), mib("rss_end_kib"), settled))
    if not b["settled"]:
        print("\nWarning: the usage route's big stream was not settled exactly: expected input 100 and output %d tokens, one settled request." % b["events"])

print("""
What the figures are: "first event" is the time from sending the request to reading the stream's
first event (its first line), "whole stream" to reading its end ([DONE]); "added" is the
difference from the upstream straight, of medians of each round's percentile. sluice's CPU is
its process's utime + stime over a round's streams (ticks of 10 ms), divided by the streams: the
upstream's CPU and the client's are not in it. In the big stream's table, sluice's CPU is over the
stream, its RSS is read just before the request, sampled during it, and read just after the
client read its end; "settled exactly" is read from sluice's /metrics once the request is settled.
What is not like for like: the upstream straight is one hop (client → upstream), through sluice
two (client → sluice → upstream), all on the same CPUs; the usage route also reads the request's
body before it forwards it (to estimate it), settles it at the end, and asks the upstream for an
uncompressed answer (the plain route does none of these; the fake upstream never compresses).
Through sluice each chunk the upstream flushed is passed on as a chunk of its own: a read and a
write per event, for a stream written as fast as the upstream can as for one a model paces. A
stream written as fast as it can (INTERVAL=0s) keeps the upstream and sluice busy from its first
event on: on a machine with fewer than three CPUs the client then waits for one to read that
event, which the upstream straight (one busy process) does not make it do; a paced stream
(INTERVAL=1ms) leaves them idle between events.""")
EOF

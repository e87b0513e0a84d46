#!/usr/bin/env bash
# The clients API's benchmark, in ONE run on loopback with one local redis-server:
#   1. three `sluice serve` instances on the Redis, no client in their file; N (10,000) clients
#      created through instance A's API (16 writers);
#   2. propagation: PROBES (200) changes written through A, each timed until B and C both run it
#      (their decision API answers the key as the client with the changed limit): p50, p99, max;
#   3. throughput: wrk against instance A (the N clients from the API) and against an instance F
#      whose file has the same N clients, in ROUNDS (3) interleaved rounds, each request with one
#      of the N keys (a wrk script walks them); medians and the ratio API / file (goal ≥ 0.95).
# DURATION (10s) each wrk measurement, THREADS (2), CONNECTIONS (50). Nothing else should run.
set -euo pipefail
. "$(dirname "$0")/bench-lib.sh"
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/sbin:/sbin"
N=${N:-10000}
PROBES=${PROBES:-200}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10s}
THREADS=${THREADS:-2}
CONNECTIONS=${CONNECTIONS:-50}
TOKEN=bench-clients-token-$RANDOM
for c in redis-server wrk curl python3; do command -v "$c" >/dev/null || die "$c is needed"; done

log "building sluice, the upstream and the load driver"
go build -o "$work/sluice" ./cmd/sluice
go build -o "$work/upstream" ./bench/upstream
go build -o "$work/clientsload" ./bench/clientsload

rport=$(free_port)
redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no >"$work/redis.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.05; done
uport=$(free_port)
"$work/upstream" -listen "127.0.0.1:$uport" >"$work/upstream.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$uport/" "${pids[-1]}" "$work/upstream.log"

# config PORT ADMIN PREFIX [clients...]: a configuration on the Redis (its own prefix), per-key
# high enough to refuse nothing.
config() {
	cat <<YAML
listen: 127.0.0.1:$1
admin_listen: 127.0.0.1:$2
upstream: http://127.0.0.1:$uport
store: {type: redis, addrs: [127.0.0.1:$rport], prefix: "$3"}
admin: {token_env: SLUICE_ADMIN_TOKEN}
identity:
  - api_key: {header: X-API-Key}
  - ip: {}
policies:
  - {name: per-key, algorithm: token-bucket, limit: 1000000000, period: 1s}
default_policy: [per-key]
YAML
}
declare -A proxy admin
start() { # start NAME PREFIX FILE-CLIENTS(0/1)
	local name=$1 p a
	p=$(free_port) a=$(free_port)
	config "$p" "$a" "$2" >"$work/$name.yaml"
	if [ "$3" = 1 ]; then
		echo "clients:" >>"$work/$name.yaml"
		python3 - "$N" >>"$work/$name.yaml" <<'PY'
import hashlib, sys
for i in range(int(sys.argv[1])):
    n = "bench-client-%d" % i
    print("  - {name: %s, api_key_sha256: %s, policy: per-key}" % (n, hashlib.sha256(n.encode()).hexdigest()))
PY
	fi
	SLUICE_ADMIN_TOKEN=$TOKEN "$work/sluice" serve --config "$work/$name.yaml" --watch 0 2>"$work/$name.log" &
	pids+=($!)
	wait_http "http://127.0.0.1:$a/healthz" "${pids[-1]}" "$work/$name.log"
	proxy[$name]="http://127.0.0.1:$p" admin[$name]="http://127.0.0.1:$a"
}
start a "api:" 0
start b "api:" 0
start c "api:" 0
start f "file:" 1

log "creating $N clients through A's API"
created=$("$work/clientsload" -mode create -admin "${admin[a]}" -token "$TOKEN" -n "$N")
log "$created"
log "timing $PROBES changes through A until B and C run them"
prop=$("$work/clientsload" -mode propagate -admin "${admin[a]}" -others "${admin[b]},${admin[c]}" -token "$TOKEN" -probes "$PROBES")
log "$prop"
curl -s -H "Authorization: Bearer $TOKEN" "${admin[a]}/v1/stats" | python3 -c 'import json,sys; r=json.load(sys.stdin)["registry"]; print("A runs", r["from_api"], "clients from the API")' >&2

cat >"$work/keys.lua" <<LUA
local i = 0
request = function()
  i = (i + 7919) % $N
  return wrk.format("GET", "/", {["X-API-Key"] = "bench-client-" .. i})
end
LUA
declare -A rps
for r in $(seq "$ROUNDS"); do
	for t in f a; do
		out=$(wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" -s "$work/keys.lua" "${proxy[$t]}/")
		v=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
		rps[$t]+="$v "
		log "round $r, $t: $v req/s"
	done
done
median() { tr ' ' '\n' | awk 'NF' | sort -g | awk '{v[NR] = $1} END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.1f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
mf=$(median <<<"${rps[f]}") ma=$(median <<<"${rps[a]}")
echo
echo "Clients API: $N clients, Redis store, \`wrk -t$THREADS -c$CONNECTIONS -d$DURATION\` with a key of the $N per request, medians of $ROUNDS interleaved rounds."
echo "$(date -u +%Y-%m-%d), $(git rev-parse --short HEAD), $(nproc) CPUs ($(awk -F: '/model name/ {print $2; exit}' /proc/cpuinfo | sed 's/^ //'))"
echo
echo "| | value |"
echo "|---|---:|"
echo "| $created | |"
echo "| $prop | |"
echo "| sluice serve, the $N clients in the file | $mf req/s (rounds: ${rps[f]% }) |"
echo "| sluice serve, the $N clients from the API | $ma req/s (rounds: ${rps[a]% }) |"
echo "| API / file | $(awk "BEGIN { printf \"%.3f\", $ma / $mf }")× (goal ≥ 0.95) |"

#!/usr/bin/env bash
# The gateway's load benchmark: requests/s and p50/p99 latency with wrk, in ONE
# run and on loopback only, of
#   a. the upstream (bench/upstream) straight;
#   b. sluice serve with limiting switched off (no policy applies): the proxy engine's own cost;
#   c. sluice serve on the memory store, a token bucket so high that nothing is refused;
#   d. the same on a local Redis; d'. and with local budgets (local_budget, size 1,000);
#   e. nginx limit_req keyed by the API key, proxy_pass with keepalive to the same upstream;
#   f. refusals: sluice (memory) and nginx refusing nearly everything, 429s per second.
# Each target runs alone (the others are stopped) behind a short warm-up, in ROUNDS (3) interleaved
# rounds; the Markdown tables at the end (medians, then the ratios with their goals, with the
# date, revision and machine of the run) are what docs/performance.md quotes. FROM=file prints
# them again from a run's saved output, measuring nothing. DURATION (10s) is each
# measurement, WARMUP (1s) each warm-up;
# THREADS (2) and CONNECTIONS (50) are wrk's -t and -c.
# BASE=<git revision> also builds sluice at that revision and measures it on the memory store and on
# Redis in the same rounds (targets base-memory, base-redis), with a table of this tree's figures
# beside the revision's: what a change costs or gains, measured side by side.
set -euo pipefail
. "$(dirname "$0")/bench-lib.sh" # log, die, $work and $pids (stopped on exit), stop, free_port, wait_http
[ -z "${FROM:-}" ] || FROM=$(realpath -m -- "$FROM") # FROM is read after the cd below
cd "$(dirname "$0")/.."
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
	export PATH="/usr/local/go/bin:$PATH"
fi
export PATH="$PATH:/usr/sbin:/sbin"

DURATION=${DURATION:-10s}
ROUNDS=${ROUNDS:-3}
WARMUP=${WARMUP:-1s}
THREADS=${THREADS:-2}
CONNECTIONS=${CONNECTIONS:-50}
KEY=bench-key-0123456789
HASH=$(printf %s "$KEY" | sha256sum | cut -d' ' -f1)

# seconds turns a wrk duration (10s, 2m, 1h, 30) into seconds.
seconds() {
	case $1 in
	*h) echo $((${1%h} * 3600)) ;;
	*m) echo $((${1%m} * 60)) ;;
	*s) echo "${1%s}" ;;
	*) echo "$1" ;;
	esac
}
[[ $(seconds "$DURATION") =~ ^[0-9]+$ ]] || die "DURATION=$DURATION: want whole seconds, minutes or hours (5s, 1m)"
[[ $(seconds "$WARMUP") =~ ^[0-9]+$ ]] || die "WARMUP=$WARMUP: want whole seconds (1s)"

# Each target's figures, one space-separated list per figure (one value a round), in the order
# the targets first ran: record adds a round's, tables prints their medians.
declare -A rps p50 p99 total non2xx errors
order=()

# record NAME REQS P50 P99 REQUESTS NON2XX [SOCKET-ERRORS] adds one round of target NAME: its
# requests/s, p50 and p99 in ms, the number of requests and of non-2xx answers, wrk's socket errors.
record() {
	local name=$1 r=$2 l50=$3 l99=$4 n=$5 bad=$6 err=${7:-}
	rps[$name]+="$r " p50[$name]+="$l50 " p99[$name]+="$l99 "
	total[$name]=$((${total[$name]:-0} + n)) non2xx[$name]=$((${non2xx[$name]:-0} + bad))
	[ -z "$err" ] || errors[$name]+="${errors[$name]:+; }$err"
	[[ " ${order[*]} " == *" $name "* ]] || order+=("$name")
}

# median turns a list of per-round figures into their median.
median() { tr ' ' '\n' | awk 'NF' | sort -g | awk '{v[NR] = $1} END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
calc() { awk "BEGIN { printf \"$1\", $2 }"; }
goal() { if awk "BEGIN { exit !($1) }"; then echo yes; else echo no; fi; }

# tables prints the run's tables, the ones docs/performance.md quotes, from the figures record
# kept: each target's medians, then the ratios with their goals (where one is set), and
# with BASE this tree beside the revision; $measured and $machine say when, where and how.
tables() {
	# With BASE, each round's ratio of this tree to the revision first (a round's load touches both):
	# their median is steadier than the ratio of the medians on a machine whose speed drifts.
	declare -A round_ratio
	if [ -n "${BASE:-}" ]; then
		for st in memory redis; do
			read -r -a mine <<<"${rps[sluice-$st]}"
			read -r -a theirs <<<"${rps[base-$st]}"
			ratios=""
			for i in "${!mine[@]}"; do
				ratios+="$(awk "BEGIN { printf \"%.3f\", ${mine[$i]} / ${theirs[$i]} }") "
			done
			round_ratio[$st]="$(median <<<"$ratios") (rounds: ${ratios% })"
		done
	fi
	for n in "${order[@]}"; do
		rps[$n]=$(median <<<"${rps[$n]}")
		p50[$n]=$(median <<<"${p50[$n]}")
		p99[$n]=$(median <<<"${p99[$n]}")
		errors[$n]=${errors[$n]:-none}
	done

	declare -A label=(
		[upstream]="upstream straight (bench/upstream)"
		[sluice-off]="sluice serve, limiting off (engine only)"
		[bare-nethttp]="bare \`httputil.ReverseProxy\` (bench/proxy), no limiting"
		[bare-hybrid]="bare net/http server + \`fasthttp\` HostClient (bench/proxy), no limiting"
		[bare-fasthttp]="bare \`fasthttp\` server + HostClient proxy (bench/proxy), no limiting"
		[sluice-memory]="sluice serve, memory store"
		[sluice-redis]="sluice serve, Redis store"
		[sluice-redis-budget]="sluice serve, Redis store, local budgets of 1,000"
		[base-memory]="sluice serve at ${BASE:-} (${base_rev:-}), memory store"
		[base-redis]="sluice serve at ${BASE:-} (${base_rev:-}), Redis store"
		[nginx]="nginx \`limit_req\` + \`proxy_pass\` keepalive"
		[sluice-refuse]="sluice serve, memory: refusing (429)"
		[nginx-refuse]="nginx \`limit_req\`: refusing (429)"
	)

	echo
	echo "Gateway load: \`wrk -t$THREADS -c$CONNECTIONS -d$DURATION --latency\`, loopback, medians of $ROUNDS interleaved rounds."
	echo "$measured"
	echo "$machine"
	echo
	echo "| target | requests/s | p50 | p99 | added p50 | added p99 | non-2xx |"
	echo "|---|---:|---:|---:|---:|---:|---:|"
	for n in "${order[@]}"; do
		if [ "$n" = upstream ]; then
			a50="—" a99="—"
		else
			a50="$(calc '%+.3f ms' "${p50[$n]} - ${p50[upstream]}")"
			a99="$(calc '%+.3f ms' "${p99[$n]} - ${p99[upstream]}")"
		fi
		printf '| %s | %s | %s ms | %s ms | %s | %s | %s of %s |\n' "${label[$n]}" \
			"$(calc '%.0f' "${rps[$n]}")" "${p50[$n]}" "${p99[$n]}" "$a50" "$a99" "${non2xx[$n]}" "${total[$n]}"
	done
	echo
	mem_nginx=$(calc '%.2f' "${rps[sluice-memory]} / ${rps[nginx]}")
	redis_nginx=$(calc '%.2f' "${rps[sluice-redis]} / ${rps[nginx]}")
	cost=$(calc '%.1f' "100 * (1 - ${rps[sluice-memory]} / ${rps[sluice-off]})")
	off_nginx=$(calc '%.2f' "${rps[sluice-off]} / ${rps[nginx]}")
	refuse_nginx=$(calc '%.2f' "${rps[sluice-refuse]} / ${rps[nginx-refuse]}")
	refuse_fwd=$(calc '%.2f' "${rps[sluice-refuse]} / ${rps[sluice-memory]}")
	mem_a99=$(calc '%.3f' "${p99[sluice-memory]} - ${p99[upstream]}")
	redis_a99=$(calc '%.3f' "${p99[sluice-redis]} - ${p99[upstream]}")
	echo "| ratio | value | goal | met |"
	echo "|---|---:|---|---|"
	echo "| limiter's cost: 1 − memory / limiting off | $cost % | < 10 % | $(goal "$cost < 10") |"
	echo "| sluice memory / nginx (req/s) | $mem_nginx× | ≥ 0.9× | $(goal "$mem_nginx >= 0.9") |"
	redis_mem=$(calc '%.2f' "${rps[sluice-redis]} / ${rps[sluice-memory]}")
	echo "| sluice Redis exact / memory (req/s) | $redis_mem× | ≥ 0.8× | $(goal "$redis_mem >= 0.8") |"
	echo "| sluice Redis exact / nginx (req/s) | $redis_nginx× | | |"
	budget_mem=$(calc '%.2f' "${rps[sluice-redis-budget]} / ${rps[sluice-memory]}")
	echo "| sluice Redis with local budgets / memory (req/s) | $budget_mem× | ≥ 0.95× | $(goal "$budget_mem >= 0.95") |"
	echo "| sluice limiting off / nginx (req/s) | $off_nginx× | | |"
	echo "| added p99, memory | $mem_a99 ms | < 1 ms | $(goal "$mem_a99 < 1") |"
	echo "| added p99, Redis | $redis_a99 ms | < 1 ms | $(goal "$redis_a99 < 1") |"
	echo "| sluice 429s/s / memory forwards/s | $refuse_fwd× | > 1× (refusals cheaper) | $(goal "$refuse_fwd > 1") |"
	echo "| sluice 429s/s / nginx 429s/s | $refuse_nginx× | | |"
	if [ -n "${BASE:-}" ]; then
		echo
		echo "This tree beside $BASE ($base_rev), same rounds (requests/s: above 1× is faster; p99: the difference):"
		echo
		echo "| store | this tree | $base_rev | ratio of medians | median of each round's ratio | p99 this tree | p99 $base_rev |"
		echo "|---|---:|---:|---:|---:|---:|---:|"
		for st in memory redis; do
			printf '| %s | %s | %s | %s× | %s | %s ms | %s ms |\n' "$st" "$(calc '%.0f' "${rps[sluice-$st]}")" "$(calc '%.0f' "${rps[base-$st]}")" \
				"$(calc '%.2f' "${rps[sluice-$st]} / ${rps[base-$st]}")" "${round_ratio[$st]}" "${p99[sluice-$st]}" "${p99[base-$st]}"
		done
	fi
	for n in "${order[@]}"; do
		case $n in
		*-refuse) want_non2xx=1 ;;
		*) want_non2xx=0 ;;
		esac
		if ((want_non2xx == 0)) && [ "${non2xx[$n]}" != 0 ]; then
			echo
			echo "Warning: ${label[$n]} answered ${non2xx[$n]} of ${total[$n]} requests with a non-2xx status."
		elif ((want_non2xx == 1)) && [ "${non2xx[$n]}" = 0 ]; then
			echo
			echo "Warning: ${label[$n]} refused nothing."
		fi
		if [ "${errors[$n]}" != none ]; then
			echo
			echo "Warning: ${label[$n]}: socket errors: ${errors[$n]}."
		fi
	done
}

# FROM=file prints the tables again from a run's whole output (stderr with stdout, as
# `bash scripts/bench-gateway.sh >file 2>&1` keeps it), measuring nothing: every round's line of
# each target (see measure), the rounds, the revision with BASE, and the run's own lines saying
# when and on what machine it was measured.
if [ -n "${FROM:-}" ]; then
	[ -f "$FROM" ] || die "FROM=$FROM: no such file"
	line_re='^[0-9:]+ +([a-z0-9-]+): ([0-9.]+) req/s, p50 ([0-9.]+) ms, p99 ([0-9.]+) ms, non-2xx ([0-9]+) of ([0-9]+), socket errors: (.*)$'
	measured="" machine=""
	while IFS= read -r line; do
		if [[ $line =~ $line_re ]]; then
			err=${BASH_REMATCH[7]}
			[ "$err" != none ] || err=""
			record "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" "${BASH_REMATCH[3]}" "${BASH_REMATCH[4]}" "${BASH_REMATCH[6]}" "${BASH_REMATCH[5]}" "$err"
		elif [[ $line =~ ^[0-9:]+\ round\ [0-9]+\ of\ ([0-9]+)$ ]]; then
			ROUNDS=${BASH_REMATCH[1]}
		elif [[ $line =~ ^[0-9:]+\ building\ sluice\ at\ (.+)\ \((.+)\)$ ]]; then
			BASE=${BASH_REMATCH[1]} base_rev=${BASH_REMATCH[2]}
		elif [[ $line =~ ^[0-9:]+\ measuring\ .*warm-up\ ([^,]+),\ then\ (.+)$ ]]; then
			WARMUP=${BASH_REMATCH[1]} DURATION=${BASH_REMATCH[2]}
		elif [[ $line =~ \`wrk\ -t([0-9]+)\ -c([0-9]+)\  ]]; then
			THREADS=${BASH_REMATCH[1]} CONNECTIONS=${BASH_REMATCH[2]}
		elif [[ $line == "Measured "* ]]; then
			measured=$line
		elif [[ $line == "Machine: "* ]]; then
			machine=$line
		fi
	done <"$FROM"
	((${#order[@]})) || die "FROM=$FROM: no target's figures in it"
	measured=${measured:-"Measured: unknown (no such line in $FROM)."} machine=${machine:-"Machine: unknown (no such line in $FROM)."}
	tables
	exit 0
fi

# 1. Tools: wrk, nginx and redis-server from apt, as root, updating the lists only when one is missing.
missing=()
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
command -v nginx >/dev/null 2>&1 || missing+=(nginx)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
if ((${#missing[@]})); then
	sudo=()
	if ((EUID != 0)); then
		command -v sudo >/dev/null 2>&1 || die "need root (or sudo) to install: ${missing[*]}"
		sudo=(sudo)
	fi
	log "installing ${missing[*]}"
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
command -v go >/dev/null 2>&1 || die "go not found (looked on PATH and in /usr/local/go/bin)"

load_before=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)
started=$(date -u +%Y-%m-%d)
revision=$(git rev-parse --short HEAD)
[ -z "$(git status --porcelain --untracked-files=no)" ] || revision+=" with uncommitted changes"

# 2. Build, and start the upstream.
log "building sluice and the upstream"
go build -o "$work/sluice" ./cmd/sluice
go build -o "$work/upstream" ./bench/upstream
go build -o "$work/proxy" ./bench/proxy
if [ -n "${BASE:-}" ]; then
	base_rev=$(git rev-parse --short "$BASE^{commit}") || die "BASE=$BASE is not a revision of this repository"
	log "building sluice at $BASE ($base_rev)"
	git worktree add -q --detach "$work/base" "$base_rev"
	(cd "$work/base" && go build -o "$work/sluice-base" ./cmd/sluice)
	git worktree remove --force "$work/base"
fi

up_port=$(free_port)
upstream_url="http://127.0.0.1:$up_port"
"$work/upstream" -listen "127.0.0.1:$up_port" >"$work/upstream.log" 2>&1 &
pids+=($!)
up_pid=$!
wait_http "$upstream_url/" "$up_pid" "$work/upstream.log"

# 3. Measuring.
wrk_secs=$(($(seconds "$DURATION") + 30))

# to_ms turns one of wrk's latencies (612.00us, 2.04ms, 1.01s, 1.00m) into milliseconds.
to_ms() {
	awk -v v="$1" 'BEGIN {
		if (v ~ /us$/) { sub(/us$/, "", v); printf "%.3f", v / 1000 }
		else if (v ~ /ms$/) { sub(/ms$/, "", v); printf "%.3f", v }
		else if (v ~ /m$/) { sub(/m$/, "", v); printf "%.3f", v * 60000 }
		else if (v ~ /s$/) { sub(/s$/, "", v); printf "%.3f", v * 1000 }
		else { printf "nan" }
	}'
}

# measure NAME URL runs a warm-up and then the measurement against URL with the API key, and
# keeps requests/s, p50, p99, the request count, the non-2xx count and socket errors under NAME.
measure() {
	local name=$1 url=$2 out="$work/$1.wrk"
	log "measuring $name ($url): warm-up $WARMUP, then $DURATION"
	timeout 60 wrk -t"$THREADS" -c"$CONNECTIONS" -d"$WARMUP" -H "X-API-Key: $KEY" "$url" >/dev/null
	timeout "$wrk_secs" wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" --timeout 5s --latency \
		-H "X-API-Key: $KEY" "$url" >"$out"
	local r l50 l99 n bad err
	r=$(awk '/^Requests\/sec:/ {print $2}' "$out")
	[ -n "$r" ] || { cat "$out" >&2; die "no Requests/sec from wrk for $name"; }
	l50=$(to_ms "$(awk '$1 == "50%" {print $2; exit}' "$out")")
	l99=$(to_ms "$(awk '$1 == "99%" {print $2; exit}' "$out")")
	n=$(awk '/ requests in / {print $1; exit}' "$out")
	bad=$(awk '/Non-2xx or 3xx responses:/ {print $NF}' "$out")
	err=$(awk '/Socket errors:/ {sub(/^ *Socket errors: */, ""); print}' "$out")
	record "$name" "$r" "$l50" "$l99" "$n" "${bad:-0}" "$err"
	# FROM=file reads this line back (see record_log).
	log "  $name: $r req/s, p50 $l50 ms, p99 $l99 ms, non-2xx ${bad:-0} of $n, socket errors: ${err:-none}"
}

# start_sluice NAME starts sluice serve on $work/NAME.yaml (see sluice_config) and waits until it
# answers; it sets sluice_pid.
start_sluice() {
	local name=$1 bin=${2:-$work/sluice}
	"$bin" serve --config "$work/$name.yaml" --watch 0 >"$work/$name.log" 2>&1 &
	sluice_pid=$!
	pids+=("$sluice_pid")
	wait_http "$sluice_url/" "$sluice_pid" "$work/$name.log"
}

# sluice_config NAME [YAML...] writes $work/NAME.yaml on a fresh free port: the upstream, no admin
# listener, clients identified by API key, and the lines given (store, policies, clients).
sluice_config() {
	local name=$1
	shift
	local port
	port=$(free_port)
	sluice_url="http://127.0.0.1:$port"
	{
		echo "listen: 127.0.0.1:$port"
		echo 'admin_listen: ""'
		echo "upstream: $upstream_url"
		echo "identity:"
		echo "  - api_key: {header: X-API-Key}"
		printf '%s\n' "$@"
	} >"$work/$name.yaml"
}

# nginx limit_req keyed by the API key, proxying with keepalive to the same upstream.
# nginx_start NAME RATE LIMIT_REQ writes $work/NAME/nginx.conf (limit_req_zone at RATE, the
# location's limit_req directive LIMIT_REQ) and starts nginx in the foreground on it; it sets
# nginx_pid and nginx_url.
nginx_start() {
	local name=$1 rate=$2 limit_req=$3 dir="$work/$1" port user=""
	port=$(free_port)
	mkdir -p "$dir/logs"
	((EUID == 0)) && user="user root;"
	cat >"$dir/nginx.conf" <<EOF
$user
worker_processes 2;
pid $dir/nginx.pid;
error_log $dir/logs/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $dir/client_body;
    proxy_temp_path $dir/proxy;
    fastcgi_temp_path $dir/fastcgi;
    uwsgi_temp_path $dir/uwsgi;
    scgi_temp_path $dir/scgi;
    limit_req_zone \$http_x_api_key zone=k:10m rate=$rate;
    upstream backend {
        server 127.0.0.1:$up_port;
        keepalive 64;
    }
    server {
        listen 127.0.0.1:$port;
        location / {
            $limit_req
            limit_req_status 429;
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
EOF
	nginx_url="http://127.0.0.1:$port"
	local e=()
	# -e: the error log before the configuration is read (nginx >= 1.19.5), else nginx's default.
	[[ $(nginx -h 2>&1 || true) == *"-e filename"* ]] && e=(-e "$dir/logs/error.log")
	nginx -p "$dir" "${e[@]}" -c "$dir/nginx.conf" -g 'daemon off;' >"$dir/logs/stdout.log" 2>&1 &
	nginx_pid=$!
	pids+=("$nginx_pid")
	wait_http "$nginx_url/" "$nginx_pid" "$dir/logs/error.log"
}

# One local Redis for the Redis rounds, idle the rest of the time.
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

# run_target NAME starts NAME's server, measures it and stops it.
run_target() {
	case $1 in
	upstream) # a. The upstream straight.
		measure upstream "$upstream_url/" ;;
	sluice-off) # b. sluice with limiting off: the client is identified, but no policy applies to it.
		sluice_config sluice-off \
			"clients:" \
			"  - {name: bench, api_key_sha256: $HASH}"
		start_sluice sluice-off
		measure sluice-off "$sluice_url/"
		stop "$sluice_pid" ;;
	bare-*) # b'. The candidate engines bare, with no limiting at all: what sluice's engine could be.
		local engine=${1#bare-} port
		port=$(free_port)
		"$work/proxy" -engine "$engine" -listen "127.0.0.1:$port" -upstream "127.0.0.1:$up_port" >"$work/proxy-$engine.log" 2>&1 &
		proxy_pid=$!
		pids+=("$proxy_pid")
		wait_http "http://127.0.0.1:$port/" "$proxy_pid" "$work/proxy-$engine.log"
		measure "$1" "http://127.0.0.1:$port/"
		stop "$proxy_pid" ;;
	sluice-memory) # c. sluice on the memory store, a token bucket that never refuses.
		sluice_config sluice-memory \
			"store: {type: memory}" \
			"policies:" \
			"  - {name: high, algorithm: token-bucket, limit: 100000000, period: 1s}" \
			"clients:" \
			"  - {name: bench, api_key_sha256: $HASH, policy: high}"
		start_sluice sluice-memory
		measure sluice-memory "$sluice_url/"
		stop "$sluice_pid" ;;
	sluice-redis) # d. The same on Redis.
		sluice_config sluice-redis \
			"store: {type: redis, addrs: [127.0.0.1:$redis_port], on_error: fail-closed}" \
			"policies:" \
			"  - {name: high, algorithm: token-bucket, limit: 100000000, period: 1s}" \
			"clients:" \
			"  - {name: bench, api_key_sha256: $HASH, policy: high}"
		start_sluice sluice-redis
		measure sluice-redis "$sluice_url/"
		stop "$sluice_pid" ;;
	sluice-redis-budget) # d'. The same on Redis with local budgets of 1,000 (one Redis call per 1,000 requests).
		sluice_config sluice-redis-budget \
			"store: {type: redis, addrs: [127.0.0.1:$redis_port], on_error: fail-closed}" \
			"policies:" \
			"  - {name: high, algorithm: token-bucket, limit: 100000000, period: 1s, local_budget: {size: 1000, max_age: 1s}}" \
			"clients:" \
			"  - {name: bench, api_key_sha256: $HASH, policy: high}"
		start_sluice sluice-redis-budget
		measure sluice-redis-budget "$sluice_url/"
		stop "$sluice_pid" ;;
	base-memory | base-redis) # c, d at BASE: the same configurations on the revision's binary.
		local store="store: {type: memory}"
		[ "$1" = base-redis ] && store="store: {type: redis, addrs: [127.0.0.1:$redis_port], on_error: fail-closed}"
		sluice_config "$1" "$store" \
			"policies:" \
			"  - {name: high, algorithm: token-bucket, limit: 100000000, period: 1s}" \
			"clients:" \
			"  - {name: bench, api_key_sha256: $HASH, policy: high}"
		start_sluice "$1" "$work/sluice-base"
		measure "$1" "$sluice_url/"
		stop "$sluice_pid" ;;
	nginx) # e. nginx forwarding.
		nginx_start nginx 100000000r/s "limit_req zone=k burst=1000000 nodelay;"
		measure nginx "$nginx_url/"
		stop "$nginx_pid" ;;
	sluice-refuse) # f. Refusals: nearly every request answered 429.
		sluice_config sluice-refuse \
			"store: {type: memory}" \
			"policies:" \
			"  - {name: tiny, algorithm: token-bucket, limit: 1, period: 1h}" \
			"clients:" \
			"  - {name: bench, api_key_sha256: $HASH, policy: tiny}"
		start_sluice sluice-refuse
		measure sluice-refuse "$sluice_url/"
		stop "$sluice_pid" ;;
	nginx-refuse) # nginx at 1r/m, without a burst: a burst of 1,000,000 would let that many through first.
		nginx_start nginx-refuse 1r/m "limit_req zone=k nodelay;"
		measure nginx-refuse "$nginx_url/"
		stop "$nginx_pid" ;;
	esac
}

# ROUNDS rounds, each of every target in turn: a slow minute on this shared machine then touches
# every target alike, and the table takes each target's median. The targets compared in the goals
# (limiting off, memory, Redis, nginx) run back to back.
for round in $(seq "$ROUNDS"); do
	log "round $round of $ROUNDS"
	targets=(upstream sluice-off sluice-memory sluice-redis sluice-redis-budget nginx sluice-refuse nginx-refuse bare-nethttp bare-hybrid bare-fasthttp)
	if [ -n "${BASE:-}" ]; then
		# The revision and this tree take turns going first: whatever a target's place in the
		# round costs (the one before it just stopped) falls on both alike.
		if ((round % 2)); then
			targets=(upstream sluice-off sluice-memory base-memory sluice-redis base-redis sluice-redis-budget nginx sluice-refuse nginx-refuse)
		else
			targets=(upstream sluice-off base-memory sluice-memory base-redis sluice-redis sluice-redis-budget nginx sluice-refuse nginx-refuse)
		fi
	fi
	for t in "${targets[@]}"; do
		run_target "$t"
	done
done
stop "$redis_pid"
stop "$up_pid"
measured="Measured $started at $revision: \`ROUNDS=$ROUNDS DURATION=$DURATION WARMUP=$WARMUP THREADS=$THREADS CONNECTIONS=$CONNECTIONS${BASE:+ BASE=$BASE} bash scripts/bench-gateway.sh\`."
cpu=$(awk -F': *' '/^model name/ {print $2; exit}' /proc/cpuinfo 2>/dev/null || true)
[ -n "$cpu" ] || cpu=$(lscpu 2>/dev/null | awk -F': *' '/^Model name/ {print $2; exit}' || true)
machine="Machine: $(nproc) CPUs, ${cpu:-unknown CPU}; $(uname -sr); $(go version | cut -d' ' -f3);\
 $(nginx -v 2>&1 | sed 's/^nginx version: //'); redis $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p');\
 $( (wrk -v 2>&1 || true) | head -1 | cut -d' ' -f1-2). wrk, the servers and the upstream share the CPUs;\
 load average before the run: $load_before, after: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)."
tables

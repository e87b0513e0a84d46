# What the benchmark scripts share (bench-gateway.sh, bench-rls.sh, bench-llm.sh): their log, a
# work directory and the processes they start (stop ends one; all are stopped on exit), free ports
# and a wait for a server.
# Source it after `set -euo pipefail`; set KEEP_OUT to a directory to keep the work's *.json,
# *.txt and *.log files there after the run.

log() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

work=$(mktemp -d)
pids=()
cleanup() {
	local pid
	for pid in "${pids[@]}"; do
		kill -TERM "$pid" 2>/dev/null || true
	done
	for pid in "${pids[@]}"; do
		wait "$pid" 2>/dev/null || true
	done
	if [ -n "${KEEP_OUT:-}" ]; then
		mkdir -p "$KEEP_OUT" && cp "$work"/*.json "$work"/*.txt "$work"/*.log "$KEEP_OUT"/ 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# stop ends one process this script started and forgets it.
stop() {
	local pid=$1 p keep=()
	kill -TERM "$pid" 2>/dev/null || true
	for _ in $(seq 100); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.05
	done
	kill -KILL "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	for p in "${pids[@]}"; do
		[ "$p" = "$pid" ] || keep+=("$p")
	done
	pids=("${keep[@]+"${keep[@]}"}")
}

free_port() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# wait_http polls URL until it answers with any HTTP status, for at most 15 seconds, while the
# process PID lives; LOG is shown if it does not.
wait_http() {
	local url=$1 pid=$2 logfile=$3 deadline=$((SECONDS + 15))
	while ((SECONDS < deadline)); do
		kill -0 "$pid" 2>/dev/null || { cat "$logfile" >&2; die "the server for $url exited"; }
		if curl -s -o /dev/null --max-time 1 "$url"; then
			return 0
		fi
		sleep 0.05
	done
	cat "$logfile" >&2
	die "$url did not answer within 15s"
}

# start_peer starts envoyproxy/ratelimit ($peer_bin, at $version) on a free port, on the Redis at
# $redis_port, with its runtime under $work/peer/runtime and $PEER_ENV's settings added ("K=V ..."),
# as its README recommends for throughput (bench-rls.sh's header says which), and waits for it with
# the caller's wait_ready ADDR PID LOG; it sets peer_addr and peer_pid.
start_peer() {
	local peer_port
	peer_port=$(free_port)
	peer_addr=127.0.0.1:$peer_port
	local -a peer_extra peer_env
	read -r -a peer_extra <<<"${PEER_ENV:-}"
	peer_env=(
		"PATH=$PATH" "HOME=$work/peer"
		REDIS_SOCKET_TYPE=tcp REDIS_TYPE=SINGLE "REDIS_URL=127.0.0.1:$redis_port"
		REDIS_PIPELINE_WINDOW=150us
		BACKEND_TYPE=redis LOCAL_CACHE_SIZE_IN_BYTES=0
		"RUNTIME_ROOT=$work/peer/runtime" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_APPDIRECTORY=config
		RUNTIME_WATCH_ROOT=false RUNTIME_IGNOREDOTFILES=true
		USE_STATSD=false DISABLE_STATS=true LOG_LEVEL=warn
		GRPC_HOST=127.0.0.1 "GRPC_PORT=$peer_port"
		HOST=127.0.0.1 "PORT=$(free_port)" DEBUG_HOST=127.0.0.1 "DEBUG_PORT=$(free_port)"
		"${peer_extra[@]+"${peer_extra[@]}"}"
	)
	log "starting the peer ($version) on $peer_addr"
	env -i "${peer_env[@]}" "$peer_bin" >"$work/peer.log" 2>&1 &
	peer_pid=$!
	pids+=("$peer_pid")
	wait_ready "$peer_addr" "$peer_pid" "$work/peer.log"
}

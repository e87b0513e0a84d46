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

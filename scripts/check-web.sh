#!/usr/bin/env bash
# Checks the browser simulation's committed assets: that web/assets holds exactly what
# scripts/build-web.sh builds from the sources and the lock file, and that the build is
# reproducible — two builds, the second with an empty Go build cache, give the same bytes.
# Fails with what differs and what to do. Needs Go, Node.js and npm (and the npm registry).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
	export PATH="/usr/local/go/bin:$PATH"
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

bash scripts/build-web.sh "$tmp/first" >/dev/null
GOCACHE="$tmp/gocache" bash scripts/build-web.sh "$tmp/second" >/dev/null

generated="sluice.wasm regions.wasm wasm_exec.js uPlot.iife.min.js uPlot.min.css uPlot.LICENSE.txt"
status=0
for f in $generated; do
	if ! cmp -s "$tmp/first/$f" "$tmp/second/$f"; then
		echo "check-web.sh: two builds of $f differ: the build is not reproducible (a path, a time or the checkout's state got into it?)" >&2
		status=1
	fi
done
[ "$status" -eq 0 ] || exit 1

stale=""
for f in $generated; do
	if ! cmp -s "$tmp/first/$f" "web/assets/$f"; then
		stale="$stale $f"
	fi
done
for f in index.html app.js style.css favicon.svg regions.html regions.js regions.css; do
	[ -f "web/assets/$f" ] || { echo "check-web.sh: web/assets/$f is missing" >&2; exit 1; }
done
if [ -n "$stale" ]; then
	echo "check-web.sh: web/assets is out of date: these files are not what scripts/build-web.sh builds with $(go env GOVERSION):$stale" >&2
	echo "  Run 'bash scripts/build-web.sh' (or 'go generate ./web') and commit web/assets." >&2
	exit 1
fi
echo "check-web.sh: web/assets is up to date, and its build is reproducible ($(go env GOVERSION))"

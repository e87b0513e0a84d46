#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what the tests need (redis-server, chromium,
# node), then runs gofmt, vet, the web assets' check, the race-enabled tests, a short fuzzing run of
# every fuzz target, and every benchmark once (so that they keep compiling and running; their
# numbers come from `scripts/bench.sh`).
set -euo pipefail
cd "$(dirname "$0")/.."

# Go lives in /usr/local/go on our machines; a non-login shell may not have it on PATH.
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
	export PATH="/usr/local/go/bin:$PATH"
fi
command -v go >/dev/null || { echo "test.sh: Go is not installed (https://go.dev/dl/)" >&2; exit 1; }

# apt_install NEEDED PACKAGE... installs the Debian packages (as root, with apt-get), or stops,
# saying what is NEEDED and how to install it.
apt_install() {
	local needed=$1
	shift
	echo "== installing $*"
	if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
		echo "test.sh: $needed (Debian: apt-get install $*)" >&2
		exit 1
	fi
	apt-get update -qq >/dev/null
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# Real Redis for the Redis store's tests (single servers and a cluster, started by the tests
# themselves on free loopback ports): install it where it is missing.
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1 || ! command -v redis-benchmark >/dev/null 2>&1; then
	apt_install "redis-server, redis-cli and redis-benchmark are needed" redis-server redis-tools
	# The package may start a system server on 6379; the tests use their own ports, so stop it.
	(service redis-server stop || true) >/dev/null 2>&1
fi

# Chromium for the browser tests of the web pages (web/, cmd/sluice), and Node.js/npm for
# check-web.sh (it rebuilds the page's vendored chart library from the lock file).
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
[ ${#missing[@]} -eq 0 ] || apt_install "chromium, node and npm are needed" "${missing[@]}"

# The official openai and @anthropic-ai/sdk packages, the real clients of the LLM tests
# (internal/llmtest), from their lock file. The tests install them too when they are missing or
# stale (llmtest.EnsureNode), but here the npm registry is known to be reachable.
echo "== npm ci (internal/llmtest/node)"
(cd internal/llmtest/node && npm ci --no-audit --no-fund >/dev/null)

# Real nginx and Caddy for the forward-auth recipes' tests (cmd/sluice, docs/forward-auth.md):
# the tests run them as their own processes on free loopback ports.
if { ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; } || ! command -v caddy >/dev/null 2>&1; then
	apt_install "nginx and caddy are needed" nginx caddy
	# The packages may start system servers on port 80; the tests use their own ports, so stop them.
	(service nginx stop || true) >/dev/null 2>&1
	(service caddy stop || true) >/dev/null 2>&1
fi

# systemd-analyze for the systemd unit's tests (deploy/): they verify the unit file offline, no
# running systemd needed.
command -v systemd-analyze >/dev/null 2>&1 || apt_install "systemd-analyze is needed" systemd

# podman and runc for the container image's test (deploy/): it builds the image with
# scripts/build-image.sh and runs it, with a podman configuration and storage of its own.
if ! command -v podman >/dev/null 2>&1 || ! command -v runc >/dev/null 2>&1; then
	apt_install "podman and runc are needed" podman runc
fi

# python3 for the benchmark scripts' tables, which a test prints from saved runs
# (config.TestPerformanceDocTables: scripts/bench-rls.sh computes its medians in Python).
command -v python3 >/dev/null 2>&1 || apt_install "python3 is needed" python3

# stress-ng, to load the CPU beside a test: a healthy Redis on a busy machine must not be taken
# for a dead one (cmd/sluice's TestServeE2EBusyMachine fails, rather than skips, without it).
command -v stress-ng >/dev/null 2>&1 || apt_install "stress-ng is needed" stress-ng

echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
	echo "gofmt would change:"; echo "$unformatted"; exit 1
fi

echo "== go vet"
go vet ./...

echo "== web assets up to date and reproducible"
bash scripts/check-web.sh

echo "== go test -race"
# -timeout: on a fresh machine, deploy/ builds helm from the Go module proxy and a static sluice
# for the container image first (minutes each, once: both are cached after).
go test -race -count=1 -timeout 25m ./...

# A count (Nx), not a duration: with a duration, go1.26's fuzz coordinator can report a spurious
# "context deadline exceeded" when the time runs out mid-execution (golang/go#75804, fixed in 1.27).
echo "== fuzz (${FUZZTIME:=20000x} per target)"
for pkg in $(go list ./...); do
	dir=$(go list -f '{{.Dir}}' "$pkg")
	for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //'); do
		echo "-- $pkg $target"
		go test -run='^$' -fuzz="^${target}\$" -fuzztime="$FUZZTIME" "$pkg" >/tmp/sluice-fuzz.log 2>&1 || { cat /tmp/sluice-fuzz.log; exit 1; }
	done
done

echo "== benchmarks, once each"
go test -run='^$' -bench=. -benchtime=1x ./... >/tmp/sluice-bench.log 2>&1 || { cat /tmp/sluice-bench.log; exit 1; }

echo "== all passed"

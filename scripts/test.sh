#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what the tests need (redis-server, chromium,
# node), then runs gofmt, vet, the web assets' check, the race-enabled tests, a short fuzzing run of
# every fuzz target, and every benchmark once (so that they keep compiling and running; their
# numbers come from `scripts/bench.sh`).
#
# The installs stop the script at the first failure: nothing after them can run without them. The
# stages after them all run, whichever failed before, so that one failure does not hide the
# others' results; the script ends with a summary of each stage, passed or FAILED, and exits 1 if
# any failed.
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

# shellcheck for the release's tests (deploy/): actionlint checks the release workflow's run:
# blocks with it, and the release scripts are checked with it.
command -v shellcheck >/dev/null 2>&1 || apt_install "shellcheck is needed" shellcheck

# python3 for the benchmark scripts' tables, which a test prints from saved runs
# (config.TestPerformanceDocTables: scripts/bench-rls.sh computes its medians in Python).
command -v python3 >/dev/null 2>&1 || apt_install "python3 is needed" python3

# stress-ng, to load the CPU beside a test: a healthy Redis on a busy machine must not be taken
# for a dead one (cmd/sluice's TestServeE2EBusyMachine fails, rather than skips, without it).
command -v stress-ng >/dev/null 2>&1 || apt_install "stress-ng is needed" stress-ng

# Where the stages keep the output they print only on failure.
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# stage NAME COMMAND...: runs COMMAND under the header NAME and records whether it passed. Not the
# installs' set -e: a failing stage is recorded and the next one runs.
results=()
failed=0
stage() {
	local name=$1
	shift
	echo "== $name"
	if "$@"; then
		results+=("passed  $name")
	else
		results+=("FAILED  $name")
		failed=1
	fi
}

gofmt_clean() {
	local unformatted
	unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go')) || return 1
	if [ -n "$unformatted" ]; then
		echo "gofmt would change:"
		echo "$unformatted"
		return 1
	fi
}

# go test's output goes to the console as it comes (its closing lines, the packages' ok and FAIL,
# are what a reader of the run looks for), and to a log, from which the summary repeats its
# failures.
race_tests() {
	# -timeout: on a fresh machine, deploy/ builds helm from the Go module proxy and a static sluice
	# for the container image first (minutes each, once: both are cached after).
	go test -race -count=1 -timeout 25m ./... 2>&1 | tee "$logs/test.log"
}

# fuzz_target PACKAGE TARGET: the short fuzzing run of one target, its output printed if it fails.
fuzz_target() {
	go test -run='^$' -fuzz="^${2}\$" -fuzztime="$FUZZTIME" "$1" >"$logs/fuzz.log" 2>&1 || { cat "$logs/fuzz.log"; return 1; }
}

# fuzz_targets prints PACKAGE:TARGET for every fuzz target of the module.
fuzz_targets() {
	local pkgs pkg dir
	pkgs=$(go list ./...) || return 1
	for pkg in $pkgs; do
		dir=$(go list -f '{{.Dir}}' "$pkg") || return 1
		grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed "s|^func |$pkg:|"
	done
	return 0 # (grep finds none in most packages)
}

benchmarks() {
	go test -run='^$' -bench=. -benchtime=1x ./... >"$logs/bench.log" 2>&1 || { cat "$logs/bench.log"; return 1; }
}

stage gofmt gofmt_clean
stage "go vet" go vet ./...
stage "web assets up to date and reproducible" bash scripts/check-web.sh
stage "go test -race" race_tests

# A count (Nx), not a duration: with a duration, go1.26's fuzz coordinator can report a spurious
# "context deadline exceeded" when the time runs out mid-execution (fixed in Go 1.27).
: "${FUZZTIME:=20000x}"
if targets=$(fuzz_targets); then
	for t in $targets; do
		stage "fuzz ${t%:*} ${t##*:} ($FUZZTIME)" fuzz_target "${t%:*}" "${t##*:}"
	done
else
	stage "fuzz: listing the targets" false
fi

stage "benchmarks, once each" benchmarks

echo
echo "== summary"
printf '%s\n' "${results[@]}"
if [ "$failed" -ne 0 ]; then
	if grep -q -e '^FAIL' -e '^--- FAIL' -e '^panic: ' "$logs/test.log" 2>/dev/null; then
		echo "go test -race's failures:"
		grep -e '^FAIL' -e '^--- FAIL' -e '^panic: ' "$logs/test.log"
	fi
	echo "== some stages FAILED"
	exit 1
fi
echo "== all passed"

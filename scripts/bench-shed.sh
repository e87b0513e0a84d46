#!/usr/bin/env bash
# Load shedding's figures (docs/performance.md, Load shedding): the latency of answered requests while an
# upstream of 8 workers × 10ms (800 requests/s) gets 1500 requests/s, with and without
# load_shedding. See BenchmarkShedOverload in gateway/shed_bench_test.go.
set -euo pipefail
cd "$(dirname "$0")/.."
exec go test -run '^$' -bench '^BenchmarkShedOverload$' -benchtime 1x -count "${COUNT:-1}" ./gateway

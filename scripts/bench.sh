#!/usr/bin/env bash
# The benchmarks whose numbers the README quotes, each beside its baseline in the same run.
# Our machines are noisy (neighbours come and go within seconds), so the whole set runs many
# short times in rounds — every implementation once per round, so a noisy spell hits all alike —
# and benchstat reports each one's median, spread and ratio to the baseline.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
	export PATH="/usr/local/go/bin:$PATH"
fi
benchstat="go run golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

go test -c -o "$work/memory.test" ./store/memory/
for round in $(seq "${ROUNDS:-10}"); do
	"$work/memory.test" -test.run='^$' -test.bench=BenchmarkMemoryAllowParallel -test.benchmem \
		-test.benchtime="${BENCHTIME:-300ms}" >>"$work/memory.txt"
done
grep -E '^(goos|goarch|pkg|cpu):' "$work/memory.txt" | sort -u
echo
$benchstat -col /impl "$work/memory.txt"

# The Redis store: decisions per second and latency from 64 goroutines on one local Redis, beside
# go-redis doing one EVALSHA per round trip and redis-benchmark's ceiling, in the same run.
go test -c -o "$work/redis.test" ./store/redis/
for round in $(seq "${REDIS_ROUNDS:-5}"); do
	"$work/redis.test" -test.run='^$' -test.bench=BenchmarkRedisDecisions -test.benchtime=100000x >>"$work/redis.txt"
done
echo
$benchstat -col /impl "$work/redis.txt"

# The same on a 3-master Redis Cluster: batched by hash slot beside one script per decision,
# on many clients and on a few hot ones.
for round in $(seq "${REDIS_ROUNDS:-5}"); do
	"$work/redis.test" -test.run='^$' -test.bench=BenchmarkRedisClusterDecisions -test.benchtime=50000x >>"$work/cluster.txt"
done
echo
$benchstat -col /impl "$work/cluster.txt"

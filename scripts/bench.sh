#!/usr/bin/env bash
# The benchmarks whose numbers docs/performance.md quotes, each beside its baselines in the same run.
# Our machines are noisy (neighbours come and go within seconds), so the whole set runs many
# short times in rounds — every implementation once per round, so a noisy spell hits all alike —
# and benchstat reports each one's median, spread and ratio to the baseline. At the end, the
# medians again as Markdown tables for docs/performance.md, with the ratios to the baselines.
#
# ROUNDS (memory, default 10), BENCHTIME (memory, default 300ms) and REDIS_ROUNDS (Redis and
# Redis Cluster, default 7: benchstat needs 6 for a confidence interval) set the length; the
# defaults take about 5–6 minutes on 2 cores.
#
# BASE=<git revision> also builds the memory and Redis benchmarks at that revision and runs them
# in the same rounds, each right after this tree's, then prints benchstat's comparison of the two
# (old: the revision, new: this tree): what a change costs or gains, measured side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
	export PATH="/usr/local/go/bin:$PATH"
fi
benchstat="go run golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da"
work=$(mktemp -d)
# BENCH_OUT=dir keeps every round's raw output there (memory.txt, redis.txt, cluster.txt, budgets.txt).
trap 'if [ -n "${BENCH_OUT:-}" ]; then mkdir -p "$BENCH_OUT" && cp "$work"/*.txt "$BENCH_OUT"/; fi; git worktree prune 2>/dev/null || true; rm -rf "$work"' EXIT

# The memory store beside golang.org/x/time/rate twice: calling Allow (time.Now) and AllowN at
# the time read from the memory store's own clock; and the two clocks' cost alone.
go test -c -o "$work/memory.test" ./store/memory/
go test -c -o "$work/redis.test" ./store/redis/
if [ -n "${BASE:-}" ]; then
	base_rev=$(git rev-parse --short "$BASE^{commit}")
	git worktree add -q --detach "$work/base" "$base_rev"
	(cd "$work/base" && go test -c -o "$work/memory-base.test" ./store/memory/ && go test -c -o "$work/redis-base.test" ./store/redis/)
	git worktree remove --force "$work/base"
fi
for round in $(seq "${ROUNDS:-10}"); do
	"$work/memory.test" -test.run='^$' -test.bench='^BenchmarkMemory(AllowParallel|Clock)$' -test.benchmem \
		-test.benchtime="${BENCHTIME:-300ms}" >>"$work/memory.txt"
	if [ -n "${BASE:-}" ]; then
		for tree in memory-base memory-new; do
			bin=$work/memory.test
			[ "$tree" = memory-base ] && bin=$work/memory-base.test
			"$bin" -test.run='^$' -test.bench='^BenchmarkMemoryAllowParallel$/keys=10000/' -test.benchmem \
				-test.benchtime="${BENCHTIME:-300ms}" >>"$work/$tree.txt"
		done
	fi
done
grep -E '^(goos|goarch|pkg|cpu):' "$work/memory.txt" | sort -u
echo
$benchstat -col /impl "$work/memory.txt"
echo
echo "== The same against the baseline on the same clock (x/time/rate AllowN)"
$benchstat -filter '.name:MemoryAllowParallel -/impl:x-time-rate' -col /impl "$work/memory.txt" | awk '/^$/ { done = 1 } !done'

# The Redis store: decisions per second and latency from 64 goroutines on one local Redis, beside
# redis_rate, go-redis doing one EVALSHA per round trip, the one-script ceiling and
# redis-benchmark, in the same run.
for round in $(seq "${REDIS_ROUNDS:-7}"); do
	"$work/redis.test" -test.run='^$' -test.bench='^BenchmarkRedisDecisions$' -test.benchtime=100000x >>"$work/redis.txt"
	if [ -n "${BASE:-}" ]; then
		"$work/redis-base.test" -test.run='^$' -test.bench='^BenchmarkRedisDecisions$/^impl=sluice$' -test.benchtime=100000x >>"$work/redis-base.txt"
		"$work/redis.test" -test.run='^$' -test.bench='^BenchmarkRedisDecisions$/^impl=sluice$' -test.benchtime=100000x >>"$work/redis-new.txt"
	fi
done
echo
$benchstat -col /impl "$work/redis.txt"

# The same on a 3-master Redis Cluster: batched by hash slot beside one script per decision,
# on many clients and on a few hot ones.
for round in $(seq "${REDIS_ROUNDS:-7}"); do
	"$work/redis.test" -test.run='^$' -test.bench='^BenchmarkRedisClusterDecisions$' -test.benchtime=50000x >>"$work/cluster.txt"
done
echo
$benchstat -col /impl "$work/cluster.txt"

# Local budgets: the same store exact and under sluice.Budgeted (budgets of 100), 64 goroutines,
# on 10,000 keys and on one hot key, in the same rounds.
for round in $(seq "${REDIS_ROUNDS:-7}"); do
	"$work/redis.test" -test.run='^$' -test.bench='^BenchmarkRedisBudgets$' -test.benchtime=200000x >>"$work/budgets.txt"
done
echo
$benchstat -col /impl "$work/budgets.txt"

# summary prints the medians of the rounds in $1 as Markdown tables (see the END block): every
# benchmark line's name (less its -GOMAXPROCS suffix) and unit give one list of values.
summary() {
	awk -v rounds="$2" '
	function median(k,    n, i, j, v, a) {
		n = cnt[k]
		if (n == 0) return ""
		for (i = 1; i <= n; i++) a[i] = val[k, i]
		for (i = 2; i <= n; i++) { v = a[i]; for (j = i - 1; j >= 1 && a[j] > v; j--) a[j + 1] = a[j]; a[j + 1] = v }
		return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
	}
	function m(name, unit) { return median(name SUBSEP unit) }
	function num(x) { return x == "" ? "–" : x >= 1000 ? commas(sprintf("%.0f", x)) : x >= 100 ? sprintf("%.0f", x) : sprintf("%.1f", x) }
	function commas(s,    out) { out = ""; while (length(s) > 3) { out = "," substr(s, length(s) - 2) out; s = substr(s, 1, length(s) - 3) }; return s out }
	function us(x) { return x == "" || x == 0 ? "–" : sprintf("%.2f ms", x / 1000) }
	function times(a, b) { return a == "" || b == "" || b == 0 ? "–" : sprintf("%.2f×", a / b) }
	/^Benchmark/ {
		name = $1; sub(/-[0-9]+$/, "", name)
		for (i = 3; i + 1 <= NF; i += 2) { k = name SUBSEP $(i + 1); val[k, ++cnt[k]] = $i }
	}
	END {
		mem = "BenchmarkMemoryAllowParallel/keys="
		if (cnt[mem "10000/impl=x-time-rate" SUBSEP "ns/op"]) {
			print "Memory store; speed-up = the baseline'"'"'s ns / ns (above 1: faster than the baseline)\n"
			print "| ns per decision, median of " rounds " rounds | 10,000 keys | speed-up vs `Allow` (time.Now) | speed-up vs `AllowN` (same clock) | one hot key | bytes allocated per decision (10,000 keys) |"
			print "|---|---|---|---|---|---|"
			split("x-time-rate x-time-rate-monotonic fixed-window sliding-log sliding-window token-bucket leaky-bucket", impls, " ")
			label["x-time-rate"] = "x/time/rate map, `Allow` (time.Now)"
			label["x-time-rate-monotonic"] = "x/time/rate map, `AllowN` (same clock)"
			base1 = m(mem "10000/impl=x-time-rate", "ns/op"); base2 = m(mem "10000/impl=x-time-rate-monotonic", "ns/op")
			for (i = 1; i <= 7; i++) {
				im = impls[i]; many = m(mem "10000/impl=" im, "ns/op"); hot = m(mem "1/impl=" im, "ns/op")
				b = m(mem "10000/impl=" im, "B/op")
				printf "| %s | %s | %s | %s | %s | %.0f |\n", (im in label ? label[im] : im), num(many), times(base1, many), times(base2, many), num(hot), b
			}
			printf "\nClock reads, parallel: time.Now %s ns, monotonic (time.Since) %s ns.\n\n", num(m("BenchmarkMemoryClock/impl=time-now", "ns/op")), num(m("BenchmarkMemoryClock/impl=monotonic", "ns/op"))
		}
		r = "BenchmarkRedisDecisions/impl="
		if (cnt[r "sluice" SUBSEP "decisions/s"]) {
			printf "Redis store, token bucket, 64 goroutines, 10,000 keys, medians of %s rounds\n\n", rounds
			print "| | decisions/s | vs redis_rate | vs one-script ceiling | p50 | p99 | decisions per script call |"
			print "|---|---|---|---|---|---|---|"
			split("sluice sluice-unbatched redis_rate go-redis-evalsha ceiling ceiling-sluice-commands ceiling-go-redis redis-benchmark", impls, " ")
			label["sluice"] = "**sluice** (rueidis, auto-pipelining, batches of waiting decisions)"
			label["sluice-unbatched"] = "sluice with `MaxBatch: 1` (one script per decision, pipelined)"
			label["redis_rate"] = "`go-redis/redis_rate/v10` (GCRA, go-redis, pool of 64)"
			label["go-redis-evalsha"] = "sluice'"'"'s script through go-redis, one EVALSHA per round trip (pool of 64)"
			label["ceiling"] = "one-script ceiling: EVALSHA of one HINCRBY per decision, rueidis"
			label["ceiling-sluice-commands"] = "the same with a script of sluice'"'"'s Redis commands (TIME, GET, EXISTS, SET … PX), no arithmetic"
			label["ceiling-go-redis"] = "the minimal script through go-redis (pool of 64)"
			label["redis-benchmark"] = "`redis-benchmark -c 64 -P 16` running EVALSHA of sluice'"'"'s script"
			rr = m(r "redis_rate", "decisions/s"); ceil = m(r "ceiling", "decisions/s")
			for (i = 1; i <= 8; i++) {
				im = impls[i]; v = m(r im, "decisions/s"); dc = m(r im, "decisions/call")
				printf "| %s | %s | %s | %s | %s | %s | %s |\n", label[im], num(v), times(v, rr), times(v, ceil), us(m(r im, "p50-µs")), us(m(r im, "p99-µs")), dc == "" ? "1" : sprintf("%.1f", dc)
			}
			print ""
		}
		bu = "BenchmarkRedisBudgets/keys="
		if (cnt[bu "10000/impl=exact" SUBSEP "decisions/s"]) {
			printf "Redis store with local budgets (size 100), token bucket, 64 goroutines, medians of %s rounds\n\n", rounds
			print "| keys | exact decisions/s | with budgets | budgets vs exact | p99 (exact / budgets) | decisions per script call (budgets) |"
			print "|---|---|---|---|---|---|"
			split("10000 1", ks, " ")
			for (i = 1; i <= 2; i++) {
				k = ks[i]; ev = m(bu k "/impl=exact", "decisions/s"); bv = m(bu k "/impl=budget-100", "decisions/s")
				printf "| %s | %s | %s | %s | %s / %s | %.1f |\n", commas(k), num(ev), num(bv), times(bv, ev), us(m(bu k "/impl=exact", "p99-µs")), us(m(bu k "/impl=budget-100", "p99-µs")), m(bu k "/impl=budget-100", "decisions/call")
			}
			print ""
		}
		c = "BenchmarkRedisClusterDecisions/keys="
		if (cnt[c "10000/impl=sluice" SUBSEP "decisions/s"]) {
			printf "Redis Cluster (3 masters), token bucket, 64 goroutines, medians of %s rounds\n\n", rounds
			print "| clients | sluice decisions/s | `MaxBatch: 1` decisions/s | batched vs `MaxBatch: 1` | p50 (batched / 1) | decisions per script call |"
			print "|---|---|---|---|---|---|"
			split("10000 100 4", ks, " ")
			for (i = 1; i <= 3; i++) {
				k = ks[i]; bv = m(c k "/impl=sluice", "decisions/s"); uv = m(c k "/impl=sluice-unbatched", "decisions/s")
				printf "| %s | %s | %s | %s | %s / %s | %.1f |\n", commas(k), num(bv), num(uv), times(bv, uv), us(m(c k "/impl=sluice", "p50-µs")), us(m(c k "/impl=sluice-unbatched", "p50-µs")), m(c k "/impl=sluice", "decisions/call")
			}
			print ""
		}
	}' "$1"
}
echo
echo "== Summary for docs/performance.md (medians of the rounds above)"
echo
summary "$work/memory.txt" "${ROUNDS:-10}"
summary "$work/redis.txt" "${REDIS_ROUNDS:-7}"
summary "$work/cluster.txt" "${REDIS_ROUNDS:-7}"
summary "$work/budgets.txt" "${REDIS_ROUNDS:-7}"
if [ -n "${BASE:-}" ]; then
	echo
	echo "== This tree (new) beside $BASE ($base_rev, old), in the same rounds"
	echo
	$benchstat "$work/memory-base.txt" "$work/memory-new.txt"
	echo
	$benchstat "$work/redis-base.txt" "$work/redis-new.txt"
fi

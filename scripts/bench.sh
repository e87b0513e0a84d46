#!/usr/bin/env bash
# The benchmarks whose numbers docs/performance.md quotes, each beside its baselines in the same run.
# Our machines are noisy (neighbours come and go within seconds), so the whole set runs many
# short times in rounds — every implementation once per round, so a noisy spell hits all alike —
# and benchstat reports each one's median, spread and ratio to the baseline. At the end, the
# medians again as the Markdown tables of docs/performance.md (with the date, revision, settings
# and machine of the run), with the ratios to the baselines, and the goals they
# measure: yes or no. FROM=dir prints those tables again from a run's raw output (see BENCH_OUT).
#
# ROUNDS (memory, default 10), BENCHTIME (memory, default 300ms) and REDIS_ROUNDS (Redis and
# Redis Cluster, default 7: benchstat needs 6 for a confidence interval) set the length; the
# defaults take about 5–6 minutes on 2 cores.
#
# BASE=<git revision> also builds the memory and Redis benchmarks at that revision and runs them
# in the same rounds, each right after this tree's, then prints benchstat's comparison of the two
# (old: the revision, new: this tree): what a change costs or gains, measured side by side.
set -euo pipefail
[ -z "${FROM:-}" ] || FROM=$(realpath -m -- "$FROM") # FROM is read after the cd below
cd "$(dirname "$0")/.."
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
	export PATH="/usr/local/go/bin:$PATH"
fi
# summary prints the medians of the rounds in the files given (memory.txt, redis.txt, cluster.txt,
# budgets.txt, any of them) as the Markdown tables docs/performance.md uses, and last the goals of
# these benchmarks measure: every benchmark line's name (less its -GOMAXPROCS
# suffix) and unit give one list of values; a table's "median of N rounds" counts its lines.
summary() {
	awk '
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
	function ratio(a, b) { return a == "" || b == "" || b == 0 ? "" : a / b }
	function times(x) { return x == "" ? "–" : sprintf("%.2f×", x) }
	function perCall(x) { return x == "" ? "1" : sprintf("%.1f", x) }
	# met says whether x (a ratio or a count), to the two decimals printed, is at least (op ">=")
	# or exactly (op "==") goal; a figure that is missing meets nothing.
	function met(x, op, goal) { if (x == "") return "–"; x = sprintf("%.2f", x) + 0; return (op == ">=" ? x >= goal : x == goal) ? "yes" : "no" }
	/^Benchmark/ {
		name = $1; sub(/-[0-9]+$/, "", name)
		for (i = 3; i + 1 <= NF; i += 2) { k = name SUBSEP $(i + 1); val[k, ++cnt[k]] = $i }
	}
	END {
		mem = "BenchmarkMemoryAllowParallel/keys="
		if (cnt[mem "10000/impl=x-time-rate" SUBSEP "ns/op"]) {
			print "Memory store; speed-up = the baseline'"'"'s ns / ns (above 1: faster than the baseline)\n"
			print "| ns per decision, median of " cnt[mem "10000/impl=x-time-rate" SUBSEP "ns/op"] " rounds | 10,000 keys | speed-up vs `Allow` (time.Now) | speed-up vs `AllowN` (same clock) | one hot key | bytes allocated per decision (10,000 keys) |"
			print "|---|---|---|---|---|---|"
			split("x-time-rate x-time-rate-monotonic fixed-window sliding-log sliding-window token-bucket leaky-bucket", impls, " ")
			label["x-time-rate"] = "x/time/rate map, `Allow` (time.Now)"
			label["x-time-rate-monotonic"] = "x/time/rate map, `AllowN` (same clock)"
			base1 = m(mem "10000/impl=x-time-rate", "ns/op"); base2 = m(mem "10000/impl=x-time-rate-monotonic", "ns/op")
			for (i = 1; i <= 7; i++) {
				im = impls[i]; many = m(mem "10000/impl=" im, "ns/op"); hot = m(mem "1/impl=" im, "ns/op")
				b = m(mem "10000/impl=" im, "B/op")
				printf "| %s | %s | %s | %s | %s | %s |\n", (im in label ? label[im] : im), num(many), times(ratio(base1, many)), times(ratio(base2, many)), num(hot), b == "" ? "–" : sprintf("%.0f", b)
			}
			printf "\nClock reads, parallel: time.Now %s ns, monotonic (time.Since) %s ns.\n\n", num(m("BenchmarkMemoryClock/impl=time-now", "ns/op")), num(m("BenchmarkMemoryClock/impl=monotonic", "ns/op"))
			tb = m(mem "10000/impl=token-bucket", "ns/op")
			goals = goals sprintf("| token bucket, 10,000 keys: x/time/rate `Allow` ns / token bucket ns | %s | ≥ 1.5× | %s |\n", times(ratio(base1, tb)), met(ratio(base1, tb), ">=", 1.5))
			goals = goals sprintf("| token bucket, 10,000 keys: x/time/rate `AllowN` (same clock) ns / token bucket ns | %s | none: the baseline on sluice'"'"'s clock, shown beside | |\n", times(ratio(base2, tb)))
			tbb = m(mem "10000/impl=token-bucket", "B/op")
			goals = goals sprintf("| token bucket, 10,000 keys: bytes allocated per decision | %s | 0 B | %s |\n", tbb == "" ? "–" : sprintf("%.0f B", tbb), met(tbb, "==", 0))
		}
		r = "BenchmarkRedisDecisions/impl="
		if (cnt[r "sluice" SUBSEP "decisions/s"]) {
			printf "Redis store, token bucket, 64 goroutines, 10,000 keys, medians of %s rounds\n\n", cnt[r "sluice" SUBSEP "decisions/s"]
			print "| | decisions/s | vs redis_rate | vs one-script ceiling | p50 | p99 | decisions per script call | Redis CPU µs per decision |"
			print "|---|---|---|---|---|---|---|---|"
			split("sluice sluice-unbatched sluice-scripts sluice-scripts-unbatched redis_rate go-redis-evalsha ceiling ceiling-sluice-commands ceiling-go-redis redis-benchmark", impls, " ")
			label["sluice"] = "**sluice** (rueidis, auto-pipelining, batches of waiting decisions, FCALL)"
			label["sluice-unbatched"] = "sluice with `MaxBatch: 1` (one function call per decision, pipelined)"
			label["sluice-scripts"] = "sluice calling its Lua scripts (EVALSHA), as on a server without Functions"
			label["sluice-scripts-unbatched"] = "the same with `MaxBatch: 1`"
			label["redis_rate"] = "`go-redis/redis_rate/v10` (GCRA, go-redis, pool of 64)"
			label["go-redis-evalsha"] = "sluice'"'"'s script through go-redis, one EVALSHA per round trip (pool of 64)"
			label["ceiling"] = "one-script ceiling: EVALSHA of one HINCRBY per decision, rueidis"
			label["ceiling-sluice-commands"] = "the same with a script of sluice'"'"'s Redis commands (TIME, GET, EXISTS, SET … PX), no arithmetic"
			label["ceiling-go-redis"] = "the minimal script through go-redis (pool of 64)"
			label["redis-benchmark"] = "`redis-benchmark -c 64 -P 16` running EVALSHA of sluice'"'"'s script"
			rr = m(r "redis_rate", "decisions/s"); ceil = m(r "ceiling", "decisions/s")
			for (i = 1; i <= 10; i++) {
				im = impls[i]; v = m(r im, "decisions/s")
				if (v == "") continue
				cpu = m(r im, "redis-µs/decision")
				printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", label[im], num(v), times(ratio(v, rr)), times(ratio(v, ceil)), us(m(r im, "p50-µs")), us(m(r im, "p99-µs")), perCall(m(r im, "decisions/call")), cpu == "" ? "–" : sprintf("%.1f", cpu)
			}
			print ""
			sl = ratio(m(r "sluice", "decisions/s"), rr)
			goals = goals sprintf("| Redis store, 64 callers, 10,000 keys: sluice decisions/s / redis_rate | %s | ≥ 1.5× | %s |\n", times(sl), met(sl, ">=", 1.5))
			goals = goals sprintf("| the same, the moonshot | %s | ≥ 2× | %s |\n", times(sl), met(sl, ">=", 2))
		}
		bu = "BenchmarkRedisBudgets/keys="
		if (cnt[bu "10000/impl=exact" SUBSEP "decisions/s"]) {
			printf "Redis store with local budgets (size 100), token bucket, 64 goroutines, medians of %s rounds\n\n", cnt[bu "10000/impl=exact" SUBSEP "decisions/s"]
			print "| keys | exact decisions/s | with budgets | budgets vs exact | p99 (exact / budgets) | decisions per script call (budgets) |"
			print "|---|---|---|---|---|---|"
			split("10000 1", ks, " ")
			for (i = 1; i <= 2; i++) {
				k = ks[i]; ev = m(bu k "/impl=exact", "decisions/s"); bv = m(bu k "/impl=budget-100", "decisions/s")
				printf "| %s | %s | %s | %s | %s / %s | %s |\n", commas(k), num(ev), num(bv), times(ratio(bv, ev)), us(m(bu k "/impl=exact", "p99-µs")), us(m(bu k "/impl=budget-100", "p99-µs")), perCall(m(bu k "/impl=budget-100", "decisions/call"))
			}
			print ""
		}
		c = "BenchmarkRedisClusterDecisions/keys="
		if (cnt[c "10000/impl=sluice" SUBSEP "decisions/s"]) {
			printf "Redis Cluster (3 masters), token bucket, 64 goroutines, medians of %s rounds\n\n", cnt[c "10000/impl=sluice" SUBSEP "decisions/s"]
			print "| clients | sluice decisions/s | `MaxBatch: 1` decisions/s | batched vs `MaxBatch: 1` | p50 (batched / 1) | decisions per script call |"
			print "|---|---|---|---|---|---|"
			split("10000 100 4", ks, " ")
			for (i = 1; i <= 3; i++) {
				k = ks[i]; bv = m(c k "/impl=sluice", "decisions/s"); uv = m(c k "/impl=sluice-unbatched", "decisions/s")
				printf "| %s | %s | %s | %s | %s / %s | %s |\n", commas(k), num(bv), num(uv), times(ratio(bv, uv)), us(m(c k "/impl=sluice", "p50-µs")), us(m(c k "/impl=sluice-unbatched", "p50-µs")), perCall(m(c k "/impl=sluice", "decisions/call"))
			}
			print ""
		}
		if (goals != "") {
			print "Goals\n"
			print "| ratio | value | goal | met |"
			print "|---|---:|---|---|"
			printf "%s", goals
		}
	}' "$@"
}

# FROM=dir prints the summary again from the raw output a run kept with BENCH_OUT=dir, measuring
# nothing: to print the tables of a saved run, or to check what this script prints.
if [ -n "${FROM:-}" ]; then
	files=()
	for f in memory redis cluster budgets; do
		[ ! -f "$FROM/$f.txt" ] || files+=("$FROM/$f.txt")
	done
	((${#files[@]})) || { echo "bench.sh: FROM=$FROM holds none of memory.txt, redis.txt, cluster.txt, budgets.txt" >&2; exit 1; }
	echo "== Summary for docs/performance.md (medians of the rounds in $FROM)"
	echo
	if [ -f "$FROM/run.txt" ]; then cat "$FROM/run.txt"; else echo "Measured: unknown ($FROM has no run.txt)."; fi
	echo
	summary "${files[@]}"
	exit 0
fi

benchstat="go run golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da"
work=$(mktemp -d)
# BENCH_OUT=dir keeps every round's raw output there (memory.txt, redis.txt, cluster.txt, budgets.txt,
# and run.txt: the date, revision, settings and machine), for FROM=dir to print again.
trap 'if [ -n "${BENCH_OUT:-}" ]; then mkdir -p "$BENCH_OUT" && cp "$work"/*.txt "$BENCH_OUT"/; fi; git worktree prune 2>/dev/null || true; rm -rf "$work"' EXIT

# What the summary says of the run: when, at which revision, with which settings.
started=$(date -u +%Y-%m-%d)
revision=$(git rev-parse --short HEAD)
[ -z "$(git status --porcelain --untracked-files=no)" ] || revision+=" with uncommitted changes"
load_before=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)

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

{
	printf 'Measured %s at %s: `ROUNDS=%s BENCHTIME=%s REDIS_ROUNDS=%s bash scripts/bench.sh`.\n' \
		"$started" "$revision" "${ROUNDS:-10}" "${BENCHTIME:-300ms}" "${REDIS_ROUNDS:-7}"
	printf 'Machine: %s CPUs, %s; %s; %s; redis %s. The benchmarks, their baselines and redis-server share the CPUs; load average before the run: %s, after: %s.\n' \
		"$(nproc)" "$(sed -n 's/^cpu: //p' "$work/memory.txt" | head -1)" "$(uname -sr)" "$(go version | cut -d' ' -f3-4)" \
		"$(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p')" "$load_before" "$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)"
} >"$work/run.txt"
echo
echo "== Summary for docs/performance.md (medians of the rounds above)"
echo
cat "$work/run.txt"
echo
summary "$work/memory.txt" "$work/redis.txt" "$work/cluster.txt" "$work/budgets.txt"
if [ -n "${BASE:-}" ]; then
	echo
	echo "== This tree (new) beside $BASE ($base_rev, old), in the same rounds"
	echo
	$benchstat "$work/memory-base.txt" "$work/memory-new.txt"
	echo
	$benchstat "$work/redis-base.txt" "$work/redis-new.txt"
fi

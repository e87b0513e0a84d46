#!/usr/bin/env bash
# The benchmarks whose numbers the README quotes, each beside its baseline in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
	export PATH="/usr/local/go/bin:$PATH"
fi
go test -run='^$' -bench=BenchmarkMemoryAllowParallel -benchmem -count="${COUNT:-3}" ./store/memory/

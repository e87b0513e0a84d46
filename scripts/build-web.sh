#!/usr/bin/env bash
# Builds the browser simulation's generated assets into web/assets (or into the folder given as
# the first argument), from the lock file and the Go toolchain in use:
#
#   uPlot.iife.min.js, uPlot.min.css, uPlot.LICENSE.txt   from npm (web/package-lock.json, `npm ci`)
#   wasm_exec.js                                           from $(go env GOROOT)/lib/wasm
#   sluice.wasm                                            web/wasm, GOOS=js GOARCH=wasm
#   regions.wasm                                           web/wasm/regions, the same way
#
# regions.wasm is the regions page's own (regions.html): it holds what simulating regions needs
# (the decision layer, the refresher, the Go ledger), which the main page does not load. The
# hand-written assets (index.html, app.js, style.css, favicon.svg, regions.html, regions.js,
# regions.css) are not touched. The build is reproducible: the same sources and Go version give
# the same bytes (scripts/check-web.sh checks that, and that the committed files are what this
# script makes). Run it after changing anything the pages run (algorithm, store/memory, sim,
# web/scenario, web/wasm; for regions.wasm also decision, region, ledger, sim/regions) and commit
# web/assets; `go generate ./web` runs it too.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
	export PATH="/usr/local/go/bin:$PATH"
fi
for tool in go node npm; do
	command -v "$tool" >/dev/null || { echo "build-web.sh: $tool is needed (Node.js 18 or later for node and npm)" >&2; exit 1; }
done

out=${1:-web/assets}
mkdir -p "$out"

# The chart library, exactly as locked (integrity-checked by npm ci); no install scripts run.
(cd web && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null)
cp web/node_modules/uplot/dist/uPlot.iife.min.js web/node_modules/uplot/dist/uPlot.min.css "$out/"
cp web/node_modules/uplot/LICENSE "$out/uPlot.LICENSE.txt"

# Go's loader for the WebAssembly it builds: it must come from the same Go as sluice.wasm.
cp "$(go env GOROOT)/lib/wasm/wasm_exec.js" "$out/"

# -trimpath and -buildvcs=false keep paths and the checkout's state out of the binary, and
# -buildid= its build ID, so that the bytes depend on the sources and the Go version only.
for wasm in sluice:./web/wasm regions:./web/wasm/regions; do
	GOOS=js GOARCH=wasm CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags="-s -w -buildid=" \
		-o "$out/${wasm%%:*}.wasm" "${wasm#*:}"
done
chmod 644 "$out"/*

echo "build-web.sh: $(cd "$out" && ls -l sluice.wasm regions.wasm wasm_exec.js uPlot.iife.min.js uPlot.min.css | awk '{printf "%s %s B; ", $NF, $5}')"

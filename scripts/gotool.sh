#!/usr/bin/env bash
# Prints the path of a pinned Go tool the release and its tests use, building it first if it is
# not cached: `go install MODULE@VERSION` into os.UserCacheDir()/sluice-NAME/VERSION/ (on Linux
# ${XDG_CACHE_HOME:-~/.cache}), built into a directory of its own and renamed into place, so that
# a run elsewhere at the same time never finds half a binary. The versions are pinned here, and
# helm's is the one deploy/helm_test.go builds (helmVersion there) into the same place.
#
#   scripts/gotool.sh helm               # helm v3.22.0 (HELM=/path/to/helm: that one instead)
#   scripts/gotool.sh cyclonedx-gomod    # the SBOM generator, v1.10.0
#   scripts/gotool.sh actionlint         # the GitHub workflow linter, v1.7.12
set -euo pipefail

if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
	export PATH="/usr/local/go/bin:$PATH"
fi

case ${1:-} in
helm)
	if [ -n "${HELM:-}" ]; then
		printf '%s\n' "$HELM"
		exit 0
	fi
	pkg=helm.sh/helm/v3/cmd/helm version=v3.22.0 ;;
cyclonedx-gomod) pkg=github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod version=v1.10.0 ;;
actionlint) pkg=github.com/rhysd/actionlint/cmd/actionlint version=v1.7.12 ;;
*)
	echo "gotool.sh: unknown tool \"${1:-}\": want helm, cyclonedx-gomod or actionlint" >&2
	exit 2 ;;
esac
name=$1

cache=${XDG_CACHE_HOME:-$HOME/.cache}
dir="$cache/sluice-$name/$version"
bin="$dir/$name"
if [ -x "$bin" ]; then
	printf '%s\n' "$bin"
	exit 0
fi
command -v go >/dev/null || { echo "gotool.sh: Go is not installed (https://go.dev/dl/)" >&2; exit 1; }
mkdir -p "$dir"
tmp=$(mktemp -d "$dir/build-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "gotool.sh: building $name $version into $dir (once; minutes)" >&2
# Outside this module (go install pkg@version ignores it anyway) and without its GOFLAGS; for
# this machine, whatever GOOS and GOARCH the caller cross-builds for.
(cd "$tmp" && env -u GOOS -u GOARCH GOBIN="$tmp" GOWORK=off GOFLAGS= go install "$pkg@$version") >&2
mv "$tmp/$name" "$bin"
printf '%s\n' "$bin"

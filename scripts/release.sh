#!/usr/bin/env bash
# Builds a release of sluice into dist/ (or --out DIR): the same steps in CI, at a version tag,
# and here (--snapshot), one script and no tool this machine cannot get. docs/releasing.md says
# how to cut a release and what it publishes.
#
#   scripts/release.sh --snapshot                # this checkout, nothing pushed
#   scripts/release.sh --version v1.2.3          # a release's files, nothing pushed
#   scripts/release.sh --version v1.2.3 --publish    # and push the image and the chart (CI)
#   scripts/release.sh --notes v1.2.3            # print CHANGELOG.md's section for v1.2.3
#
# In order, into the output directory (VERSION is the version without its leading v):
#   1. sluice_VERSION_OS_ARCH.tar.gz for linux and darwin on amd64 and arm64: the static binary
#      (CGO_ENABLED=0, -trimpath, stamped with the version, the commit and the commit's date),
#      LICENSE, NOTICE, README.md and the license files NOTICE names;
#   2. sluice_VERSION_OS_ARCH.cdx.json: each binary's SBOM (CycloneDX JSON, cyclonedx-gomod's
#      bin mode: the modules linked into that binary, as Go recorded them in it);
#   3. the image IMAGE:VERSION (default ghcr.io/sluicehq/sluice), a manifest list of
#      linux/amd64 and linux/arm64 images built by scripts/build-image.sh from the linux
#      binaries (each also tagged IMAGE:VERSION-ARCH here); with --snapshot also saved as
#      sluice_VERSION_image.oci.tar, an OCI archive holding both;
#   4. sluice-VERSION.tgz: the Helm chart, version and appVersion VERSION, so that its default
#      image is the one above;
#   5. checksums.txt: the SHA-256 of every file above (sha256sum -c checksums.txt).
# With --publish it then pushes the image (podman manifest push --all) and the chart (helm push
# to CHART_REPO, default oci://ghcr.io/sluicehq/charts): log in to the registry first.
#
# A snapshot's version is the last release tag's (0.0.0 before the first) followed by
# -SNAPSHOT-<short commit>, and -dirty when the work tree has changes: 0.0.0-SNAPSHOT-1a2b3c4.
# Everything is stamped with the commit's date, not the time of the build: the same commit
# builds the same binaries, archives and images.
#
# podman's settings come from its usual places, and from CONTAINERS_CONF and
# CONTAINERS_STORAGE_CONF (the release test points them at files of its own). helm and
# cyclonedx-gomod are built once into the user's cache (scripts/gotool.sh); HELM= names a helm.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
	sed -n '6,9p' scripts/release.sh | sed 's/^# *//' >&2
}
fail() { # fail CODE MESSAGE
	echo "release.sh: $2" >&2
	exit "$1"
}

snapshot=false publish=false version="" out="" notes=""
while [ $# -gt 0 ]; do
	case $1 in
	--snapshot) snapshot=true ;;
	--publish) publish=true ;;
	--version | --out | --notes)
		if [ $# -lt 2 ] || [ -z "$2" ]; then fail 2 "$1 needs a value"; fi
		case $1 in
		--version) version=$2 ;;
		--out) out=$2 ;;
		--notes) notes=$2 ;;
		esac
		shift ;;
	-h | --help)
		usage
		exit 0 ;;
	*)
		usage
		fail 2 "unknown argument \"$1\"" ;;
	esac
	shift
done

# A release version: vMAJOR.MINOR.PATCH, perhaps with a pre-release (v1.2.3-rc.1), as the tags
# Go modules take.
semver='^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$'

# The section "## [X.Y.Z] - date" of CHANGELOG.md (or "## [Unreleased]"), without its heading,
# up to the next section or the links at the end: the notes of a release. Fails when there is none.
changelog_section() { # changelog_section X.Y.Z|Unreleased
	awk -v want="$1" '
		found && (/^## / || /^\[[^]]*\]: /) { exit }
		/^## / { h = $2; gsub(/[][]/, "", h); if (h == want) found = 1; next }
		found { line[++n] = $0 }
		END {
			if (!found) exit 1
			first = 1; while (first <= n && line[first] ~ /^[ \t]*$/) first++
			while (n >= first && line[n] ~ /^[ \t]*$/) n--
			for (i = first; i <= n; i++) print line[i]
		}
	' CHANGELOG.md
}

if [ -n "$notes" ]; then
	if [ "$snapshot" = true ] || [ "$publish" = true ] || [ -n "$version" ] || [ -n "$out" ]; then
		fail 2 "--notes takes no other flag"
	fi
	if [ "$notes" != Unreleased ]; then
		[[ $notes =~ $semver ]] || fail 2 "--notes \"$notes\": not a version vX.Y.Z[-pre] (or Unreleased)"
		notes=${notes#v}
	fi
	changelog_section "$notes" || fail 1 "CHANGELOG.md has no section \"## [$notes]\""
	exit 0
fi

if [ "$snapshot" = true ] && [ "$publish" = true ]; then
	fail 2 "--snapshot and --publish exclude each other: a snapshot is never published"
fi
if [ "$snapshot" = true ] && [ -n "$version" ]; then
	fail 2 "--snapshot takes no --version: a snapshot's version is the commit's (0.0.0-SNAPSHOT-<commit>)"
fi
if [ "$snapshot" = false ] && [ -z "$version" ]; then
	usage
	fail 2 "give --snapshot, or --version vX.Y.Z"
fi
if [ -n "$version" ] && ! [[ $version =~ $semver ]]; then
	fail 2 "--version \"$version\": not a release version vX.Y.Z or vX.Y.Z-pre (such as v0.1.0, v1.2.0-rc.1)"
fi

if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
	export PATH="/usr/local/go/bin:$PATH"
fi
for tool in go git podman tar gzip sha256sum; do
	command -v "$tool" >/dev/null || fail 1 "$tool is not installed"
done

commit=$(git rev-parse HEAD)
short=$(git rev-parse --short HEAD)
if [ "$snapshot" = true ]; then
	base=$(git describe --tags --abbrev=0 --match 'v[0-9]*.[0-9]*.[0-9]*' 2>/dev/null || echo v0.0.0)
	[[ $base =~ $semver ]] || base=v0.0.0
	version="$base-SNAPSHOT-$short"
	git diff --quiet HEAD -- || version="$version-dirty"
else
	changelog_section "${version#v}" >/dev/null ||
		fail 1 "CHANGELOG.md has no section \"## [${version#v}]\": write the release's notes first"
fi
if [ "$publish" = true ]; then
	[ -z "$(git status --porcelain)" ] || fail 1 "refusing to publish from a work tree with changes (git status)"
	git tag --points-at HEAD | grep -qxF "$version" ||
		fail 1 "refusing to publish $version: HEAD ($short) is not tagged $version (git tag --points-at HEAD)"
fi
ver=${version#v}
# The commit's time, in UTC: the date stamped in the binaries and on every file and image.
epoch=$(git log -1 --format=%ct HEAD)
date=$(TZ=UTC git log -1 --date=format-local:%Y-%m-%dT%H:%M:%SZ --format=%cd HEAD)
export SOURCE_DATE_EPOCH=$epoch

image=${IMAGE:-ghcr.io/sluicehq/sluice}
chart_repo=${CHART_REPO:-oci://ghcr.io/sluicehq/charts}

# The output directory: dist/ is this script's and made anew; another must be empty.
if [ -z "$out" ]; then
	out=dist
	rm -rf dist
elif [ -e "$out" ] && [ -n "$(ls -A "$out")" ]; then
	fail 1 "--out $out is not empty"
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "release.sh: sluice $version (commit $commit, $date) into $out" >&2

# 1. Binaries and archives.
ldflags="-s -w -X main.version=$version -X main.commit=$commit -X main.date=$date"
for target in linux/amd64 linux/arm64 darwin/amd64 darwin/arm64; do
	os=${target%/*} arch=${target#*/}
	name=sluice_${ver}_${os}_${arch}
	stage=$work/$name
	mkdir -p "$stage/licenses" "$stage/web/assets"
	echo "release.sh: building $target" >&2
	CGO_ENABLED=0 GOOS=$os GOARCH=$arch go build -trimpath -ldflags "$ldflags" -o "$stage/sluice" ./cmd/sluice
	# NOTICE names licenses/Go-LICENSE.txt and web/assets/uPlot.LICENSE.txt: the binary embeds
	# wasm_exec.js and uPlot (the operator pages), so their licenses go with it, where NOTICE says.
	cp LICENSE NOTICE README.md "$stage/"
	cp licenses/* "$stage/licenses/"
	cp web/assets/uPlot.LICENSE.txt "$stage/web/assets/"
	# The Go modules linked into this binary keep their licenses with it (MIT, BSD and Apache ask
	# for their notices in a binary distribution): each module's LICENSE, COPYING and NOTICE files,
	# from the module cache, under licenses/third_party/<module path>/. A module without any
	# stops the release: it would ship without its terms.
	CGO_ENABLED=0 GOOS=$os GOARCH=$arch go list -deps -f '{{with .Module}}{{if not .Main}}{{.Path}} {{.Dir}}{{end}}{{end}}' ./cmd/sluice |
		sort -u >"$work/modules"
	while read -r mod dir; do
		mkdir -p "$stage/licenses/third_party/$mod"
		found=0
		for f in "$dir"/LICENSE* "$dir"/LICENCE* "$dir"/COPYING* "$dir"/NOTICE*; do
			[ -f "$f" ] || continue
			cp "$f" "$stage/licenses/third_party/$mod/"
			found=1
		done
		[ "$found" = 1 ] || { echo "release.sh: module $mod ($dir) has no LICENSE, COPYING or NOTICE file" >&2; exit 1; }
	done <"$work/modules"
	find "$stage" -type d -exec chmod 0755 {} +
	find "$stage" -type f -exec chmod 0644 {} +
	chmod 0755 "$stage/sluice"
	find "$stage" -exec touch -h -d "@$epoch" {} +
	tar -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" \
		-cf - sluice LICENSE NOTICE README.md licenses web | gzip -n -9 >"$out/$name.tar.gz"
done

# 2. SBOMs, one per binary.
cyclonedx=$(bash scripts/gotool.sh cyclonedx-gomod)
for target in linux/amd64 linux/arm64 darwin/amd64 darwin/arm64; do
	os=${target%/*} arch=${target#*/}
	name=sluice_${ver}_${os}_${arch}
	# GOOS and GOARCH: the package URLs' qualifiers name the binary's platform.
	GOOS=$os GOARCH=$arch "$cyclonedx" bin -json -noserial -notimestamp -version "$version" \
		-output "$out/$name.cdx.json" "$work/$name/sluice" 2>"$work/cyclonedx.log" ||
		{ cat "$work/cyclonedx.log" >&2; fail 1 "cyclonedx-gomod failed for $target"; }
done

# 3. The image: one per architecture, from the binaries above, in one manifest list.
manifest=$image:$ver
podman manifest exists "$manifest" 2>/dev/null && podman manifest rm "$manifest" >/dev/null
podman image exists "$manifest" 2>/dev/null && podman rmi "$manifest" >/dev/null
podman manifest create "$manifest" >/dev/null
for arch in amd64 arm64; do
	echo "release.sh: building the image for linux/$arch" >&2
	id=$(GOARCH=$arch BINARY="$work/sluice_${ver}_linux_${arch}/sluice" VERSION=$version \
		TAGS="$image:$ver-$arch" bash scripts/build-image.sh | tail -n 1)
	podman manifest add "$manifest" "containers-storage:$id" >/dev/null
done
if [ "$snapshot" = true ]; then
	podman manifest push --quiet --all "$manifest" "oci-archive:$out/sluice_${ver}_image.oci.tar:$ver"
fi

# 4. The chart, from a copy: the repository's Chart.yaml is left as it is.
helm=$(bash scripts/gotool.sh helm)
mkdir -p "$work/chart"
cp -R deploy/helm/sluice "$work/chart/sluice"
HELM_CACHE_HOME=$work/helm/cache HELM_DATA_HOME=$work/helm/data \
	"$helm" package "$work/chart/sluice" --version "$ver" --app-version "$ver" --destination "$out" >/dev/null

# 5. Checksums of every file.
(cd "$out" && find . -maxdepth 1 -type f -printf '%f\n' | LC_ALL=C sort | xargs sha256sum --) >"$work/checksums.txt"
mv "$work/checksums.txt" "$out/checksums.txt"

if [ "$publish" = true ]; then
	echo "release.sh: pushing $manifest" >&2
	podman manifest push --all "$manifest" "docker://$manifest"
	echo "release.sh: pushing the chart to $chart_repo" >&2
	"$helm" push "$out/sluice-$ver.tgz" "$chart_repo"
fi
echo "release.sh: done: $out" >&2
ls -1 "$out"

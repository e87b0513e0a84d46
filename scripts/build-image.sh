#!/usr/bin/env bash
# Builds sluice's container image with podman: the static binary first, outside the container
# build (no base image and no registry needed), then the image FROM scratch around it
# (deploy/container/Containerfile). Tags it sluice:dev and sluice:<version>, the version being
# `git describe` of this checkout (v1.2.3, v1.2.3-4-gabc1234, or the commit; -dirty with changes),
# and at a release tag v1.2.3 also sluice:1.2.3.
#
#   scripts/build-image.sh                 # sluice:dev, sluice:<version>
#   IMAGE=registry.example.com/sluice scripts/build-image.sh
#
# scripts/release.sh builds its images with it, one per architecture, setting:
#
#   GOARCH=arm64       the image's architecture (podman build --platform linux/arm64; default
#                      this machine's): the Containerfile only copies files, so a foreign
#                      architecture needs no emulation
#   BINARY=path        a static linux sluice of that architecture, built already, instead of
#                      building one here
#   VERSION=v1.2.3     the version (stamped in a binary built here, and the image's label)
#                      instead of `git describe`
#   TAGS="a:1 b:2"     the image's names instead of $IMAGE:dev and $IMAGE:<version>
#   SOURCE_DATE_EPOCH  the image's creation time (podman build --timestamp): a rebuild of the
#                      same files is the same image
#
# podman's own settings come from its usual places, and from CONTAINERS_CONF and
# CONTAINERS_STORAGE_CONF (the container test points them at files of its own). Prints the
# image's ID last, on a line of its own.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
	export PATH="/usr/local/go/bin:$PATH"
fi
command -v go >/dev/null || { echo "build-image.sh: Go is not installed (https://go.dev/dl/)" >&2; exit 1; }
command -v podman >/dev/null || { echo "build-image.sh: podman is not installed (Debian: apt-get install podman runc)" >&2; exit 1; }

image=${IMAGE:-sluice}
ca=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
[ -r "$ca" ] || { echo "build-image.sh: no CA bundle at $ca (Debian: apt-get install ca-certificates; or set CA_BUNDLE)" >&2; exit 1; }
version=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo devel)}
arch=${GOARCH:-$(go env GOARCH)}
if [ -n "${BINARY:-}" ] && [ ! -f "$BINARY" ]; then
	echo "build-image.sh: BINARY=$BINARY: no such file" >&2
	exit 1
fi

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
# Static (no cgo: no libc in the image), no build paths in it, the version stamped in.
# cmd/sluice embeds the time zone database itself (time/tzdata): there is no /usr/share/zoneinfo.
# The binary is staged twice, as /sluice and as /bin/ratelimit (the name envoyproxy/ratelimit's
# image starts, with which sluice reads that image's environment), hard links of one file in one
# directory copied in one step: the layer holds it once.
mkdir -p "$ctx/bin/bin"
if [ -n "${BINARY:-}" ]; then
	cp "$BINARY" "$ctx/bin/sluice"
else
	CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath -ldflags "-s -w -X main.version=$version" -o "$ctx/bin/sluice" ./cmd/sluice
fi
ln "$ctx/bin/sluice" "$ctx/bin/bin/ratelimit"
cp "$ca" "$ctx/ca-certificates.crt"
cp deploy/container/sluice.yaml deploy/container/passwd deploy/container/group "$ctx/"
chmod 0644 "$ctx/ca-certificates.crt" "$ctx/sluice.yaml" "$ctx/passwd" "$ctx/group"
chmod 0755 "$ctx/bin/sluice" "$ctx/bin/bin"

# The version is a valid tag only without characters a tag may not hold (a tag: [A-Za-z0-9_.-]).
tag=$(printf %s "$version" | tr -c 'A-Za-z0-9_.-' '-')
tags=(-t "$image:dev" -t "$image:$tag")
# A release (tag v1.2.3) is also tagged 1.2.3: the form a Helm chart's appVersion has.
case $tag in v[0-9]*) tags+=(-t "$image:${tag#v}") ;; esac
if [ -n "${TAGS:-}" ]; then
	tags=()
	for t in $TAGS; do tags+=(-t "$t"); done
fi
build=(--platform "linux/$arch")
[ -z "${SOURCE_DATE_EPOCH:-}" ] || build+=(--timestamp "$SOURCE_DATE_EPOCH")
podman build --quiet -f deploy/container/Containerfile "${build[@]}" \
	--label org.opencontainers.image.version="$version" \
	--label org.opencontainers.image.source=https://github.com/sluicehq/sluice \
	"${tags[@]}" "$ctx"

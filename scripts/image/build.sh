#!/usr/bin/env bash
# `make image`: build kubegpu's image from the Dockerfile with a real OCI builder, tag it
# localhost/kubegpu:<version> (pyproject.toml's version) and leave dist/kubegpu-<version>.oci.tar, the OCI
# archive air-gapped nodes import (docs/install.md). `build.sh --names` prints the two names and stops.
#
# Settings (environment or make variables):
#   IMAGE_BUILDER  buildah, podman or docker; default: the first of them that works here, else buildah,
#                  installed from Debian's archive (scripts/image/install-builder.sh).
#   IMAGE_BASE     a Python 3.11 image for both stages, e.g. python:3.11-slim-bookworm where a registry is
#                  reachable; default: bases built from Debian 12's packages (scripts/image/build-base.sh).
#   PIP_CA         CA bundle pip trusts in the build, given as a build secret (never stored in a layer);
#                  default: $PIP_CERT, else the system bundle. Behind a TLS-intercepting proxy it must
#                  hold the proxy's CA.
# buildah runs with --isolation chroot unless BUILDAH_ISOLATION says otherwise: it needs no OCI runtime
# and works inside a container, where runc may not. Its storage driver is the one
# /etc/containers/storage.conf names, else the first that works here (overlay; vfs where it cannot mount).
#
# Exit status 3: no builder here and none can be installed (not root, or no apt-get).
set -euo pipefail
cd "$(dirname "$0")/../.."
log() { echo "image: $*" >&2; }

version="$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n1)"
image="localhost/kubegpu:$version"
archive="dist/kubegpu-$version.oci.tar"
if [ "${1:-}" = --names ]; then  # what it would build, for the checks (tests/deploy/test_image.py)
    echo "$image $archive"
    exit 0
fi

pick_builder() {
    if [ -n "${IMAGE_BUILDER:-}" ]; then
        echo "$IMAGE_BUILDER"
    elif command -v buildah >/dev/null; then
        echo buildah
    elif command -v docker >/dev/null && docker info >/dev/null 2>&1; then
        echo docker
    elif command -v podman >/dev/null; then
        echo podman
    else
        scripts/image/install-builder.sh && echo buildah
    fi
}
builder="$(pick_builder)" || {
    status=$?  # 3: none can be installed here; anything else (apt failed) is an error, not a skip
    [ $status -ne 3 ] || log "no OCI builder (buildah, podman, docker) here, and buildah cannot be installed"
    exit $status
}
if [ "$builder" = buildah ]; then
    scripts/image/install-builder.sh  # dpkg-deb for the base, too
    export BUILDAH_ISOLATION="${BUILDAH_ISOLATION:-chroot}"
fi

if [ -n "${IMAGE_BASE:-}" ]; then
    runtime_base="$IMAGE_BASE" build_base="$IMAGE_BASE"
else
    read -r runtime_base build_base < <(scripts/image/build-base.sh "$builder")
    [ -n "$build_base" ] || exit 1
fi

revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
source_url="$(git remote get-url origin 2>/dev/null | sed 's#//[^/@]*@#//#' || echo unknown)"
args=(
    --build-arg "BUILD_BASE=$build_base"
    --build-arg "RUNTIME_BASE=$runtime_base"
    --build-arg "VERSION=$version" --build-arg "REVISION=$revision" --build-arg "SOURCE=$source_url"
    # Again as --label: buildah 1.28 reuses a cached LABEL step whose build-arg changed (a new commit
    # would keep the old revision); --label is applied to the final image every time.
    --label "org.opencontainers.image.version=$version"
    --label "org.opencontainers.image.revision=$revision"
    --label "org.opencontainers.image.source=$source_url"
    -t "$image" -f Dockerfile
)
ca="${PIP_CA:-${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}}"
[ -f "$ca" ] && args+=(--secret "id=pip-ca,src=$ca")

log "building $image with $builder (base: $runtime_base)"
start=$SECONDS
case "$builder" in
    buildah) buildah bud --layers --quiet "${args[@]}" . ;;
    docker) DOCKER_BUILDKIT=1 docker build --quiet "${args[@]}" . ;;
    *) "$builder" build --layers --quiet "${args[@]}" . ;;
esac >/dev/null
log "built $image in $((SECONDS - start))s"

# The archive is written again only when the image changed (compressing it is most of a warm build).
case "$builder" in
    docker) id="$(docker image inspect --format '{{.Id}}' "$image")" ;;
    *) id="$("$builder" images --noheading --no-trunc --format '{{.ID}}' "$image")" ;;
esac
stamp="$archive.image-id"
if [ -f "$archive" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$id" ]; then
    log "$archive holds this image already"
else
    mkdir -p dist
    rm -f "$archive" "$stamp"
    case "$builder" in
        buildah) buildah push --quiet "$image" "oci-archive:$archive:$image" ;;
        podman) podman save --quiet --format oci-archive -o "$archive" "$image" ;;
        docker) docker save -o "$archive" "$image" ;; # Docker 25+ writes an OCI image layout
    esac
    echo "$id" >"$stamp"
fi
case "$builder" in
    docker) size="$(docker image inspect --format '{{.Size}}' "$image") bytes" ;;
    *) size="$("$builder" images --noheading --format '{{.Size}}' "$image")" ;;
esac
log "$image: $size uncompressed; $archive: $(($(stat -c %s "$archive") / 1000000)) MB"

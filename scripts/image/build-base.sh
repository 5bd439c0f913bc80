#!/usr/bin/env bash
# Build the image's base from Debian's own packages when no registry is reachable (python:3.11-slim
# cannot be pulled), distroless-style: the .debs listed in base-packages.txt are unpacked into a root
# filesystem (no maintainer scripts run, no package manager in the result), with a nonroot user (65532),
# a CA bundle made from Debian's Mozilla certificates (never the build machine's), an ld.so cache, and the
# standard library compiled ahead (the daemons run with a read-only root filesystem and write no .pyc).
#
#   scripts/image/build-base.sh BUILDER    # buildah, podman or docker
#
# Prints two image names on stdout: the runtime base and the build base (runtime + venv tooling). Both
# are tagged with a hash of this script and the package list, so they are built once and reused until
# either changes (the .debs are cached in build/image/debs). Needs root (chroot, file ownership) and a
# Debian 12 apt (apt-get download).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
builder="${1:?usage: build-base.sh buildah|podman|docker}"
cache="${KUBEGPU_IMAGE_CACHE:-$here/../../build/image}"
packages_file="$here/base-packages.txt"
key="$(cat "$0" "$packages_file" | sha256sum | cut -c1-12)"
runtime_tag="localhost/kubegpu-base:bookworm-$key"
build_tag="localhost/kubegpu-base:bookworm-$key-build"
log() { echo "build-base: $*" >&2; }

image_exists() {
    case "$builder" in
        buildah) buildah inspect --type image "$1" >/dev/null 2>&1 ;;
        *) "$builder" image inspect "$1" >/dev/null 2>&1 ;;
    esac
}
if image_exists "$runtime_tag" && image_exists "$build_tag"; then
    echo "$runtime_tag $build_tag"
    exit 0
fi

if [ "$(id -u)" != 0 ]; then
    log "unpacking the base needs root (file owners, chroot); or use the official base where a registry"
    log "is reachable: make image IMAGE_BASE=python:3.11-slim-bookworm"
    exit 1
fi
if ! grep -qs 'VERSION_CODENAME=bookworm' /etc/os-release; then
    log "the base is unpacked from Debian 12 packages and this machine's apt is not Debian 12's;"
    log "build with the official base instead: make image IMAGE_BASE=python:3.11-slim-bookworm"
    exit 1
fi
packages() { sed -n "s/^$1://p" "$packages_file" | tr -s ' \n' '\n' | sed '/^$/d'; }
mapfile -t runtime_pkgs < <(packages runtime)
mapfile -t build_pkgs < <(packages build)

debs="$cache/debs"
mkdir -p "$debs"
download() {
    (cd "$debs" && apt-get -qq -o APT::Sandbox::User=root download "$@" >/dev/null)
}
log "downloading ${#runtime_pkgs[@]}+${#build_pkgs[@]} packages from Debian's archive"
if ! download "${runtime_pkgs[@]}" "${build_pkgs[@]}"; then
    log "apt-get download failed; refreshing the package lists once"
    apt-get -qq -o DPkg::Lock::Timeout=600 update >/dev/null
    download "${runtime_pkgs[@]}" "${build_pkgs[@]}"
fi
deb_of() {  # the cached .deb of the candidate version apt picked
    local version
    version="$(apt-cache policy "$1" | sed -n 's/^  Candidate: //p')"
    ls "$debs/$1_${version//:/%3a}_"*.deb
}

work="$(mktemp -d "${TMPDIR:-/tmp}/kubegpu-base.XXXXXX")"
trap 'rm -rf "$work"' EXIT

unpack() {  # unpack .debs into a root; record each package where scanners (trivy, grype) look
    local root="$1"
    shift
    mkdir -p "$root/var/lib/dpkg/status.d"
    for pkg in "$@"; do
        local deb
        deb="$(deb_of "$pkg")"
        dpkg-deb --fsys-tarfile "$deb" | tar -x --keep-directory-symlink -C "$root"
        { dpkg-deb -f "$deb"; echo "Status: install ok installed"; } >"$root/var/lib/dpkg/status.d/$pkg"
    done
}
slim() {  # documentation goes, licences stay
    local root="$1"
    find "$root/usr/share/doc" -mindepth 2 ! -name copyright ! -type d -delete 2>/dev/null || true
    find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete 2>/dev/null || true
    rm -rf "$root"/usr/share/{man,info,lintian,locale,bug}
}

log "assembling the runtime root filesystem"
rootfs="$work/runtime"
mkdir -p "$rootfs"/usr/{bin,sbin,lib,lib64}
for dir in bin sbin lib lib64; do ln -s "usr/$dir" "$rootfs/$dir"; done  # merged /usr, as Debian 12
unpack "$rootfs" "${runtime_pkgs[@]}"
slim "$rootfs"
ln -sf python3.11 "$rootfs/usr/bin/python3"
cat >"$rootfs/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
PASSWD
cat >"$rootfs/etc/group" <<'GROUP'
root:x:0:
nogroup:x:65534:
nonroot:x:65532:
GROUP
printf 'passwd: files\ngroup: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\n' \
    >"$rootfs/etc/nsswitch.conf"
install -d -m 0700 "$rootfs/root"
install -d -m 0700 -o 65532 -g 65532 "$rootfs/home/nonroot"
install -d -m 1777 "$rootfs/tmp"
install -d "$rootfs/etc/ssl/certs" "$rootfs/usr/lib/ssl"
cat "$rootfs"/usr/share/ca-certificates/mozilla/*.crt >"$rootfs/etc/ssl/certs/ca-certificates.crt"
ln -sf /etc/ssl/certs/ca-certificates.crt "$rootfs/usr/lib/ssl/cert.pem"
ln -sfn /etc/ssl/certs "$rootfs/usr/lib/ssl/certs"
echo 'include /etc/ld.so.conf.d/*.conf' >"$rootfs/etc/ld.so.conf"
ldconfig -r "$rootfs"
# Compiled with the image's own interpreter; unchecked-hash: valid whatever the files' times become.
chroot "$rootfs" /usr/bin/python3.11 -m compileall -q --invalidation-mode unchecked-hash \
    -x '/(test|tests|idle_test)/' /usr/lib/python3.11 >/dev/null

log "assembling the build stage's additions"
extras="$work/build"
mkdir -p "$extras"/usr/{bin,sbin,lib,lib64}
for dir in bin sbin lib lib64; do ln -s "usr/$dir" "$extras/$dir"; done
unpack "$extras" "${build_pkgs[@]}"
slim "$extras"

# Deterministic archives: sorted, numeric owners, every file time 0 (the .pyc files do not check them).
archive() { mkdir -p "$2" && tar -C "$1" --sort=name --numeric-owner --mtime=@0 -cf "$2/rootfs.tar" .; }
archive "$rootfs" "$work/ctx-runtime"
archive "$extras" "$work/ctx-build"

build() {  # a FROM-scratch image from a tar: every builder can do this without a registry
    local context="$1" from="$2" tag="$3"
    printf 'FROM %s\nADD rootfs.tar /\nENV PATH=%s LANG=C.UTF-8\n' "$from" \
        /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin >"$context/Containerfile"
    case "$builder" in
        buildah) buildah bud --quiet --isolation chroot --timestamp 0 -t "$tag" "$context" ;;
        *) "$builder" build --quiet -t "$tag" "$context" ;;
    esac >/dev/null
}
build "$work/ctx-runtime" scratch "$runtime_tag"
build "$work/ctx-build" "$runtime_tag" "$build_tag"
log "built $runtime_tag and $build_tag"
echo "$runtime_tag $build_tag"

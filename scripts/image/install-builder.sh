#!/usr/bin/env bash
# Install what `make image` and `make image-test` need from Debian's archive, once: buildah (the OCI
# builder; no daemon, no registry) and the tools the base image is assembled with. Idempotent and quiet:
# nothing is done when every tool is already there.
#
# Exit status: 0 when the tools are there, 3 when they are missing and cannot be installed here (not
# root, no apt-get): the callers turn that into a loud skip (image-test) or a clear error (image).
set -euo pipefail

needed=()
command -v buildah >/dev/null || needed+=(buildah)
command -v dpkg-deb >/dev/null || needed+=(dpkg)
command -v apt-get >/dev/null || { echo "install-builder: no apt-get on this machine" >&2; exit 3; }
[ ${#needed[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
    echo "install-builder: ${needed[*]} missing and not root: apt-get install ${needed[*]}" >&2
    exit 3
fi
echo "install-builder: apt-get install ${needed[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt_opts=(-o DPkg::Lock::Timeout=600 -o Acquire::Retries=3 -qq)
apt-get "${apt_opts[@]}" update >/dev/null
apt-get "${apt_opts[@]}" install --no-install-recommends -y "${needed[@]}" >/dev/null

#!/bin/sh
# Debian's prometheus package (the server and promtool) for the tests that scrape the plugin with a real
# Prometheus and check the chart's alert rules (tests/deploy/test_observability.py). Idempotent: nothing
# to do when both binaries are on PATH. Where apt cannot install it (not root, not Debian, no network) it
# says so and exits 0: those tests then skip, naming this script.
set -u
if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1 || [ "$(id -u)" != 0 ]; then
    echo "install_prometheus.sh: cannot install Debian's prometheus here (needs apt-get as root);" \
        "the Prometheus tests will skip" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null; then
    # The package starts a system service where systemd runs; the tests start their own server.
    exit 0
fi
echo "install_prometheus.sh: apt-get could not install prometheus; the Prometheus tests will skip" >&2
exit 0

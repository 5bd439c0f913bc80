"""The node doctor's kubelet-side checks: the device-plugin directory and the sockets in it.

A plugin socket older than kubelet.sock means the kubelet restarted after the plugin registered.
"""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

from kubegpu.toolkit.doctor.findings import FAIL, OK, WARN, Finding

PLUGIN_DIR = "var/lib/kubelet/device-plugins"


def check_plugin_dir(root: Path) -> Iterator[Finding]:
    directory = root / PLUGIN_DIR
    shown = "/" + PLUGIN_DIR
    if not directory.is_dir():
        yield Finding(
            "device-plugin-dir",
            FAIL,
            shown,
            "missing",
            4,
            "is the kubelet running with its default root dir? Point the plugin's hostPath at the real "
            "one (k0s: /var/lib/k0s/kubelet/device-plugins, microk8s: /var/snap/microk8s/common/var/lib/"
            "kubelet/device-plugins)",
        )
        return
    info = directory.stat()
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o700 != 0o700 or info.st_uid != 0:
        yield Finding(
            "device-plugin-dir",
            FAIL,
            shown,
            f"mode {mode:o}, owner uid {info.st_uid}",
            4,
            "the kubelet creates it as root:root 0750; restore that (chown root:root, chmod 750) and run "
            "the plugin as root, or the plugin cannot create its socket (permission denied)",
        )
    else:
        yield Finding("device-plugin-dir", OK, shown, f"mode {mode:o}, owner root", None, "")
    yield from _check_sockets(directory, shown)


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(path.lstat().st_mode)
    except OSError:
        return False


def _check_sockets(directory: Path, shown: str) -> Iterator[Finding]:
    kubelet = directory / "kubelet.sock"
    if not kubelet.exists():
        yield Finding(
            "kubelet-socket",
            FAIL,
            f"{shown}/kubelet.sock",
            "missing: the kubelet is not running, or uses another root dir",
            2,
            "systemctl status kubelet; check --root-dir",
        )
        return
    if not _is_socket(kubelet):
        yield Finding(
            "kubelet-socket",
            WARN,
            f"{shown}/kubelet.sock",
            "exists but is not a socket",
            2,
            "restart the kubelet; it recreates the socket",
        )
    else:
        yield Finding("kubelet-socket", OK, f"{shown}/kubelet.sock", "present", None, "")
    yield from _check_plugin_sockets(directory, shown, kubelet)


def _check_plugin_sockets(directory: Path, shown: str, kubelet: Path) -> Iterator[Finding]:
    """The plugin's sockets, each created after the kubelet's (else its registration died with it)."""
    ours = sorted(
        p
        for p in directory.iterdir()
        if p.name.endswith(".sock")
        and p.name != "kubelet.sock"
        and (p.name.startswith("nvidia") or p.name.startswith("kubegpu"))
    )
    if not ours:
        yield Finding(
            "plugin-sockets",
            FAIL,
            shown,
            "no nvidia-*.sock: the device plugin is not serving here",
            2,
            "check the device-plugin pod on this node (kubectl -n <ns> get pods -o wide --field-selector "
            "spec.nodeName=<node>) and its log",
        )
        return
    kubelet_mtime = kubelet.stat().st_mtime
    stale = [p.name for p in ours if p.stat().st_mtime < kubelet_mtime]
    if stale:
        yield Finding(
            "plugin-sockets",
            FAIL,
            shown,
            f"{', '.join(stale)} older than kubelet.sock: the kubelet restarted after the plugin "
            "registered, so these registrations are gone (GPUs show 0, new pods fail with "
            "UnexpectedAdmissionError)",
            2,
            "restart the device-plugin pod on this node; kubegpu re-registers by itself when kubelet.sock "
            "is re-created",
        )
    else:
        yield Finding(
            "plugin-sockets",
            OK,
            shown,
            f"{', '.join(p.name for p in ours)} registered after the kubelet's last start",
            None,
            "",
        )

"""`kubegpu doctor` (node): the host-side GPU faults, read from a host tree.

Everything is read under `host_root` ("/" on the node, "/host" in a debug pod with the host mounted,
a temporary directory in tests): the driver library and device nodes, the /dev/char symlinks whose
absence breaks GPU access after `systemctl daemon-reload`, the NVIDIA container toolkit, the
containerd / CRI-O / Docker runtime configuration, the kubelet's device-plugin directory and sockets,
and CDI specs. NVML itself is checked through the plugin's own discovery.

This module checks the driver, NVML, the device nodes and /dev/char, and runs every check;
`doctor.runtime` checks the container toolkit, the runtimes and CDI, `doctor.kubelet` the kubelet's
device-plugin directory and sockets.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubegpu.settings.goyaml import GoYamlError
from kubegpu.settings.goyaml import load as load_yaml
from kubegpu.toolkit.doctor.findings import FAIL, OK, WARN, Finding, ordered
from kubegpu.toolkit.doctor.host_tree import shown, under
from kubegpu.toolkit.doctor.kubelet import check_plugin_dir
from kubegpu.toolkit.doctor.runtime import check_cdi, check_runtimes, check_toolkit, read_host_file

if TYPE_CHECKING:
    from kubegpu.node.inventory import Inventory

if TYPE_CHECKING:
    from kubegpu.settings.env import NvmlSelection

LIB_DIRS = (
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib64",
    "lib64",
    "usr/lib",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "usr/local/nvidia/lib64",
)
DRIVER_ROOTS = ("", "run/nvidia/driver")  # the host itself, or the GPU operator's driver container


# --- driver and NVML ---------------------------------------------------------------------------------


def check_library(root: Path) -> Iterator[Finding]:
    for driver_root in DRIVER_ROOTS:
        for lib_dir in LIB_DIRS:
            candidate = under(under(root, driver_root), lib_dir) / "libnvidia-ml.so.1"
            if candidate.exists():
                target = candidate.resolve().name
                yield Finding("libnvidia-ml", OK, shown(candidate, root), f"found (-> {target})", None, "")
                return
    yield Finding(
        "libnvidia-ml",
        FAIL,
        "libnvidia-ml.so.1",
        f"not found in {', '.join('/' + d for d in LIB_DIRS[:4])} ... nor under /run/nvidia/driver",
        2,
        "install the NVIDIA driver (or let the GPU operator's driver container run); NVML and "
        "therefore the device plugin cannot start without it",
    )


def check_nvml(nvml: Any | None, selection: NvmlSelection | None = None) -> Iterator[Finding]:
    """nvmlInit and discovery exactly as the plugin runs them (on `selection`'s NVML: the real one)."""
    try:
        from kubegpu.node.discovery import NVMLError, discover, explain_nvml_error, nvml_session
        from kubegpu.node.nvml.backend import load_nvml
    except ImportError as exc:  # the plugin's discovery is not installed alongside
        yield Finding(
            "nvml",
            WARN,
            "NVML",
            f"cannot import the plugin's discovery ({exc})",
            None,
            "install kubegpu fully to check NVML",
        )
        return
    try:
        backend = nvml if nvml is not None else load_nvml(selection)
        with nvml_session(backend):
            inventory = discover(backend)
    except NVMLError as err:
        yield Finding("nvml", FAIL, "NVML", f"nvmlInit failed: {err}", 2, explain_nvml_error(err))
        return
    except Exception as exc:  # a broken fake profile, a missing symbol: still a finding, not a crash
        yield Finding(
            "nvml",
            FAIL,
            "NVML",
            f"NVML could not be used: {exc}",
            2,
            "check the driver with nvidia-smi on the node",
        )
        return
    yield from _inventory_findings(inventory)


def _inventory_findings(inventory: Inventory) -> Iterator[Finding]:
    """What NVML sees: the GPUs and driver, or none; then each GPU that is not healthy."""
    names = sorted({g.name for g in inventory.gpus})
    if not inventory.gpus:
        yield Finding(
            "nvml",
            FAIL,
            "NVML",
            f"NVML works (driver {inventory.driver_version}) but sees no GPU",
            2,
            "check lspci | grep -i nvidia and dmesg for NVRM errors",
        )
        return
    yield Finding(
        "nvml",
        OK,
        "NVML",
        f"{len(inventory.gpus)} GPU(s) ({', '.join(names)}), driver {inventory.driver_version}, "
        f"CUDA {inventory.cuda_driver_version}",
        None,
        "",
    )
    for gpu in inventory.gpus:
        if not gpu.health.healthy:
            xid = f" (XID {gpu.health.xid})" if gpu.health.xid else ""
            yield Finding(
                "gpu-health",
                FAIL,
                f"GPU {gpu.index} {gpu.uuid}",
                f"unhealthy{xid}: {gpu.health.reason}",
                2,
                "drain the node and reset the GPU (nvidia-smi -r) or reboot; replace it if it recurs",
            )


# --- device nodes and /dev/char ----------------------------------------------------------------------


def _nvidia_nodes(dev: Path) -> list[Path]:
    if not dev.is_dir():
        return []
    nodes = [p for p in dev.iterdir() if p.name.startswith("nvidia") and not p.is_dir()]
    caps = dev / "nvidia-caps"
    if caps.is_dir():
        nodes.extend(p for p in caps.iterdir() if not p.is_dir())
    return sorted(nodes)


def check_device_nodes(root: Path) -> Iterator[Finding]:
    dev = root / "dev"
    nodes = _nvidia_nodes(dev)
    names = {p.name for p in nodes}
    gpus = sorted(n for n in names if n.removeprefix("nvidia").isdigit())
    if "nvidiactl" not in names or not gpus:
        missing = [
            n
            for n, ok in (("/dev/nvidiactl", "nvidiactl" in names), ("/dev/nvidia<N>", bool(gpus)))
            if not ok
        ]
        yield Finding(
            "device-nodes",
            FAIL,
            "/dev",
            f"missing {', '.join(missing)}",
            2,
            "the driver is not loaded or created no device nodes: modprobe nvidia, or "
            "nvidia-ctk system create-device-nodes --control-devices --load-kernel-modules",
        )
        return
    yield Finding(
        "device-nodes", OK, "/dev", f"/dev/nvidiactl and {len(gpus)} GPU node(s): {', '.join(gpus)}", None, ""
    )
    if "nvidia-uvm" not in names:
        yield Finding(
            "device-nodes",
            WARN,
            "/dev/nvidia-uvm",
            "missing: CUDA programs fail to start without it",
            1,
            "nvidia-modprobe -u -c=0 (or modprobe nvidia-uvm)",
        )


def _cgroup_driver(root: Path) -> str | None:
    config = root / "var/lib/kubelet/config.yaml"
    try:
        data = load_yaml(read_host_file(config)).value or {}
    except (OSError, GoYamlError):
        return None
    value = data.get("cgroupDriver") if isinstance(data, dict) else None
    return str(value) if value else None


def check_dev_char(root: Path) -> Iterator[Finding]:
    """Every NVIDIA device node needs a /dev/char/<major>:<minor> symlink, or runc's systemd cgroup rules
    lose it on the next `systemctl daemon-reload` ("Failed to initialize NVML: Unknown Error")."""
    dev = root / "dev"
    nodes = [p for p in _nvidia_nodes(dev) if not p.is_symlink()]
    if not nodes:
        return
    char = dev / "char"
    linked: set[str] = set()
    if char.is_dir():
        for link in char.iterdir():
            if link.is_symlink():
                linked.add(Path(os.readlink(link)).name)
    missing = sorted(p.name for p in nodes if p.name not in linked)
    driver = _cgroup_driver(root)
    if not missing:
        yield Finding(
            "dev-char-symlinks", OK, "/dev/char", f"all {len(nodes)} NVIDIA device node(s) linked", None, ""
        )
        return
    systemd = driver == "systemd"
    yield Finding(
        "dev-char-symlinks",
        FAIL if systemd else WARN,
        "/dev/char",
        f"no /dev/char symlink for {', '.join(missing)}"
        + (
            " and the kubelet uses the systemd cgroup driver"
            if systemd
            else f" (cgroup driver: {driver or 'unknown'})"
        ),
        1,
        "nvidia-ctk system create-dev-char-symlinks --create-all (and add it as a udev rule); "
        "otherwise containers lose their GPUs after systemctl daemon-reload with "
        '"Failed to initialize NVML: Unknown Error". CDI device injection avoids it too',
    )


# --- all together -----------------------------------------------------------------------------------------


def doctor_node(
    host_root: Path,
    nvml: Any | None = None,
    env: dict[str, str] | None = None,
    nvml_selection: NvmlSelection | None = None,
) -> list[Finding]:
    """Every node check. `nvml` overrides the NVML backend (tests), else `nvml_selection` picks it (the
    real NVML by default); `env` is the environment diagnosed (the process's by default)."""
    root = host_root
    if not root.is_dir():
        return [
            Finding(
                "host-root",
                FAIL,
                str(root),
                "not a directory",
                None,
                "pass the directory where the host's filesystem is mounted, e.g. --host-root /host",
            )
        ]
    env = dict(os.environ) if env is None else env
    checks: list[Callable[[], Iterator[Finding]]] = [
        lambda: check_library(root),
        lambda: check_nvml(nvml, nvml_selection),
        lambda: check_device_nodes(root),
        lambda: check_dev_char(root),
        lambda: check_toolkit(root),
        lambda: check_runtimes(root),
        lambda: check_plugin_dir(root),
        lambda: check_cdi(root, env),
    ]
    findings: list[Finding] = []
    for check in checks:
        findings.extend(check())
    return ordered(findings)

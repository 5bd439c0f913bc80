"""`kubegpu doctor` (node): the host-side GPU faults, read from a host tree.

Everything is read under `host_root` ("/" on the node, "/host" in a debug pod with the host mounted,
a temporary directory in tests): the driver library and device nodes, the /dev/char symlinks whose
absence breaks GPU access after `systemctl daemon-reload`, the NVIDIA container toolkit, the
containerd / CRI-O / Docker runtime configuration, the kubelet's device-plugin directory and sockets,
and CDI specs. NVML itself is checked through the plugin's own discovery.
"""

from __future__ import annotations

import json
import os
import stat
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from kubegpu.toolkit.findings import FAIL, OK, WARN, Finding, ordered

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
TOOLKIT_DIRS = ("usr/bin", "usr/local/bin", "usr/local/nvidia/toolkit")
TOOLKIT_BINARIES = ("nvidia-container-runtime", "nvidia-ctk", "nvidia-container-cli")
PLUGIN_DIR = "var/lib/kubelet/device-plugins"
CDI_DIRS = ("etc/cdi", "var/run/cdi", "run/cdi")
CONFIGURE = "nvidia-ctk runtime configure --runtime={rt} --set-as-default, then restart {rt}"


def _join(root: Path, rel: str) -> Path:
    return root / rel.lstrip("/") if rel else root


def _shown(path: Path, root: Path) -> str:
    """The path as it is on the host, whatever root it was read under."""
    try:
        return "/" + str(path.relative_to(root)).lstrip("./")
    except ValueError:
        return str(path)


# --- driver and NVML ---------------------------------------------------------------------------------


def check_library(root: Path) -> Iterator[Finding]:
    for driver_root in DRIVER_ROOTS:
        for lib_dir in LIB_DIRS:
            candidate = _join(_join(root, driver_root), lib_dir) / "libnvidia-ml.so.1"
            if candidate.exists():
                target = candidate.resolve().name
                yield Finding("libnvidia-ml", OK, _shown(candidate, root), f"found (-> {target})", None, "")
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
        data = yaml.safe_load(config.read_text()) or {}
    except (OSError, yaml.YAMLError):
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


# --- container toolkit and runtimes ------------------------------------------------------------------


def _toolkit_mode(root: Path) -> str | None:
    for rel in (
        "etc/nvidia-container-runtime/config.toml",
        "usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml",
    ):
        try:
            data = tomllib.loads((root / rel).read_text())
        except (OSError, tomllib.TOMLDecodeError):
            continue
        mode = data.get("nvidia-container-runtime", {}).get("mode")
        return str(mode) if mode else "auto"
    return None


def check_toolkit(root: Path) -> Iterator[Finding]:
    found: dict[str, Path] = {}
    for name in TOOLKIT_BINARIES:
        for rel in TOOLKIT_DIRS:
            path = root / rel / name
            if path.exists():
                found[name] = path
                break
    if "nvidia-container-runtime" not in found:
        yield Finding(
            "container-toolkit",
            FAIL,
            "nvidia-container-runtime",
            f"not found in {', '.join('/' + d for d in TOOLKIT_DIRS)}",
            1,
            "install the NVIDIA container toolkit (apt/dnf nvidia-container-toolkit, or the GPU operator); "
            "without it containers get no driver libraries or device nodes",
        )
        return
    version = _toolkit_version(root, found)
    mode = _toolkit_mode(root)
    yield Finding(
        "container-toolkit",
        OK,
        _shown(found["nvidia-container-runtime"], root),
        f"{', '.join(sorted(found))} present{version}; runtime mode {mode or 'auto (no config.toml)'}",
        None,
        "",
    )


def _toolkit_version(root: Path, found: dict[str, Path]) -> str:
    """Read from the package metadata under the host root: running host binaries from a pod is unsafe."""
    for rel in ("var/lib/dpkg/status",):
        try:
            text = (root / rel).read_text(errors="replace")
        except OSError:
            continue
        for block in text.split("\n\n"):
            if block.startswith("Package: nvidia-container-toolkit\n"):
                for line in block.splitlines():
                    if line.startswith("Version:"):
                        return f", version {line.split(':', 1)[1].strip()}"
    return ""


def _containerd_runtimes(data: dict[str, Any]) -> tuple[dict[str, Any], str | None, bool | None]:
    """(runtimes, default runtime, enable_cdi) from a containerd config (v2 or v3 layout)."""
    plugins = data.get("plugins", {})
    for key in ("io.containerd.cri.v1.runtime", "io.containerd.grpc.v1.cri"):
        cri = plugins.get(key)
        if isinstance(cri, dict):
            containerd = cri.get("containerd", {})
            return (
                containerd.get("runtimes", {}),
                containerd.get("default_runtime_name"),
                cri.get("enable_cdi"),
            )
    return {}, None, None


def check_runtimes(root: Path) -> Iterator[Finding]:
    seen = False
    for reader in (_containerd, _crio, _docker):
        for finding in reader(root):
            seen = True
            yield finding
    if not seen:
        yield Finding(
            "runtime-config",
            WARN,
            "container runtime",
            "no containerd, CRI-O or Docker configuration found under the host root",
            1,
            "run the doctor with --host-root pointing at the host's filesystem",
        )


def _containerd(root: Path) -> Iterator[Finding]:
    main = root / "etc/containerd/config.toml"
    files = [main, *sorted((root / "etc/containerd/conf.d").glob("*.toml"))]
    runtimes: dict[str, Any] = {}
    default: str | None = None
    cdi: bool | None = None
    version = None
    read_any = False
    for path in files:
        try:
            data = tomllib.loads(path.read_text())
        except OSError:
            continue
        except tomllib.TOMLDecodeError as exc:
            yield Finding(
                "runtime-config",
                FAIL,
                _shown(path, root),
                f"not valid TOML: {exc}",
                1,
                "fix the file; containerd refuses to start with it",
            )
            continue
        read_any = True
        version = data.get("version", version)
        more, dflt, enable = _containerd_runtimes(data)
        runtimes.update(more)
        default = dflt or default
        cdi = enable if enable is not None else cdi
    if not read_any:
        return
    where = "/etc/containerd/config.toml"
    if version is not None and int(version) >= 3 and cdi is None:
        cdi = True  # containerd 2.x enables CDI by default
    cdi_text = {True: "CDI enabled", False: "CDI disabled", None: "CDI not enabled (enable_cdi unset)"}[cdi]
    if "nvidia" not in runtimes:
        yield Finding(
            "runtime-config",
            FAIL,
            where,
            f"containerd has no nvidia runtime (runtimes: "
            f"{', '.join(sorted(runtimes)) or 'none'}); {cdi_text}",
            1,
            CONFIGURE.format(rt="containerd"),
        )
    elif default != "nvidia":
        yield Finding(
            "runtime-config",
            WARN,
            where,
            f"containerd has the nvidia runtime but the default is {default or 'runc'}; {cdi_text}",
            1,
            "GPU pods (and the device plugin) need runtimeClassName: nvidia, or make it the default: "
            + CONFIGURE.format(rt="containerd"),
        )
    else:
        yield Finding(
            "runtime-config", OK, where, f"containerd: nvidia runtime is the default; {cdi_text}", None, ""
        )


def _crio(root: Path) -> Iterator[Finding]:
    files = [root / "etc/crio/crio.conf", *sorted((root / "etc/crio/crio.conf.d").glob("*.conf"))]
    runtimes: dict[str, Any] = {}
    default = None
    read_any = False
    for path in files:
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError):
            continue
        read_any = True
        section = data.get("crio", {}).get("runtime", {})
        runtimes.update(section.get("runtimes", {}))
        default = section.get("default_runtime", default)
    if not read_any:
        return
    if "nvidia" not in runtimes:
        yield Finding(
            "runtime-config", FAIL, "/etc/crio", "CRI-O has no nvidia runtime", 1, CONFIGURE.format(rt="crio")
        )
    elif default != "nvidia":
        yield Finding(
            "runtime-config",
            WARN,
            "/etc/crio",
            f"CRI-O's default runtime is {default or 'runc'}",
            1,
            "GPU pods need runtimeClassName: nvidia, or " + CONFIGURE.format(rt="crio"),
        )
    else:
        yield Finding("runtime-config", OK, "/etc/crio", "CRI-O: nvidia runtime is the default", None, "")


def _docker(root: Path) -> Iterator[Finding]:
    path = root / "etc/docker/daemon.json"
    try:
        data = json.loads(path.read_text())
    except OSError:
        return
    except json.JSONDecodeError as exc:
        yield Finding(
            "runtime-config", FAIL, "/etc/docker/daemon.json", f"not valid JSON: {exc}", 1, "fix the file"
        )
        return
    runtimes = data.get("runtimes", {}) if isinstance(data, dict) else {}
    default = data.get("default-runtime") if isinstance(data, dict) else None
    if "nvidia" not in runtimes:
        yield Finding(
            "runtime-config",
            FAIL,
            "/etc/docker/daemon.json",
            "Docker has no nvidia runtime",
            1,
            CONFIGURE.format(rt="docker"),
        )
    elif default != "nvidia":
        yield Finding(
            "runtime-config",
            WARN,
            "/etc/docker/daemon.json",
            f"Docker's default runtime is {default or 'runc'}",
            1,
            CONFIGURE.format(rt="docker"),
        )
    else:
        yield Finding(
            "runtime-config", OK, "/etc/docker/daemon.json", "Docker: nvidia runtime is the default", None, ""
        )


# --- kubelet device-plugin directory -----------------------------------------------------------------


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


# --- CDI -----------------------------------------------------------------------------------------------


def check_cdi(root: Path, env: dict[str, str]) -> Iterator[Finding]:
    strategy = env.get("DEVICE_LIST_STRATEGY", "")
    mode = _toolkit_mode(root)
    wants_cdi = "cdi" in strategy or mode == "cdi"
    specs = [
        p for d in CDI_DIRS for p in sorted((root / d).glob("*")) if p.suffix in (".json", ".yaml", ".yml")
    ]
    nvidia = [p for p in specs if "nvidia" in p.name or "nvidia.com" in _head(p)]
    why = f"DEVICE_LIST_STRATEGY={strategy}" if "cdi" in strategy else "nvidia-container-runtime mode = cdi"
    if wants_cdi and not nvidia:
        yield Finding(
            "cdi-spec",
            FAIL,
            "/var/run/cdi, /etc/cdi",
            f"CDI is configured ({why}) but no NVIDIA CDI spec exists",
            1,
            "nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml (the device plugin "
            "writes its own with a cdi-* deviceListStrategy)",
        )
    elif nvidia:
        yield Finding(
            "cdi-spec", OK, ", ".join(_shown(p, root) for p in nvidia), "NVIDIA CDI spec present", None, ""
        )


def _head(path: Path) -> str:
    try:
        with path.open(errors="replace") as f:
            return f.read(4096)
    except OSError:
        return ""


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

"""The node doctor's container-side checks: the NVIDIA container toolkit, the runtimes, the CDI specs.

The runtimes are containerd, CRI-O and Docker, read from their configuration files; a CDI spec is needed
when the plugin or the toolkit is set to inject devices by CDI.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubegpu.common.files import MIB, FileProblem, read_bytes, read_text_file
from kubegpu.toolkit.doctor.findings import FAIL, OK, WARN, Finding
from kubegpu.toolkit.doctor.host_tree import shown

TOOLKIT_DIRS = ("usr/bin", "usr/local/bin", "usr/local/nvidia/toolkit")
TOOLKIT_BINARIES = ("nvidia-container-runtime", "nvidia-ctk", "nvidia-container-cli")
CDI_DIRS = ("etc/cdi", "var/run/cdi", "run/cdi")
CONFIGURE = "nvidia-ctk runtime configure --runtime={rt} --set-as-default, then restart {rt}"
HOST_FILE_LIMIT = 16 * MIB  # runtime configs are KBs; the dpkg database a few MB


class Unreadable(OSError):
    """A host file that exists but cannot be used (too large, not UTF-8): the message says why."""


def read_host_file(path: Path) -> str:
    """A host config file's text. OSError when missing; Unreadable (an OSError) when present but unusable."""
    try:
        return read_text_file(path, limit=HOST_FILE_LIMIT, what="config file")
    except FileProblem as err:
        if isinstance(err.__cause__, OSError):
            raise err.__cause__ from None
        raise Unreadable(str(err)) from None


def toolkit_mode(root: Path) -> str | None:
    for rel in (
        "etc/nvidia-container-runtime/config.toml",
        "usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml",
    ):
        try:
            data = tomllib.loads(read_host_file(root / rel))
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
    mode = toolkit_mode(root)
    yield Finding(
        "container-toolkit",
        OK,
        shown(found["nvidia-container-runtime"], root),
        f"{', '.join(sorted(found))} present{version}; runtime mode {mode or 'auto (no config.toml)'}",
        None,
        "",
    )


def _toolkit_version(root: Path, found: dict[str, Path]) -> str:
    """Read from the package metadata under the host root: running host binaries from a pod is unsafe."""
    for rel in ("var/lib/dpkg/status",):
        try:
            # dpkg's database may hold descriptions in other encodings: only the Version line matters here.
            data = read_bytes(root / rel, limit=HOST_FILE_LIMIT, what="dpkg status")
            text = data.decode("utf-8", "replace")
        except FileProblem:
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
            data = tomllib.loads(read_host_file(path))
        except Unreadable as exc:
            yield Finding("runtime-config", FAIL, shown(path, root), str(exc), 1, "fix the file")
            continue
        except OSError:
            continue
        except tomllib.TOMLDecodeError as exc:
            yield Finding(
                "runtime-config",
                FAIL,
                shown(path, root),
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
            data = tomllib.loads(read_host_file(path))
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
        data = json.loads(read_host_file(path))
    except Unreadable as exc:
        yield Finding("runtime-config", FAIL, "/etc/docker/daemon.json", str(exc), 1, "fix the file")
        return
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


# --- CDI -----------------------------------------------------------------------------------------------


def check_cdi(root: Path, env: dict[str, str]) -> Iterator[Finding]:
    strategy = env.get("DEVICE_LIST_STRATEGY", "")
    mode = toolkit_mode(root)
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
            "cdi-spec", OK, ", ".join(shown(p, root) for p in nvidia), "NVIDIA CDI spec present", None, ""
        )


def _head(path: Path) -> str:
    try:
        with path.open(errors="replace") as f:
            return f.read(4096)
    except OSError:
        return ""

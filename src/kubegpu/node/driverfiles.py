"""What the NVIDIA driver puts on a node, and where the plugin finds it.

Device nodes, IMEX channels, the user-space libraries and binaries a container needs, and the nodes that
GPUDirect Storage, GDRCopy and MOFED bring. Allocate (`allocate.py`) and the CDI specs (`cdi.py`) both build
on these, so the two always agree on what a container gets.

Paths come in two views. *Host* paths are what the container runtime sees: `--driver-root` /
`--dev-root` plus the path. The plugin itself usually runs in a container with the host's driver root
mounted at `--driver-root-ctr-path` (default `/driver-root`), so it *looks* there; when that directory does
not exist the plugin is taken to run on the host and looks at the driver root itself.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
IMEX_CHANNEL_DIR = "/dev/nvidia-caps-imex-channels"

# The driver's compute libraries (what nvidia-container-toolkit mounts for the compute/utility capabilities).
LIBRARIES = (
    "libcuda.so",
    "libcudadebugger.so",
    "libnvidia-allocator.so",
    "libnvidia-cfg.so",
    "libnvidia-gpucomp.so",
    "libnvidia-ml.so",
    "libnvidia-nscq.so",
    "libnvidia-nvvm.so",
    "libnvidia-opencl.so",
    "libnvidia-pkcs11-openssl3.so",
    "libnvidia-pkcs11.so",
    "libnvidia-ptxjitcompiler.so",
)
# Searched in this order; the first directory holding a library wins (lib64 is often a link to usr/lib64).
LIBRARY_DIRS = (
    "/usr/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib64",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib",
)
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
BINARY_DIRS = ("/usr/bin", "/usr/sbin", "/bin", "/sbin")
FIRMWARE_DIR = "/lib/firmware/nvidia"

# Extra device nodes per mode flag (--gdrcopy-enabled, --gds-enabled, --mofed-enabled); globs allowed.
MODE_DEVICES = {
    "gdrcopy": ("/dev/gdrdrv",),
    "gds": ("/dev/nvidia-fs*",),
    "mofed": ("/dev/infiniband/uverbs*", "/dev/infiniband/rdma_cm"),
}
MODE_ENV = {"gdrcopy": "NVIDIA_GDRCOPY", "gds": "NVIDIA_GDS", "mofed": "NVIDIA_MOFED"}
MODES = tuple(MODE_DEVICES)  # NVIDIA's order in Allocate's CDI device list


class ImexChannelError(RuntimeError):
    """A required IMEX channel is missing; the message names the channel and the fix."""


def join(root: str, path: str) -> str:
    """`path` (absolute) under `root`: join("/run/nvidia/driver", "/dev/nvidia0")."""
    return root.rstrip("/") + path if root not in ("", "/") else path


def looking_root(host_root: str, container_root: str) -> str:
    """Where the plugin looks for what lives under `host_root` on the host (see the module docstring)."""
    if container_root and os.path.isdir(container_root):
        return container_root
    return host_root or "/"


def imex_channel_path(channel: str) -> str:
    return f"{IMEX_CHANNEL_DIR}/channel{channel}"


def imex_channels(channel_ids: Sequence[int], dev_root: str, required: bool) -> tuple[str, ...]:
    """The configured IMEX channels whose character device exists under `dev_root`. As NVIDIA: a missing
    channel, or a path that is not a character device (a regular file left by a script, a directory), is
    skipped with a warning, or fails the start when IMEX is required (NVIDIA's text first)."""
    found = []
    for channel in (str(c) for c in channel_ids):
        path = join(dev_root, imex_channel_path(channel))
        problem = _not_a_channel(path)
        if problem is None:
            found.append(channel)
        elif required:
            raise ImexChannelError(
                f"requested IMEX channel channel{channel} does not exist ({problem}); create it (the IMEX "
                "daemon or nvidia-modprobe does) or drop --imex-required"
            )
        else:
            log.warning("Ignoring requested IMEX channel channel%s (does not exist: %s)", channel, problem)
    return tuple(found)


def _not_a_channel(path: str) -> str | None:
    """Why `path` is not an IMEX channel's device node, or None when it is one (symlinks followed)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return f"no {path}"
    except OSError as err:
        return f"{path}: {err.strerror}"
    if not stat.S_ISCHR(mode):
        return f"{path} is not a character device"
    return None


def existing(root: str, patterns: Iterable[str]) -> list[str]:
    """Absolute paths (without `root`) matching `patterns` under `root`, each pattern's matches sorted."""
    out: list[str] = []
    base = "" if root in ("", "/") else glob.escape(root.rstrip("/"))  # the root is a path, not a pattern
    for pattern in patterns:
        for match in sorted(glob.glob(base + pattern)):
            path = "/" + os.path.relpath(match, root or "/")
            if path not in out:
                out.append(path)
    return out


@dataclass(frozen=True, slots=True)
class DriverFiles:
    """What of the driver's user space a container needs, as paths relative to the driver root."""

    libraries: tuple[str, ...] = ()
    binaries: tuple[str, ...] = ()
    firmware: tuple[str, ...] = ()

    @property
    def library_dirs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(os.path.dirname(p) for p in self.libraries))

    def library(self, name: str) -> str | None:
        """The path of library `name` (e.g. "libcuda.so"), if found."""
        return next((p for p in self.libraries if os.path.basename(p).startswith(name + ".")), None)


def find_driver_files(root: str, driver_version: str) -> DriverFiles:
    """The driver's libraries (`<name>.<driver version>`), binaries and GSP firmware under `root`."""
    return DriverFiles(
        libraries=tuple(_find_libraries(root, driver_version)),
        binaries=tuple(_find_first(root, BINARY_DIRS, BINARIES)),
        firmware=tuple(_find_firmware(root, driver_version)),
    )


def _library_pattern(driver_version: str) -> re.Pattern[str]:
    # The real file carries the full driver version; libcuda.so.1 and libcuda.so are links the runtime's
    # ldconfig and our create-symlinks hook recreate in the container. Without a known version, any
    # dotted numeric suffix of two parts or more.
    version = re.escape(driver_version) if driver_version else r"\d+(\.\d+)+"
    names = "|".join(re.escape(n) for n in LIBRARIES)
    return re.compile(rf"^({names})\.{version}$")


def _find_libraries(root: str, driver_version: str) -> list[str]:
    pattern = _library_pattern(driver_version)
    found: dict[str, str] = {}  # library name -> path
    seen_real: set[str] = set()
    for directory in LIBRARY_DIRS:
        try:
            entries = sorted(os.listdir(join(root, directory)))
        except OSError:
            continue
        for entry in entries:
            match = pattern.match(entry)
            full = join(root, f"{directory}/{entry}")
            if not match or match.group(1) in found or not _regular_file(full):
                continue
            real = os.path.realpath(full)
            if real in seen_real:
                continue
            seen_real.add(real)
            found[match.group(1)] = f"{directory}/{entry}"
    return [found[name] for name in LIBRARIES if name in found]


def _find_first(root: str, directories: Sequence[str], names: Sequence[str]) -> list[str]:
    out = []
    for name in names:
        for directory in directories:
            if _regular_file(join(root, f"{directory}/{name}")):
                out.append(f"{directory}/{name}")
                break
    return out


def _find_firmware(root: str, driver_version: str) -> list[str]:
    if not driver_version:
        return []
    directory = f"{FIRMWARE_DIR}/{driver_version}"
    try:
        entries = sorted(os.listdir(join(root, directory)))
    except OSError:
        return []
    return [f"{directory}/{e}" for e in entries if _regular_file(join(root, f"{directory}/{e}"))]


def _regular_file(path: str) -> bool:
    return os.path.isfile(path) and not os.path.islink(path)

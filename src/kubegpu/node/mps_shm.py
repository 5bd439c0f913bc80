"""The tmpfs MPS clients get as /dev/shm: `kubegpu mps-daemon mount-shm` mounts it at `<root>/shm`, the DRA
driver at each MPS claim's `<plugin dir>/mps/<id>/shm` (MPSSupport).

NVIDIA's init container mounts it before the daemons start, sized at half the node's memory as
/proc/meminfo states it (`MemTotal: 16316296 kB` -> `size=8158148k`), 65536k when that cannot be read.
A tmpfs already mounted there (a restarted pod) is unmounted first, so the new one has the new size.
Mounting needs root; the command is a plain `mount` found on PATH, and `run` is injectable for tests.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from kubegpu.common.files import MIB, FileProblem, read_text_file
from kubegpu.node import mps_control as control

log = logging.getLogger(__name__)

FALLBACK_SIZE = "65536k"
MOUNT_OPTIONS = ("rw", "nosuid", "nodev", "noexec", "relatime")
PROC_MEMINFO = Path("/proc/meminfo")
PROC_MOUNTINFO = Path("/proc/self/mountinfo")

Runner = Callable[[Sequence[str]], object]


def shm_size(meminfo: Path = PROC_MEMINFO) -> str:
    """Half of MemTotal with the first letter of its unit (`8158148k`); FALLBACK_SIZE when unreadable."""
    try:
        text = read_text_file(meminfo, limit=MIB, what="meminfo file")
    except FileProblem as err:
        log.error("failed to read %s, using %s", err, FALLBACK_SIZE)
        return FALLBACK_SIZE
    for line in text.splitlines():
        if not line.startswith("MemTotal:"):
            continue
        parts = line.removeprefix("MemTotal:").split()
        try:
            total = int(parts[0])
        except (IndexError, ValueError):
            log.error("could not convert MemTotal to an integer in %s, using %s", meminfo, FALLBACK_SIZE)
            return FALLBACK_SIZE
        unit = parts[1][0] if len(parts) > 1 else ""
        return f"{total // 2}{unit}"
    return FALLBACK_SIZE


def mount_options(size: str) -> list[str]:
    return [*MOUNT_OPTIONS, f"size={size}"]


def mount_command(mount_point: Path, size: str) -> list[str]:
    """`mount -t tmpfs -o rw,nosuid,nodev,noexec,relatime,size=<size> shm <mount point>`."""
    return ["mount", "-t", "tmpfs", "-o", ",".join(mount_options(size)), "shm", str(mount_point)]


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash in paths as octal escapes (\040 ...).
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def is_mount_point(path: Path, mountinfo: Path = PROC_MOUNTINFO) -> bool:
    """Whether something is mounted at `path` (the kernel's table, so bind mounts count too)."""
    try:
        lines = read_text_file(mountinfo, limit=64 * MIB, what="mount table").splitlines()
    except FileProblem:
        return path.is_mount()
    target = str(path.absolute())
    return any(len(f) > 4 and _unescape(f[4]) == target for f in (line.split() for line in lines))


def mount_shm(
    mount_point: Path,
    meminfo: Path = PROC_MEMINFO,
    mountinfo: Path = PROC_MOUNTINFO,
    run: Runner = control.run_tool,
) -> list[str]:
    """Unmount what is at `mount_point`, create it, mount the tmpfs. Returns the mount command it ran.

    Raises MpsCommandError (from the default runner) or OSError.
    """
    if is_mount_point(mount_point, mountinfo):
        log.info("unmounting the previous %s", mount_point)
        run(["umount", str(mount_point)])
    mount_point.mkdir(mode=0o755, parents=True, exist_ok=True)
    command = mount_command(mount_point, shm_size(meminfo))
    log.info("mounting %s: %s", mount_point, " ".join(command))
    run(command)
    return command

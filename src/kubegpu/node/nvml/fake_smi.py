"""A fake `nvidia-smi` for the fake NVML's node: it records each call and answers as told.

`install(driver_root, log)` writes `<driver_root>/usr/bin/nvidia-smi`, a shell script that appends its
arguments (one call per line) to `log` and exits 0; when the file `<log>.fail` exists it prints that file's
text on stderr and exits 3 instead, as a failing nvidia-smi would. Tests point the DRA driver's
`--container-driver-root` at `driver_root` and read the log.
"""

from __future__ import annotations

import shlex
from pathlib import Path

FAIL_STATUS = 3


def install(driver_root: Path, log: Path) -> Path:
    binary = driver_root / "usr" / "bin" / "nvidia-smi"
    binary.parent.mkdir(parents=True, exist_ok=True)
    fail = shlex.quote(f"{log}.fail")
    binary.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {shlex.quote(str(log))}\n'
        f"if [ -f {fail} ]; then cat {fail} >&2; exit {FAIL_STATUS}; fi\n"
        "exit 0\n"
    )
    binary.chmod(0o755)
    return binary


def calls(log: Path) -> list[str]:
    """The recorded calls, one argument string each, oldest first."""
    return log.read_text().splitlines() if log.exists() else []


def compute_modes(log: Path) -> dict[str, str]:
    """Each GPU's compute mode as the recorded `-i <uuid> -c <mode>` calls left it."""
    modes = {}
    for call in calls(log):
        parts = call.split()
        if len(parts) == 4 and parts[0] == "-i" and parts[2] == "-c":
            modes[parts[1]] = parts[3]
    return modes

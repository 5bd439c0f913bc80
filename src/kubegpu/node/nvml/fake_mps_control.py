"""A fake `nvidia-cuda-mps-control` for the fake NVML's node, as the simulated kubelet runs the DRA driver's
MPS control-daemon containers (`demo/deployment_runner.py`).

`install(bin_dir, log)` writes `<bin_dir>/nvidia-cuda-mps-control`, a shell script that behaves like the real
tool where a test can see it: `-d` (or `-d -M`) starts "the daemon" by creating `control` in
`$CUDA_MPS_PIPE_DIRECTORY` and a line in `$CUDA_MPS_LOG_DIRECTORY/control.log` (it fails when one is already
running there, as the real one does); a command piped in without a daemon on that pipe fails; `quit` stops
it. Each call appends one line to `log`: its arguments, its stdin and CUDA_VISIBLE_DEVICES, tab-separated.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

_SCRIPT = r"""#!/bin/sh
stdin=
[ "$*" = "-d" ] || [ "$*" = "-d -M" ] || stdin=$(cat)
pipe=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}
logdir=${CUDA_MPS_LOG_DIRECTORY:-/var/log/nvidia-mps}
printf '%s\t%s\t%s\n' "$*" "$stdin" "${CUDA_VISIBLE_DEVICES:-}" >> {log}
case "$*" in
-d|"-d -M")
    if [ -e "$pipe/control" ]; then echo "An instance of this daemon is already running"; exit 1; fi
    : > "$pipe/control"
    echo "[fake] Control daemon started $*" >> "$logdir/control.log"
    exit 0;;
esac
[ -e "$pipe/control" ] || { echo "Cannot find MPS control daemon process" >&2; exit 1; }
case $stdin in
quit) rm -f "$pipe/control";;
get_default_active_thread_percentage) echo "100.0";;
esac
echo "[fake] $stdin" >> "$logdir/control.log"
exit 0
"""


@dataclass(frozen=True, slots=True)
class Call:
    args: str
    stdin: str
    visible_devices: str


def install(bin_dir: Path, log: Path) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    binary = bin_dir / "nvidia-cuda-mps-control"
    binary.write_text(_SCRIPT.replace("{log}", shlex.quote(str(log))))
    binary.chmod(0o755)
    return binary


def calls(log: Path) -> list[Call]:
    """The recorded calls, oldest first."""
    if not log.exists():
        return []
    return [Call(*line.split("\t")) for line in log.read_text().splitlines()]

"""The `nvidia-smi` NVIDIA's DRA driver runs: the one under the container driver root, as its nvlib finds it.

Time slices (`timeslicing`) and MPS compute modes (`mps_daemon`) are set through it, never through NVML, as
NVIDIA's driver sets them. Every call has a timeout; a failure is one line with NVIDIA's inner text
(`error running nvidia-smi: ...`) and the fix when the binary is missing.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from kubegpu.node.driverfiles import BINARY_DIRS, join

NVIDIA_SMI_TIMEOUT_S = 30.0

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


class NvidiaSmiError(RuntimeError):
    """nvidia-smi is missing, failed or timed out; the text starts with `error running nvidia-smi`."""


def run_nvidia_smi(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False
    )


class NvidiaSmi:
    def __init__(self, container_driver_root: str, run: Runner = run_nvidia_smi) -> None:
        self.root = container_driver_root
        self.run = run

    def path(self) -> str | None:
        for directory in BINARY_DIRS:
            path = join(self.root, f"{directory}/nvidia-smi")
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
        return None

    def __call__(self, *args: str) -> None:
        """Run `nvidia-smi <args>`; NvidiaSmiError when it cannot be run or exits non-zero."""
        smi = self.path()
        if smi is None:
            raise NvidiaSmiError(
                f"error running nvidia-smi: not found under {Path(self.root)} ({', '.join(BINARY_DIRS)}); "
                "mount the host's driver root at --container-driver-root (DRIVER_ROOT_CTR_PATH)"
            )
        try:
            done = self.run([smi, *args])
        except (OSError, subprocess.TimeoutExpired) as err:
            raise NvidiaSmiError(f"error running nvidia-smi: {err}") from None
        if done.returncode != 0:
            output = " ".join((done.stdout + done.stderr).split())[:300]
            raise NvidiaSmiError(f"error running nvidia-smi: exit status {done.returncode}: {output}")

    def compute_mode(self, uuid: str, mode: str) -> None:
        """`nvidia-smi -i <uuid> -c <mode>` (DEFAULT, EXCLUSIVE_PROCESS)."""
        self("-i", uuid, "-c", mode)

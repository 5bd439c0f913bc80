"""The time slicer without a driver process: which nvidia-smi, NVIDIA's arguments and values, and the texts
when nvidia-smi is missing or fails (NVIDIA's `error running nvidia-smi`, written out)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from kubegpu.dra.timeslicing import TimeSliceError, TimeSlicer
from kubegpu.node.nvml import fake_smi


def test_nvidia_smi_is_looked_up_under_the_container_driver_root(tmp_path: Path) -> None:
    assert TimeSlicer(str(tmp_path)).smi.path() is None
    installed = fake_smi.install(tmp_path, tmp_path / "log")
    assert TimeSlicer(str(tmp_path)).smi.path() == str(installed)


def test_a_missing_nvidia_smi_names_where_it_was_looked_for(tmp_path: Path) -> None:
    with pytest.raises(TimeSliceError) as err:
        TimeSlicer(str(tmp_path)).reset("uid-1", ["GPU-a"])
    assert str(err.value) == (
        f"error resetting timeslice config in claim 'uid-1': error running nvidia-smi: not found under "
        f"{tmp_path} (/usr/bin, /usr/sbin, /bin, /sbin); mount the host's driver root at "
        "--container-driver-root (DRIVER_ROOT_CTR_PATH)"
    )


def test_reset_sets_default_on_each_gpu_and_a_hung_nvidia_smi_is_an_error(tmp_path: Path) -> None:
    fake_smi.install(tmp_path, tmp_path / "log")
    calls: list[list[str]] = []

    def record(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        calls.append(list(argv[1:]))
        return subprocess.CompletedProcess(argv, 0, "", "")

    TimeSlicer(str(tmp_path), run=record).reset("uid-1", ["GPU-a", "GPU-b"])
    assert calls == [
        ["-i", "GPU-a", "-c", "DEFAULT"],
        ["compute-policy", "-i", "GPU-a", "--set-timeslice", "0"],
        ["-i", "GPU-b", "-c", "DEFAULT"],
        ["compute-policy", "-i", "GPU-b", "--set-timeslice", "0"],
    ]

    def hang(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        raise subprocess.TimeoutExpired(list(argv), 30.0)

    with pytest.raises(TimeSliceError, match=r"error running nvidia-smi: Command .* timed out after 30"):
        TimeSlicer(str(tmp_path), run=hang).reset("uid-1", ["GPU-a"])

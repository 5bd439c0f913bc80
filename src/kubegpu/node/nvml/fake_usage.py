"""What the fake NVML's GPUs are doing: utilisation, memory, power, temperature, clocks and processes.

`kubegpu fake-nvml inject --gpu N --utilization P --memory-used MIB --process PID:MIB[:SM] ...` writes a
GPU's use to `usage.json` in the state directory (replaced atomically, like `faults.json`); the fake reads
it back on every telemetry call (re-read only when the file changed). A GPU nobody injected into is idle:
0 % busy, no processes, idle power, temperature and clock.

Processes carry the MIG GPU instance they run on (`gi`, None on a whole GPU) and whether they are MPS
clients (listed by nvmlDeviceGetMPSComputeRunningProcesses rather than nvmlDeviceGetComputeRunningProcesses,
as the real driver lists them).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kubegpu.common.files import write_atomic
from kubegpu.node.nvml.fake_state import StateDir, read_state_file, state_file_object, torn_state_file

USAGE_FILE = "usage.json"

# What an idle data-center GPU reports (an A100 at rest: ~60 W, low 30s C, SM clock parked at 210 MHz).
IDLE_POWER_W = 60.0
IDLE_TEMPERATURE_C = 33
IDLE_SM_CLOCK_MHZ = 210


@dataclass(frozen=True, slots=True)
class ProcessUse:
    """A compute process on a GPU: its PID, GPU memory and share of the SMs (0-100)."""

    pid: int
    used_mib: int
    sm_util: int = 0
    gi: int | None = None  # the MIG GPU instance it runs on; None on a whole GPU
    mps: bool = False  # an MPS client (listed among the MPS compute processes)


@dataclass(frozen=True, slots=True)
class GpuUse:
    """One GPU's use as `inject` set it."""

    utilization: int = 0  # % of time a kernel ran (nvmlDeviceGetUtilizationRates().gpu)
    memory_util: int = 0  # % of time memory was read or written (.memory)
    memory_used_mib: int = 0  # beyond the processes' own memory (driver reservations, contexts)
    power_w: float = IDLE_POWER_W
    temperature_c: int = IDLE_TEMPERATURE_C
    sm_clock_mhz: int = IDLE_SM_CLOCK_MHZ
    processes: tuple[ProcessUse, ...] = ()

    def processes_on(self, gi: int | None) -> tuple[ProcessUse, ...]:
        """The processes of one MIG GPU instance (`gi`), or of the whole GPU (None: all of them)."""
        return self.processes if gi is None else tuple(p for p in self.processes if p.gi == gi)

    def used_mib(self, gi: int | None = None) -> int:
        own = sum(p.used_mib for p in self.processes_on(gi))
        return own if gi is not None else own + self.memory_used_mib


IDLE = GpuUse()


@dataclass(frozen=True, slots=True)
class Usage:
    """Every GPU's use, keyed by GPU index."""

    gpus: Mapping[int, GpuUse] = field(default_factory=dict)

    def gpu(self, index: int) -> GpuUse:
        return self.gpus.get(index, IDLE)

    def to_json(self) -> bytes:
        body = {str(i): dataclasses.asdict(u) for i, u in sorted(self.gpus.items()) if u != IDLE}
        return json.dumps({"gpus": body}, indent=2).encode()

    @classmethod
    def from_json(cls, raw: bytes, path: Path | str = USAGE_FILE) -> Usage:
        """Raises StateDirError naming the file when it is not use as `to_json` writes it (a torn or foreign
        file), as a torn faults.json does."""
        body = state_file_object(raw, path).get("gpus", {})
        try:
            gpus = {}
            for index, fields in body.items():
                if not isinstance(fields, dict):
                    raise TypeError(f"GPU {index}'s use is not a JSON object")
                processes = tuple(ProcessUse(**p) for p in fields.pop("processes", ()))
                gpus[int(index)] = GpuUse(**fields, processes=processes)
        except (AttributeError, TypeError, ValueError) as err:
            raise torn_state_file(path, f"its gpus are not GPU use by GPU index ({err})") from None
        return cls(gpus)


def parse_process(text: str) -> tuple[int, int, int]:
    """`PID:MIB[:SM]` as `--process` takes it; ValueError naming what is wrong."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not all(p.strip().isdigit() for p in parts):
        raise ValueError(
            f"--process {text!r} is not PID:MIB or PID:MIB:SM (whole numbers), e.g. 4242:2048:30"
        )
    pid, mib, sm = (int(p) for p in (*parts, "0")[:3])
    if pid == 0:
        raise ValueError(f"--process {text!r}: PID 0 is not a process")
    if sm > 100:
        raise ValueError(f"--process {text!r}: SM utilisation {sm} is over 100 %")
    return pid, mib, sm


class UsageFile:
    """`usage.json` of a state directory, read by the fake on every call and written by `inject`."""

    def __init__(self, state: StateDir) -> None:
        self.state = state
        self._path = state.path / USAGE_FILE
        self._key: tuple[int, int, int] | None = None
        self._usage = Usage()

    def read(self) -> Usage:
        try:
            st = os.stat(self._path)
        except FileNotFoundError:
            return Usage()
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key != self._key:
            self._usage = Usage.from_json(read_state_file(self._path), self._path)
            self._key = key
        return self._usage

    def set_gpu(
        self,
        gpu: int,
        changes: Mapping[str, object],
        processes: Sequence[ProcessUse] | None = None,
        gi: int | None = None,
    ) -> GpuUse:
        """Change the given fields of one GPU's use; `processes` (when given) replace those on `gi` (the
        whole GPU's when None)."""
        with self.state.locked():
            path = self._path
            current = Usage.from_json(read_state_file(path), path) if path.exists() else Usage()
            new = dataclasses.replace(current.gpu(gpu), **changes)  # type: ignore[arg-type]  # checked fields
            if processes is not None:
                kept = tuple(p for p in new.processes if gi is not None and p.gi != gi)
                placed = tuple(dataclasses.replace(p, gi=gi) for p in processes)
                new = dataclasses.replace(new, processes=kept + placed)
            write_atomic(path, Usage({**current.gpus, gpu: new}).to_json(), durable=False)
            return new

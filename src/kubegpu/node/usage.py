"""What the GPUs are doing now, read from NVML: utilisation, memory, power, temperature, clock, processes.

`UsageReader.sample(inventory)` reads every GPU and MIG device of a discovered inventory once and returns
plain data (`UsageSample`); it blocks on NVML, so callers run it in a thread. Each value NVML cannot give
(NVML_ERROR_NOT_SUPPORTED on a MIG device, no permission, a flaky call) is None rather than a failed
sample; a GPU that is lost gives no device sample at all. What NVML can and cannot say:

- MIG devices answer memory and their own compute processes; utilisation, power, temperature and clocks
  are the parent GPU's (not supported on the MIG handle), and so is per-process utilisation.
- Per-process utilisation (nvmlDeviceGetProcessUtilization) returns the samples newer than a timestamp;
  the reader keeps the last one per GPU, so each process's value is its latest sample, and a process with
  no sample in the window is 0 % busy (the driver records only processes that ran).
- MPS clients are listed by nvmlDeviceGetMPSComputeRunningProcesses; the MPS server by the compute list.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pynvml

from kubegpu.node.inventory import Gpu, Inventory, MigDevice
from kubegpu.node.nvml.backend import NvmlApi

log = logging.getLogger(__name__)

MIB = 1024 * 1024
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ProcessUse:
    """A compute process on a device (GPU or MIG device)."""

    pid: int
    used_bytes: int | None  # None when the driver cannot say (e.g. without permission)
    sm_util: int | None  # % of the SMs from its latest sample; None where NVML has no per-process samples


@dataclass(frozen=True, slots=True)
class DeviceUse:
    """One GPU or MIG device as sampled. Labels come from the inventory, values from NVML."""

    uuid: str  # the GPU's or the MIG device's own UUID (what the plugin's devices carry)
    gpu: Gpu  # the physical GPU (for a MIG device: its parent)
    mig: MigDevice | None
    utilization: float | None  # %
    memory_util: float | None  # %
    fb_used_mib: float | None
    fb_free_mib: float | None
    power_w: float | None
    temperature_c: float | None
    sm_clock_mhz: float | None
    processes: tuple[ProcessUse, ...]

    @property
    def active_processes(self) -> int:
        return len(self.processes)


@dataclass(frozen=True, slots=True)
class UsageSample:
    taken_at: float  # time.monotonic() when the sample was taken
    devices: tuple[DeviceUse, ...] = ()
    nvlinks: tuple[tuple[str, str, int], ...] = ()  # (GPU UUID, GPU UUID, lanes) of NVLink-connected pairs

    def by_uuid(self) -> dict[str, DeviceUse]:
        return {d.uuid: d for d in self.devices}


class UsageReader:
    """Reads NVML's telemetry for an inventory's devices. Not thread-safe: one sampler thread uses it."""

    def __init__(self, nvml: NvmlApi, clock: Callable[[], float] = time.monotonic) -> None:
        self.nvml = nvml
        self._clock = clock
        self._last_sample_us: dict[str, int] = {}  # GPU UUID -> newest per-process sample seen

    def sample(self, inventory: Inventory) -> UsageSample:
        devices: list[DeviceUse] = []
        for gpu in inventory.gpus:
            try:
                devices.extend(self._sample_gpu(gpu))
            except pynvml.NVMLError as err:  # lost or unreachable now: no values beat wrong ones
                log.debug("no telemetry from GPU %s: %s", gpu.uuid, err)
        by_index = {g.index: g.uuid for g in inventory.gpus}
        nvlinks = tuple(
            (by_index[link.a], by_index[link.b], link.nvlinks)
            for link in inventory.links
            if link.nvlinks and link.a in by_index and link.b in by_index
        )
        return UsageSample(self._clock(), tuple(devices), nvlinks)

    def _sample_gpu(self, gpu: Gpu) -> list[DeviceUse]:
        nvml = self.nvml
        handle = nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
        rates = _maybe(nvml.nvmlDeviceGetUtilizationRates, handle)
        power_mw = _maybe(nvml.nvmlDeviceGetPowerUsage, handle)
        common = {
            "power_w": None if power_mw is None else power_mw / 1000,
            "temperature_c": _float(
                _maybe(nvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU)
            ),
            "sm_clock_mhz": _float(_maybe(nvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM)),
        }
        sm_util = self._process_utilization(gpu.uuid, handle)
        whole = DeviceUse(
            gpu.uuid,
            gpu,
            None,
            utilization=None if rates is None else float(rates.gpu),
            memory_util=None if rates is None else float(rates.memory),
            **_memory(nvml, handle),
            **common,
            # In MIG mode the GPU lists every MIG device's processes; they are counted on their device.
            processes=() if gpu.mig_devices else self._processes(handle, sm_util),
        )
        samples = [whole]
        for mig in gpu.mig_devices:
            mig_handle = _maybe(nvml.nvmlDeviceGetHandleByUUID, mig.uuid)
            if mig_handle is None:
                continue
            samples.append(
                DeviceUse(
                    mig.uuid,
                    gpu,
                    mig,
                    utilization=None,
                    memory_util=None,
                    **_memory(nvml, mig_handle),
                    **common,
                    processes=self._processes(mig_handle, None),
                )
            )
        return samples

    def _processes(self, handle: Any, sm_util: dict[int, int] | None) -> tuple[ProcessUse, ...]:
        found: dict[int, ProcessUse] = {}
        for call in (
            self.nvml.nvmlDeviceGetComputeRunningProcesses,
            self.nvml.nvmlDeviceGetMPSComputeRunningProcesses,
        ):
            for p in _maybe(call, handle) or ():
                used = p.usedGpuMemory if isinstance(p.usedGpuMemory, int) else None
                util = None if sm_util is None else sm_util.get(p.pid, 0)
                found[p.pid] = ProcessUse(int(p.pid), used, util)
        return tuple(found[pid] for pid in sorted(found))

    def _process_utilization(self, gpu_uuid: str, handle: Any) -> dict[int, int] | None:
        """pid -> SM % from the samples since the last call; None where the GPU keeps none (MIG mode)."""
        since = self._last_sample_us.get(gpu_uuid, 0)
        try:
            samples = self.nvml.nvmlDeviceGetProcessUtilization(handle, since)
        except pynvml.NVMLError as err:
            if err.value == pynvml.NVML_ERROR_NOT_FOUND:  # nothing ran since: every process idle
                return {}
            return None
        latest: dict[int, tuple[int, int]] = {}
        for s in samples:
            if s.timeStamp >= latest.get(s.pid, (-1, 0))[0]:
                latest[s.pid] = (s.timeStamp, min(int(s.smUtil), 100))
            self._last_sample_us[gpu_uuid] = max(self._last_sample_us.get(gpu_uuid, 0), int(s.timeStamp))
        return {pid: value for pid, (_, value) in latest.items()}


def _maybe(call: Callable[..., T], *args: Any) -> T | None:
    """NVML's answer, or None where this device or driver cannot give it."""
    try:
        return call(*args)
    except pynvml.NVMLError_GpuIsLost:
        raise
    except pynvml.NVMLError:
        return None


def _float(value: int | None) -> float | None:
    return None if value is None else float(value)


def _memory(nvml: NvmlApi, handle: Any) -> dict[str, float | None]:
    memory = _maybe(nvml.nvmlDeviceGetMemoryInfo, handle)
    if memory is None:
        return {"fb_used_mib": None, "fb_free_mib": None}
    return {"fb_used_mib": memory.used / MIB, "fb_free_mib": memory.free / MIB}

"""The fake NVML's telemetry calls: utilisation, memory used, power, temperature, clocks and processes.

Values come from the state directory's `usage.json` (`fake_usage.py`, written by `kubegpu fake-nvml
inject`). As on real GPUs: MIG device handles answer memory and their own processes but not utilisation,
power, temperature or clocks (NVML_ERROR_NOT_SUPPORTED); per-process utilisation raises
NVML_ERROR_NOT_FOUND when there is no sample newer than the timestamp asked for; a process on a MIG-enabled
GPU carries its GPU and compute instance ids, one on a whole GPU carries 0xFFFFFFFF in both.
"""

from __future__ import annotations

import time
from typing import Any

import pynvml

from kubegpu.node.nvml.fake_handles import DeviceTable, Gpu, fail
from kubegpu.node.nvml.fake_usage import GpuUse, ProcessUse, UsageFile
from kubegpu.node.nvml.pci import WHOLE_GPU

MIB = 1024 * 1024


class TelemetryCalls(DeviceTable):
    """nvmlDeviceGet{UtilizationRates,PowerUsage,Temperature,ClockInfo,*RunningProcesses,ProcessUtilization}."""

    _usage_file: UsageFile | None = None

    def _use(self, handle: Any, *, mig_ok: bool) -> tuple[GpuUse, int | None]:
        """The GPU's use and the MIG GPU instance the handle names (None: the whole GPU)."""
        gpu, mig = self._resolve(handle)
        if mig is not None and not mig_ok:
            fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self._usage(gpu), (mig.spec.gi if mig else None)

    def _usage(self, gpu: Gpu) -> GpuUse:
        """What `kubegpu fake-nvml inject` says the GPU is doing (no NVML checks: the caller resolved it)."""
        if self._usage_file is None:
            self._usage_file = UsageFile(self.state)
        return self._usage_file.read().gpu(gpu.index)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        use, _ = self._use(handle, mig_ok=False)
        rates = pynvml.c_nvmlUtilization_t()
        rates.gpu, rates.memory = use.utilization, use.memory_util
        return rates

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return round(self._use(handle, mig_ok=False)[0].power_w * 1000)  # milliwatts, as NVML

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        use, _ = self._use(handle, mig_ok=False)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return use.temperature_c

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        use, _ = self._use(handle, mig_ok=False)
        if type != pynvml.NVML_CLOCK_SM:
            fail(pynvml.NVML_ERROR_NOT_SUPPORTED)  # the fake models the SM clock only
        return use.sm_clock_mhz

    def _processes(self, handle: Any, *, mps: bool) -> list[Any]:
        use, gi = self._use(handle, mig_ok=True)
        return [_process_info(p) for p in use.processes_on(gi) if p.mps == mps]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        return self._processes(handle, mps=False)

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: Any) -> list[Any]:
        return self._processes(handle, mps=True)

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list[Any]:
        use, _ = self._use(handle, mig_ok=False)
        now_us = time.time_ns() // 1000
        if not use.processes or timeStamp >= now_us:
            fail(pynvml.NVML_ERROR_NOT_FOUND)  # no sample newer than timeStamp
        samples = []
        for p in use.processes:
            sample = pynvml.c_nvmlProcessUtilizationSample_t()
            sample.pid, sample.timeStamp, sample.smUtil, sample.memUtil = p.pid, now_us, p.sm_util, 0
            samples.append(sample)
        return samples


def _process_info(process: ProcessUse) -> Any:
    info = pynvml.c_nvmlProcessInfo_v3_t()
    info.pid, info.usedGpuMemory = process.pid, process.used_mib * MIB
    # A process on a whole GPU names no instance, with the same all-ones value events use.
    info.gpuInstanceId = WHOLE_GPU if process.gi is None else process.gi
    info.computeInstanceId = WHOLE_GPU if process.gi is None else 0
    return pynvml.nvmlStructToFriendlyObject(info)  # what pynvml hands back

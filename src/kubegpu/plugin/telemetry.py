"""GPU telemetry for /metrics: NVML sampled in a thread every --metrics-interval, never on a scrape.

`Telemetry.run` (a supervised task) samples the served inventory's devices in a worker thread
(`node/usage.py`), reads the cgroup of each process found (`node/proc_cgroup.py`) and the kubelet's pod
UIDs per device (`kubelet_checkpoint.py`), and hands the snapshot to `on_sample` in that thread, where
`telemetry_metrics.py` formats the series. A scrape only appends those bytes, so neither scrapes nor
Allocate wait on NVML or on formatting, and a hung NVML call delays the next sample, nothing else.

Idle time: a device is active in a sample when its utilisation is above --idle-threshold (for MIG devices,
whose utilisation NVML does not report, when any compute process runs on it). A holder has been idle since
the later of the device's last active sample and the first scrape that saw it holding the device.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kubegpu.node.inventory import Inventory
from kubegpu.node.nvml.backend import NvmlApi
from kubegpu.node.proc_cgroup import ContainerRef, read_container
from kubegpu.node.usage import DeviceUse, UsageReader, UsageSample
from kubegpu.plugin.kubelet_checkpoint import PodContainer, read_device_pods

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TelemetrySnapshot:
    sample: UsageSample
    containers: Mapping[int, ContainerRef | None] = field(default_factory=dict)  # absent pid: unreadable
    device_pods: Mapping[tuple[str, str], PodContainer] = field(default_factory=dict)


def is_active(device: DeviceUse, threshold_percent: float) -> bool:
    if device.utilization is not None:
        return device.utilization > threshold_percent
    return bool(device.processes)


class IdleClock:
    """When each device was last active, and since when each holder has held it."""

    def __init__(self, threshold_percent: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.threshold_percent = threshold_percent
        self._clock = clock
        self._last_active: dict[str, float] = {}  # device UUID -> monotonic time
        self._holding_since: dict[tuple[str, ...], float] = {}

    def observe(self, sample: UsageSample) -> None:
        for device in sample.devices:
            if is_active(device, self.threshold_percent):
                self._last_active[device.uuid] = sample.taken_at

    def idle_seconds(self, holders: Iterable[tuple[str, ...]]) -> dict[tuple[str, ...], float]:
        """Seconds each holder has been idle; a holder key's last item is the device UUID. Holders no
        longer seen are forgotten, so a pod that takes the device again starts from zero."""
        now = self._clock()
        seen = {key: self._holding_since.get(key, now) for key in holders}
        self._holding_since = seen
        return {
            key: max(0.0, now - max(since, self._last_active.get(key[-1], since)))
            for key, since in seen.items()
        }


class Telemetry:
    def __init__(
        self,
        nvml: Callable[[], NvmlApi],
        inventory: Callable[[], Inventory],
        *,
        interval_s: float,
        idle_threshold_percent: float,
        proc_root: Path,
        plugin_dir: Path,
    ) -> None:
        self._nvml = nvml
        self._inventory = inventory
        self.interval_s = interval_s
        self.proc_root = proc_root
        self.plugin_dir = plugin_dir
        self.idle = IdleClock(idle_threshold_percent)
        self.latest: TelemetrySnapshot | None = None
        self._reader: UsageReader | None = None
        # Called in the sampler thread with each new snapshot (telemetry_metrics formats it there).
        self.on_sample: Callable[[TelemetrySnapshot], None] | None = None
        # Awaited on the loop before each sample: PodResources read afresh, so the holders are current
        # whether or not anyone scrapes (`kubegpu top` through the pod proxy may be the only reader).
        self.before_sample: Callable[[], Awaitable[None]] | None = None

    async def run(self) -> None:
        while True:
            if self.before_sample is not None:
                await self.before_sample()
            await asyncio.to_thread(self.sample_once)
            await asyncio.sleep(self.interval_s)

    def sample_once(self) -> TelemetrySnapshot:
        nvml = self._nvml()
        if self._reader is None or self._reader.nvml is not nvml:
            self._reader = UsageReader(nvml)
        sample = self._reader.sample(self._inventory())
        self.idle.observe(sample)
        pids = {p.pid for d in sample.devices for p in d.processes}
        containers: dict[int, ContainerRef | None] = {}
        unreadable = 0
        for pid in pids:
            ref = read_container(self.proc_root, pid)
            if ref is None and not (self.proc_root / str(pid)).exists():
                unreadable += 1  # not in our PID namespace: the cgroup cannot be read
                continue
            containers[pid] = ref
        if unreadable:
            log.debug("%d GPU processes not visible under %s", unreadable, self.proc_root)
        device_pods = read_device_pods(self.plugin_dir) if pids else {}
        snapshot = TelemetrySnapshot(sample, containers, device_pods)
        self.latest = snapshot
        if self.on_sample is not None:
            self.on_sample(snapshot)
        return snapshot

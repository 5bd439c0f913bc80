"""The GPU telemetry series of /metrics, formatted at scrape time from the sampler's last snapshot.

dcgm-exporter's names, help texts and labels (its default counters, checked against its
default-counters.csv and its exposition template: `gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`, then
`GPU_I_PROFILE` and `GPU_I_ID` for a MIG device, `Hostname`, and `container`, `namespace`, `pod` of the
holder), so dashboards and alerts written for dcgm-exporter read these unchanged. As dcgm-exporter, a MIG
device's series carry its parent's `gpu`, `UUID` and `device`, and a device held by several containers
(time-slicing, MPS) has one series per holder, each with the device's values.

kubegpu's own: what each container's processes use on each device (`kubegpu_container_gpu_*`, with the
device's own `UUID`: a MIG device's, as `kubegpu_pod_device_info`), processes no holder owns
(`kubegpu_gpu_unattributed_processes`) and how long each holder has held its device without using it
(`kubegpu_device_idle_seconds`).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from kubegpu.node.inventory import Inventory
from kubegpu.node.nvml.backend import NvmlApi
from kubegpu.node.usage import DeviceUse
from kubegpu.plugin.metrics import PluginMetrics
from kubegpu.plugin.telemetry import Telemetry, TelemetrySnapshot
from kubegpu.plugin.usage_attribution import Holder, attribute
from kubegpu.settings.plugin import PluginSettings

MIB = 1024 * 1024

# (name, help, value) of dcgm-exporter's default counters that NVML can give.
DCGM_GAUGES: tuple[tuple[str, str, Callable[[DeviceUse], float | None]], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda d: d.sm_clock_mhz),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda d: d.temperature_c),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda d: d.power_w),
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda d: d.utilization),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", lambda d: d.memory_util),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", lambda d: d.fb_free_mib),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda d: d.fb_used_mib),
)
XID_NAME = "DCGM_FI_DEV_XID_ERRORS"
XID_HELP = "Value of the last XID error encountered."
NO_HOLDER = ("", "", "")  # container, namespace, pod


def dcgm_labels(device: DeviceUse, hostname: str) -> dict[str, str]:
    gpu = device.gpu
    labels = {
        "gpu": str(gpu.index),
        "UUID": gpu.uuid,
        "pci_bus_id": gpu.pci_bus_id,
        "device": f"nvidia{gpu.minor}",
        "modelName": gpu.name,
    }
    if device.mig is not None:
        labels["GPU_I_PROFILE"] = device.mig.profile
        labels["GPU_I_ID"] = str(device.mig.gi)
    labels["Hostname"] = hostname
    return labels


class TelemetryCollector:
    """A prometheus_client collector over `Telemetry.latest`; `holders` and `last_xid` come from
    PluginMetrics (PodResources as of the last scrape, the last XID per GPU UUID)."""

    def __init__(
        self,
        telemetry: Telemetry,
        *,
        holders: Callable[[], Iterable[Holder]],
        last_xid: Callable[[], Mapping[str, int]],
        hostname: str,
    ) -> None:
        self.telemetry = telemetry
        self.holders = holders
        self.last_xid = last_xid
        self.hostname = hostname

    def describe(self) -> Iterable[Metric]:
        return ()

    def collect(self) -> Iterator[Metric]:
        snapshot = self.telemetry.latest
        if snapshot is None:
            return
        holders = list(self.holders())
        devices = snapshot.sample.devices
        by_uuid: dict[str, list[Holder]] = {}
        for h in holders:
            by_uuid.setdefault(h.uuid, []).append(h)
        yield from self._dcgm(devices, by_uuid)
        yield from self._containers(devices, holders, snapshot)
        yield from self._idle(devices, by_uuid)
        yield self._nvlinks(snapshot.sample.nvlinks)

    def _holder_labels(
        self, device: DeviceUse, by_uuid: Mapping[str, list[Holder]]
    ) -> list[tuple[str, str, str]]:
        found = sorted({(h.container, h.namespace, h.pod) for h in by_uuid.get(device.uuid, ())})
        return found or [NO_HOLDER]

    def _dcgm(self, devices: Iterable[DeviceUse], by_uuid: Mapping[str, list[Holder]]) -> Iterator[Metric]:
        families = [(Metric(name, help_, "gauge"), value) for name, help_, value in DCGM_GAUGES]
        xid = Metric(XID_NAME, XID_HELP, "gauge")
        last_xid = self.last_xid()
        for device in devices:
            base = dcgm_labels(device, self.hostname)
            for container, namespace, pod in self._holder_labels(device, by_uuid):
                labels = {**base, "container": container, "namespace": namespace, "pod": pod}
                for family, value in families:
                    got = value(device)
                    if got is not None:
                        family.add_sample(family.name, labels, got)
                xid.add_sample(XID_NAME, labels, float(last_xid.get(device.gpu.uuid, 0)))
        for family, _ in families:
            yield family
        yield xid

    def _containers(
        self, devices: Iterable[DeviceUse], holders: Iterable[Holder], snapshot: TelemetrySnapshot
    ) -> Iterator[Metric]:
        memory = Metric(
            "kubegpu_container_gpu_memory_used_bytes",
            "GPU memory used by the container's processes on the device (NVML's running processes); "
            "empty pod, namespace and container: processes no holder of the device owns.",
            "gauge",
        )
        util = Metric(
            "kubegpu_container_gpu_utilization_ratio",
            "Share of the device's SMs the container's processes used in the last sample (0-1), from NVML's "
            "per-process utilisation; absent where NVML keeps none (MIG devices).",
            "gauge",
        )
        unattributed = Metric(
            "kubegpu_gpu_unattributed_processes",
            "Compute processes on the device that belong to no container holding it (or whose container "
            "cannot be told: no host /proc, several holders).",
            "gauge",
        )
        for result in attribute(devices, holders, snapshot.containers, snapshot.device_pods):
            device = result.device
            where = {"gpu": str(device.gpu.index), "UUID": device.uuid}
            for owner, use in sorted(result.owners.items()):
                labels = {
                    "pod": owner.pod,
                    "namespace": owner.namespace,
                    "container": owner.container,
                    **where,
                }
                memory.add_sample(memory.name, labels, float(use.used_bytes))
                if use.sm_util is not None:
                    util.add_sample(util.name, labels, min(use.sm_util, 100) / 100)
            stray = result.unattributed
            unattributed.add_sample(unattributed.name, where, float(stray.processes))
            if stray.processes:
                labels = {"pod": "", "namespace": "", "container": "", **where}
                memory.add_sample(memory.name, labels, float(stray.used_bytes))
        yield memory
        yield util
        yield unattributed

    def _nvlinks(self, pairs: Iterable[tuple[str, str, int]]) -> Metric:
        links = Metric(
            "kubegpu_gpu_nvlink_lanes",
            "NVLink lanes between two GPUs of this node (each pair once), for the NVLink groups "
            "`kubegpu top` finds split by allocations.",
            "gauge",
        )
        for a, b, lanes in pairs:
            links.add_sample(links.name, {"UUID": a, "peer_UUID": b}, float(lanes))
        return links

    def _idle(self, devices: Iterable[DeviceUse], by_uuid: Mapping[str, list[Holder]]) -> Iterator[Metric]:
        idle = Metric(
            "kubegpu_device_idle_seconds",
            "Seconds since the held device was last busy (utilisation above --idle-threshold; on a MIG "
            "device: any compute process), or since the container took it if later.",
            "gauge",
        )
        sampled = {d.uuid: d for d in devices}
        keys = sorted(
            {
                (h.namespace, h.pod, h.container, h.uuid)
                for uuid, hs in by_uuid.items()
                if uuid in sampled
                for h in hs
            }
        )
        for (namespace, pod, container, uuid), seconds in self.telemetry.idle.idle_seconds(keys).items():
            device = sampled[uuid]
            labels = {
                "pod": pod,
                "namespace": namespace,
                "container": container,
                "gpu": str(device.gpu.index),
                "UUID": uuid,
            }
            idle.add_sample(idle.name, labels, seconds)
        yield idle


def install_telemetry(
    metrics: PluginMetrics,
    settings: PluginSettings,
    nvml: Callable[[], NvmlApi],
    inventory: Callable[[], Inventory],
    plugin_dir: Path,
) -> Telemetry | None:
    """The sampler, its series registered in `metrics`; None when --metrics-interval is 0."""
    if settings.metrics_interval_s <= 0:
        return None
    telemetry = Telemetry(
        nvml,
        inventory,
        interval_s=settings.metrics_interval_s,
        idle_threshold_percent=settings.idle_threshold_percent,
        proc_root=settings.proc_root,
        plugin_dir=plugin_dir,
    )
    collector = TelemetryCollector(
        telemetry,
        holders=lambda: [_holder(row) for row in metrics.holders()],
        last_xid=lambda: dict(metrics.last_xid),
        hostname=settings.node_name or socket.gethostname(),
    )
    exposition = Exposition(collector)
    telemetry.on_sample = exposition.update
    telemetry.before_sample = metrics.refresh_pod_resources
    metrics.appendix = exposition.text
    return telemetry


class Exposition:
    """The telemetry families formatted in the sampler thread, in both formats, for the next scrapes.

    Formatting a node's few hundred series takes milliseconds of Python; done at scrape time on the
    daemon's one event loop it would hold up the Allocate calls that arrive meanwhile. The holders are
    PodResources' as read just before the sample, so a new holder shows from the next sample on."""

    def __init__(self, collector: TelemetryCollector) -> None:
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(collector)
        self._formatted = (b"", b"")  # (text, OpenMetrics without its end marker); replaced whole

    def update(self, _snapshot: TelemetrySnapshot) -> None:
        text = generate_latest(self._registry)
        openmetrics = openmetrics_latest(self._registry).removesuffix(b"# EOF\n")
        self._formatted = (text, openmetrics)

    def text(self, openmetrics: bool) -> bytes:
        return self._formatted[1 if openmetrics else 0]


def _holder(row: tuple[str, str, str, str, str, str]) -> Holder:
    container, device_id, namespace, pod, resource, uuid = row
    return Holder(namespace, pod, container, resource, device_id, uuid)

"""The plugin's Prometheus metrics, in a registry of their own.

The daemon reports what happens (`update_resources`, `allocated`, `allocation_failed`, `registered`, `xid`,
`xid_ignored`, `ecc_event`, `config_reload`, `task_restarted`);
what is a state rather than an event is read when Prometheus scrapes: device counts and health from the last
resources snapshot, registration from the daemon's `RegistrationSource`, and which pod and container hold
which device from the kubelet's PodResources API. `render()` fetches PodResources first (async, with a
short deadline, on the daemon's loop) and then formats; a PodResources failure becomes
`kubegpu_pod_resources_up 0` and a count by reason, never a failed scrape.

Labels stay bounded: resource names, device IDs of this node, XID codes, GPU UUIDs, and the node's pods.
`uuid` is the GPU (or MIG device) a device lives on, so these series join DCGM-exporter's `UUID` label.
"""

from __future__ import annotations

import logging
import platform
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Protocol

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from kubegpu import __version__
from kubegpu.allocation.device_ids import backing_id
from kubegpu.allocation.resources import Resource
from kubegpu.api.podresources.v1 import api_pb2
from kubegpu.plugin.podresources_client import (
    UNEXPECTED,
    PodResourcesClient,
    PodResourcesError,
    device_holders,
)
from kubegpu.plugin.registrar import KubeletId, Registration

log = logging.getLogger(__name__)

PREFIX = "kubegpu"
# Re-registration after a kubelet restart takes milliseconds when all is well; the kubelet may spend up to
# 10 s dialing back, and the registrar backs off up to 5 s between failures.
REREGISTRATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
POD_RESOURCES_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
UNKNOWN_GPU = "unknown"
OPENMETRICS_EOF = b"# EOF\n"


class RegistrationSource(Protocol):
    """What the metrics and the health endpoints read from the daemon, at scrape or probe time."""

    def expected_resources(self) -> Sequence[str] | None:
        """Resources that should be registered now; None while the first discovery is still running, ()
        when there is nothing to register (no devices, or registration switched off)."""
        ...

    def registration(self, resource: str) -> Registration | None:
        """The registrar's record for `resource` (Registrar.state.get(resource))."""
        ...

    def current_kubelet(self) -> KubeletId | None:
        """The identity of the kubelet serving kubelet.sock now (registrar.kubelet_identity); None: none."""
        ...


def is_registered(source: RegistrationSource, resource: str, kubelet: KubeletId | None) -> bool:
    """Registered with the kubelet running now: a record of an earlier kubelet does not count."""
    reg = source.registration(resource)
    return kubelet is not None and reg is not None and reg.registered_with == kubelet


class _Callback:
    """A collector that calls `collect` at scrape time."""

    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self.collect = collect

    def describe(self) -> Iterable[Metric]:
        return ()  # the registry does not check names; these are ours alone


def _escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class PodDeviceInfo:
    """kubegpu_pod_device_info: which pod and container hold which of our devices.

    On a big node these are most of the series, and prometheus_client takes ~4 ms to format 384 of them:
    for every sample it validates and escapes each label name, which for our six fixed names is wasted.
    So this family is formatted here, byte for byte as prometheus_client formats it in both the text and
    the OpenMetrics format (tests/test_metrics.py holds us to that), in ~0.6 ms; and only when the kubelet's
    answer or our resources changed since the last scrape, which is seldom."""

    NAME = f"{PREFIX}_pod_device_info"
    HELP = "Which pod and container hold which device (value 1), from the kubelet's PodResources API."
    LABELS = ("container", "device_id", "namespace", "pod", "resource", "uuid")  # sorted, as the library

    def __init__(self) -> None:
        self._answer: api_pb2.ListPodResourcesResponse | None = None  # what `text` was built from
        self.rows: list[tuple[str, str, str, str, str, str]] = []
        self.text = self._format([])

    def clear(self) -> None:
        self._answer = None
        self.rows = []
        self.text = self._format([])

    def forget_answer(self) -> None:
        """Our resources changed: rebuild from the next answer even if it is the same."""
        self._answer = None

    def update(
        self, answer: api_pb2.ListPodResourcesResponse, served: Mapping[str, Mapping[str, str]]
    ) -> None:
        """`served`: resource -> device id -> GPU/MIG UUID, for each resource we serve; other plugins'
        resources are left out. A device we no longer list (a reload changed the replicas) is still held:
        it stays, with the UUID read from its ID."""
        if self._answer is not None and answer == self._answer:
            return
        rows: list[tuple[str, str, str, str, str, str]] = []
        for h in device_holders(answer):
            uuids = served.get(h.resource)
            if uuids is not None:
                uuid = uuids.get(h.device_id) or backing_id(h.device_id)
                rows.append((h.container, h.device_id, h.namespace, h.pod, h.resource, uuid))
        self._answer = answer
        self.rows = rows
        self.text = self._format(rows)

    @classmethod
    def _format(cls, rows: Iterable[tuple[str, str, str, str, str, str]]) -> bytes:
        e = _escape_label_value
        lines = [f"# HELP {cls.NAME} {cls.HELP}\n# TYPE {cls.NAME} gauge\n"]
        for container, device_id, namespace, pod, resource, uuid in rows:  # LABELS, in this order
            lines.append(
                f'{cls.NAME}{{container="{e(container)}",device_id="{e(device_id)}",'
                f'namespace="{e(namespace)}",pod="{e(pod)}",resource="{e(resource)}",uuid="{e(uuid)}"}} 1.0\n'
            )
        return "".join(lines).encode()


class _Declare:
    """Declares the plugin's event metrics in one registry, each named kubegpu_<name>."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def build_info(self, version: str) -> None:
        Info(f"{PREFIX}_build", "kubegpu build and runtime versions.", registry=self.registry).info(
            {
                "version": version,
                "python_version": platform.python_version(),
                "grpc_version": grpc.__version__,
            }
        )

    def counter(self, name: str, documentation: str, *labels: str) -> Counter:
        return Counter(f"{PREFIX}_{name}", documentation, labels, registry=self.registry)

    def gauge(self, name: str, documentation: str, *labels: str) -> Gauge:
        return Gauge(f"{PREFIX}_{name}", documentation, labels, registry=self.registry)

    def histogram(self, name: str, documentation: str, buckets: Sequence[float], *labels: str) -> Histogram:
        return Histogram(f"{PREFIX}_{name}", documentation, labels, buckets=buckets, registry=self.registry)


class PluginMetrics:
    def __init__(
        self,
        *,
        status: RegistrationSource | None = None,
        pod_resources: PodResourcesClient | None = None,
        version: str = __version__,
        process_metrics: bool = True,
        tasks: Callable[[], Mapping[str, bool]] | None = None,
    ) -> None:
        self.status = status
        self.pod_resources = pod_resources
        self.tasks = tasks  # supervised background tasks by name: True while running
        self.registry = r = CollectorRegistry()
        declare = _Declare(r)
        declare.build_info(version)
        self._allocations = declare.counter(
            "allocations", "Container allocations served (one per container request).", "resource"
        )
        self._allocated_devices = declare.counter(
            "allocated_devices", "Devices handed out by Allocate.", "resource"
        )
        self._allocation_errors = declare.counter(
            "allocation_errors", "Allocate or GetPreferredAllocation requests refused.", "resource", "rpc"
        )
        self._rpc_refusals = declare.counter(
            "rpc_refusals",
            "Calls refused before they ran, by resource, method and reason: busy (the socket's limit of "
            "calls or ListAndWatch streams at once was reached).",
            "resource",
            "rpc",
            "reason",
        )
        self._registrations = declare.counter(
            "registrations", "Successful registrations with the kubelet.", "resource"
        )
        self._reregistrations = declare.counter(
            "reregistrations", "Registrations after the first one (kubelet restarts, reloads).", "resource"
        )
        self._reregistration_latency = declare.histogram(
            "reregistration_latency_seconds",
            "From the event that required registering again (e.g. a new kubelet.sock) to registered.",
            REREGISTRATION_BUCKETS,
            "resource",
        )
        self._xids = declare.counter("xid_errors", "XID events by code and GPU.", "xid", "uuid")
        self._xids_ignored = declare.counter(
            "xid_ignored",
            "XID events not acted on (application faults, ignored by DP_DISABLE_HEALTHCHECKS or the XID "
            "catalog, or on a GPU this plugin does not manage), by code.",
            "xid",
        )
        self._ecc_events = declare.counter(
            "ecc_events", "NVML ECC error events by type (counted only, as NVIDIA acts on XIDs).", "type"
        )
        self._config_reloads = declare.counter(
            "config_reloads",
            "Config reloads (SIGHUP or a changed config file), by result: applied or failed (the last good "
            "config kept serving).",
            "result",
        )
        self._config_reload_failures = declare.counter(
            "config_reload_failures",
            "Failed config reloads by reason: invalid_config, timeout (parsing over its time budget), "
            "discovery, resources (the config does not build on this node's devices), cdi (spec files "
            "not writable), error (unexpected).",
            "reason",
        )
        self._config_last_reload_ok = declare.gauge(
            "config_last_reload_successful", "1 when the last config reload was applied (or none was tried)."
        )
        self._config_last_reload_ok.set(1)
        for result in ("applied", "failed"):
            self._config_reloads.labels(result)
        self._task_restarts = declare.counter(
            "task_restarts", "Restarts of a background task after it failed, by task.", "task"
        )
        self._transitions = declare.counter(
            "health_transitions",
            "Devices that changed health, by the health they changed to.",
            "resource",
            "direction",
        )
        self._pod_resources_errors = declare.counter(
            "pod_resources_errors", "Failed reads of the kubelet's PodResources API, by reason.", "reason"
        )
        self._pod_resources_latency = declare.histogram(
            "pod_resources_list_duration_seconds",
            "Time taken by the kubelet's PodResources List.",
            POD_RESOURCES_BUCKETS,
        )
        if process_metrics:
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
        r.register(_Callback(self._collect_state))
        self._resources: tuple[Resource, ...] = ()
        self._health: dict[str, dict[str, bool]] = {}  # resource -> device id -> healthy
        self._uuids: dict[str, dict[str, str]] = {}  # resource -> device id -> GPU/MIG UUID
        self._registered_once: set[str] = set()
        self._pod_devices = PodDeviceInfo()
        self._pod_resources_read = False  # the last attempt succeeded
        self._pod_resources_error: PodResourcesError | None = None  # the last failure, until a success
        self.last_xid: dict[str, int] = {}  # GPU UUID -> the last XID seen (DCGM_FI_DEV_XID_ERRORS)
        # Families formatted elsewhere (the GPU telemetry, off the event loop): (openmetrics) -> bytes.
        self.appendix: Callable[[bool], bytes] | None = None

    # --- what the daemon reports ----------------------------------------------------------------------

    def update_resources(self, resources: Iterable[Resource]) -> None:
        """The resources now served (after every build_resources: start, health change, reload). Device
        health flips against the previous snapshot are counted as transitions."""
        self._resources = tuple(resources)
        self._uuids = {r.name: {d.id: d.uuid for d in r.devices} for r in self._resources}
        self._pod_devices.forget_answer()
        health = {r.name: {d.id: d.health.healthy for d in r.devices} for r in self._resources}
        for name, devices in health.items():
            for direction in ("healthy", "unhealthy"):
                self._transitions.labels(name, direction)  # a zero series from the start, for rate()
            self._allocations.labels(name)
            self._allocated_devices.labels(name)
            before = self._health.get(name, {})
            for device_id, healthy in devices.items():
                was = before.get(device_id)
                if was is not None and was != healthy:
                    self._transitions.labels(name, "healthy" if healthy else "unhealthy").inc()
        self._health = health

    def allocated(self, resource: str, devices: int) -> None:
        """One container request served by Allocate (called by ResourceServer)."""
        self._allocations.labels(resource).inc()
        self._allocated_devices.labels(resource).inc(devices)

    def allocation_failed(self, resource: str, rpc: str = "Allocate") -> None:
        """A refused request; `rpc` is "Allocate" or "GetPreferredAllocation"."""
        self._allocation_errors.labels(resource, rpc).inc()

    def rpc_refused(self, resource: str, rpc: str, reason: str) -> None:
        """A call refused by the socket's admission limits (called by ResourceServer)."""
        self._rpc_refusals.labels(resource, rpc, reason).inc()

    def registered(self, resource: str, latency_s: float) -> None:
        """A successful registration; same signature as Registrar's `on_registered`."""
        self._registrations.labels(resource).inc()
        if resource in self._registered_once:
            self._reregistrations.labels(resource).inc()
            self._reregistration_latency.labels(resource).observe(latency_s)
        self._registered_once.add(resource)

    def xid(self, code: int, gpu_uuid: str | None) -> None:
        """An XID event from NVML; `gpu_uuid` None when NVML could not say which GPU."""
        self._xids.labels(str(code), gpu_uuid or UNKNOWN_GPU).inc()
        if gpu_uuid:
            self.last_xid[gpu_uuid] = code

    def xid_ignored(self, code: int) -> None:
        """An XID event that is not acted on (the health monitor logs only the first of a storm)."""
        self._xids_ignored.labels(str(code)).inc()

    def ecc_event(self, kind: str) -> None:
        """An NVML ECC event: "single_bit" or "double_bit"."""
        self._ecc_events.labels(kind).inc()

    def config_reload(self, failure: str | None = None) -> None:
        """A config reload ended: applied (`failure` None) or failed for the reason given."""
        self._config_reloads.labels("applied" if failure is None else "failed").inc()
        if failure is not None:
            self._config_reload_failures.labels(failure).inc()
        self._config_last_reload_ok.set(1 if failure is None else 0)

    def task_restarted(self, name: str) -> None:
        """A supervised background task failed and was started again."""
        self._task_restarts.labels(name).inc()

    def holders(self) -> list[tuple[str, str, str, str, str, str]]:
        """Who holds our devices as PodResources last said: (container, device_id, namespace, pod, resource,
        uuid) rows of kubegpu_pod_device_info; none while PodResources cannot be read."""
        return self._pod_devices.rows

    # --- scraping -------------------------------------------------------------------------------------

    async def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """The exposition for one scrape and its content type (OpenMetrics when `accept` asks for it).

        `self.registry` holds every series but kubegpu_pod_device_info, which this adds (see
        PodDeviceInfo); call this rather than formatting the registry."""
        if self.pod_resources is not None:
            await self._refresh_pod_resources(self.pod_resources)
        encoder, content_type = choose_encoder(accept or "")
        body = encoder(self.registry)
        openmetrics = body.endswith(OPENMETRICS_EOF)
        extra = self.appendix(openmetrics) if self.appendix is not None else b""
        if self.pod_resources is None and not extra:
            return body, content_type
        pods = self._pod_devices.text if self.pod_resources is not None else b""
        if openmetrics:  # every family comes before the end marker
            return body[: -len(OPENMETRICS_EOF)] + pods + extra + OPENMETRICS_EOF, content_type
        return body + pods + extra, content_type

    async def refresh_pod_resources(self) -> None:
        """Read PodResources now (the GPU telemetry does before each sample, so its holders are fresh
        without a scrape); a failure is counted as at a scrape."""
        if self.pod_resources is not None:
            await self._refresh_pod_resources(self.pod_resources)

    async def _refresh_pod_resources(self, client: PodResourcesClient) -> None:
        started = time.perf_counter()
        try:
            response = await client.list()
        except PodResourcesError as err:
            self._pod_resources_failed(err)
            return
        except Exception as err:  # a scrape must not fail because the kubelet said something odd
            log.exception("reading PodResources failed unexpectedly")
            self._pod_resources_failed(PodResourcesError(UNEXPECTED, f"unexpected error: {err!r}"))
            return
        self._pod_resources_latency.observe(time.perf_counter() - started)
        if self._pod_resources_error is not None:
            log.info("the PodResources API on %s answers again", client.socket)
            self._pod_resources_error = None
        self._pod_resources_read = True
        self._pod_devices.update(response, self._uuids)

    def _pod_resources_failed(self, err: PodResourcesError) -> None:
        self._pod_resources_errors.labels(err.reason).inc()
        if self._pod_resources_error is None or self._pod_resources_error.reason != err.reason:
            log.warning("cannot tell which pods hold which GPUs: %s", err)  # once per kind of failure
        self._pod_resources_error = err
        self._pod_resources_read = False
        self._pod_devices.clear()  # stale holders would be wrong; no series is honest

    def _collect_state(self) -> Iterator[Metric]:
        yield from self._device_families()
        if self.status is not None:
            yield from self._registration_families(self.status)
        if self.pod_resources is not None:
            yield from self._pod_families()
        if self.tasks is not None:
            yield from self._task_families(self.tasks())

    def _device_families(self) -> Iterator[Metric]:
        counts = GaugeMetricFamily(
            f"{PREFIX}_devices", "Devices served, by resource and health.", labels=["resource", "health"]
        )
        # Per GPU or MIG device, not per device ID: replicas share their GPU's health, and 48 identical
        # series per GPU would only slow the scrape down.
        healthy = GaugeMetricFamily(
            f"{PREFIX}_device_healthy",
            "1 while the GPU or MIG device is reported Healthy to the kubelet, else 0.",
            labels=["resource", "uuid"],
        )
        for r in self._resources:
            up = r.healthy_count
            counts.add_metric([r.name, "healthy"], up)
            counts.add_metric([r.name, "unhealthy"], len(r.devices) - up)
            by_uuid: dict[str, bool] = {}
            for d in r.devices:
                by_uuid[d.uuid] = by_uuid.get(d.uuid, True) and d.health.healthy
            for uuid, ok in by_uuid.items():
                healthy.add_metric([r.name, uuid], 1 if ok else 0)
        yield counts
        yield healthy

    def _registration_families(self, status: RegistrationSource) -> Iterator[Metric]:
        registered = GaugeMetricFamily(
            f"{PREFIX}_registered",
            "1 while the resource is registered with the kubelet running now, else 0.",
            labels=["resource"],
        )
        failures = CounterMetricFamily(
            f"{PREFIX}_registration_failures",
            "Failed registration attempts since the resource was last (re)configured.",
            labels=["resource"],
        )
        kubelet = status.current_kubelet()
        for resource in status.expected_resources() or ():
            registered.add_metric([resource], 1 if is_registered(status, resource, kubelet) else 0)
            reg = status.registration(resource)
            failures.add_metric([resource], reg.failures if reg is not None else 0)
        yield registered
        yield failures

    def _pod_families(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            f"{PREFIX}_pod_resources_up",
            "1 when this scrape read the kubelet's PodResources API, 0 when it could not.",
        )
        up.add_metric([], 1 if self._pod_resources_read else 0)
        yield up

    def _task_families(self, tasks: Mapping[str, bool]) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            f"{PREFIX}_task_up",
            "1 while the background task runs, 0 while it is down after a failure (/healthz fails then).",
            labels=["task"],
        )
        for name, running in tasks.items():
            up.add_metric([name], 1 if running else 0)
        yield up

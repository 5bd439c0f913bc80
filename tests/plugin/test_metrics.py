"""PluginMetrics: event counters, state read at scrape time, and PodResources that never fail a scrape."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from kubegpu import __version__
from kubegpu.allocation.resources import Device, Resource
from kubegpu.api.podresources.v1 import api_pb2
from kubegpu.node.inventory import Health
from kubegpu.plugin.metrics import PluginMetrics, PodDeviceInfo
from kubegpu.plugin.podresources_client import PodResourcesError, device_holders
from kubegpu.plugin.registrar import KubeletId, Registration
from tests.builders import gpu_uuid

GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"
UUID0, UUID1 = gpu_uuid(0), gpu_uuid(1)
XID79 = Health.failed("GPU has fallen off the bus", 79)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def replicas(name: str, sick: frozenset[int] = frozenset(), per_gpu: int = 3) -> Resource:
    """2 GPUs shared `per_gpu` ways, replica IDs `<uuid>::<r>`; GPUs in `sick` unhealthy."""
    return Resource(
        name,
        tuple(
            Device(
                f"{uuid}::{r}", uuid, str(g), g, XID79 if g in sick else Health.ok(), 0, (f"/dev/nvidia{g}",)
            )
            for g, uuid in enumerate((UUID0, UUID1))
            for r in range(per_gpu)
        ),
    )


async def scrape(metrics: PluginMetrics) -> Samples:
    body, content_type = await metrics.render()
    assert content_type.startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in samples, f"duplicate series {key}"
            samples[key] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def named(samples: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


async def test_build_info_and_process_metrics() -> None:
    samples = await scrape(PluginMetrics())
    (labels,) = named(samples, "kubegpu_build_info")
    assert dict(labels)["version"] == __version__ and "python_version" in dict(labels)
    assert value(samples, "process_resident_memory_bytes") is not None
    assert named(await scrape(PluginMetrics(process_metrics=False)), "process_resident_memory_bytes") == {}


async def test_device_counts_and_health_per_gpu_not_per_replica() -> None:
    metrics = PluginMetrics()
    metrics.update_resources([replicas(SHARED, sick=frozenset({1}))])
    samples = await scrape(metrics)
    assert value(samples, "kubegpu_devices", resource=SHARED, health="healthy") == 3
    assert value(samples, "kubegpu_devices", resource=SHARED, health="unhealthy") == 3
    assert named(samples, "kubegpu_device_healthy") == {
        frozenset({("resource", SHARED), ("uuid", UUID0)}): 1,
        frozenset({("resource", SHARED), ("uuid", UUID1)}): 0,
    }


async def test_a_reload_that_drops_a_resource_drops_its_series() -> None:
    metrics = PluginMetrics()
    metrics.update_resources([replicas(SHARED)])
    metrics.update_resources([replicas(GPU, per_gpu=1)])
    samples = await scrape(metrics)
    assert value(samples, "kubegpu_devices", resource=SHARED, health="healthy") is None
    assert value(samples, "kubegpu_devices", resource=GPU, health="healthy") == 2


async def test_health_transitions_are_counted_against_the_previous_snapshot() -> None:
    metrics = PluginMetrics()
    metrics.update_resources([replicas(SHARED, sick=frozenset({1}))])  # the first snapshot: no transition
    samples = await scrape(metrics)
    assert value(samples, "kubegpu_health_transitions_total", resource=SHARED, direction="unhealthy") == 0
    assert value(samples, "kubegpu_health_transitions_total", resource=SHARED, direction="healthy") == 0
    metrics.update_resources([replicas(SHARED, sick=frozenset({0}))])  # GPU 0 breaks, GPU 1 recovers
    metrics.update_resources([replicas(SHARED, sick=frozenset({0}))])  # no change: nothing counted
    samples = await scrape(metrics)
    assert value(samples, "kubegpu_health_transitions_total", resource=SHARED, direction="unhealthy") == 3
    assert value(samples, "kubegpu_health_transitions_total", resource=SHARED, direction="healthy") == 3


async def test_allocations_and_refusals_by_resource() -> None:
    metrics = PluginMetrics()
    metrics.update_resources([replicas(GPU, per_gpu=1)])
    samples = await scrape(metrics)
    assert value(samples, "kubegpu_allocations_total", resource=GPU) == 0  # present before the first one
    metrics.allocated(GPU, 2)
    metrics.allocated(GPU, 1)
    metrics.allocation_failed(GPU)
    metrics.allocation_failed(GPU, "GetPreferredAllocation")
    samples = await scrape(metrics)
    assert value(samples, "kubegpu_allocations_total", resource=GPU) == 2
    assert value(samples, "kubegpu_allocated_devices_total", resource=GPU) == 3
    assert value(samples, "kubegpu_allocation_errors_total", resource=GPU, rpc="Allocate") == 1
    assert value(samples, "kubegpu_allocation_errors_total", resource=GPU, rpc="GetPreferredAllocation") == 1
    metrics.rpc_refused(GPU, "ListAndWatch", "busy")
    samples = await scrape(metrics)
    assert value(samples, "kubegpu_rpc_refusals_total", resource=GPU, rpc="ListAndWatch", reason="busy") == 1


async def test_the_first_registration_is_not_a_reregistration() -> None:
    metrics = PluginMetrics()
    metrics.registered(GPU, 0.8)  # cold start: not a re-registration
    metrics.registered(GPU, 0.03)
    metrics.registered(GPU, 0.2)
    samples = await scrape(metrics)
    assert value(samples, "kubegpu_registrations_total", resource=GPU) == 3
    assert value(samples, "kubegpu_reregistrations_total", resource=GPU) == 2
    assert value(samples, "kubegpu_reregistration_latency_seconds_count", resource=GPU) == 2
    assert value(samples, "kubegpu_reregistration_latency_seconds_sum", resource=GPU) == pytest.approx(0.23)
    assert value(samples, "kubegpu_reregistration_latency_seconds_bucket", resource=GPU, le="0.05") == 1


async def test_xids_by_code_and_gpu() -> None:
    metrics = PluginMetrics()
    metrics.xid(79, UUID0)
    metrics.xid(79, UUID0)
    metrics.xid(48, UUID1)
    metrics.xid(13, None)
    samples = await scrape(metrics)
    assert value(samples, "kubegpu_xid_errors_total", xid="79", uuid=UUID0) == 2
    assert value(samples, "kubegpu_xid_errors_total", xid="48", uuid=UUID1) == 1
    assert value(samples, "kubegpu_xid_errors_total", xid="13", uuid="unknown") == 1


async def test_ignored_xids_by_code_and_ecc_events_by_type() -> None:
    metrics = PluginMetrics()
    for _ in range(3):
        metrics.xid_ignored(13)
    metrics.xid_ignored(31)
    metrics.ecc_event("single_bit")
    samples = await scrape(metrics)
    assert named(samples, "kubegpu_xid_ignored_total") == {
        frozenset({("xid", "13")}): 3,
        frozenset({("xid", "31")}): 1,
    }
    assert value(samples, "kubegpu_ecc_events_total", type="single_bit") == 1


async def test_config_reloads_by_result_and_failures_by_reason() -> None:
    metrics = PluginMetrics()
    samples = await scrape(metrics)
    assert (
        value(samples, "kubegpu_config_reloads_total", result="applied") == 0
    )  # series exist from the start
    assert value(samples, "kubegpu_config_reloads_total", result="failed") == 0
    assert value(samples, "kubegpu_config_last_reload_successful") == 1
    metrics.config_reload("cdi")
    samples = await scrape(metrics)
    assert value(samples, "kubegpu_config_reloads_total", result="failed") == 1
    assert value(samples, "kubegpu_config_reload_failures_total", reason="cdi") == 1
    assert value(samples, "kubegpu_config_last_reload_successful") == 0
    metrics.config_reload(None)
    samples = await scrape(metrics)
    assert value(samples, "kubegpu_config_reloads_total", result="applied") == 1
    assert value(samples, "kubegpu_config_last_reload_successful") == 1


async def test_background_tasks_up_and_restarts() -> None:
    tasks = {"config-watch": True, "nvml-health": False}
    metrics = PluginMetrics(tasks=lambda: tasks)
    metrics.task_restarted("nvml-health")
    samples = await scrape(metrics)
    assert named(samples, "kubegpu_task_up") == {
        frozenset({("task", "config-watch")}): 1,
        frozenset({("task", "nvml-health")}): 0,
    }
    assert value(samples, "kubegpu_task_restarts_total", task="nvml-health") == 1


@dataclass
class FakeStatus:
    expected: Sequence[str] | None
    regs: dict[str, Registration] = field(default_factory=dict)
    kubelet: KubeletId | None = (1, 1)
    started_at: float = 0.0

    def expected_resources(self) -> Sequence[str] | None:
        return self.expected

    def registration(self, resource: str) -> Registration | None:
        return self.regs.get(resource)

    def current_kubelet(self) -> KubeletId | None:
        return self.kubelet


async def test_registration_state_is_read_from_the_daemon_at_scrape_time() -> None:
    status = FakeStatus(
        [GPU, SHARED],
        {GPU: Registration(registered_with=(1, 1)), SHARED: Registration(failures=4, last_error="x")},
    )
    metrics = PluginMetrics(status=status)
    samples = await scrape(metrics)
    assert value(samples, "kubegpu_registered", resource=GPU) == 1
    assert value(samples, "kubegpu_registered", resource=SHARED) == 0
    assert value(samples, "kubegpu_registration_failures_total", resource=SHARED) == 4
    status.kubelet = (2, 2)  # the kubelet restarted: the old registration no longer counts
    assert value(await scrape(metrics), "kubegpu_registered", resource=GPU) == 0
    status.expected = None  # discovery still running: nothing to report yet
    assert named(await scrape(metrics), "kubegpu_registered") == {}


class FakePodResources:
    """Stands in for PodResourcesClient: answers with `response` or raises `error`."""

    socket = "/fake/kubelet.sock"

    def __init__(self) -> None:
        self.response = api_pb2.ListPodResourcesResponse()
        self.error: Exception | None = None
        self.calls = 0

    async def list(self) -> api_pb2.ListPodResourcesResponse:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return self.response


def devices(resource: str, *ids: str, numa: int | None = None) -> api_pb2.ContainerDevices:
    topology = api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=numa)]) if numa is not None else None
    return api_pb2.ContainerDevices(resource_name=resource, device_ids=ids, topology=topology)


TRAIN = api_pb2.PodResources(
    name="train",
    namespace="ml",
    containers=[
        api_pb2.ContainerResources(
            name="main",
            devices=[
                devices(SHARED, f"{UUID0}::1", numa=0),
                devices(SHARED, f"{UUID0}::1", numa=1),  # one entry per NUMA node: one series
                devices(SHARED, f"{UUID1}::9"),  # not in our snapshot (any more): UUID from the ID
                devices("rdma/hca", "mlx5_0"),  # another plugin's: not ours to report
            ],
        ),
        api_pb2.ContainerResources(name="sidecar"),
    ],
)


def holder(container: str, device_id: str, uuid: str) -> frozenset[tuple[str, str]]:
    labels = {"namespace": "ml", "pod": "train", "container": container, "resource": SHARED}
    return frozenset({**labels, "device_id": device_id, "uuid": uuid}.items())


async def test_which_pod_holds_which_device() -> None:
    client = FakePodResources()
    client.response = api_pb2.ListPodResourcesResponse(pod_resources=[TRAIN])
    metrics = PluginMetrics(pod_resources=client)  # type: ignore[arg-type]
    metrics.update_resources([replicas(SHARED)])
    samples = await scrape(metrics)
    assert client.calls == 1  # read at scrape time
    assert value(samples, "kubegpu_pod_resources_up") == 1
    assert named(samples, "kubegpu_pod_device_info") == {
        holder("main", f"{UUID0}::1", UUID0): 1,
        holder("main", f"{UUID1}::9", UUID1): 1,
    }
    assert value(samples, "kubegpu_pod_resources_list_duration_seconds_count") == 1


async def test_pod_resources_failures_never_fail_the_scrape(caplog: pytest.LogCaptureFixture) -> None:
    client = FakePodResources()
    client.response = api_pb2.ListPodResourcesResponse(pod_resources=[TRAIN])
    metrics = PluginMetrics(pod_resources=client)  # type: ignore[arg-type]
    metrics.update_resources([replicas(SHARED)])
    assert named(await scrape(metrics), "kubegpu_pod_device_info")
    client.error = PodResourcesError("socket_missing", "the kubelet's PodResources socket /x does not exist")
    for _ in range(3):
        samples = await scrape(metrics)
    assert value(samples, "kubegpu_pod_resources_up") == 0
    assert value(samples, "kubegpu_pod_resources_errors_total", reason="socket_missing") == 3
    assert named(samples, "kubegpu_pod_device_info") == {}  # no stale holders
    warnings = [r for r in caplog.records if "cannot tell which pods hold which GPUs" in r.message]
    assert len(warnings) == 1  # logged once, not on every scrape
    client.error = ValueError("a malformed answer")
    samples = await scrape(metrics)
    assert value(samples, "kubegpu_pod_resources_errors_total", reason="unexpected") == 1
    client.error = None
    samples = await scrape(metrics)
    assert value(samples, "kubegpu_pod_resources_up") == 1
    assert len(named(samples, "kubegpu_pod_device_info")) == 2


async def test_openmetrics_when_asked() -> None:
    metrics = PluginMetrics()
    metrics.xid(79, UUID0)
    body, content_type = await metrics.render("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    text = body.decode()
    assert text.endswith("# EOF\n")
    assert f'kubegpu_xid_errors_total{{uuid="{UUID0}",xid="79"}} 1.0' in text


async def test_pod_device_info_follows_the_answer_and_our_resources() -> None:
    client = FakePodResources()
    client.response = api_pb2.ListPodResourcesResponse(pod_resources=[TRAIN])
    metrics = PluginMetrics(pod_resources=client)  # type: ignore[arg-type]
    assert named(await scrape(metrics), "kubegpu_pod_device_info") == {}  # nothing served yet: not ours
    metrics.update_resources([replicas(SHARED)])  # the same answer now names our devices
    assert len(named(await scrape(metrics), "kubegpu_pod_device_info")) == 2
    moved = api_pb2.ListPodResourcesResponse()
    moved.CopyFrom(client.response)
    moved.pod_resources[0].containers[0].devices[0].device_ids[0] = f"{UUID1}::2"
    moved.pod_resources[0].containers[0].devices[1].device_ids[0] = f"{UUID1}::2"
    client.response = moved
    assert named(await scrape(metrics), "kubegpu_pod_device_info") == {
        holder("main", f"{UUID1}::2", UUID1): 1,
        holder("main", f"{UUID1}::9", UUID1): 1,
    }
    client.response = api_pb2.ListPodResourcesResponse()
    assert named(await scrape(metrics), "kubegpu_pod_device_info") == {}


async def test_openmetrics_with_pod_devices_parses_strictly() -> None:
    client = FakePodResources()
    client.response = api_pb2.ListPodResourcesResponse(pod_resources=[TRAIN])
    metrics = PluginMetrics(pod_resources=client)  # type: ignore[arg-type]
    metrics.update_resources([replicas(SHARED)])
    for _ in range(2):  # formatted, then from the cache
        body, _ = await metrics.render("application/openmetrics-text; version=1.0.0")
        families = {f.name: f for f in openmetrics_families(body.decode())}
        assert len(families["kubegpu_pod_device_info"].samples) == 2
        assert families["kubegpu_pod_resources_up"].samples[0].value == 1
        text, _ = await metrics.render()
        assert text.count(b"# TYPE kubegpu_pod_device_info gauge") == 1


def test_pod_device_info_is_formatted_exactly_as_prometheus_client_formats_it() -> None:
    odd = ["a\\b", 'say "hi"', "two\nlines", "naïve-✓", ""]
    answer = api_pb2.ListPodResourcesResponse(
        pod_resources=[
            api_pb2.PodResources(
                name=text,
                namespace=odd[-1 - i],
                containers=[api_pb2.ContainerResources(name=text, devices=[devices(SHARED, f"{text}::{i}")])],
            )
            for i, text in enumerate(odd)
        ]
    )
    info = PodDeviceInfo()
    info.update(answer, {SHARED: {}})
    family = GaugeMetricFamily(
        PodDeviceInfo.NAME, PodDeviceInfo.HELP, labels=list(reversed(PodDeviceInfo.LABELS))
    )
    for h in device_holders(answer):
        family.add_metric(
            [h.device_id.split("::")[0], h.resource, h.pod, h.namespace, h.device_id, h.container], 1
        )
    registry = CollectorRegistry()
    registry.register(Family(family))
    assert info.text == generate_latest(registry)
    assert info.text + b"# EOF\n" == generate_openmetrics(registry)
    assert info.text.count(b"\n") == 2 + len(odd)


class Family:
    def __init__(self, family: GaugeMetricFamily) -> None:
        self.family = family

    def collect(self) -> list[GaugeMetricFamily]:
        return [self.family]

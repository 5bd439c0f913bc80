"""The reconcile plan, without sockets: every reload case the daemon meets, as data in and a plan out."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

from kubegpu.allocation.allocate import AllocateOptions
from kubegpu.allocation.resources import Resource, ResourceOptions, build_resources
from kubegpu.node.discovery import discover, nvml_session
from kubegpu.node.inventory import Health, Inventory, LinkLevel
from kubegpu.node.nvml.backend import load_nvml
from kubegpu.plugin.reconcile import (
    Carried,
    MonitorStep,
    Plan,
    Served,
    Step,
    carry_missing,
    plan,
    with_faults,
)
from kubegpu.settings.env import NvmlSelection
from kubegpu.settings.nvidia_sharing import ReplicatedResource, SharingStrategy
from tests.builders import gpu_uuid, make_inventory

GPU = "nvidia.com/gpu"
NODE = make_inventory(8, nvlinks={(4, 5): 12, (5, 6): 12}, level=LinkLevel.NODE)
UUIDS = [g.uuid for g in NODE.gpus]
XID_79 = Health.failed("XID 79 (GPU has fallen off the bus); action: reset_gpu", 79)
OPTIONS = AllocateOptions()
WHOLE_GPUS = ResourceOptions()
TIME_SLICED = ResourceOptions(
    sharing_kind="time-slicing", sharing=SharingStrategy(resources=[ReplicatedResource(name=GPU, replicas=2)])
)


def profile_inventory(profile: str) -> Inventory:
    backend = load_nvml(NvmlSelection.fake(profile))
    with nvml_session(backend.nvml):
        return discover(backend)


def serving(resources: Sequence[Resource], options: AllocateOptions = OPTIONS) -> list[Served]:
    return [Served(r, options) for r in resources]


def health_of(resource: Resource) -> dict[str, bool]:
    return {d.id: d.health.healthy for d in resource.devices}


def reload(
    previous: Inventory,
    discovered: Inventory,
    faults: dict[str, Health],
    served: list[Served],
    resource_options: ResourceOptions = WHOLE_GPUS,
    options: AllocateOptions = OPTIONS,
) -> tuple[Carried, Plan]:
    """What the daemon does on a reload: carry lost GPUs, faults on top, build, plan."""
    carried = carry_missing(previous, discovered)
    snapshot = with_faults(carried.inventory, faults)
    resources = build_resources(snapshot, resource_options)
    watched = frozenset(g.uuid for g in previous.gpus)
    gpus = [g.uuid for g in carried.inventory.gpus]
    return carried, plan(served, resources, options, watched=watched, gpus=gpus)


def test_the_first_start_adds_every_resource_and_watches_every_gpu() -> None:
    resources = build_resources(NODE)
    first = plan([], resources, OPTIONS, watched=None, gpus=UUIDS)
    assert [(c.name, c.step) for c in first.changes] == [(GPU, Step.ADD)]
    assert first.registrations == (GPU,)
    assert first.monitor is MonitorStep.WATCH and first.gpus == frozenset(UUIDS)


def test_a_reload_that_changes_nothing_plans_nothing() -> None:
    resources = build_resources(NODE)
    again = plan(serving(resources), build_resources(NODE), OPTIONS, watched=frozenset(UUIDS), gpus=UUIDS)
    assert again.changes_nothing and again.registrations == ()
    assert again.summary() == "nothing to change"


def test_an_xid_faulted_gpu_stays_unhealthy_through_reloads_and_config_switches() -> None:
    faults = {UUIDS[5]: XID_79}
    served = serving(build_resources(with_faults(NODE, faults)))
    for _ in range(3):  # SIGHUP after SIGHUP: discovery finds the GPU "healthy" every time
        _, same = reload(NODE, NODE, faults, served)
        assert same.changes_nothing
    # A config switch to time-slicing: new device IDs, served in place, GPU 5's replicas unhealthy.
    _, switched = reload(NODE, NODE, faults, served, TIME_SLICED)
    (change,) = switched.changes
    assert change.step is Step.UPDATE and change.listed_changed and switched.registrations == ()
    assert change.resource is not None
    unhealthy = sorted(i for i, ok in health_of(change.resource).items() if not ok)
    assert unhealthy == [f"{UUIDS[5]}::0", f"{UUIDS[5]}::1"]
    assert change.resource.healthy_count == 14


def test_without_the_faults_the_same_reload_would_show_the_gpu_healthy() -> None:
    """The guard above is real: the plan follows the faults it is given, nothing else."""
    served = serving(build_resources(with_faults(NODE, {UUIDS[5]: XID_79})))
    _, forgot = reload(NODE, NODE, {}, served)
    (change,) = forgot.changes
    assert change.step is Step.UPDATE and change.resource is not None and change.resource.healthy_count == 8


def test_a_gpu_lost_at_reload_stays_listed_unhealthy_with_the_same_ids() -> None:
    served = serving(build_resources(NODE))
    lost = dataclasses.replace(NODE, gpus=tuple(g for g in NODE.gpus if g.index != 5))
    carried, after = reload(NODE, lost, {UUIDS[5]: XID_79}, served)
    assert list(carried.missing) == [UUIDS[5]]
    assert [g.uuid for g in carried.inventory.gpus] == UUIDS  # same GPUs, same order
    (change,) = after.changes
    assert change.step is Step.UPDATE and change.listed_changed and after.registrations == ()
    assert change.resource is not None
    assert [d.id for d in change.resource.devices] == UUIDS
    assert not health_of(change.resource)[UUIDS[5]] and change.resource.healthy_count == 7
    assert after.monitor is MonitorStep.KEEP  # the same GPUs: the running monitor keeps watching GPU 5


def test_a_lost_gpu_keeps_its_links() -> None:
    lost = dataclasses.replace(
        NODE,
        gpus=tuple(g for g in NODE.gpus if g.index != 5),
        links=tuple(link for link in NODE.links if 5 not in (link.a, link.b)),
    )
    carried = carry_missing(NODE, lost)
    assert carried.inventory.link_map()[(4, 5)].nvlinks == 12
    assert carried.inventory.link_map()[(6, 5)].nvlinks == 12
    assert len(carried.inventory.links) == len(NODE.links)


def test_a_lost_gpu_that_is_back_is_served_as_discovery_finds_it() -> None:
    lost = dataclasses.replace(NODE, gpus=tuple(g for g in NODE.gpus if g.index != 5))
    carried = carry_missing(NODE, lost)
    served = serving(build_resources(with_faults(carried.inventory, {UUIDS[5]: XID_79})))
    # The fault recovered; the rediscovery finds the GPU again, with what NVML reads now.
    back = dataclasses.replace(NODE, gpus=tuple(dataclasses.replace(g, numa_node=1) for g in NODE.gpus))
    again, after = reload(carried.inventory, back, {}, served)
    assert again.missing == {}
    (change,) = after.changes
    assert change.step is Step.UPDATE and change.resource is not None and change.resource.healthy_count == 8
    assert {d.numa_node for d in change.resource.devices} == {1}


def test_a_gpu_replaced_at_the_same_index_is_not_carried() -> None:
    swapped = dataclasses.replace(
        NODE,
        gpus=tuple(dataclasses.replace(g, uuid=gpu_uuid(100)) if g.index == 5 else g for g in NODE.gpus),
    )
    carried, after = reload(NODE, swapped, {}, serving(build_resources(NODE)))
    assert carried.missing == {}
    (change,) = after.changes
    assert change.resource is not None and UUIDS[5] not in health_of(change.resource)
    assert after.monitor is MonitorStep.WATCH and gpu_uuid(100) in after.gpus


def test_a_change_of_allocate_options_only_is_served_in_place() -> None:
    resources = build_resources(NODE)
    index = AllocateOptions(device_id_strategy="index")
    after = plan(serving(resources), resources, index, watched=frozenset(UUIDS), gpus=UUIDS)
    (change,) = after.changes
    assert change.step is Step.UPDATE and change.options_changed and not change.listed_changed
    assert after.registrations == () and after.summary() == "nvidia.com/gpu: update (options)"


def test_a_mig_strategy_switch_adds_the_new_resources_and_updates_the_kept_one() -> None:
    node = profile_inventory("a100-mig")
    gpus = [g.uuid for g in node.gpus]
    before = serving(build_resources(node, ResourceOptions(mig_strategy="none")))
    mixed = build_resources(node, ResourceOptions(mig_strategy="mixed"))
    after = plan(before, mixed, OPTIONS, watched=frozenset(gpus), gpus=gpus)
    steps = {c.name: c.step for c in after.changes}
    assert steps == {
        "nvidia.com/gpu": Step.UPDATE,  # only GPU 3, the one without MIG, is left
        "nvidia.com/mig-1g.5gb": Step.ADD,
        "nvidia.com/mig-2g.10gb": Step.ADD,
        "nvidia.com/mig-3g.20gb": Step.ADD,
    }
    assert after.registrations == (
        "nvidia.com/mig-1g.5gb",
        "nvidia.com/mig-2g.10gb",
        "nvidia.com/mig-3g.20gb",
    )
    assert after.monitor is MonitorStep.KEEP  # MIG layouts change, the physical GPUs do not
    back = plan(serving(mixed), build_resources(node), OPTIONS, watched=frozenset(gpus), gpus=gpus)
    assert [c.name for c in back.of(Step.REMOVE)] == [
        "nvidia.com/mig-1g.5gb",
        "nvidia.com/mig-2g.10gb",
        "nvidia.com/mig-3g.20gb",
    ]


def test_a_renamed_shared_resource_is_removed_and_added() -> None:
    renamed = ResourceOptions(
        sharing_kind="time-slicing",
        sharing=SharingStrategy(resources=[ReplicatedResource(name=GPU, rename=f"{GPU}.shared", replicas=4)]),
    )
    after = plan(
        serving(build_resources(NODE)),
        build_resources(NODE, renamed),
        OPTIONS,
        watched=frozenset(UUIDS),
        gpus=UUIDS,
    )
    assert [(c.name, c.step) for c in after.changes] == [(GPU, Step.REMOVE), (f"{GPU}.shared", Step.ADD)]
    assert after.summary() == "nvidia.com/gpu: remove; nvidia.com/gpu.shared: add (devices, options)"


def test_no_gpus_left_stops_the_monitor_and_removes_every_server() -> None:
    after = plan(serving(build_resources(NODE)), [], OPTIONS, watched=frozenset(UUIDS), gpus=[])
    assert after.monitor is MonitorStep.STOP and [c.step for c in after.changes] == [Step.REMOVE]
    idle = plan([], [], OPTIONS, watched=None, gpus=[])
    assert idle.changes_nothing


NAMES = ["nvidia.com/gpu", "nvidia.com/mig-1g.5gb", "nvidia.com/mig-2g.10gb", "nvidia.com/gpu.shared"]


@st.composite
def resource_sets(draw: st.DrawFn) -> list[Resource]:
    names = draw(st.sets(st.sampled_from(NAMES)))
    out = []
    for name in sorted(names):
        healthy = draw(st.lists(st.booleans(), min_size=1, max_size=4))
        base = build_resources(make_inventory(len(healthy)))[0].devices
        devices = tuple(
            dataclasses.replace(d, health=Health.ok() if ok else XID_79)
            for d, ok in zip(base, healthy, strict=True)
        )
        out.append(Resource(name, devices))
    return out


@given(before=resource_sets(), after=resource_sets(), options_change=st.booleans())
def test_applying_any_plan_serves_exactly_the_new_resources(
    before: list[Resource], after: list[Resource], options_change: bool
) -> None:
    options = AllocateOptions(device_id_strategy="index") if options_change else OPTIONS
    result = plan(serving(before), after, options, watched=None, gpus=[])
    assert list(result.serving) == sorted(after, key=lambda r: r.name)
    old, new = {r.name for r in before}, {r.name for r in after}
    assert set(result.registrations) == new - old
    assert {c.name for c in result.of(Step.REMOVE)} == old - new
    for change in result.of(Step.KEEP):
        assert not options_change and change.resource in before


def test_a_lost_gpu_brings_back_only_its_own_links_and_the_driver_is_the_one_found_now() -> None:
    # Discovery lost GPU 5 and, separately, no longer reports the 0-1 link: only GPU 5's links are carried.
    lost = dataclasses.replace(
        NODE,
        gpus=tuple(g for g in NODE.gpus if g.index != 5),
        links=tuple(link for link in NODE.links if 5 not in (link.a, link.b) and (link.a, link.b) != (0, 1)),
        driver_version="560.35.03",
        cuda_driver_version="12.6",
    )
    carried = carry_missing(NODE, lost)
    pairs = [(link.a, link.b) for link in carried.inventory.links]
    assert pairs == sorted((link.a, link.b) for link in NODE.links if (link.a, link.b) != (0, 1))
    inventory = carried.inventory
    assert (inventory.driver_version, inventory.cuda_driver_version) == ("560.35.03", "12.6")


def test_the_summary_names_every_change_after_a_kept_resource_and_the_monitor() -> None:
    renamed = ResourceOptions(
        sharing_kind="time-slicing",
        sharing=SharingStrategy(resources=[ReplicatedResource(name=GPU, rename=f"{GPU}.shared", replicas=2)]),
    )
    seven = dataclasses.replace(NODE, gpus=NODE.gpus[:7])
    after = plan(
        serving(build_resources(NODE)),
        [*build_resources(NODE), *build_resources(seven, renamed)],
        OPTIONS,
        watched=frozenset(UUIDS),
        gpus=UUIDS[:7],
    )
    assert [(c.name, c.step) for c in after.changes] == [(GPU, Step.KEEP), (f"{GPU}.shared", Step.ADD)]
    assert after.summary() == (
        "nvidia.com/gpu.shared: add (devices, options); health monitor: watch (7 GPUs)"
    )

"""Resources built from an inventory, each device field by field: MIG devices and replicas carry what their
GPU has."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from kubegpu.allocation.resources import (
    Device,
    ResourceError,
    ResourceOptions,
    build_resources,
    mig_resource_name,
    parse_mig_minors,
)
from kubegpu.node.inventory import Health
from kubegpu.settings.nvidia_sharing import ReplicatedResource, SharingStrategy
from tests.allocation.test_sharing_resources import SUBSET, inventory, resources
from tests.builders import gpu_uuid, make_inventory

XID_79 = Health.failed("XID 79 (GPU has fallen off the bus); action: reset_gpu", 79)


def test_mig_devices_carry_their_gpus_fault_and_their_own_memory() -> None:
    node = inventory("a100-mig")
    sick = node.with_gpu_health({node.gpus[2].uuid: XID_79})
    migs = {m.uuid: m for g in node.gpus for m in g.mig_devices}
    devices = [d for r in build_resources(sick, ResourceOptions("mixed")) for d in r.devices if d.is_mig]
    assert sorted(d.id for d in devices) == sorted(migs)
    for device in devices:
        assert device.health == (XID_79 if device.gpu_index == 2 else Health.ok()), device.id
        assert device.memory_bytes == migs[device.id].memory_bytes and device.memory_bytes > 0


def test_replicas_are_their_device_but_for_the_id() -> None:
    node = make_inventory(2, numa=[0, 1]).with_gpu_health({gpu_uuid(1): XID_79})
    sharing = SharingStrategy(resources=[ReplicatedResource(name="nvidia.com/gpu", replicas=2)])
    (resource,) = build_resources(node, ResourceOptions(sharing_kind="time-slicing", sharing=sharing))
    memory = 40 * 1024**3
    assert resource.devices == tuple(
        Device(f"{gpu_uuid(g)}::{r}", gpu_uuid(g), str(g), g, health, g, (f"/dev/nvidia{g}",), memory)
        for g, health in ((0, Health.ok()), (1, XID_79))
        for r in range(2)
    )
    assert resource.device(f"{gpu_uuid(1)}::1") == resource.devices[3]
    assert resource.device(gpu_uuid(1)) is None  # a shared resource lists replicas only


def test_only_the_gpus_named_in_devices_are_shared() -> None:
    node = inventory("t4-pcie")
    by_name = {r.name: r for r in resources("t4-pcie", SUBSET, allow_resource_customization=True)}
    assert {d.uuid for d in by_name["nvidia.com/gpu-shared"].devices} == {g.uuid for g in node.gpus[:2]}
    assert [d.uuid for d in by_name["nvidia.com/gpu"].devices] == [g.uuid for g in node.gpus[2:]]


def test_single_strategy_with_two_kinds_of_mig_device_is_nvidias_error() -> None:
    node = inventory("a100-mig")  # GPU 0: 1g.5gb only; GPU 1: 3g.20gb only
    two_kinds = replace(node, gpus=node.gpus[:2])
    with pytest.raises(ResourceError) as err:
        build_resources(two_kinds, ResourceOptions("single"))
    assert str(err.value).endswith("more than one MIG device type present on node")


def test_mig_names_and_minors() -> None:
    assert mig_resource_name("1g.10gb+me") == "nvidia.com/mig-1g.10gb.me"
    text = "gpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\ngpu0/gi2/access x\nnot a minor line\n\n"
    assert parse_mig_minors(text) == {"gpu0/gi1/access": 12, "gpu0/gi1/ci0/access": 13}


def test_opt_in_mig_name_patterns_and_a_profile_with_no_default_name() -> None:
    config = (
        "resources:\n  mig:\n  - {pattern: '1g.*', name: mig-small}\n  - {pattern: '*.20gb', name: mig-big}\n"
    )
    got = {
        r.name: len(r.devices)
        for r in resources("a100-mig", config, allow_resource_customization=True, mig_strategy="mixed")
    }
    # 1g.5gb: 8 devices; 3g.20gb: 3; 2g.10gb matches no pattern and keeps its default name.
    assert got == {
        "nvidia.com/gpu": 1,
        "nvidia.com/mig-small": 8,
        "nvidia.com/mig-big": 3,
        "nvidia.com/mig-2g.10gb": 1,
    }
    node = inventory("a100-mig")
    gpu = node.gpus[1]
    odd = replace(gpu, mig_devices=tuple(replace(m, profile="1c.2g.10gb") for m in gpu.mig_devices))
    with pytest.raises(ResourceError) as err:
        build_resources(replace(node, gpus=(odd,)), ResourceOptions("mixed"))
    assert str(err.value) == "MIG profile '1c.2g.10gb' does not match any resource patterns"


def test_whole_gpus_as_nvidia_gpu() -> None:
    (resource,) = build_resources(make_inventory(4, numa=[0, 0, 1, None]))
    assert resource.name == "nvidia.com/gpu"
    assert resource.socket_name == "nvidia-gpu.sock"
    assert [d.id for d in resource.devices] == [gpu_uuid(i) for i in range(4)]
    assert [d.numa_node for d in resource.devices] == [0, 0, 1, None]
    assert [d.index for d in resource.devices] == ["0", "1", "2", "3"]
    assert resource.devices[2].paths == ("/dev/nvidia2",)


def test_health_is_data_and_recovers() -> None:
    inventory = make_inventory(2)
    sick = inventory.with_gpu_health({gpu_uuid(1): Health.failed("XID 79", 79)})
    assert [d.health_text for d in build_resources(sick)[0].devices] == ["Healthy", "Unhealthy"]
    well = sick.with_gpu_health({gpu_uuid(1): Health.ok()})
    assert [d.health_text for d in build_resources(well)[0].devices] == ["Healthy", "Healthy"]
    assert inventory.with_gpu_health({}) is inventory


def test_no_gpus_no_resources() -> None:
    assert build_resources(make_inventory(0)) == []


def test_unshared_resources_next_to_shared_ones_say_so() -> None:
    by_name = {r.name: r for r in resources("t4-pcie", SUBSET, allow_resource_customization=True)}
    whole, shared = by_name["nvidia.com/gpu"], by_name["nvidia.com/gpu-shared"]
    assert (whole.sharing, whole.fail_requests_greater_than_one, whole.replicas) == ("none", False, 1)
    assert (shared.sharing, shared.fail_requests_greater_than_one, shared.replicas) == (
        "time-slicing",
        False,
        3,
    )


def test_a_sharing_entry_for_a_resource_the_node_lacks_leaves_the_next_entry_working() -> None:
    sharing = SharingStrategy(
        resources=[
            ReplicatedResource(name="mig-1g.5gb", replicas=2),  # t4-pcie has no MIG devices
            ReplicatedResource(name="gpu", replicas=2),
        ]
    )
    (gpu,) = build_resources(
        inventory("t4-pcie"), ResourceOptions(sharing_kind="time-slicing", sharing=sharing)
    )
    assert (gpu.name, len(gpu.devices), gpu.replicas) == ("nvidia.com/gpu", 8, 2)


def test_a_gpu_pattern_that_does_not_match_is_skipped() -> None:
    config = "resources:\n  gpus:\n  - {pattern: 'A100*', name: a100}\n  - {pattern: 'Tesla T*', name: t4}\n"
    assert {
        r.name: len(r.devices) for r in resources("t4-pcie", config, allow_resource_customization=True)
    } == {"nvidia.com/t4": 4}


def test_an_unknown_mig_strategy_is_named() -> None:
    with pytest.raises(ResourceError) as err:
        build_resources(make_inventory(1), ResourceOptions("mix"))
    assert str(err.value) == "unknown MIG strategy: mix"


def test_a_mig_enabled_gpu_without_mig_devices_is_logged_under_mixed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="kubegpu.allocation.resources")
    names = [r.name for r in build_resources(inventory("a100-mig-invalid"), ResourceOptions("mixed"))]
    assert names == ["nvidia.com/mig-3g.20gb"]
    assert [r for r in caplog.record_tuples if r[0] == "kubegpu.allocation.resources"] == [
        (
            "kubegpu.allocation.resources",
            logging.WARNING,
            "GPU 1 has MIG enabled but no MIG devices; nothing to advertise from it",
        )
    ]

from __future__ import annotations

from kubegpu.allocation.resources import build_resources
from kubegpu.node.inventory import Health
from tests.builders import gpu_uuid, make_inventory


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

"""The ListAndWatch size bound: computed sizes equal protobuf's, and configs past 4 MiB are refused early."""

from __future__ import annotations

import tracemalloc
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubegpu.allocation.message_size import device_bytes, max_replicas, replicas_bytes
from kubegpu.allocation.resources import Device, ResourceError, ResourceOptions, build_resources
from kubegpu.api.v1beta1 import api_pb2
from kubegpu.settings.nvidia_sharing import ReplicatedDevices, ReplicatedResource, SharingStrategy
from tests.allocation.test_sharing_resources import inventory
from tests.builders import make_inventory

KUBELET_LIMIT = 4194304  # grpc: received message larger than max (... vs. 4194304), kubernetes#109304


def encoded(ids: list[str], numa: int | None) -> int:
    topology = api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=numa)]) if numa is not None else None
    devices = [api_pb2.Device(ID=i, health="Unhealthy", topology=topology) for i in ids]
    return api_pb2.ListAndWatchResponse(devices=devices).ByteSize()


@given(
    st.text(alphabet="abcdef0123456789-", min_size=1, max_size=300),
    st.none() | st.integers(min_value=-1, max_value=2**40),
)
def test_one_device_is_sized_as_protobuf_encodes_it(device_id: str, numa: int | None) -> None:
    assert device_bytes(len(device_id), numa) == encoded([device_id], numa)


@given(st.integers(min_value=0, max_value=1200), st.none() | st.integers(min_value=0, max_value=3))
def test_replicas_are_sized_as_protobuf_encodes_them(replicas: int, numa: int | None) -> None:
    base = "GPU-6ebfd3ec-1a10-4a6f-8ea5-3a0f41ccbf1d"
    ids = [f"{base}::{r}" for r in range(replicas)]
    assert replicas_bytes(len(base), numa, replicas) == encoded(ids, numa)


def test_max_replicas_is_the_largest_that_fits() -> None:
    base = [(40, 0), (40, 1)]
    fit = max_replicas(base, KUBELET_LIMIT)
    assert sum(replicas_bytes(n, numa, fit) for n, numa in base) <= KUBELET_LIMIT
    assert sum(replicas_bytes(n, numa, fit + 1) for n, numa in base) > KUBELET_LIMIT


def sharing(replicas: int) -> ResourceOptions:
    block = SharingStrategy(resources=[ReplicatedResource(name="gpu", replicas=replicas)])
    return ResourceOptions(sharing_kind="time-slicing", sharing=block)


@pytest.mark.parametrize("replicas", [8000, 100_000, 1_000_000, 10**18])
def test_replicas_the_kubelet_cannot_read_are_refused_before_they_are_built(replicas: int) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(ResourceError) as err:
            build_resources(inventory("dgx-a100"), sharing(replicas))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(err.value)
    assert message.startswith(f"nvidia.com/gpu would list {8 * replicas} devices, ")
    assert (
        "over the 4 MiB the kubelet reads (gRPC's receive limit); lower replicas to at most 7960 for 8"
        in message
    )
    assert peak < 10 * 2**20  # nothing close to the device list was built


def test_the_largest_replica_count_that_fits_is_served_and_fits_even_when_all_unhealthy() -> None:
    (resource,) = build_resources(inventory("dgx-a100"), sharing(7960))
    assert len(resource.devices) == 8 * 7960
    assert listed(resource.devices) <= KUBELET_LIMIT


def listed(devices: tuple[Device, ...]) -> int:
    """The encoded ListAndWatch response of these devices, every one Unhealthy (the longer health text)."""
    return api_pb2.ListAndWatchResponse(
        devices=[
            api_pb2.Device(
                ID=d.id,
                health="Unhealthy",
                topology=None
                if d.numa_node is None
                else api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=d.numa_node)]),
            )
            for d in devices
        ]
    ).ByteSize()


def test_a_list_of_exactly_the_limit_is_served_and_one_byte_more_is_refused() -> None:
    # One GPU whose ID is 4194283 bytes long encodes, without a NUMA node, to exactly 4194304 bytes.
    node = make_inventory(1)
    exact = replace(node, gpus=(replace(node.gpus[0], uuid="G" * 4194283),))
    (resource,) = build_resources(exact)
    assert listed(resource.devices) == KUBELET_LIMIT
    over = replace(node, gpus=(replace(node.gpus[0], uuid="G" * 4194284),))
    with pytest.raises(ResourceError) as err:
        build_resources(over)
    assert str(err.value) == (
        "nvidia.com/gpu would list 1 devices, 4 MiB in one ListAndWatch message, over the 4 MiB the kubelet "
        "reads (gRPC's receive limit)"
    )


def test_the_devices_left_whole_count_against_the_replicas_that_fit() -> None:
    # dgx-a100: 2 of its 8 GPUs shared under their own name, so 6 whole GPUs are listed next to the replicas.
    def two_shared(replicas: int) -> ResourceOptions:
        entry = ReplicatedResource(name="gpu", replicas=replicas, devices=ReplicatedDevices(count=2))
        return ResourceOptions(sharing_kind="time-slicing", sharing=SharingStrategy(resources=[entry]))

    with pytest.raises(ResourceError) as err:
        build_resources(inventory("dgx-a100"), two_shared(32000))
    assert str(err.value) == (
        "nvidia.com/gpu would list 64006 devices, 4.01 MiB in one ListAndWatch message, over the 4 MiB the "
        "kubelet reads (gRPC's receive limit); lower replicas to at most 31940 for 2 device(s) on this node"
    )
    (resource,) = build_resources(inventory("dgx-a100"), two_shared(31940))
    assert len(resource.devices) == 6 + 2 * 31940
    assert listed(resource.devices) <= KUBELET_LIMIT
    with pytest.raises(ResourceError, match="lower replicas to at most 31940 for 2 device"):
        build_resources(inventory("dgx-a100"), two_shared(31941))

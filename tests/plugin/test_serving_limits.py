"""The receive limit against real encoded requests, and the method table against the proto."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kubegpu.api.v1beta1 import api_pb2
from kubegpu.plugin.rpc_table import Undecodable, lenient, method_handlers
from kubegpu.plugin.serving_limits import largest_request_bytes, receive_limit


def preferred_request(devices: int, id_length: int) -> api_pb2.PreferredAllocationRequest:
    ids = [f"{i:0{id_length}d}" for i in range(devices)]
    return api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=ids, must_include_deviceIDs=ids, allocation_size=devices
            )
        ]
    )


@given(st.integers(0, 5000))
def test_largest_request_is_the_encoded_size_of_every_id_twice_at_63_characters(devices: int) -> None:
    assert largest_request_bytes(devices) == preferred_request(devices, 63).ByteSize()


@given(st.integers(0, 5000), st.integers(5, 63))
def test_every_request_a_kubelet_can_send_fits_the_limit(devices: int, id_length: int) -> None:
    assert preferred_request(devices, id_length).ByteSize() <= receive_limit(devices)


def test_limits_for_real_nodes() -> None:
    assert receive_limit(8) == 65536  # 8 GPUs
    # 8 GPUs x 48 MPS replicas, room for twice as many: 2 lists x 768 IDs x 65 bytes, + 3 + 4 of framing.
    assert receive_limit(8 * 48) == 99_847
    assert receive_limit(8 * 100) == 208_007  # 800 time-sliced replicas: 2 x 1,600 x 65 + 7
    assert receive_limit(100_000) > 4 * 1024 * 1024  # no cap: the kubelet's own 4 MiB is the bound there


def test_the_table_serves_the_five_methods_with_their_types() -> None:
    methods = [
        "Allocate",
        "GetDevicePluginOptions",
        "GetPreferredAllocation",
        "ListAndWatch",
        "PreStartContainer",
    ]
    handlers = method_handlers(type("Servicer", (), dict.fromkeys(methods, print))())
    assert sorted(handlers) == methods
    assert [n for n in methods if handlers[n].response_streaming] == ["ListAndWatch"]
    assert {n: type(handlers[n].request_deserializer(b"")).__name__ for n in methods} == {
        "Allocate": "AllocateRequest",
        "GetDevicePluginOptions": "Empty",
        "GetPreferredAllocation": "PreferredAllocationRequest",
        "ListAndWatch": "Empty",
        "PreStartContainer": "PreStartContainerRequest",
    }
    assert handlers["Allocate"].response_serializer(api_pb2.AllocateResponse()) == b""


@given(st.binary(max_size=200))
def test_decoding_never_raises_and_keeps_no_bytes(body: bytes) -> None:
    out = lenient(api_pb2.AllocateRequest)(body)
    if isinstance(out, Undecodable):
        assert out.size == len(body) and out.type_name == "v1beta1.AllocateRequest"
        assert out.describe().isprintable()
    else:
        assert isinstance(out, api_pb2.AllocateRequest)

"""The committed gRPC stubs match the proto, and the proto matches the kubelet's wire contract."""

from __future__ import annotations

import filecmp
import importlib.util
from pathlib import Path

import pytest

from kubegpu.api.v1beta1 import api_pb2

ROOT = Path(__file__).resolve().parent.parent
STUB_DIR = ROOT / "src" / "kubegpu" / "api" / "v1beta1"
STUBS = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")


@pytest.mark.skipif(importlib.util.find_spec("grpc_tools") is None, reason="grpcio-tools not installed")
def test_committed_stubs_are_current(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("gen_proto", ROOT / "scripts" / "gen_proto.py")
    assert spec and spec.loader
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    gen.generate(tmp_path)
    fresh = tmp_path / "kubegpu" / "api" / "v1beta1"
    stale = [name for name in STUBS if not filecmp.cmp(fresh / name, STUB_DIR / name, shallow=False)]
    assert not stale, f"stubs {stale} are stale: run `make proto` and commit the result"


# (message, field, number) straight from the spec's message table.
WIRE_FIELDS = [
    ("DevicePluginOptions", "pre_start_required", 1),
    ("DevicePluginOptions", "get_preferred_allocation_available", 2),
    ("RegisterRequest", "version", 1),
    ("RegisterRequest", "endpoint", 2),
    ("RegisterRequest", "resource_name", 3),
    ("RegisterRequest", "options", 4),
    ("ListAndWatchResponse", "devices", 1),
    ("TopologyInfo", "nodes", 1),
    ("NUMANode", "ID", 1),
    ("Device", "ID", 1),
    ("Device", "health", 2),
    ("Device", "topology", 3),
    ("PreStartContainerRequest", "devices_ids", 1),
    ("PreferredAllocationRequest", "container_requests", 1),
    ("ContainerPreferredAllocationRequest", "available_deviceIDs", 1),
    ("ContainerPreferredAllocationRequest", "must_include_deviceIDs", 2),
    ("ContainerPreferredAllocationRequest", "allocation_size", 3),
    ("PreferredAllocationResponse", "container_responses", 1),
    ("ContainerPreferredAllocationResponse", "deviceIDs", 1),
    ("AllocateRequest", "container_requests", 1),
    ("ContainerAllocateRequest", "devices_ids", 1),
    ("CDIDevice", "name", 1),
    ("AllocateResponse", "container_responses", 1),
    ("ContainerAllocateResponse", "envs", 1),
    ("ContainerAllocateResponse", "mounts", 2),
    ("ContainerAllocateResponse", "devices", 3),
    ("ContainerAllocateResponse", "annotations", 4),
    ("ContainerAllocateResponse", "cdi_devices", 5),
    ("Mount", "container_path", 1),
    ("Mount", "host_path", 2),
    ("Mount", "read_only", 3),
    ("DeviceSpec", "container_path", 1),
    ("DeviceSpec", "host_path", 2),
    ("DeviceSpec", "permissions", 3),
]


@pytest.mark.parametrize(("message", "field", "number"), WIRE_FIELDS)
def test_wire_field_numbers(message: str, field: str, number: int) -> None:
    descriptor = api_pb2.DESCRIPTOR.message_types_by_name[message]
    assert descriptor.fields_by_name[field].number == number


def test_method_paths() -> None:
    assert api_pb2.DESCRIPTOR.package == "v1beta1"
    services = api_pb2.DESCRIPTOR.services_by_name
    assert [m.name for m in services["Registration"].methods] == ["Register"]
    assert [m.name for m in services["DevicePlugin"].methods] == [
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    ]
    assert (
        services["DevicePlugin"].methods_by_name["ListAndWatch"].full_name
        == "v1beta1.DevicePlugin.ListAndWatch"
    )

"""The committed gRPC stubs match the protos, and the protos match the kubelet's wire contracts."""

from __future__ import annotations

import filecmp
import importlib.util
from pathlib import Path

import pytest

from kubegpu.api.podresources.v1 import api_pb2 as podresources_pb2
from kubegpu.api.v1beta1 import api_pb2

ROOT = Path(__file__).resolve().parents[2]
API_DIRS = (
    "v1beta1",
    "podresources/v1",
    "pluginregistration/v1",
    "dra/v1",
    "dra/v1beta1",
    "drahealth/v1alpha1",
)
STUBS = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py", "api_pb2_grpc.pyi")


@pytest.mark.skipif(
    importlib.util.find_spec("grpc_tools") is None or importlib.util.find_spec("mypy_protobuf") is None,
    reason="grpcio-tools or mypy-protobuf not installed (the dev extras)",
)
def test_committed_stubs_are_current(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("gen_proto", ROOT / "scripts" / "gen_proto.py")
    assert spec and spec.loader
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    gen.generate(tmp_path)
    committed = ROOT / "src" / "kubegpu" / "api"
    fresh = tmp_path / "kubegpu" / "api"
    stale = [
        f"{api}/{name}"
        for api in API_DIRS
        for name in STUBS
        if not filecmp.cmp(fresh / api / name, committed / api / name, shallow=False)
    ]
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


# PodResources v1, as the kubelet's k8s.io/kubelet/pkg/apis/podresources/v1/api.proto has them.
POD_RESOURCES_FIELDS = [
    ("AllocatableResourcesResponse", "devices", 1),
    ("AllocatableResourcesResponse", "cpu_ids", 2),
    ("AllocatableResourcesResponse", "memory", 3),
    ("ListPodResourcesResponse", "pod_resources", 1),
    ("PodResources", "name", 1),
    ("PodResources", "namespace", 2),
    ("PodResources", "containers", 3),
    ("ContainerResources", "name", 1),
    ("ContainerResources", "devices", 2),
    ("ContainerResources", "cpu_ids", 3),
    ("ContainerResources", "memory", 4),
    ("ContainerResources", "dynamic_resources", 5),
    ("ContainerMemory", "memory_type", 1),
    ("ContainerMemory", "size", 2),
    ("ContainerMemory", "topology", 3),
    ("ContainerDevices", "resource_name", 1),
    ("ContainerDevices", "device_ids", 2),
    ("ContainerDevices", "topology", 3),
    ("TopologyInfo", "nodes", 1),
    ("NUMANode", "ID", 1),
    ("DynamicResource", "claim_name", 2),
    ("DynamicResource", "claim_namespace", 3),
    ("DynamicResource", "claim_resources", 4),
    ("ClaimResource", "cdi_devices", 1),
    ("ClaimResource", "driver_name", 2),
    ("ClaimResource", "pool_name", 3),
    ("ClaimResource", "device_name", 4),
    ("CDIDevice", "name", 1),
    ("GetPodResourcesRequest", "pod_name", 1),
    ("GetPodResourcesRequest", "pod_namespace", 2),
    ("GetPodResourcesResponse", "pod_resources", 1),
]


@pytest.mark.parametrize(("message", "field", "number"), POD_RESOURCES_FIELDS)
def test_pod_resources_field_numbers(message: str, field: str, number: int) -> None:
    descriptor = podresources_pb2.DESCRIPTOR.message_types_by_name[message]
    assert descriptor.fields_by_name[field].number == number


def test_pod_resources_method_paths() -> None:
    assert podresources_pb2.DESCRIPTOR.package == "v1"
    lister = podresources_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert [m.name for m in lister.methods] == ["List", "GetAllocatableResources", "Get"]
    assert lister.methods_by_name["List"].full_name == "v1.PodResourcesLister.List"

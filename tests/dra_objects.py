"""resource.k8s.io objects for tests, written as a user or a driver would write them (v1 JSON).

Attribute names and types are NVIDIA's (docs/reference/dra.md §2.4), so selectors in tests read like the
ones users write for gpu.nvidia.com.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

DRIVER = "gpu.nvidia.com"


def gpu(
    minor: int,
    *,
    product: str = "NVIDIA A100-SXM4-80GB",
    memory: str = "80Gi",
    driver_version: str = "550.54.15",
    compute_capability: str = "8.0.0",
    pcie_root: str = "pci0000:00",
    taints: Sequence[Mapping[str, str]] = (),
    **extra: Any,
) -> dict[str, Any]:
    device: dict[str, Any] = {
        "name": f"gpu-{minor}",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": f"GPU-{minor:08d}-0000-0000-0000-000000000000"},
            "productName": {"string": product},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": "Ampere"},
            "cudaComputeCapability": {"version": compute_capability},
            "driverVersion": {"version": driver_version},
            "cudaDriverVersion": {"version": "12.4.0"},
            "resource.kubernetes.io/pciBusID": {"string": f"0000:{minor + 1:02x}:00.0"},
            "resource.kubernetes.io/pcieRoot": {"string": pcie_root},
        },
        "capacity": {"memory": {"value": memory}},
    }
    if taints:
        device["taints"] = [dict(t) for t in taints]
    device.update(extra)
    return device


def resource_slice(
    node: str,
    devices: Sequence[Mapping[str, Any]],
    *,
    name: str | None = None,
    driver: str = DRIVER,
    pool: str | None = None,
    generation: int = 1,
    slice_count: int = 1,
    owner_uid: str | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name or f"{node}-{driver}-slice"}
    if owner_uid:
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": owner_uid, "controller": True}
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": meta,
        "spec": {
            "driver": driver,
            "pool": {"name": pool or node, "generation": generation, "resourceSliceCount": slice_count},
            "nodeName": node,
            "devices": [dict(d) for d in devices],
        },
    }


def device_class(
    name: str = DRIVER, expression: str | None = None, config: Sequence[Any] = ()
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selectors": [{"cel": {"expression": expression or f'device.driver == "{DRIVER}"'}}],
    }
    if config:
        spec["config"] = list(config)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": spec,
    }


def request(
    name: str = "gpu",
    *,
    device_class_name: str = DRIVER,
    count: int | None = None,
    mode: str | None = None,
    selectors: Sequence[str] = (),
    tolerations: Sequence[Mapping[str, str]] = (),
    admin_access: bool = False,
) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class_name}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if mode:
        exactly["allocationMode"] = mode
    if count is not None:
        exactly["count"] = count
    if tolerations:
        exactly["tolerations"] = [dict(t) for t in tolerations]
    if admin_access:
        exactly["adminAccess"] = True
    return {"name": name, "exactly": exactly}


def claim(
    name: str,
    requests: Sequence[Mapping[str, Any]] = (),
    *,
    namespace: str = "default",
    constraints: Sequence[Mapping[str, Any]] = (),
    config: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": [dict(r) for r in (requests or [request()])]}
    if constraints:
        devices["constraints"] = [dict(c) for c in constraints]
    if config:
        devices["config"] = [dict(c) for c in config]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": devices},
    }


def mps_config(
    thread_percentage: int = 50, pinned: str = "10Gi", requests: Sequence[str] = ("gpu",)
) -> dict[str, Any]:
    """A claim's opaque GpuConfig with MPS sharing and its two default limits (NVIDIA's demo values)."""
    return {
        "requests": list(requests),
        "opaque": {
            "driver": "gpu.nvidia.com",
            "parameters": {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "GpuConfig",
                "sharing": {
                    "strategy": "MPS",
                    "mpsConfig": {
                        "defaultActiveThreadPercentage": thread_percentage,
                        "defaultPinnedDeviceMemoryLimit": pinned,
                    },
                },
            },
        },
    }

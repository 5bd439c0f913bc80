"""What NVIDIA's DRA driver (gpu.nvidia.com) publishes and ships, for `lint` and `explain` to check claims
and classes against (docs/reference/dra.md, section 2.4), and where a CEL selector reads device attributes.

Selectors name attributes as `device.attributes["<domain>"].<name>` (or `["<name>"]`), capacities as
`device.capacity["<domain>"].<name>`, and test presence with `"<name>" in device.attributes["<domain>"]`.
A name the driver does not publish is a CEL runtime error ("no such key") on every device, so the claim
never allocates: the scheduler reports the error instead of a fit.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

NVIDIA_DRIVER = "gpu.nvidia.com"
DRA_KINDS = ("ResourceSlice", "ResourceClaim", "ResourceClaimTemplate", "DeviceClass")
STANDARD_DOMAIN = "resource.kubernetes.io"

# Full GPUs, MIG devices (which repeat the parent's), VFIO passthrough devices.
NVIDIA_ATTRIBUTES = frozenset(
    {
        "type",
        "uuid",
        "productName",
        "brand",
        "architecture",
        "cudaComputeCapability",
        "driverVersion",
        "cudaDriverVersion",
        "addressingMode",
        "parentUUID",
        "profile",
        "deviceID",
        "vendorID",
        "numa",
        "iommuFDEnabled",
    }
)
NVIDIA_CAPACITIES = frozenset(
    {
        "memory",
        "multiprocessors",
        "copyEngines",
        "decoders",
        "encoders",
        "jpegEngines",
        "ofaEngines",
        "addressableMemory",
        "shares",  # --consumable-shares=N (ConsumableShares gate): N shares per device
    }
)
_MEMORY_SLICE = re.compile(r"memorySlice\d+")
STANDARD_ATTRIBUTES = frozenset({"pciBusID", "pcieRoot"})

# Names NVIDIA published once and removed (September 2025): selectors copied from older examples use them.
RETIRED = {
    "index": "NVIDIA's DRA driver stopped publishing `index` (it is not stable across reboots)",
    "minor": "NVIDIA's DRA driver stopped publishing `minor` (the minor number lives only in the device "
    "name, gpu-<minor>)",
}

# NVIDIA's DeviceClasses (its chart's, and this chart's with dra.enabled).
NVIDIA_CLASSES = {
    f"{kind}.nvidia.com": f"device.driver == '{NVIDIA_DRIVER}' && "
    f"device.attributes['{NVIDIA_DRIVER}'].type == '{kind}'"
    for kind in ("gpu", "mig")
}


@dataclass(frozen=True)
class Reference:
    """One attribute or capacity a selector reads."""

    what: str  # "attributes" or "capacity"
    domain: str
    name: str

    def __str__(self) -> str:
        return f'device.{self.what}["{self.domain}"].{self.name}'


def references(expression: str) -> list[Reference]:
    """The attributes and capacities `expression` names, in order, each once."""
    # CEL loads with the first expression, not with lint: 0.4 s that a file without DRA objects does not need.
    from kubegpu.resourceapi.cel import attribute_references

    return [Reference(*found) for found in attribute_references(expression)]


def published(ref: Reference, driver: str, extra: frozenset[str] = frozenset()) -> bool | None:
    """Whether `driver` (NVIDIA's DRA driver under that name) publishes `ref`; None when the domain is
    neither the driver's nor the standard one, so nothing is known. `extra`: names seen in the cluster's
    ResourceSlices for that domain."""
    if ref.name in extra:
        return True
    if ref.domain == STANDARD_DOMAIN:
        return ref.what == "attributes" and ref.name in STANDARD_ATTRIBUTES
    if ref.domain != driver:
        return None
    if ref.what == "attributes":
        return ref.name in NVIDIA_ATTRIBUTES
    return ref.name in NVIDIA_CAPACITIES or _MEMORY_SLICE.fullmatch(ref.name) is not None


def slices_per_node(slices: Iterable[Any], nodes: Iterable[Any]) -> Iterator[tuple[Any, list[Any]]]:
    """(node, the slices it may reach) for each node: its own (spec.nodeName) and every slice that is not
    node-local (allNodes, a node selector), which the allocator then matches. Keeps explain and lint
    linear in the cluster's size: the allocator never looks at another node's slices."""
    own: dict[str, list[Any]] = {}
    shared = []
    for s in slices:
        if s.node_name:
            own.setdefault(s.node_name, []).append(s)
        else:
            shared.append(s)
    for node in nodes:
        yield node, own.get(node.name, []) + shared


def claim_from_template(template: dict[str, Any], namespace: str, name: str) -> dict[str, Any]:
    """The ResourceClaim the resourceclaim controller makes from a ResourceClaimTemplate: its spec.spec."""
    spec = template.get("spec") or {}
    return {
        "apiVersion": template.get("apiVersion"),
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec.get("spec") if isinstance(spec, dict) else None,
    }

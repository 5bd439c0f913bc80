"""resource.k8s.io (DRA) objects as the scheduler reads them, CEL device selectors, and the structured
allocator: what tests, the demo and `kubegpu explain` use to see which device a claim gets, and why not.

Modules, one job each:
  cel        DRA's CEL environment on cel-python: compile selectors, evaluate them on one device
  cel_device the `device` variable an expression sees (driver, attributes, capacity), built once per device
  cel_pins   the attribute values a selector compares with (`== "<value>"`), and whether it needs them
  cel_library the Kubernetes CEL libraries selectors use (quantity, semver, strings, lists, regex)
  model      DeviceClass, ResourceClaim, ResourceSlice parsed from v1/v1beta2 or v1beta1 JSON
  nodes      which node a slice or device is reachable from (nodeName, allNodes, NodeSelector)
  pools      the pools a node reaches: highest generation, complete or not, valid or not, counter sets
  holdings   what allocated claims hold: devices whole, shares of a device with the capacity they consume
  counters   shared counters (partitionable devices): what a pool has left, what a device would take
  capacity   consumable capacity: request policies (default, validRange, validValues), what fits
  allocator  the scheduler's structured allocator: status.allocation for a pod's claims on one node
  allocator_parts what it searches with and hands back: requests, results, constraints, feature gates,
             selector errors in the scheduler's words, a claim's status.allocation JSON
  extended   the extended-resource bridge (KEP-5004): which class serves a resource, which resources go
             through DRA on a node, the special claim and the pod's request mappings
  explain    per node and request, the verdict on every device (which selector said no, taints, in use,
             which counter or capacity is short and who holds it)
Imports only kubegpu.common and third-party libraries.
"""

from typing import Any

from .allocator import AllocationError, Allocator, Features, allocated_devices
from .cel import CelError, compile_error, compile_selector, device_activation
from .explain import CANNOT_ALLOCATE, DeviceVerdict, NodeAccount, RequestAccount, explain, holders
from .extended import (
    EXTENDED_RESOURCE_CLAIM_ANNOTATION,
    ResourceRoute,
    class_mapping,
    extended_claim,
    is_extended_claim_of,
    requests_and_mappings,
    routes,
)
from .holdings import Holdings, Share
from .model import (
    DeviceClass,
    DeviceID,
    ModelError,
    ResourceClaim,
    ResourceSlice,
    parse_claim,
    parse_class,
    parse_slice,
)
from .nodes import Node


def reserved_status(allocation: dict[str, Any], pod_name: str, pod_uid: str) -> dict[str, Any]:
    """A claim's status once the scheduler allocated it and reserved it for a pod."""
    return {"allocation": allocation, "reservedFor": [{"resource": "pods", "name": pod_name, "uid": pod_uid}]}


__all__ = [
    "CANNOT_ALLOCATE",
    "EXTENDED_RESOURCE_CLAIM_ANNOTATION",
    "AllocationError",
    "Allocator",
    "CelError",
    "DeviceClass",
    "DeviceID",
    "DeviceVerdict",
    "Features",
    "Holdings",
    "ModelError",
    "Node",
    "NodeAccount",
    "RequestAccount",
    "ResourceClaim",
    "ResourceRoute",
    "ResourceSlice",
    "Share",
    "allocated_devices",
    "class_mapping",
    "compile_error",
    "compile_selector",
    "device_activation",
    "explain",
    "extended_claim",
    "holders",
    "is_extended_claim_of",
    "parse_claim",
    "parse_class",
    "parse_slice",
    "requests_and_mappings",
    "reserved_status",
    "routes",
]

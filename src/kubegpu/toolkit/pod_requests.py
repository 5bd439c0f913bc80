"""Resource names and pod requests, computed the way kube-scheduler computes them.

A pod's effective request for each resource is max(sum of app containers and sidecars, each init
container plus the sidecars started before it) plus the pod overhead
(`k8s.io/component-helpers/resource.PodRequests`). Within a pod the arithmetic is exact; the result is
then converted to scheduler units, milli-CPU and whole units for everything else, rounding up.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kubegpu.common import quantity
from kubegpu.common.k8s_names import is_extended_resource_name
from kubegpu.toolkit.model import ContainerLite, PodSpecLite, Quantity, init_containers, limits, requests

CPU, MEMORY, EPHEMERAL, PODS = "cpu", "memory", "ephemeral-storage", "pods"
GPU = "nvidia.com/gpu"
_NATIVE = {CPU, MEMORY, EPHEMERAL, PODS}


def is_scalar(name: str) -> bool:
    """Resources the scheduler tracks beyond cpu/memory/ephemeral-storage/pods."""
    return (
        is_extended_resource_name(name)
        or name.startswith("hugepages-")
        or name.startswith("attachable-volumes-")
        or ("kubernetes.io/" in name and "/" in name)
    )


def is_gpu(name: str) -> bool:
    """An NVIDIA device-plugin resource: nvidia.com/gpu, nvidia.com/mig-*, and their `.shared` names."""
    return name.startswith("nvidia.com/") and (
        name.startswith("nvidia.com/gpu") or name.startswith("nvidia.com/mig-")
    )


def is_mig(name: str) -> bool:
    return name.startswith("nvidia.com/mig-")


def is_shared(name: str) -> bool:
    return name.endswith(".shared")


def tracked(name: str) -> bool:
    return name in _NATIVE or is_scalar(name)


def container_requests(container: ContainerLite) -> dict[str, Quantity]:
    """Requests as the API server stores them: a limit without a request defaults the request."""
    req = dict(requests(container))
    for name, amount in limits(container).items():
        req.setdefault(name, amount)
    return req


def _add(into: dict[str, int], reqs: Mapping[str, Quantity]) -> None:
    for name, amount in reqs.items():
        into[name] = into.get(name, 0) + quantity.parse_nanos(amount)


def pod_request_nanos(spec: PodSpecLite) -> dict[str, int]:
    """The pod's effective request per resource, exact, in nano-units."""
    total: dict[str, int] = {}
    for container in spec.containers or ():
        _add(total, container_requests(container))
    if spec.init_containers:
        sidecars: dict[str, int] = {}
        init_max: dict[str, int] = {}
        for container in init_containers(spec):
            reqs: dict[str, int] = {}
            _add(reqs, container_requests(container))
            if container.restart_policy == "Always":
                # A sidecar runs for the pod's whole life: it adds to the sum, and to every later init step.
                for name, amount in reqs.items():
                    total[name] = total.get(name, 0) + amount
                    sidecars[name] = sidecars.get(name, 0) + amount
                step = dict(sidecars)
            else:
                step = dict(reqs)
                for name, amount in sidecars.items():
                    step[name] = step.get(name, 0) + amount
            for name, amount in step.items():
                if amount > init_max.get(name, 0):
                    init_max[name] = amount
        for name, amount in init_max.items():
            if amount > total.get(name, 0):
                total[name] = amount
    pod_level = spec.resources.requests if spec.resources and spec.resources.requests else None
    if pod_level:
        # Pod-level resources (cpu, memory) replace the container aggregate when set.
        for name in (CPU, MEMORY):
            if name in pod_level:
                total[name] = quantity.parse_nanos(pod_level[name])
    if spec.overhead:
        _add(total, spec.overhead)
    return total


def to_scheduler_units(nanos: Mapping[str, int]) -> dict[str, int]:
    """milli-CPU, and whole units for the rest, rounded up; unknown native names are dropped."""
    out: dict[str, int] = {}
    for name, amount in nanos.items():
        if not tracked(name) or name == PODS:
            continue
        if name == CPU:
            out[name] = quantity.ceil_div(amount, quantity.NANO // 1000)
        else:
            out[name] = quantity.ceil_div(amount, quantity.NANO)
    return out


def pod_requests(spec: PodSpecLite) -> dict[str, int]:
    """The pod's request in scheduler units (milli-CPU; bytes; whole devices)."""
    return to_scheduler_units(pod_request_nanos(spec))


def node_amounts(resources: Mapping[str, Quantity]) -> dict[str, int]:
    """A node's capacity or allocatable in scheduler units."""
    out: dict[str, int] = {}
    for name, amount in resources.items():
        if name == CPU:
            out[name] = quantity.milli(amount)
        elif name in _NATIVE or is_scalar(name):
            out[name] = quantity.value(amount)
    return out


def gpu_names(names: Iterable[str]) -> list[str]:
    return sorted(n for n in names if is_gpu(n))


def display(name: str, amount: int) -> str:
    """An amount in scheduler units for people."""
    if name == CPU:
        return quantity.format_milli(amount)
    if name in (MEMORY, EPHEMERAL) or name.startswith("hugepages-"):
        return quantity.format_bytes(amount)
    return str(amount)

"""The little of a pod spec the device manager looks at, and what admission gives back."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from kubegpu.api.v1beta1 import api_pb2


@dataclass(frozen=True, slots=True)
class ContainerClaim:
    """`resources.claims[]` of a container: a pod claim by name, optionally one request of it."""

    name: str
    request: str = ""


@dataclass(frozen=True, slots=True)
class PodResourceClaim:
    """`spec.resourceClaims[]` of a pod, with the ResourceClaim it resolves to.

    `claim_name` is `resourceClaimName`, or for a template the generated name the resourceclaim controller
    recorded in `status.resourceClaimStatuses` (None: none was needed, the kubelet skips it);
    `from_template` makes the kubelet check that the claim is owned by the pod.
    """

    name: str
    claim_name: str | None
    from_template: bool = False


@dataclass(frozen=True, slots=True)
class RequestMapping:
    """One entry of `status.extendedResourceClaimStatus.requestMappings`."""

    container_name: str
    resource_name: str
    request_name: str


@dataclass(frozen=True, slots=True)
class ExtendedResourceClaim:
    """`status.extendedResourceClaimStatus`: the claim the scheduler created for the pod's extended resources
    served through DRA (KEP-5004), and which of its requests serves which container's resource. The kubelet
    prepares it like a pod claim and gives each container the CDI IDs of the requests mapped to it."""

    claim_name: str
    request_mappings: Sequence[RequestMapping] = ()


@dataclass(frozen=True, slots=True)
class Container:
    """A container's name and `resources.limits` (requests equal limits for extended resources).

    `init=True` marks an init container when it is listed in `Pod.containers`; containers listed in
    `Pod.init_containers` are init containers either way. `restartable` is an init container with
    `restartPolicy: Always` (a sidecar), which keeps its devices instead of handing them on.
    """

    name: str
    limits: Mapping[str, int] = field(default_factory=dict)
    init: bool = False
    restartable: bool = False
    claims: Sequence[ContainerClaim] = ()


@dataclass(frozen=True, slots=True)
class Pod:
    name: str
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    containers: Sequence[Container] = ()
    init_containers: Sequence[Container] = ()
    namespace: str = "default"  # pods are keyed by name in the simulator
    resource_claims: Sequence[PodResourceClaim] = ()
    extended_claim: ExtendedResourceClaim | None = None

    def __post_init__(self) -> None:
        names = [c.name for c in (*self.init_containers, *self.containers)]
        if len(names) != len(set(names)):
            raise ValueError(f"pod {self.name}: container names must be unique, got {names}")

    def claim_names(self) -> list[tuple[str, bool]]:
        """The ResourceClaims the kubelet prepares for the pod: (name, must be owned by the pod)."""
        names = [(c.claim_name, c.from_template) for c in self.resource_claims if c.claim_name is not None]
        if self.extended_claim is not None:
            names.append((self.extended_claim.claim_name, False))
        return names

    def dra_extended_resources(self) -> frozenset[str]:
        """The extended resources the bridge's claim serves: the device manager leaves them alone (the
        kubelet's extendedResourceAllocationModeForPod), even where a device plugin advertises them."""
        mappings = self.extended_claim.request_mappings if self.extended_claim else ()
        return frozenset(m.resource_name for m in mappings)

    def in_start_order(self) -> Iterator[tuple[Container, bool]]:
        """(container, is_init) with init containers first, the order the kubelet admits and starts them."""
        for c in self.init_containers:
            yield c, True
        for c in self.containers:
            if c.init:
                yield c, True
        for c in self.containers:
            if not c.init:
                yield c, False

    def container(self, name: str) -> tuple[Container, bool]:
        for c, is_init in self.in_start_order():
            if c.name == name:
                return c, is_init
        raise KeyError(f"pod {self.name} has no container {name!r}")


@dataclass(frozen=True, slots=True)
class RunContainerOptions:
    """What the kubelet hands the container runtime for a container, merged from its Allocate responses."""

    envs: Mapping[str, str] = field(default_factory=dict)
    devices: tuple[api_pb2.DeviceSpec, ...] = ()
    mounts: tuple[api_pb2.Mount, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    name: str
    init: bool
    devices: Mapping[str, tuple[str, ...]]  # resource -> device ids (sorted)
    responses: Mapping[str, api_pb2.ContainerAllocateResponse]  # resource -> the response the kubelet kept
    run_options: RunContainerOptions | None = None  # set once the container has started


@dataclass(frozen=True, slots=True)
class PodAllocation:
    pod: Pod
    containers: Mapping[str, ContainerAllocation]

    def devices(self, resource: str) -> set[str]:
        """Every device of `resource` held by any container of the pod."""
        return {d for c in self.containers.values() for d in c.devices.get(resource, ())}

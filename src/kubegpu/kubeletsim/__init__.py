"""A kubelet's device manager and DRA side for tests, benchmarks and demos.

It speaks the real Device Plugin API v1beta1 on real unix sockets and follows the real kubelet's rules
(see docs/reference/kubelet-device-plugin-api.md): registration checks and dial-back, ListAndWatch as the
complete device list, capacity vs allocatable, restart wiping the socket directory (or, on request, a
restart that leaves plugin sockets as a failed clean-up does), the checkpoint, and
pod admission with GetPreferredAllocation, one Allocate per container per resource, and PreStartContainer.
It also serves the PodResources API v1 (which pod and container hold which device) next to the
device-plugin directory, as the kubelet does: `<root>/pod-resources/kubelet.sock` for `<root>/device-plugins`.

    async with KubeletSimulator(Path("/tmp/dp"), on_event=Narrator()) as sim:
        ...  # start a plugin that registers on /tmp/dp/kubelet.sock
        await sim.wait_for(lambda: sim.allocatable().get("nvidia.com/gpu") == 8, timeout=10)
        allocation = await sim.admit(Pod("train", containers=[Container("main", {"nvidia.com/gpu": 2})]))
        allocation.containers["main"].run_options.envs  # what the container would get

With `dra=DraSettings(api_url=..., node_name=...)` it is also the kubelet's DRA side (dra.py): the plugin
watcher on `<root>/plugins_registry` (GetInfo, the 1.32 and 1.34+ service choice, NotifyRegistrationStatus,
deregistration), Prepare/Unprepare per pod with the claims read from the API server and the
`dra_manager_state` checkpoint, the CDI IDs each container gets, and the ResourceSlice wiping at start-up
and after a driver is gone. Pods name their claims with `Pod(resource_claims=[PodResourceClaim(...)])` and
containers theirs with `Container(claims=[ContainerClaim(...)])`.

Not reproduced: the topology manager (the default policy "none" gives no NUMA hints), the kubelet-restart
case of containers still running, the plugin-watcher registration path, SELinux labels, metrics, and the
Go checksum of the checkpoint (written as 0).
"""

from kubegpu.common.k8s_names import is_extended_resource_name

from .devicesets import DeviceState
from .dra import DraSettings
from .dra_checkpoint import ClaimInfo, PreparedDevice
from .dra_plugins import DraPlugin
from .endpoint import RpcRecord
from .errors import AdmissionError, ContainerStartError, PodError, PrepareError
from .events import EventKind, SimEvent
from .narrator import Narrator
from .pods import (
    Container,
    ContainerAllocation,
    ContainerClaim,
    ExtendedResourceClaim,
    Pod,
    PodAllocation,
    PodResourceClaim,
    RequestMapping,
    RunContainerOptions,
)
from .simulator import KubeletSimulator

__all__ = [
    "AdmissionError",
    "ClaimInfo",
    "Container",
    "ContainerAllocation",
    "ContainerClaim",
    "ContainerStartError",
    "DeviceState",
    "DraPlugin",
    "DraSettings",
    "EventKind",
    "ExtendedResourceClaim",
    "KubeletSimulator",
    "Narrator",
    "Pod",
    "PodAllocation",
    "PodError",
    "PodResourceClaim",
    "PrepareError",
    "PreparedDevice",
    "RequestMapping",
    "RpcRecord",
    "RunContainerOptions",
    "SimEvent",
    "is_extended_resource_name",
]

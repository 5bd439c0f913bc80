"""A kubelet, as far as device plugins and DRA drivers can tell: kubelet.sock, the device manager, node
status, pods, the PodResources API that node agents read, and (with `dra=DraSettings(...)`) the plugin
watcher, the DRA manager's Prepare/Unprepare and ResourceSlice wiping.

`KubeletSimulator` ties the pieces together on one asyncio loop and is what tests, benchmarks and
`kubegpu demo` drive. The node status is synced on every change (the kubelet does it every ~10 s), so
`capacity()`/`allocatable()` show what the next sync would post.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from kubegpu.api.v1beta1 import api_pb2
from kubegpu.common.unix_socket import MAX_SOCKET_PATH

from .devicemanager import DeviceManager
from .devicesets import ENDPOINT_STOP_GRACE_PERIOD, DeviceState, describe_ids
from .dra import DraKubelet, DraSettings
from .dra_checkpoint import ClaimInfo
from .dra_manager import DraError
from .dra_plugins import DraPlugin
from .endpoint import DIAL_TIMEOUT, PRE_START_CONTAINER_TIMEOUT, RpcRecord
from .errors import AdmissionError, ContainerStartError, DeviceManagerError, PodError, PrepareError
from .events import EventKind, EventListener, EventLog, SimEvent
from .nodestatus import NodeStatus
from .podresources_service import POD_RESOURCES_DIR, POD_RESOURCES_SOCKET, PodResourcesServer
from .pods import ContainerAllocation, Pod, PodAllocation, RunContainerOptions
from .predicate import check_node_fit
from .registration import KUBELET_SOCKET, RegistrationServer

_DEVICE_PLUGINS_DIR = "device-plugins"


class KubeletSimulator:
    def __init__(
        self,
        plugin_dir: Path | str,
        *,
        on_event: EventListener | None = None,
        dial_timeout: float = DIAL_TIMEOUT,
        stop_grace_period: float = ENDPOINT_STOP_GRACE_PERIOD,
        prestart_timeout: float = PRE_START_CONTAINER_TIMEOUT,
        pod_resources_socket: Path | str | None = None,
        dra: DraSettings | None = None,
    ) -> None:
        """`pod_resources_socket`: where to serve the PodResources API. By default the kubelet's layout:
        `<root>/pod-resources/kubelet.sock` when `plugin_dir` is `<root>/device-plugins`, and not at all
        for any other directory (two simulators in sibling directories would share the socket)."""
        self.plugin_dir = Path(plugin_dir).absolute()
        if pod_resources_socket is None and self.plugin_dir.name == _DEVICE_PLUGINS_DIR:
            pod_resources_socket = self.plugin_dir.parent / POD_RESOURCES_DIR / POD_RESOURCES_SOCKET
        self.pod_resources_socket = None if pod_resources_socket is None else Path(pod_resources_socket)
        self.dial_timeout = dial_timeout
        self.stop_grace_period = stop_grace_period
        self.prestart_timeout = prestart_timeout
        self._log = EventLog()
        if on_event is not None:
            self._log.subscribe(on_event)
        self._rpcs: list[RpcRecord] = []
        self._node = NodeStatus()
        self._manager: DeviceManager | None = None
        self._server: RegistrationServer | None = None
        self._pod_resources: PodResourcesServer | None = None
        self._pods: dict[str, Pod] = {}
        self._run_options: dict[tuple[str, str], RunContainerOptions] = {}
        self._admission = asyncio.Lock()  # the kubelet admits pods one at a time
        self._dra: DraKubelet | None = None
        if dra is not None:
            root = Path(dra.root).absolute() if dra.root is not None else self.plugin_dir.parent
            self._dra = DraKubelet(dra, root, self._log, self._rpcs.append)

    # ---- lifecycle ------------------------------------------------------------------------------

    @property
    def socket_path(self) -> Path:
        return self.plugin_dir / KUBELET_SOCKET

    @property
    def running(self) -> bool:
        return self._server is not None

    async def start(self, *, keep_plugin_sockets: bool = False) -> None:
        """Start like the kubelet: read the checkpoint, wipe the directory but for it, serve kubelet.sock.

        `keep_plugin_sockets`: skip the wipe, as a kubelet does whose clean-up failed (it logs and goes on);
        plugins then still serve on their old sockets and only kubelet.sock's new identity tells them that
        the kubelet they registered with is gone.
        """
        if self.running:
            raise RuntimeError("the kubelet simulator is already running")
        if len(str(self.socket_path).encode()) > MAX_SOCKET_PATH:
            raise ValueError(
                f"{self.socket_path} is longer than {MAX_SOCKET_PATH} bytes, too long for a unix "
                "socket; use a shorter directory"
            )
        if _kubelet_answers(self.socket_path):
            raise RuntimeError(
                f"something already serves {self.socket_path} (a real kubelet or another simulator); "
                "starting here would delete its plugins' sockets, so pick another directory"
            )
        manager = DeviceManager(
            self.plugin_dir,
            self._log,
            active_pods=lambda: self._pods.values(),
            on_change=self._sync_node_status,
            stop_grace_period=self.stop_grace_period,
            prestart_timeout=self.prestart_timeout,
        )
        restored = manager.read_checkpoint()
        if not restored and self._node.reset():
            self._emit_node_status(set(self._node.capacity))
        server = RegistrationServer(
            self.plugin_dir,
            manager,
            self._log,
            self._rpcs.append,
            dial_timeout=self.dial_timeout,
            cleanup=not keep_plugin_sockets,
        )
        try:
            await server.start()
        except BaseException:
            manager.close()
            raise
        self._manager, self._server = manager, server
        if self.pod_resources_socket is not None:
            self._pod_resources = PodResourcesServer(
                self.pod_resources_socket, pods=lambda: self._pods.values(), manager=lambda: self._manager
            )
            try:
                await self._pod_resources.start()
            except BaseException:
                await self.stop()
                raise
        restored_claims = 0
        if self._dra is not None:
            try:
                restored_claims = await self._dra.start(
                    lambda: {p.uid for p in self._pods.values()}, lambda: list(self._pods.values())
                )
            except BaseException:
                await self.stop()
                raise
        waiting = sorted(r for r in manager.resources() if not self.registered(r))
        self._log.emit(
            EventKind.KUBELET_STARTED,
            f"kubelet serving {self.socket_path}"
            + (f"; from the checkpoint, waiting for {', '.join(waiting)} (capacity 0)" if waiting else "")
            + (f"; DRA plugins on {self._dra.registry_dir}" if self._dra is not None else "")
            + (f", {restored_claims} claim(s) from dra_manager_state" if restored_claims else ""),
            socket=str(self.socket_path),
            checkpoint=restored,
            waiting=waiting,
            dra_claims=restored_claims,
            kept_plugin_sockets=keep_plugin_sockets,
        )
        self._sync_node_status()

    async def stop(self) -> None:
        """Kubelet shutdown: kubelet.sock goes away and every plugin is disconnected (devices unhealthy)."""
        if self._server is None:
            return
        server, self._server = self._server, None
        await server.stop()
        if self._dra is not None:
            await self._dra.stop()
        if self._pod_resources is not None:
            await self._pod_resources.stop()
            self._pod_resources = None
        if self._manager is not None:
            self._manager.close()
        self._log.emit(EventKind.KUBELET_STOPPED, "kubelet stopped", socket=str(self.socket_path))

    async def restart(self, *, keep_plugin_sockets: bool = False) -> None:
        """Stop, then start on the same directory: plugin sockets are deleted (unless `keep_plugin_sockets`,
        see `start`) and registered resources come back from the checkpoint with capacity 0 until their
        plugins register again."""
        await self.stop()
        await self.start(keep_plugin_sockets=keep_plugin_sockets)

    async def __aenter__(self) -> KubeletSimulator:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # ---- what the node shows --------------------------------------------------------------------

    def capacity(self) -> dict[str, int]:
        self._sync_node_status()
        return dict(self._node.capacity)

    def allocatable(self) -> dict[str, int]:
        self._sync_node_status()
        return dict(self._node.allocatable)

    def devices(self, resource: str) -> dict[str, DeviceState]:
        return self._manager.devices(resource) if self._manager else {}

    def registered(self, resource: str) -> bool:
        """True while a plugin for `resource` is registered and its endpoint not stopped."""
        endpoint = self._manager.endpoint(resource) if self._manager else None
        return endpoint is not None and not endpoint.stopped

    def options(self, resource: str) -> api_pb2.DevicePluginOptions | None:
        """The options GetDevicePluginOptions returned at registration (what the kubelet acts on)."""
        endpoint = self._manager.endpoint(resource) if self._manager else None
        return endpoint.options if endpoint else None

    def _sync_node_status(self) -> None:
        if self._manager is not None:
            changed = self._node.apply(*self._manager.get_capacity())
            if changed:
                self._emit_node_status(changed)

    def _emit_node_status(self, changed: set[str]) -> None:
        parts = [
            f"{r} capacity {self._node.capacity[r]}, allocatable {self._node.allocatable[r]}"
            for r in sorted(changed)
        ]
        self._log.emit(
            EventKind.NODE_STATUS,
            "node status: " + "; ".join(parts),
            changed.pop() if len(changed) == 1 else None,
            capacity=dict(self._node.capacity),
            allocatable=dict(self._node.allocatable),
        )

    # ---- events, RPCs, waiting ------------------------------------------------------------------

    def subscribe(self, listener: EventListener) -> None:
        self._log.subscribe(listener)

    def events(
        self, kind: EventKind | None = None, *, resource: str | None = None, after: int = 0
    ) -> list[SimEvent]:
        return self._log.events(kind, resource=resource, after=after)

    @property
    def last_seq(self) -> int:
        return self._log.last_seq

    def rpc_calls(self, method: str | None = None, *, resource: str | None = None) -> list[RpcRecord]:
        """Calls the kubelet made to plugins, oldest first: GetDevicePluginOptions, ListAndWatch (opened),
        GetPreferredAllocation, Allocate, PreStartContainer."""
        return [
            r
            for r in self._rpcs
            if (method is None or r.method == method) and (resource is None or r.resource == resource)
        ]

    async def wait_for(self, predicate: Callable[[], bool], timeout: float) -> None:
        """Return once `predicate()` holds, re-checked after every state change; TimeoutError if not."""
        await self._log.wait_for(predicate, timeout)

    async def wait_for_event(
        self,
        kind: EventKind,
        *,
        resource: str | None = None,
        after: int = 0,
        where: Callable[[SimEvent], bool] | None = None,
        timeout: float,
    ) -> SimEvent:
        """The first `kind` event (of `resource`, satisfying `where`) newer than seq `after`.

        Take `last_seq` as the mark before acting, e.g. to time an XID until the kubelet sees it:
        `await sim.wait_for_event(EventKind.DEVICES_UPDATED, after=mark, where=lambda e: uuid in
        e.data["unhealthy"], timeout=5)`, then compare the event's `time` with `time.monotonic()` taken then.
        """
        return await self._log.wait_for_event(
            kind, resource=resource, after=after, where=where, timeout=timeout
        )

    # ---- pods -----------------------------------------------------------------------------------

    @property
    def pods(self) -> dict[str, Pod]:
        return dict(self._pods)

    async def admit(self, pod: Pod, *, start: bool = True) -> PodAllocation:
        """Admit a pod as the kubelet does (devices per container, init containers first), then start its
        containers (PreStartContainer where the plugin asks for it) unless `start` is False.

        AdmissionError: rejected; nothing stays allocated. ContainerStartError: admitted but a container
        could not start; the pod keeps its devices until `remove_pod`.
        """
        manager = self._require_running()
        async with self._admission:
            if pod.name in self._pods:
                raise ValueError(f"pod {pod.name} is already admitted; remove_pod() it first")
            manager.set_pending_admission(pod)
            try:
                for container, is_init in pod.in_start_order():
                    await manager.allocate(pod, container, is_init)
                held = manager.allocated() if manager.has_pod(pod.uid) else None
                check_node_fit(pod, self._pods.values(), self.allocatable(), held)
            except (DeviceManagerError, AdmissionError) as err:
                manager.release_pod(pod.uid)
                error = err if isinstance(err, AdmissionError) else AdmissionError.unexpected(err)
                self._log.emit(
                    EventKind.POD_REJECTED,
                    f"pod {pod.name} rejected ({error.reason}): {error}",
                    pod=pod.name,
                    reason=error.reason,
                    error=str(error),
                )
                raise error from None
            finally:
                manager.set_pending_admission(None)
            self._pods[pod.name] = pod
            allocation = self.allocation(pod.name)
            held_text = "; ".join(
                f"{c.name}: {r} [{describe_ids(ids, limit=8)}]"
                for c in allocation.containers.values()
                for r, ids in c.devices.items()
            )
            self._log.emit(
                EventKind.POD_ADMITTED,
                f"pod {pod.name} admitted" + (f": {held_text}" if held_text else " (no devices)"),
                pod=pod.name,
                devices={
                    c.name: {r: list(ids) for r, ids in c.devices.items()}
                    for c in allocation.containers.values()
                },
            )
        if start:
            await self.prepare_resources(pod.name)
            for container, _ in pod.in_start_order():
                await self.start_container(pod.name, container.name)
        return self.allocation(pod.name)

    # ---- dynamic resources ---------------------------------------------------------------------

    @property
    def dra(self) -> DraKubelet | None:
        return self._dra

    async def prepare_resources(self, pod_name: str) -> None:
        """NodePrepareResources for the pod's claims, as the kubelet does before its containers start
        (admit() does it when starting). PrepareError: the pod stays admitted, its containers unstarted;
        call again to retry, as the kubelet's next pod sync would."""
        pod = self._pod(pod_name)
        if not pod.claim_names():
            return
        dra = self._require_dra()
        try:
            await dra.manager.prepare(pod)
        except DraError as err:
            error = PrepareError(
                "FailedPrepareDynamicResources", f"Failed to prepare dynamic resources: {err}", str(err)
            )
            self._log.emit(
                EventKind.PREPARE_FAILED, f"pod {pod_name}: {error.message}", pod=pod_name, error=str(err)
            )
            raise error from None

    async def unprepare_resources(self, pod_name: str) -> None:
        """NodeUnprepareResources for the pod's claims that no other pod uses (the pod has terminated)."""
        pod = self._pod(pod_name)
        if not pod.claim_names():
            return
        dra = self._require_dra()
        try:
            await dra.manager.unprepare(pod)
        except DraError as err:
            self._log.emit(EventKind.UNPREPARE_FAILED, f"pod {pod_name}: {err}", pod=pod_name, error=str(err))
            raise PodError("FailedUnprepareDynamicResources", str(err), str(err)) from None

    async def terminate_pod(self, pod_name: str) -> None:
        """The pod ends: its claims are unprepared, then its devices freed (remove_pod)."""
        await self.unprepare_resources(pod_name)
        self.remove_pod(pod_name)

    async def reconcile_dra(self) -> None:
        """One pass of the DRA manager's reconcile loop: unprepare claims whose pods are all gone."""
        await self._require_dra().manager.reconcile(lambda: {p.uid for p in self._pods.values()})

    def dra_plugins(self, driver: str | None = None) -> list[DraPlugin]:
        """Registered DRA plugins (the newest last per driver), with the service each was given."""
        plugins = self._dra.plugins.all() if self._dra else []
        return [p for p in plugins if driver is None or p.driver == driver]

    def dra_claims(self) -> list[ClaimInfo]:
        """The DRA manager's claim-info cache (what dra_manager_state holds, plus `prepared`)."""
        return self._dra.manager.claims() if self._dra else []

    def _require_dra(self) -> DraKubelet:
        if self._dra is None:
            raise RuntimeError("this kubelet simulator runs without DRA; pass dra=DraSettings(...)")
        return self._dra

    async def start_container(self, pod_name: str, container_name: str) -> RunContainerOptions:
        """(Re)start one container: PreStartContainer if required, then its merged run options."""
        manager = self._require_running()
        pod = self._pod(pod_name)
        container, is_init = pod.container(container_name)
        try:
            options = await manager.run_container_options(pod, container, is_init)
            if self._dra is not None and (container.claims or pod.extended_claim is not None):
                cdi = self._dra.manager.cdi_devices(pod, container)
                options = dataclasses.replace(options, cdi_devices=(*options.cdi_devices, *cdi))
        except (DeviceManagerError, DraError) as err:
            error = ContainerStartError("CreateContainerConfigError", str(err), str(err))
            self._log.emit(
                EventKind.CONTAINER_START_FAILED,
                f"container {pod_name}/{container_name} failed to start: {err}",
                pod=pod_name,
                container=container_name,
                error=str(err),
            )
            raise error from None
        self._run_options[(pod.uid, container_name)] = options
        self._log.emit(
            EventKind.CONTAINER_STARTED,
            f"container {pod_name}/{container_name} started: {len(options.envs)} envs, "
            f"{len(options.devices)} devices, {len(options.mounts)} mounts, "
            f"{len(options.cdi_devices)} CDI devices",
            pod=pod_name,
            container=container_name,
        )
        return options

    def allocation(self, pod_name: str) -> PodAllocation:
        """An admitted pod's devices and Allocate responses per container (run options once started)."""
        pod = self._pod(pod_name)
        containers: dict[str, ContainerAllocation] = {}
        for container, is_init in pod.in_start_order():
            held = self._manager.container_allocations(pod.uid, container.name) if self._manager else {}
            containers[container.name] = ContainerAllocation(
                container.name,
                is_init,
                {r: tuple(sorted(a.ids())) for r, a in held.items()},
                {r: a.response for r, a in held.items()},
                self._run_options.get((pod.uid, container.name)),
            )
        return PodAllocation(pod, containers)

    def remove_pod(self, pod_name: str) -> None:
        """The pod is gone: its devices are free for the next admission."""
        pod = self._pod(pod_name)
        freed = self.allocation(pod_name)
        del self._pods[pod_name]
        for container, _ in pod.in_start_order():
            self._run_options.pop((pod.uid, container.name), None)
        if self._manager is not None:
            self._manager.release_pod(pod.uid)
        resources = {r for c in freed.containers.values() for r in c.devices}
        counts = ", ".join(f"{len(freed.devices(r))} {r}" for r in sorted(resources))
        self._log.emit(
            EventKind.POD_REMOVED,
            f"pod {pod_name} removed" + (f", freed {counts}" if counts else ""),
            pod=pod_name,
        )

    def _pod(self, name: str) -> Pod:
        try:
            return self._pods[name]
        except KeyError:
            raise KeyError(f"no admitted pod named {name!r}") from None

    def _require_running(self) -> DeviceManager:
        if self._manager is None or not self.running:
            raise RuntimeError("the kubelet simulator is not running; call start() first")
        return self._manager


def _kubelet_answers(path: Path) -> bool:
    """Whether a live server accepts connections on the unix socket at `path` (a unix connect is instant)."""
    if not path.is_socket():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True

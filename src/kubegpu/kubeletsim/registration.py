"""The kubelet's `v1beta1.Registration` service on kubelet.sock (Go: plugin/v1beta1/server.go, handler.go).

Register runs the kubelet's checks in its order (version, resource name, dial back, options), then keeps
one client per resource name and reads its ListAndWatch stream in a background task. Faithful to v1.32
also where that is surprising: when a stream ends, the client is looked up *by resource name*, so the end
of an old registration's stream tears down a newer registration of the same resource.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import stat
from pathlib import Path

import grpc

from kubegpu.api.v1beta1 import api_pb2, api_pb2_grpc
from kubegpu.common.k8s_names import is_extended_resource_name

from .checkpoint import CHECKPOINT_FILE
from .devicemanager import DeviceManager
from .endpoint import DIAL_TIMEOUT, PluginClient, RpcRecorder, plugin_socket_path
from .errors import DeviceManagerError, go_quote
from .events import EventKind, EventLog

log = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"
SUPPORTED_VERSIONS = ("v1beta1",)


def cleanup_plugin_directory(directory: Path) -> None:
    """Delete every non-directory entry except the checkpoint, as the kubelet does when it starts."""
    for entry in directory.iterdir():
        if entry.name == CHECKPOINT_FILE:
            continue
        try:
            if stat.S_ISDIR(entry.lstat().st_mode):
                continue
            entry.unlink()
        except OSError as err:
            log.error("cleaning the device-plugin directory: %s", err)


class RegistrationServer(api_pb2_grpc.RegistrationServicer):
    def __init__(
        self,
        directory: Path,
        manager: DeviceManager,
        events: EventLog,
        record: RpcRecorder,
        *,
        dial_timeout: float = DIAL_TIMEOUT,
        cleanup: bool = True,
    ) -> None:
        self.directory = directory
        self._cleanup = cleanup
        self._manager = manager
        self._events = events
        self._record = record
        self._dial_timeout = dial_timeout
        self._server: grpc.aio.Server | None = None
        self._clients: dict[str, PluginClient] = {}  # the registered client per resource name
        self._open: set[PluginClient] = set()  # every live connection, replaced registrations included
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def socket_path(self) -> Path:
        return self.directory / KUBELET_SOCKET

    async def start(self) -> None:
        self.directory.mkdir(mode=0o750, parents=True, exist_ok=True)
        if self._cleanup:
            cleanup_plugin_directory(self.directory)
        server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix:{self.socket_path.absolute()}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        """Kubelet shutdown: stop serving (removes kubelet.sock) and disconnect every plugin."""
        if self._server is not None:
            await self._server.stop(None)
            self._server = None
        for resource, client in list(self._clients.items()):
            del self._clients[resource]
            await self._close(client)
            self._manager.plugin_disconnected(resource, EventKind.DISCONNECTED, "kubelet stopped")
        for client in list(self._open):
            await self._close(client)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def Register(
        self,
        request: api_pb2.RegisterRequest,
        context: grpc.aio.ServicerContext[api_pb2.RegisterRequest, api_pb2.Empty],
    ) -> api_pb2.Empty:
        resource = request.resource_name
        try:
            if request.version not in SUPPORTED_VERSIONS:
                supported = "[" + " ".join(go_quote(v) for v in SUPPORTED_VERSIONS) + "]"
                raise DeviceManagerError(
                    f"requested API version {go_quote(request.version)} is not supported by kubelet. "
                    f"Supported version is {supported}"
                )
            if not is_extended_resource_name(resource):
                raise DeviceManagerError(f"the ResourceName {go_quote(resource)} is invalid")
            await self._connect_client(resource, plugin_socket_path(self.directory, request.endpoint))
        except DeviceManagerError as err:
            self._events.emit(
                EventKind.REGISTRATION_REJECTED,
                f"registration of {go_quote(resource)} rejected: {err}",
                resource,
                version=request.version,
                endpoint=request.endpoint,
                error=str(err),
            )
            await context.abort(grpc.StatusCode.UNKNOWN, str(err))
        return api_pb2.Empty()

    async def _connect_client(self, resource: str, socket: Path) -> None:
        client = PluginClient(resource, socket, self._record)
        self._clients[resource] = client
        self._open.add(client)
        try:
            await client.dial(self._dial_timeout)
            options = await client.get_options()
        except BaseException:
            # Go deregisters by name, even when the name belongs to an older, still running client by now.
            self._clients.pop(resource, None)
            await self._close(client)
            raise
        self._manager.plugin_connected(resource, client, options)
        task = asyncio.create_task(self._run_client(resource, client), name=f"ListAndWatch {resource}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_client(self, resource: str, client: PluginClient) -> None:
        why = await client.run(lambda response: self._manager.plugin_list_and_watch(resource, response))
        current = self._clients.pop(resource, None)
        if client is not current:
            await self._close(client)
        if current is None:
            return  # the kubelet itself disconnected it
        await self._close(current)
        note = (
            "" if current is client else " (stream of an earlier registration; v1.32 drops the current one)"
        )
        self._manager.plugin_disconnected(
            resource, EventKind.STREAM_ENDED, f"ListAndWatch ended unexpectedly: {why}{note}"
        )

    async def _close(self, client: PluginClient) -> None:
        self._open.discard(client)
        with contextlib.suppress(Exception):
            await client.close()

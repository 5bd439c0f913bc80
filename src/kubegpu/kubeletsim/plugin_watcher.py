"""The kubelet's plugin watcher for DRA drivers (pkg/kubelet/pluginmanager), on `<root>/plugins_registry`.

It scans the directory (and its subdirectories; names starting with "." are skipped) for unix sockets.
For a new socket it dials it (10 s), asks `GetInfo` (1 s), checks the type ("DRAPlugin"; any other type
has no handler here), validates the advertised services and registers the plugin with the plugin store,
then tells the plugin the outcome with `NotifyRegistrationStatus` (5 s) - with the kubelet's error texts.
A failed registration is tried again with exponential back-off (0.5 s doubling up to 2 min 2 s), as the
plugin manager's reconciler does. A socket that goes away, or is replaced by a new one, deregisters its
plugin. The real watcher uses fsnotify; polling every `poll_interval` finds the same sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from kubegpu.api.pluginregistration.v1 import api_pb2 as reg_pb2
from kubegpu.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from kubegpu.common.backoff import Backoff

from .dra_plugins import DraPlugin, PluginStore, PluginValidationError, choose_service
from .endpoint import RpcRecord, RpcRecorder
from .errors import go_rpc_error
from .events import EventKind, EventLog

log = logging.getLogger(__name__)

DRA_PLUGIN_TYPE = "DRAPlugin"
REGISTRY_DIR = "plugins_registry"
DIAL_TIMEOUT = 10.0
GET_INFO_TIMEOUT = 1.0
NOTIFY_TIMEOUT = 5.0


@dataclass(frozen=True, slots=True)
class _Socket:
    path: str
    identity: tuple[int, int]  # (inode, mtime): a re-created socket is a new plugin


@dataclass
class _Entry:
    socket: _Socket
    driver: str | None = None  # set once registered
    backoff: Backoff | None = None
    retry_at: float = 0.0
    task: asyncio.Task[None] | None = None


class PluginWatcher:
    def __init__(
        self,
        directory: Path,
        store: PluginStore,
        events: EventLog,
        record: RpcRecorder,
        *,
        on_change: Callable[[str], None],
        call_timeout: float,
        dial_timeout: float = DIAL_TIMEOUT,
        get_info_timeout: float = GET_INFO_TIMEOUT,
        notify_timeout: float = NOTIFY_TIMEOUT,
        poll_interval: float = 0.05,
    ) -> None:
        self.directory = directory
        self._store = store
        self._events = events
        self._record = record
        self._on_change = on_change
        self._call_timeout = call_timeout
        self._dial_timeout = dial_timeout
        self._get_info_timeout = get_info_timeout
        self._notify_timeout = notify_timeout
        self._poll_interval = poll_interval
        self._entries: dict[str, _Entry] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.directory.mkdir(mode=0o750, parents=True, exist_ok=True)
        self._task = asyncio.create_task(self._watch(), name="DRA plugin watcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for entry in list(self._entries.values()):
            if entry.task is not None:
                entry.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await entry.task
        for plugin in self._store.all():
            await plugin.close()
        self._store.clear()  # a stopped kubelet forgets its plugins; they register again at start
        self._entries.clear()

    # ---- scanning ---------------------------------------------------------------------------------

    def _scan(self) -> dict[str, _Socket]:
        found: dict[str, _Socket] = {}
        for dirpath, dirnames, filenames in os.walk(self.directory):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for name in filenames:
                if name.startswith("."):
                    continue
                path = os.path.join(dirpath, name)
                try:
                    info = os.lstat(path)
                except OSError:
                    continue
                if stat.S_ISSOCK(info.st_mode):
                    found[path] = _Socket(path, (info.st_ino, info.st_mtime_ns))
        return found

    async def _watch(self) -> None:
        while True:
            await self.reconcile()
            await asyncio.sleep(self._poll_interval)

    async def reconcile(self) -> None:
        """One pass: deregister what went away (or was replaced), register what is new or due a retry."""
        found = self._scan()
        for path, entry in list(self._entries.items()):
            current = found.get(path)
            if current is None or current.identity != entry.socket.identity:
                await self._forget(entry, "socket removed" if current is None else "socket replaced")
                del self._entries[path]
        now = time.monotonic()
        for path, sock in found.items():
            known = self._entries.setdefault(path, _Entry(sock))
            busy = known.task is not None and not known.task.done()
            if known.driver is None and not busy and now >= known.retry_at:
                known.task = asyncio.create_task(self._register(known), name=f"register {path}")

    async def _forget(self, entry: _Entry, why: str) -> None:
        if entry.task is not None and not entry.task.done():
            entry.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await entry.task
        if entry.driver is None:
            return
        plugin = self._store.remove(entry.driver, entry.socket.path)
        if plugin is not None:
            await plugin.close()
            self._events.emit(
                EventKind.DRA_PLUGIN_DEREGISTERED,
                f"DRA driver {entry.driver} deregistered ({why}: {entry.socket.path})",
                entry.driver,
                socket=entry.socket.path,
            )
            self._on_change(entry.driver)

    # ---- registration (operation_generator.GenerateRegisterPluginFunc) -----------------------------

    async def _register(self, entry: _Entry) -> None:
        path = entry.socket.path
        channel = grpc.aio.insecure_channel(f"unix:{path}", options=[("grpc.default_authority", "localhost")])
        try:
            error = await self._try_register(entry, channel)
        finally:
            await channel.close(grace=None)
        if error is None:
            entry.backoff = None
            return
        entry.backoff = entry.backoff or Backoff(initial=0.5, maximum=122.0)
        entry.retry_at = time.monotonic() + entry.backoff.next_delay()
        self._events.emit(
            EventKind.DRA_PLUGIN_REJECTED, error, entry.driver or None, socket=path, error=error
        )

    async def _try_register(self, entry: _Entry, channel: grpc.aio.Channel) -> str | None:
        """None when registered, otherwise the kubelet's error text."""
        path = entry.socket.path
        try:
            await asyncio.wait_for(channel.channel_ready(), self._dial_timeout)
        except TimeoutError:
            return f"RegisterPlugin error -- dial failed at socket {path}, err: context deadline exceeded"
        stub = reg_grpc.RegistrationStub(channel)
        request = reg_pb2.InfoRequest()
        started = time.monotonic()
        try:
            info = await stub.GetInfo(request, timeout=self._get_info_timeout)
        except grpc.aio.AioRpcError as err:
            text = go_rpc_error(err)
            self._log_rpc(os.path.basename(path), "GetInfo", request, None, text, started)
            where = f"at socket {path}, err: {text}"
            return f"RegisterPlugin error -- failed to get plugin info using RPC GetInfo {where}"
        self._log_rpc(info.name, "GetInfo", request, info, None, started)
        if info.type != DRA_PLUGIN_TYPE:
            why = (
                f"RegisterPlugin error -- no handler registered for plugin type: {info.type} at socket {path}"
            )
            await self._notify(stub, info.name, False, why)
            return why
        endpoint = info.endpoint or path
        try:
            service = choose_service(self._store.kubelet, info.name, endpoint, list(info.supported_versions))
        except PluginValidationError as err:
            await self._notify(
                stub, info.name, False, f"RegisterPlugin error -- plugin validation failed with err: {err}"
            )
            return f"RegisterPlugin error -- plugin validation failed with err: {err}"
        plugin = DraPlugin(info.name, endpoint, service, path, self._record, self._call_timeout)
        try:
            replaced = self._store.add(plugin)
        except PluginValidationError as err:
            await plugin.close()
            why = f"RegisterPlugin error -- plugin registration failed with err: {err}"
            await self._notify(stub, info.name, False, why)
            return why
        for old in replaced:
            await old.close()
            for other in self._entries.values():
                if other.socket.path == old.registration_socket:
                    other.driver = None
                    other.retry_at = float("inf")  # replaced, not failed: a 1.32 kubelet forgets it
        entry.driver = info.name
        self._events.emit(
            EventKind.DRA_PLUGIN_REGISTERED,
            f"DRA driver {info.name} registered: {service} on {endpoint}"
            + (f" (replacing {len(replaced)} earlier registration)" if replaced else ""),
            info.name,
            service=service,
            endpoint=endpoint,
            socket=path,
            supported_versions=list(info.supported_versions),
        )
        self._on_change(info.name)
        if not await self._notify(stub, info.name, True, ""):
            log.warning("DRA plugin %s registered but could not be told so", info.name)
        return None

    async def _notify(
        self, stub: reg_grpc.RegistrationAsyncStub, driver: str, registered: bool, error: str
    ) -> bool:
        request = reg_pb2.RegistrationStatus(plugin_registered=registered, error=error)
        started = time.monotonic()
        try:
            response = await stub.NotifyRegistrationStatus(request, timeout=self._notify_timeout)
        except grpc.aio.AioRpcError as err:
            self._log_rpc(driver, "NotifyRegistrationStatus", request, None, go_rpc_error(err), started)
            return False
        self._log_rpc(driver, "NotifyRegistrationStatus", request, response, None, started)
        return True

    def _log_rpc(
        self, driver: str, method: str, request: object, response: object, error: str | None, started: float
    ) -> None:
        self._record(RpcRecord(started, driver, method, request, response, error, time.monotonic() - started))  # type: ignore[arg-type]

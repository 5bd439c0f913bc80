"""Registrar: keeps every ResourceServer serving and registered with the current kubelet.

It does not react to inotify events one by one. Events (and a slow safety timer) only wake a reconcile pass
that compares what is with what should be:
- each server runs and its socket file is the one it bound (the kubelet deletes sockets when it restarts);
- each server is registered with the kubelet that owns the current kubelet.sock, identified by the socket
  file's inode and ctime (a restarted kubelet creates a new one).
A server registered with an older kubelet is restarted before it registers again, so the old connection's
stream is gone first (the v1.32 kubelet can otherwise tear down the new registration when the old stream
ends). A server that restarted on its own (a resource outgrowing its receive limit) registers its new
incarnation. Our own socket deletions wake the loop too, and the pass then finds nothing to do: idempotent.

The plugin directory, when the kubelet has not made it yet, is created 0750 as the kubelet makes it,
whatever the umask.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from asyncinotify import Inotify, Mask

from kubegpu.api.v1beta1 import api_pb2, api_pb2_grpc
from kubegpu.common.backoff import Backoff
from kubegpu.common.dirs import ensure_dir
from kubegpu.plugin.server import OPTIONS, ResourceServer

if TYPE_CHECKING:
    from kubegpu.api.v1beta1.api_pb2_grpc import RegistrationAsyncStub

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
PLUGIN_DIR_MODE = 0o750  # what the kubelet gives the directory
REGISTER_TIMEOUT_S = 15.0  # the kubelet may spend up to 10 s dialing back before it answers
SAFETY_INTERVAL_S = 5.0  # reconcile even without events, in case one was missed
CLOSE_TIMEOUT_S = 2.0

KubeletId = tuple[int, int]


@dataclass(slots=True)
class Registration:
    """What the registrar knows about one resource's registration."""

    registered_with: KubeletId | None = None
    incarnation: int = 0  # the server's incarnation that registration was for
    registered_at: float | None = None  # time.monotonic() of the last success
    registrations: int = 0
    failures: int = 0
    last_error: str | None = None


def registration_backoff() -> Backoff:
    """Retries of serving and registering: 20 ms doubling to 5 s, each wait 20% either side for jitter."""
    return Backoff(initial=0.02, maximum=5.0, jitter=(0.8, 1.2))


def _failed(channel: grpc.aio.Channel) -> bool:
    """A connection attempt failed: the channel would now wait out gRPC's reconnect back-off (1 s)."""
    return channel.get_state() in (
        grpc.ChannelConnectivity.TRANSIENT_FAILURE,
        grpc.ChannelConnectivity.SHUTDOWN,
    )


def kubelet_identity(path: Path) -> KubeletId | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_ctime_ns)


class Registrar:
    def __init__(
        self,
        plugin_dir: Path,
        kubelet_socket: Path | None,
        *,
        on_registered: Callable[[str, float], None] | None = None,
        spawn: Callable[[str, Callable[[], Awaitable[None]]], asyncio.Task[None]] | None = None,
    ) -> None:
        self.plugin_dir = plugin_dir
        self._spawn = spawn  # runs the two loops (the daemon's supervisor restarts them); plain tasks if None
        self.kubelet_socket = kubelet_socket  # None: serve without registering (NVIDIA's --kubelet-socket "")
        self._on_registered = on_registered
        self._servers: list[ResourceServer] = []
        self.state: dict[str, Registration] = {}
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._backoff = registration_backoff()
        self._woken_at = time.monotonic()
        self._lock = asyncio.Lock()  # one reconcile pass at a time: the loop and set_servers both run them

    @property
    def servers(self) -> Sequence[ResourceServer]:
        return self._servers

    def all_registered(self) -> bool:
        if self.kubelet_socket is None:
            return all(s.running for s in self._servers)
        current = kubelet_identity(self.kubelet_socket)
        return current is not None and all(self._registered(s, current) for s in self._servers)

    def _registered(self, server: ResourceServer, kubelet: KubeletId | None) -> bool:
        reg = self.state[server.name]
        return server.running and reg.registered_with == kubelet and reg.incarnation == server.incarnation

    def registration(self, resource: str) -> Registration | None:
        return self.state.get(resource)

    def current_kubelet(self) -> KubeletId | None:
        """The identity of the kubelet behind kubelet.sock now; None when there is none (or no socket)."""
        return kubelet_identity(self.kubelet_socket) if self.kubelet_socket is not None else None

    async def set_servers(self, servers: Sequence[ResourceServer]) -> None:
        """Replace the served set (config reload, re-discovery).

        Servers that are kept (the same objects) keep serving and stay registered; the others stop before
        any new one starts, so the kubelet never sees two endpoints for one resource.
        """
        async with self._lock:
            keep = {id(s) for s in servers}
            kept = {s.name for s in self._servers if id(s) in keep}
            for old in self._servers:
                if id(old) not in keep:
                    await old.stop()
            self.state = {s.name: self.state[s.name] if s.name in kept else Registration() for s in servers}
            self._servers = list(servers)
            for server in servers:
                server.on_outgrown = self.wake
        await self.reconcile()

    def wake(self) -> None:
        self._woken_at = time.monotonic()
        self._backoff.reset()
        self._wake.set()

    async def start(self) -> None:
        ensure_dir(self.plugin_dir, PLUGIN_DIR_MODE)
        if self._spawn is not None:
            spawn = self._spawn
            self._tasks = [spawn("registrar-watch", self._watch), spawn("registrar-loop", self._loop)]
        else:
            self._tasks = [
                asyncio.create_task(self._watch(), name="registrar-watch"),
                asyncio.create_task(self._loop(), name="registrar-loop"),
            ]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            # Bounded: shutdown must not hang on a gRPC call that does not honour cancellation.
            _, pending = await asyncio.wait(self._tasks, timeout=CLOSE_TIMEOUT_S)
            for task in pending:
                frames = "".join(
                    f"\n  {f.f_code.co_filename}:{f.f_lineno} {f.f_code.co_name}" for f in task.get_stack()
                )
                log.warning(
                    "%s did not end within %.0f s of cancellation; abandoning it:%s",
                    task.get_name(),
                    CLOSE_TIMEOUT_S,
                    frames,
                )
        self._tasks = []
        for server in self._servers:
            log.debug("stopping %s", server.name)
            await server.stop()
        log.debug("registrar closed")

    async def _loop(self) -> None:
        while True:
            try:
                retry_in = await self.reconcile()
            except Exception:  # the loop must outlive any one bad pass
                log.exception("reconcile pass failed; retrying")
                retry_in = self._backoff.next_delay()
            timeout = SAFETY_INTERVAL_S if retry_in is None else retry_in
            # asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a cancellation that arrives as
            # the wake-up does, and close() then waited in vain for this loop to end.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            self._wake.clear()

    async def reconcile(self) -> float | None:
        """One pass; returns seconds until a retry is due, or None when everything is as it should be."""
        async with self._lock:
            return await self._reconcile()

    async def _reconcile(self) -> float | None:
        """Serve every server that must (re)start, all at once; then register every one the current kubelet
        does not know, all at once over one connection, opened while the servers start. A kubelet restart
        costs one restart and one Register round trip, however many resources there are."""
        current = self.current_kubelet()
        restarts = [s for s in self._servers if self._must_serve(s, current)]
        early: grpc.aio.Channel | None = None
        if current is not None and restarts:
            # Connect to the kubelet while the servers start; Register reuses the connection.
            early = self._kubelet_channel()
            early.get_state(try_to_connect=True)
        try:
            served = await asyncio.gather(*(self._serve(s) for s in restarts))
            retry = None if all(served) else self._backoff.next_delay()
            if self.kubelet_socket is None:
                return retry
            kubelet = self.current_kubelet()  # it may have come up while we served
            pending = [s for s in self._servers if self._may_register(s, kubelet)]
            if not pending:
                return retry
            if kubelet is None:
                log.info("waiting for the kubelet: %s does not exist yet", self.kubelet_socket)
                return retry  # its creation wakes us
            if early is not None and (kubelet != current or _failed(early)):
                await early.close(grace=None)  # kubelet.sock replaced meanwhile, or the attempt failed
                early = None
            if early is None:
                early = self._kubelet_channel()
            stub: RegistrationAsyncStub = api_pb2_grpc.RegistrationStub(early)
            registered = await asyncio.gather(*(self._register(stub, s, kubelet) for s in pending))
        finally:
            if early is not None:
                await early.close(grace=None)
        if all(registered):
            self._backoff.reset()
            return retry
        return self._backoff.next_delay()

    def _may_register(self, server: ResourceServer, kubelet: KubeletId | None) -> bool:
        """Serving, not registered with this kubelet, and nothing the next pass must do first.

        Its socket must still be its own: the kubelet wipes sockets one by one, and one deleted since this
        pass began is served again by the next pass (the deletion woke us); registering it now would have
        the kubelet dial a missing socket for 10 s while this pass waits. And it must not be registered with
        another kubelet (one that restarted while this pass ran): the next pass restarts it first."""
        registered_with = self.state[server.name].registered_with
        return (
            server.running
            and not self._registered(server, kubelet)
            and registered_with in (None, kubelet)
            and server.socket_intact()
        )

    def _kubelet_channel(self) -> grpc.aio.Channel:
        assert self.kubelet_socket is not None
        return grpc.aio.insecure_channel(f"unix://{self.kubelet_socket.resolve()}")

    def _must_serve(self, server: ResourceServer, current: KubeletId | None) -> bool:
        """Whether `server` must (re)start before it can register; says why in the log."""
        reg = self.state[server.name]
        if server.outgrown:
            log.info(
                "%s has %d devices, more than its receive limit of %d KiB lets a request name: "
                "serving it again with a larger limit",
                server.name,
                len(server.resource.devices),
                server.receive_limit // 1024,
            )
        elif server.running and not server.socket_intact():
            log.warning("socket %s was removed (kubelet restart?): serving again", server.socket_path)
        elif not server.running:
            pass
        elif current is not None and reg.registered_with is not None and reg.registered_with != current:
            # The old kubelet's stream must be gone before we register with the new one (v1.32 tears the
            # new registration down when it ends later).
            log.info("kubelet restarted: restarting %s before registering again", server.name)
        else:
            return False
        reg.registered_with = None
        return True

    async def _serve(self, server: ResourceServer) -> bool:
        try:
            await server.restart()
        except (OSError, RuntimeError) as err:
            log.warning("cannot serve %s on %s (%s); retrying", server.name, server.socket_path, err)
            await server.stop()
            return False
        return True

    async def _register(
        self, stub: RegistrationAsyncStub, server: ResourceServer, kubelet: KubeletId
    ) -> bool:
        reg = self.state[server.name]
        request = api_pb2.RegisterRequest(
            version=API_VERSION,
            endpoint=server.resource.socket_name,
            resource_name=server.name,
            options=OPTIONS,
        )
        incarnation = server.incarnation
        try:
            await stub.Register(request, timeout=REGISTER_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            reg.failures += 1
            reg.last_error = f"{err.code().name}: {err.details()}"
            log.warning(
                "registering %s with the kubelet failed (%s); retrying with back-off",
                server.name,
                reg.last_error,
            )
            return False
        reg.registered_with = kubelet
        reg.incarnation = incarnation
        reg.registered_at = time.monotonic()
        reg.registrations += 1
        reg.last_error = None
        latency = reg.registered_at - self._woken_at
        log.info(
            "registered %s with the kubelet (endpoint %s, %d devices)",
            server.name,
            server.resource.socket_name,
            len(server.resource.devices),
        )
        if self._on_registered is not None:
            self._on_registered(server.name, latency)
        return True

    async def _watch(self) -> None:
        """Wake the loop on any change in the plugin directory; survive the directory being removed."""
        mask = Mask.CREATE | Mask.DELETE | Mask.MOVED_TO | Mask.MOVED_FROM | Mask.DELETE_SELF | Mask.MOVE_SELF
        while True:
            # inotify cannot watch a directory that does not exist: poll for it.
            while not self.plugin_dir.is_dir():  # noqa: ASYNC110
                await asyncio.sleep(0.1)
            with Inotify() as inotify:
                try:
                    inotify.add_watch(self.plugin_dir, mask)
                except OSError as err:
                    log.warning("cannot watch %s (%s); retrying", self.plugin_dir, err)
                    await asyncio.sleep(0.5)
                    continue
                self.wake()  # anything may have changed while we were not watching
                async for event in inotify:
                    self.wake()
                    if event.mask & (Mask.DELETE_SELF | Mask.MOVE_SELF | Mask.IGNORED):
                        log.warning("device-plugin directory %s went away; waiting for it", self.plugin_dir)
                        break

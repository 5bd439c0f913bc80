"""The two gRPC servers the kubelet talks to.

- The DRA service on <plugins dir>/<driver>/dra.sock, serving both `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`
  and `...v1beta1.DRAPlugin` (same messages; v1beta1 has no share_id): a 1.32-1.33 kubelet takes v1beta1,
  1.34+ takes v1.
- Registration on <registrar dir>/<driver>-reg.sock (`pluginregistration.Registration`): GetInfo answers
  type DRAPlugin, the driver name, the DRA socket and ["v1.DRAPlugin", "v1beta1.DRAPlugin"] from memory
  (the kubelet gives it 1 s); NotifyRegistrationStatus is logged.

As the kubelet plugin helper does: the DRA socket is served before the registration socket appears (the
kubelet dials the endpoint as soon as it registers), stale sockets are removed before listening, and a clean
stop removes both.

Every service is added through `add_service` (`api.lenient`): a body that does not decode is answered
INVALID_ARGUMENT with one warning a minute, never an ERROR and a traceback per body. Every claim of a call
gets an answer: a bug while handling a call fails each of its claims with the reason (logged once with its
traceback), not the call.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from kubegpu.api import lenient
from kubegpu.api.dra.v1 import api_pb2 as dra_v1
from kubegpu.api.dra.v1 import api_pb2_grpc as dra_v1_grpc
from kubegpu.api.dra.v1beta1 import api_pb2 as dra_v1beta1
from kubegpu.api.drahealth.v1alpha1 import api_pb2 as health_pb2
from kubegpu.api.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from kubegpu.api.pluginregistration.v1 import api_pb2 as reg_pb2
from kubegpu.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from kubegpu.common.log_throttle import LogThrottle
from kubegpu.dra.claim_calls import ClaimRef, too_many
from kubegpu.dra.claims import RETRY
from kubegpu.dra.health_stream import HEALTH_SERVICE
from kubegpu.dra.prepare import Outcome, Preparer

log = logging.getLogger(__name__)
# Whoever reaches a socket decides how often these happen: one line a minute, the rest counted.
UNDECODABLE = LogThrottle(log, interval_s=60.0, burst=1)
TOO_MANY = LogThrottle(log, interval_s=60.0, burst=1)


def _internal_error(rpc: str, refs: Sequence[ClaimRef]) -> str:
    log.exception("%s failed for %d claim(s); each is answered with the error", rpc, len(refs))
    return f"internal error in the DRA driver while handling this call (logged); {RETRY}"


PLUGIN_TYPE = "DRAPlugin"
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


class _DraService(dra_v1_grpc.DRAPluginServicer):
    """NodePrepareResources / NodeUnprepareResources for one version's messages (`pb`)."""

    def __init__(self, preparer: Preparer, pb: Any) -> None:
        self.preparer = preparer
        self.pb = pb

    def _too_many(self, rpc: str, request: Any, context: grpc.aio.ServicerContext) -> bool:
        """Refuse a call over the claim limit whole (see claim_calls); True when refused."""
        message = too_many(len(request.claims))
        if message is None:
            return False
        self.preparer.failures.count({"too-many": len(request.claims)})
        TOO_MANY.warning(rpc, "refusing %s: %s", rpc, message)
        context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
        context.set_details(message)
        return True

    async def NodePrepareResources(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if self._too_many("NodePrepareResources", request, context):
            return self.pb.NodePrepareResourcesResponse()
        refs = [ClaimRef(c.namespace, c.uid, c.name) for c in request.claims]
        try:
            outcomes = await self.preparer.prepare(refs)
        except Exception:
            error = _internal_error("NodePrepareResources", refs)
            outcomes = {ref.uid: Outcome(error=error, kind="internal") for ref in refs}
        response = self.pb.NodePrepareResourcesResponse()
        for ref in refs:
            outcome = outcomes[ref.uid]
            answer = response.claims[ref.uid]
            if outcome.error:
                answer.error = outcome.error
                continue
            for device in outcome.devices:
                answer.devices.append(
                    self.pb.Device(
                        request_names=list(device.request_names),
                        pool_name=device.pool,
                        device_name=device.device,
                        cdi_device_ids=list(device.cdi_ids),
                    )
                )
        return response

    async def NodeUnprepareResources(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if self._too_many("NodeUnprepareResources", request, context):
            return self.pb.NodeUnprepareResourcesResponse()
        refs = [ClaimRef(c.namespace, c.uid, c.name) for c in request.claims]
        try:
            errors = await self.preparer.unprepare(refs)
        except Exception:
            error = _internal_error("NodeUnprepareResources", refs)
            errors = {ref.uid: error for ref in refs}
        response = self.pb.NodeUnprepareResourcesResponse()
        for ref in refs:
            answer = response.claims[ref.uid]
            answer.SetInParent()
            if errors.get(ref.uid):
                answer.error = errors[ref.uid]
        return response


class _Registration(reg_grpc.RegistrationServicer):
    def __init__(
        self, driver_name: str, endpoint: Path, versions: tuple[str, ...] = SUPPORTED_VERSIONS
    ) -> None:
        self.info = reg_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=driver_name,
            endpoint=str(endpoint),
            supported_versions=list(versions),
        )
        self.registered = False

    async def GetInfo(
        self, request: reg_pb2.InfoRequest, context: grpc.aio.ServicerContext
    ) -> reg_pb2.PluginInfo:
        return self.info

    async def NotifyRegistrationStatus(
        self, request: reg_pb2.RegistrationStatus, context: grpc.aio.ServicerContext
    ) -> reg_pb2.RegistrationStatusResponse:
        self.registered = request.plugin_registered
        if request.plugin_registered:
            log.info("registered with the kubelet as DRA driver %s", self.info.name)
        else:
            log.error(
                "the kubelet refused the registration of DRA driver %s: %s", self.info.name, request.error
            )
        return reg_pb2.RegistrationStatusResponse()


def dra_socket(plugins_dir: Path, driver_name: str) -> Path:
    return plugins_dir / driver_name / "dra.sock"


def registration_socket(registrar_dir: Path, driver_name: str) -> Path:
    return registrar_dir / f"{driver_name}-reg.sock"


class KubeletServers:
    def __init__(
        self,
        preparer: Preparer,
        *,
        driver_name: str,
        registrar_dir: Path,
        plugins_dir: Path,
        health: health_grpc.DRAResourceHealthServicer | None = None,
    ) -> None:
        self.preparer = preparer
        self.driver_name = driver_name
        self.health = health
        self.dra_socket = dra_socket(plugins_dir, driver_name)
        self.reg_socket = registration_socket(registrar_dir, driver_name)
        # The health service is advertised after the DRA services, as the kubelet plugin helper does.
        versions = SUPPORTED_VERSIONS + ((HEALTH_SERVICE,) if health is not None else ())
        self.registration = _Registration(driver_name, self.dra_socket, versions)
        self._dra: grpc.aio.Server | None = None
        self._reg: grpc.aio.Server | None = None
        self.undecodable_bodies = 0  # refused since the start, on every socket (for a metrics endpoint)

    async def start(self) -> None:
        self._dra = await self._serve(self.dra_socket, self._add_dra)
        self._reg = await self._serve(self.reg_socket, self._add_registration)
        log.info("serving DRA on %s, registration on %s", self.dra_socket, self.reg_socket)

    def add_service(self, server: grpc.aio.Server, messages: ModuleType, service: str, servicer: Any) -> None:
        """Serve `servicer` as `service` of `messages` (an api_pb2 module) on `server`: every service of
        the driver goes through here, so an undecodable body is refused the same way on every socket."""
        lenient.add_service(server, messages, service, servicer, self._refused)

    def _refused(self, method: str, request: lenient.Undecodable) -> None:
        self.undecodable_bodies += 1
        self.preparer.failures.count({"undecodable": 1})  # its claims are unknown: the call counts once
        UNDECODABLE.warning("undecodable", "refusing %s: %s", method, request.describe())

    def _add_dra(self, server: grpc.aio.Server) -> None:
        self.add_service(server, dra_v1, "DRAPlugin", _DraService(self.preparer, dra_v1))
        self.add_service(server, dra_v1beta1, "DRAPlugin", _DraService(self.preparer, dra_v1beta1))
        if self.health is not None:
            self.add_service(server, health_pb2, "DRAResourceHealth", self.health)

    def _add_registration(self, server: grpc.aio.Server) -> None:
        self.add_service(server, reg_pb2, "Registration", self.registration)

    async def _serve(self, socket: Path, add: Any) -> grpc.aio.Server:
        _clear(socket)
        server = grpc.aio.server()
        add(server)
        server.add_insecure_port(f"unix:{socket}")
        await server.start()
        return server

    async def stop(self) -> None:
        # Registration first: the kubelet sees the driver go before its endpoint does. A Prepare in flight
        # gets a moment to finish; its claim is checkpointed either way.
        for server, socket, grace in ((self._reg, self.reg_socket, 0.1), (self._dra, self.dra_socket, 1.0)):
            if server is not None:
                await server.stop(grace=grace)
            socket.unlink(missing_ok=True)
        self._reg = self._dra = None


def _clear(socket: Path) -> None:
    """Remove a socket a previous process left (bind fails on an existing path)."""
    socket.parent.mkdir(parents=True, exist_ok=True)
    if socket.exists() or socket.is_symlink():
        log.info("removing the stale socket %s", socket)
        socket.unlink()

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
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import grpc

from kubegpu.api.dra.v1 import api_pb2 as dra_v1
from kubegpu.api.dra.v1 import api_pb2_grpc as dra_v1_grpc
from kubegpu.api.dra.v1beta1 import api_pb2 as dra_v1beta1
from kubegpu.api.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from kubegpu.api.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from kubegpu.api.pluginregistration.v1 import api_pb2 as reg_pb2
from kubegpu.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from kubegpu.dra.health_stream import HEALTH_SERVICE
from kubegpu.dra.prepare import ClaimRef, Preparer

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


class _DraService(dra_v1_grpc.DRAPluginServicer):
    """NodePrepareResources / NodeUnprepareResources for one version's messages (`pb`)."""

    def __init__(self, preparer: Preparer, pb: Any) -> None:
        self.preparer = preparer
        self.pb = pb

    async def NodePrepareResources(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        refs = [ClaimRef(c.namespace, c.uid, c.name) for c in request.claims]
        outcomes = await self.preparer.prepare(refs)
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
        refs = [ClaimRef(c.namespace, c.uid, c.name) for c in request.claims]
        errors = await self.preparer.unprepare(refs)
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
        self.dra_socket = plugins_dir / driver_name / "dra.sock"
        self.reg_socket = registrar_dir / f"{driver_name}-reg.sock"
        # The health service is advertised after the DRA services, as the kubelet plugin helper does.
        versions = SUPPORTED_VERSIONS + ((HEALTH_SERVICE,) if health is not None else ())
        self.registration = _Registration(driver_name, self.dra_socket, versions)
        self._dra: grpc.aio.Server | None = None
        self._reg: grpc.aio.Server | None = None

    async def start(self) -> None:
        self._dra = await self._serve(self.dra_socket, self._add_dra)
        self._reg = await self._serve(self.reg_socket, self._add_registration)
        log.info("serving DRA on %s, registration on %s", self.dra_socket, self.reg_socket)

    def _add_dra(self, server: grpc.aio.Server) -> None:
        dra_v1_grpc.add_DRAPluginServicer_to_server(_DraService(self.preparer, dra_v1), server)
        dra_v1beta1_grpc.add_DRAPluginServicer_to_server(_DraService(self.preparer, dra_v1beta1), server)  # type: ignore[arg-type]
        if self.health is not None:
            health_grpc.add_DRAResourceHealthServicer_to_server(self.health, server)

    def _add_registration(self, server: grpc.aio.Server) -> None:
        reg_grpc.add_RegistrationServicer_to_server(self.registration, server)

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

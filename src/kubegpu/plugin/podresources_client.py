"""Client for the kubelet's PodResources API v1: which pod and container hold which device.

The kubelet serves it on /var/lib/kubelet/pod-resources/kubelet.sock (the plugin's pod must mount that
directory). `List` answers for every pod on the node; `device_holders` flattens the answer to one row per
device. Every failure is a `PodResourcesError` whose `reason` is a short, fixed word (a metric label) and
whose message names the cause and the fix, so a scrape can report it instead of failing.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import grpc

from kubegpu.api.podresources.v1 import api_pb2, api_pb2_grpc
from kubegpu.settings.choices import DEFAULT_POD_RESOURCES_SOCKET

DEFAULT_TIMEOUT_S = 1.0  # the kubelet answers from memory in milliseconds; a scrape must not wait long

# PodResourcesError.reason values (bounded: they become label values).
SOCKET_MISSING = "socket_missing"
UNAVAILABLE = "unavailable"
TIMEOUT = "timeout"
RPC_ERROR = "rpc_error"
UNEXPECTED = "unexpected"


class PodResourcesError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class DeviceHolder(NamedTuple):
    """One device held by one container, as the kubelet reports it (a tuple: a scrape makes hundreds)."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str


def device_holders(response: api_pb2.ListPodResourcesResponse) -> Iterator[DeviceHolder]:
    """One row per (container, resource, device). The kubelet repeats a device once per NUMA node it
    sits on, so rows are de-duplicated."""
    for pod in response.pod_resources:
        for container in pod.containers:
            seen: set[tuple[str, str]] = set()
            for devices in container.devices:
                for device_id in devices.device_ids:
                    key = (devices.resource_name, device_id)
                    if key not in seen:
                        seen.add(key)
                        yield DeviceHolder(
                            pod.namespace, pod.name, container.name, devices.resource_name, device_id
                        )


class PodResourcesClient:
    def __init__(
        self, socket: Path | str = DEFAULT_POD_RESOURCES_SOCKET, *, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> None:
        self.socket = Path(socket)
        self.timeout_s = timeout_s

    async def list(self) -> api_pb2.ListPodResourcesResponse:
        """`List` with a deadline; PodResourcesError on any failure."""
        self._check_socket()
        # A channel per call: a cached one would sit in gRPC's reconnect back-off (up to minutes) after a
        # kubelet restart, while connecting to a unix socket costs about a millisecond per scrape.
        try:
            async with grpc.aio.insecure_channel(f"unix://{self.socket.absolute()}") as channel:
                stub = api_pb2_grpc.PodResourcesListerStub(channel)
                return await stub.List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.aio.AioRpcError as err:
            raise self._explain(err) from None

    def _check_socket(self) -> None:
        try:
            mode = os.stat(self.socket).st_mode
        except FileNotFoundError:
            raise PodResourcesError(
                SOCKET_MISSING,
                f"the kubelet's PodResources socket {self.socket} does not exist: mount the kubelet's "
                f"{self.socket.parent} directory into the plugin's pod (hostPath), or point "
                "--pod-resources-socket at the right path",
            ) from None
        except OSError as err:
            raise PodResourcesError(
                SOCKET_MISSING, f"cannot reach the PodResources socket {self.socket}: {err.strerror}"
            ) from None
        if not stat.S_ISSOCK(mode):
            raise PodResourcesError(
                SOCKET_MISSING,
                f"{self.socket} is not a unix socket; point --pod-resources-socket at the "
                "kubelet's pod-resources/kubelet.sock",
            )

    def _explain(self, err: grpc.aio.AioRpcError) -> PodResourcesError:
        code = err.code()
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return PodResourcesError(
                TIMEOUT,
                f"the kubelet did not answer PodResources List on {self.socket} within "
                f"{self.timeout_s:g} s; it may be overloaded or restarting",
            )
        if code == grpc.StatusCode.UNAVAILABLE:
            return PodResourcesError(
                UNAVAILABLE,
                f"nothing answers on {self.socket} ({err.details()}): the kubelet is down or restarting",
            )
        return PodResourcesError(
            RPC_ERROR, f"PodResources List on {self.socket} failed: {code.name}: {err.details()}"
        )

"""The kubelet's side of one plugin connection (Go: plugin/v1beta1/client.go and endpoint.go).

`PluginClient` owns the gRPC channel: the blocking dial, GetDevicePluginOptions and the ListAndWatch
stream. `Endpoint` is what the device manager allocates through; once stopped (stream ended, kubelet
restarted) every call fails with "endpoint ... has been stopped" without touching the plugin.
Every RPC the kubelet makes is handed to a recorder so tests can assert on what the plugin received.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import grpc
from google.protobuf.message import Message

from kubegpu.api.v1beta1 import api_pb2, api_pb2_grpc

from .errors import DeviceManagerError, go_rpc_error

PRE_START_CONTAINER_TIMEOUT = 30.0  # KubeletPreStartContainerRPCTimeoutInSecs
DIAL_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class RpcRecord:
    """One call the kubelet made to a plugin: started at `time` (monotonic), took `duration_s`.

    `error` is the Go-style error text when it failed. For ListAndWatch only the opening is recorded.
    """

    time: float
    resource: str
    method: str
    request: Message
    response: Message | None = None
    error: str | None = None
    duration_s: float = 0.0


RpcRecorder = Callable[[RpcRecord], None]


def plugin_socket_path(directory: Path, endpoint: str) -> Path:
    # Go's filepath.Join: an absolute `endpoint` stays under `directory`, and the result is cleaned.
    return Path(os.path.normpath(f"{directory}/{endpoint}"))


class PluginClient:
    def __init__(self, resource: str, socket: Path, record: RpcRecorder) -> None:
        self.resource = resource
        self.socket = socket
        self._record = record
        self._channel = grpc.aio.insecure_channel(
            f"unix:{socket.absolute()}", options=[("grpc.default_authority", "localhost")]
        )
        self._stub = api_pb2_grpc.DevicePluginStub(self._channel)

    async def dial(self, within_s: float = DIAL_TIMEOUT) -> None:
        """Block until the connection is READY, like grpc.DialContext with WithBlock."""
        try:
            await asyncio.wait_for(self._channel.channel_ready(), within_s)
        except TimeoutError:
            raise DeviceManagerError("failed to dial device plugin: context deadline exceeded") from None

    async def get_options(self) -> api_pb2.DevicePluginOptions:
        """No timeout, like the kubelet's context.Background() call."""
        response, error = await self.unary("GetDevicePluginOptions", api_pb2.Empty())
        if error is not None:
            raise DeviceManagerError(f"failed to get device plugin options: {error}")
        return cast(api_pb2.DevicePluginOptions, response)

    async def run(self, receive: Callable[[api_pb2.ListAndWatchResponse], None]) -> str:
        """Feed every ListAndWatch message to `receive` until the stream ends; return why it ended."""
        request = api_pb2.Empty()
        self._log("ListAndWatch", request, time.monotonic())
        try:
            async for response in self._stub.ListAndWatch(request):
                receive(response)
        except grpc.aio.AioRpcError as err:
            return go_rpc_error(err)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            # grpc.aio cancels the stream's read when our own channel is closed.
            return "rpc error: code = Canceled desc = grpc: the client connection is closing"
        return "EOF"  # the plugin returned from ListAndWatch: Go's Recv reports io.EOF

    async def unary(
        self, method: str, request: Message, deadline_s: float | None = None
    ) -> tuple[Message | None, str | None]:
        """Call a unary DevicePlugin method; (response, None) or (None, Go-style error text)."""
        started = time.monotonic()
        try:
            response = await getattr(self._stub, method)(request, timeout=deadline_s)
        except grpc.aio.AioRpcError as err:
            self._log(method, request, started, error=go_rpc_error(err))
            return None, go_rpc_error(err)
        self._log(method, request, started, response)
        return response, None

    async def close(self) -> None:
        await self._channel.close(grace=None)  # None: cancel calls in flight now (grpc's default)

    def _log(
        self,
        method: str,
        request: Message,
        started: float,
        response: Message | None = None,
        error: str | None = None,
    ) -> None:
        duration = time.monotonic() - started
        self._record(RpcRecord(started, self.resource, method, request, response, error, duration))


class Endpoint:
    """A registered resource's endpoint as the device manager keeps it, with the options it was given."""

    def __init__(
        self,
        resource: str,
        client: PluginClient | None,
        options: api_pb2.DevicePluginOptions | None,
    ) -> None:
        self.resource = resource
        self.client = client  # None: restored from the checkpoint after a kubelet restart
        self.options = options
        self.stop_time: float | None = None if client is not None else time.monotonic()

    @property
    def stopped(self) -> bool:
        return self.stop_time is not None

    def stop(self) -> None:
        self.stop_time = time.monotonic()

    def grace_period_expired(self, grace_period: float) -> bool:
        return self.stop_time is not None and time.monotonic() - self.stop_time >= grace_period

    def __str__(self) -> str:
        where = self.client.socket.name if self.client else "restored from checkpoint"
        return f"{self.resource} ({where})"

    async def get_preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> api_pb2.PreferredAllocationResponse:
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available, must_include_deviceIDs=must_include, allocation_size=size
                )
            ]
        )
        return cast(api_pb2.PreferredAllocationResponse, await self._call("GetPreferredAllocation", request))

    async def allocate(self, devices: Sequence[str]) -> api_pb2.AllocateResponse:
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=devices)]
        )
        return cast(api_pb2.AllocateResponse, await self._call("Allocate", request))

    async def pre_start_container(self, devices: Sequence[str], deadline_s: float) -> None:
        await self._call(
            "PreStartContainer", api_pb2.PreStartContainerRequest(devices_ids=devices), deadline_s
        )

    async def _call(self, method: str, request: Message, deadline_s: float | None = None) -> Message:
        if self.stopped or self.client is None:
            raise DeviceManagerError(f"endpoint {self} has been stopped")
        response, error = await self.client.unary(method, request, deadline_s)
        if error is not None:
            raise DeviceManagerError(error)
        assert response is not None
        return response

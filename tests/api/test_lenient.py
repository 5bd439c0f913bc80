"""The lenient method table on a real grpc.aio server over a unix socket: with a `refused` callback an
undecodable body is INVALID_ARGUMENT for unary and streaming methods alike (the DRA health stream is the
streaming example), the servicer never sees it, and good requests are served as before."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubegpu.api import lenient
from kubegpu.api.dra.v1 import api_pb2 as dra_v1
from kubegpu.api.drahealth.v1alpha1 import api_pb2 as health


class Health:
    def __init__(self) -> None:
        self.calls = 0

    async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:
        self.calls += 1
        assert not isinstance(request, lenient.Undecodable)
        yield health.NodeWatchResourcesResponse()


class Dra:
    def __init__(self) -> None:
        self.seen: list[Any] = []

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        self.seen.append(request)
        return dra_v1.NodePrepareResourcesResponse()

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        self.seen.append(request)
        return dra_v1.NodeUnprepareResourcesResponse()


@given(st.binary(max_size=64))
def test_decoding_never_raises(body: bytes) -> None:
    decoded = lenient.lenient(dra_v1.NodePrepareResourcesRequest)(body)
    assert isinstance(decoded, dra_v1.NodePrepareResourcesRequest | lenient.Undecodable)


def test_every_method_of_the_proto_is_in_the_table() -> None:
    assert sorted(lenient.method_handlers(dra_v1, "DRAPlugin", Dra())) == [
        "NodePrepareResources",
        "NodeUnprepareResources",
    ]


@pytest.mark.parametrize(
    ("method", "streaming"),
    [
        ("/v1alpha1.DRAResourceHealth/NodeWatchResources", True),
        ("/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources", False),
    ],
)
async def test_an_undecodable_body_is_invalid_argument_and_never_reaches_the_servicer(
    method: str, streaming: bool, tmp_path: Path
) -> None:
    refused: list[tuple[str, str]] = []
    server = grpc.aio.server()
    watcher, dra = Health(), Dra()
    record = lambda name, bad: refused.append((name, bad.describe()))  # noqa: E731
    lenient.add_service(server, health, "DRAResourceHealth", watcher, record)
    lenient.add_service(server, dra_v1, "DRAPlugin", dra, record)
    socket = tmp_path / "s.sock"
    server.add_insecure_port(f"unix:{socket}")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
            make = channel.unary_stream if streaming else channel.unary_unary
            rpc = make(method, request_serializer=None, response_deserializer=None)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                if streaming:
                    async for _ in rpc(b"\xff\xff\xff"):
                        pass
                else:
                    await rpc(b"\xff\xff\xff")
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            name = method.lstrip("/").replace("/", ".")
            assert err.value.details().startswith(f"{name}: the request body (3 bytes) is not a valid ")
            assert [r[0] for r in refused] == [name]
            assert watcher.calls == 0 and dra.seen == []
            # A good body is served.
            if streaming:
                answers = [a async for a in rpc(health.NodeWatchResourcesRequest().SerializeToString())]
                assert len(answers) == 1 and watcher.calls == 1
            else:
                await rpc(dra_v1.NodePrepareResourcesRequest().SerializeToString())
                assert len(dra.seen) == 1
    finally:
        await server.stop(None)

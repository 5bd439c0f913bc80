"""A faulty API server in front of the simulated one, for drivers running as processes (a refused
connection is the simulated server stopped: `ApiServerSim.stop()`).

`FaultyApi` listens on its own port and forwards each request to the API server, or, by `mode`:
- "hang": holds every request unanswered until the mode changes (then forwards it: an overloaded server
  that answers late);
- "500" / "429": answers the API server's Status for an internal error / too many requests (429 with
  `Retry-After: 1`, as the API server's max-in-flight filter sends it).
Entering any fault ends the streams in flight (watches), as a restarted or failing server does.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

FAULTS = ("hang", "500", "429")


class FaultyApi:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.mode = "pass"
        self._changed = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._streams: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def __aenter__(self) -> FaultyApi:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self._drop_streams()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def point_kubeconfig(self, path: Path, api_url: str) -> None:
        """Make the kubeconfig at `path` (the simulated server's) name this proxy instead."""
        path.write_text(path.read_text().replace(api_url, self.url))

    def set(self, mode: str) -> None:
        assert mode == "pass" or mode in FAULTS, mode
        self.mode = mode
        self._changed.set()
        self._changed = asyncio.Event()
        if mode != "pass":
            self._drop_streams()

    def _drop_streams(self) -> None:
        for writer in list(self._streams):
            writer.transport.abort()
        self._streams.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await _read_request(reader)
                if request is None:
                    return
                while self.mode == "hang":
                    await self._changed.wait()
                if self.mode in ("500", "429"):
                    writer.write(_status(int(self.mode)))
                    await writer.drain()
                    continue
                await self._forward(request, writer)
                return  # the API server closes every connection after its answer
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.transport.abort()

    async def _forward(self, request: bytes, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._streams.add(writer)
        try:
            up_writer.write(request)
            await up_writer.drain()
            while data := await up_reader.read(65536):
                writer.write(data)
                await writer.drain()
        finally:
            self._streams.discard(writer)
            up_writer.transport.abort()


async def _read_request(reader: asyncio.StreamReader) -> bytes | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None  # the client closed its kept-alive connection
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    body = await reader.readexactly(length) if length else b""
    return head + body


def _status(code: int) -> bytes:
    reason, message, extra = {
        500: ("Internal Server Error", "etcdserver: request timed out", ""),
        429: ("Too Many Requests", "Too many requests, please try again later.", "Retry-After: 1\r\n"),
    }[code]
    body = json.dumps(
        {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
         "reason": "InternalError" if code == 500 else "TooManyRequests", "code": code}
    ).encode()  # fmt: skip
    head = (
        f"HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\n{extra}"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body

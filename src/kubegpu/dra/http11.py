"""HTTP/1.1 on one socket, as much as the Kubernetes API server's JSON answers need: a request out, a
response's status line and headers, its body by Content-Length, chunked, or up to the end of the
connection, and a chunked body read line by line as it arrives (a watch).

Why not `http.client`: it brings the `email` package (about 1.7 MB of the driver's resident memory, for
parsing headers), and the driver is held to a memory budget against a bare grpc.aio server.

Bounded against a server that sends garbage: the status line and each header line are cut at MAX_LINE,
the head at MAX_HEAD bytes, a body at the caller's limit; anything malformed is an `HttpError`.
"""

from __future__ import annotations

import contextlib
import io
import socket
from collections.abc import Iterator
from dataclasses import dataclass

MAX_LINE = 64 * 1024
MAX_HEAD = 256 * 1024
MAX_HEADERS = 200


class HttpError(Exception):
    """The server broke the protocol or closed the connection early; str() says how."""


@dataclass(frozen=True, slots=True)
class Head:
    status: int
    reason: str
    headers: dict[str, str]  # lower-case names; a repeated header's values joined by ", "
    version: str  # "HTTP/1.1"

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    @property
    def chunked(self) -> bool:
        return "chunked" in (self.headers.get("transfer-encoding") or "").lower()

    @property
    def keeps_alive(self) -> bool:
        """Whether the connection may carry another request once this body has been read."""
        connection = (self.headers.get("connection") or "").lower()
        if self.version == "HTTP/1.0":
            return "keep-alive" in connection
        delimited = self.chunked or "content-length" in self.headers or self.status in (204, 304)
        return "close" not in connection and delimited


def request_bytes(method: str, target: str, host: str, headers: dict[str, str], body: bytes | None) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if body is not None or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body or b'')}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


class Connection:
    """One connection: `send` a request, `read_head`, then `read_body` or `lines` (not both)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._reader: io.BufferedReader = sock.makefile("rb")

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_head(self) -> Head:
        while True:
            head = self._read_one_head()
            if not 100 <= head.status < 200:
                return head  # an interim 1xx answer is followed by the real one

    def read_body(self, head: Head, limit: int) -> bytes:
        if head.status in (204, 304):
            return b""  # no body, whatever the headers say (RFC 9112 6.3)
        if head.chunked:
            parts, size = [], 0
            for chunk in self._chunks():
                size += len(chunk)
                if size > limit:
                    raise HttpError(f"the response body is larger than {limit} bytes")
                parts.append(chunk)
            return b"".join(parts)
        length = head.header("content-length")
        if length is not None:
            if not _digits(length.strip()) or len(length.strip()) > 18:
                raise HttpError(f"invalid Content-Length {length[:40]!r}")
            n = int(length)
            if n > limit:
                raise HttpError(f"the response body is larger than {limit} bytes")
            data = self._reader.read(n)
            if len(data) != n:
                raise HttpError("the connection was closed before the answer was complete")
            return data
        data = self._reader.read(limit + 1)  # no length: the body ends with the connection
        if len(data) > limit:
            raise HttpError(f"the response body is larger than {limit} bytes")
        return data

    def lines(self, head: Head, limit: int) -> Iterator[bytes]:
        """The body's lines as they arrive (each with its newline; the last one may lack it)."""
        pending = b""
        chunks = self._chunks() if head.chunked else iter(lambda: self._reader.read1(MAX_LINE), b"")
        for chunk in chunks:
            pending += chunk
            *complete, pending = pending.split(b"\n")
            for line in complete:
                yield line + b"\n"
            if len(pending) > limit:
                raise HttpError(f"a line of the response is longer than {limit} bytes")
        if pending:
            yield pending

    def shutdown(self) -> None:
        """Ends a blocked read in another thread (it sees the connection end)."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._reader.close()
        self.sock.close()

    # ---- reading -------------------------------------------------------------------------------------

    def _line(self) -> bytes:
        line = self._reader.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise HttpError(f"a line of the response head is longer than {MAX_LINE} bytes")
        return line

    def _read_one_head(self) -> Head:
        first = self._line()
        if not first:
            raise HttpError("the server closed the connection without answering")
        parts = first.decode("latin-1").rstrip("\r\n").split(" ", 2)
        if (
            len(parts) < 2
            or not parts[0].startswith("HTTP/1.")
            or not (_digits(parts[1]) and len(parts[1]) == 3)
        ):
            raise HttpError(f"not an HTTP/1.1 status line: {first[:60]!r}")
        headers: dict[str, str] = {}
        size = len(first)
        while True:
            line = self._line()
            size += len(line)
            if not line:
                raise HttpError("the connection was closed in the middle of the response head")
            if line in (b"\r\n", b"\n"):
                break
            if size > MAX_HEAD or len(headers) >= MAX_HEADERS:
                raise HttpError(f"the response head is larger than {MAX_HEAD} bytes or {MAX_HEADERS} headers")
            name, sep, value = line.decode("latin-1").partition(":")
            if not sep or not name.strip() or name != name.strip():
                raise HttpError(f"malformed header line {line[:60]!r}")
            key, value = name.lower(), value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        return Head(int(parts[1]), parts[2] if len(parts) > 2 else "", headers, parts[0])

    def _chunks(self) -> Iterator[bytes]:
        while True:
            size_line = self._line()
            if not size_line:
                raise HttpError("the connection was closed in the middle of a chunked body")
            text = size_line.split(b";", 1)[0].strip()  # a chunk extension after ";" is ignored
            if not text or len(text) > 16 or text.strip(b"0123456789abcdefABCDEF"):
                raise HttpError(f"invalid chunk size {text[:40]!r}")
            size = int(text, 16)
            if size == 0:
                while self._line() not in (b"\r\n", b"\n", b""):
                    pass  # trailers, ignored
                return
            data = self._reader.read(size)
            if len(data) != size or self._reader.read(2) != b"\r\n":
                raise HttpError("the connection was closed in the middle of a chunk")
            yield data


def _digits(text: str) -> bool:
    """ASCII digits only (str.isdigit also takes "²", which int() refuses)."""
    return bool(text) and text.isascii() and text.isdigit()

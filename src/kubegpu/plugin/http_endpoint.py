"""The optional HTTP endpoint: `/healthz` (liveness), `/readyz` (readiness) and `/metrics` (Prometheus).

Health is read from the registrar's state, not from socket files: a resource is up when it is registered
with the kubelet that serves kubelet.sock now. `/healthz` fails (503) once a resource that should be
registered has been down for longer than the grace period, counted from the daemon's start or from the
moment it went down (a kubelet restart, a reload), so a normal re-registration never flaps the probe while
a registrar that is stuck or keeps failing gets the pod restarted. `/healthz` also fails at once while a
supervised background task is down after a failure (supervise.py), naming it: the health thread, the config
watcher or the registrar not running is a plugin that must not look alive. `/readyz` is 200 once every
resource is registered. A sampler notes when resources go down once a second, so the grace period does not
depend on how often the probes come.

It is a deliberately small HTTP/1.1 server on the daemon's own event loop (three GET paths, one request
per connection): aiohttp would add ~10 MB of resident memory for nothing we need, and sharing the loop
means a wedged loop fails the liveness probe as it should.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from kubegpu.plugin.metrics import PluginMetrics, RegistrationSource, is_registered
from kubegpu.plugin.registrar import KubeletId
from kubegpu.plugin.supervise import TaskDown

log = logging.getLogger(__name__)

DEFAULT_GRACE_S = 60.0  # > the registrar's worst normal case: a 15 s Register timeout, then 5 s back-off
SAMPLE_INTERVAL_S = 1.0
READ_TIMEOUT_S = 5.0  # a client that sends no complete request by then is dropped
WRITE_TIMEOUT_S = 10.0
MAX_REQUEST_HEAD = 8192
CLOSE_TIMEOUT_S = 2.0
TEXT = "text/plain; charset=utf-8"
REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class StatusSource(RegistrationSource, Protocol):
    """What the daemon exposes to the health endpoints (and, through RegistrationSource, to metrics)."""

    @property
    def started_at(self) -> float:
        """time.monotonic() when the daemon started."""
        ...


@dataclass(frozen=True, slots=True)
class ResourceHealth:
    resource: str
    registered: bool
    down_for_s: float  # 0 while registered
    why: str  # what is going on, for a human reading the probe's body


@dataclass(frozen=True, slots=True)
class Observation:
    resources: tuple[ResourceHealth, ...]
    discovering_for_s: float | None  # None once the first discovery has finished


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    text: str


def _why_down(source: StatusSource, resource: str, kubelet: KubeletId | None) -> str:
    reg = source.registration(resource)
    if kubelet is None:
        return "waiting for the kubelet: kubelet.sock does not exist"
    if reg is None:
        return "not served yet"
    if reg.last_error:
        return f"registration failing ({reg.failures} failures so far), last error: {reg.last_error}"
    if reg.registered_with is not None:
        return "the kubelet restarted; registering again"
    return "not registered yet"


class HealthChecker:
    def __init__(
        self,
        source: StatusSource,
        *,
        grace_s: float = DEFAULT_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
        tasks_down: Callable[[], Sequence[TaskDown]] | None = None,
    ) -> None:
        self.source = source
        self.grace_s = grace_s
        self._clock = clock
        self._tasks_down = tasks_down
        self._down_since: dict[str, float] = {}
        self._discovering_since: float | None = None
        self._sampled = False

    def observe(self) -> Observation:
        """Sample the source now; remembers since when each resource has been down."""
        now = self._clock()
        # Before the first sample we cannot know when a resource went down; the daemon's start is the
        # earliest it can have been, and grace after start is what we want anyway.
        first_seen = now if self._sampled else self.source.started_at
        self._sampled = True
        expected = self.source.expected_resources()
        if expected is None:
            self._down_since.clear()
            if self._discovering_since is None:
                self._discovering_since = first_seen
            return Observation((), now - self._discovering_since)
        self._discovering_since = None
        kubelet = self.source.current_kubelet()
        rows = []
        for resource in expected:
            if is_registered(self.source, resource, kubelet):
                self._down_since.pop(resource, None)
                rows.append(ResourceHealth(resource, True, 0.0, "registered"))
            else:
                since = self._down_since.setdefault(resource, first_seen)
                why = _why_down(self.source, resource, kubelet)
                rows.append(ResourceHealth(resource, False, now - since, why))
        for gone in self._down_since.keys() - set(expected):
            del self._down_since[gone]
        return Observation(tuple(rows), None)

    def liveness(self) -> Verdict:
        down = self._tasks_down() if self._tasks_down is not None else ()
        if down:
            return Verdict(False, "unhealthy: " + "; ".join(d.describe() for d in down) + "\n")
        seen = self.observe()
        if seen.discovering_for_s is not None:
            ok = seen.discovering_for_s <= self.grace_s
            return Verdict(
                ok,
                f"{'ok' if ok else 'unhealthy'}: device discovery has not finished after "
                f"{seen.discovering_for_s:.0f} s (grace {self.grace_s:g} s)\n",
            )
        late = [r for r in seen.resources if not r.registered and r.down_for_s > self.grace_s]
        if not late:
            return Verdict(True, "ok\n" + _details(seen))
        overdue = ", ".join(
            f"{r.resource} not registered for {r.down_for_s:.0f} s (grace {self.grace_s:g} s)" for r in late
        )
        return Verdict(False, f"unhealthy: {overdue}\n" + _details(seen))

    def readiness(self) -> Verdict:
        seen = self.observe()
        if seen.discovering_for_s is not None:
            return Verdict(False, "not ready: device discovery has not finished\n")
        waiting = [r.resource for r in seen.resources if not r.registered]
        head = "ready" if not waiting else "not ready: waiting for " + ", ".join(waiting)
        return Verdict(not waiting, head + "\n" + _details(seen))


def _details(seen: Observation) -> str:
    if not seen.resources:
        return "no resources to register\n"
    return "".join(
        f"{r.resource}: registered\n"
        if r.registered
        else f"{r.resource}: not registered for {r.down_for_s:.0f} s: {r.why}\n"
        for r in seen.resources
    )


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    content_type: str = TEXT
    headers: tuple[tuple[str, str], ...] = ()


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class HttpServer:
    """Serves the three paths on `host:port` (all interfaces when host is None; port 0 picks a free one)."""

    def __init__(
        self,
        status: StatusSource,
        metrics: PluginMetrics | None,
        *,
        port: int,
        host: str | None = None,
        grace_s: float = DEFAULT_GRACE_S,
        tasks_down: Callable[[], Sequence[TaskDown]] | None = None,
        spawn: Callable[[str, Callable[[], Awaitable[None]]], asyncio.Task[None]] | None = None,
    ) -> None:
        self.health = HealthChecker(status, grace_s=grace_s, tasks_down=tasks_down)
        self.metrics = metrics
        self._spawn = spawn  # runs the sampler (the daemon's supervisor); a plain task when None
        self.host = host
        self._port = port
        self._server: asyncio.Server | None = None
        self._sampler: asyncio.Task[None] | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        """The bound port (the one the OS picked when asked for 0)."""
        if self._server is None or not self._server.sockets:
            return self._port
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._connection, self.host, self._port, limit=MAX_REQUEST_HEAD
        )
        if self._spawn is not None:
            self._sampler = self._spawn("health-sampler", self._sample)
        else:
            self._sampler = asyncio.create_task(self._sample(), name="health-sampler")
        # The daemon logs "serving ..." once at INFO; the address detail is for debugging.
        log.debug("HTTP endpoint listening on %s:%d", self.host or "*", self.port)

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        tasks = [t for t in (self._sampler, *self._connections) if t is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT_S)
        self._sampler = None
        if server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), CLOSE_TIMEOUT_S)

    async def _sample(self) -> None:
        while True:
            try:
                self.health.observe()
            except Exception:  # a bad sample must not end sampling; the probes would still answer
                log.exception("sampling the registration state failed")
            await asyncio.sleep(SAMPLE_INTERVAL_S)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            try:
                method, path, headers = await asyncio.wait_for(_read_request(reader), READ_TIMEOUT_S)
            except _BadRequest as err:
                response, method = Response(err.status, f"{err}\n".encode()), "GET"
            else:
                try:
                    response = await self._respond(method, path, headers)
                except Exception:  # a bug behind one path must not take the endpoint down
                    log.exception("answering %s %s failed", method, path)
                    response = Response(500, f"{path} failed; see the plugin's log\n".encode())
            writer.write(_encode(response, with_body=method != "HEAD"))
            await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT_S)
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away or stalled; nothing to answer
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), CLOSE_TIMEOUT_S)

    async def _respond(self, method: str, path: str, headers: dict[str, str]) -> Response:
        if method not in ("GET", "HEAD"):
            return Response(405, b"only GET and HEAD are served\n", headers=(("Allow", "GET, HEAD"),))
        if path == "/healthz":
            return _verdict(self.health.liveness())
        if path == "/readyz":
            return _verdict(self.health.readiness())
        if path == "/metrics" and self.metrics is not None:
            body, content_type = await self.metrics.render(headers.get("accept"))
            return Response(200, body, content_type)
        paths = "/healthz, /readyz" + (", /metrics" if self.metrics is not None else "")
        return Response(404, f"not found; this endpoint serves {paths}\n".encode())


def _verdict(verdict: Verdict) -> Response:
    return Response(200 if verdict.ok else 503, verdict.text.encode())


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str]]:
    """Method, path (without query) and lower-cased headers of one request; _BadRequest if malformed."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        raise _BadRequest(431, f"request head larger than {MAX_REQUEST_HEAD} bytes") from None
    request_line, *lines = head.decode("latin-1").split("\r\n")
    parts = request_line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _BadRequest(400, "malformed request line")
    headers: dict[str, str] = {}
    for line in lines:
        if line:
            name, colon, value = line.partition(":")
            if not colon:
                raise _BadRequest(400, "malformed header line")
            headers[name.strip().lower()] = value.strip()
    return parts[0], parts[1].split("?", 1)[0], headers


def _encode(response: Response, *, with_body: bool) -> bytes:
    head = [
        f"HTTP/1.1 {response.status} {REASONS[response.status]}",
        f"Date: {email.utils.formatdate(usegmt=True)}",
        f"Content-Type: {response.content_type}",
        f"Content-Length: {len(response.body)}",
        "Cache-Control: no-store",
        "Connection: close",
        *(f"{name}: {value}" for name, value in response.headers),
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (response.body if with_body else b"")

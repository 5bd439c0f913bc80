"""Liveness/readiness from registrar state with grace periods, and the small HTTP server that serves them."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kubegpu.allocation.allocate import AllocateOptions
from kubegpu.allocation.resources import build_resources
from kubegpu.kubeletsim import KubeletSimulator
from kubegpu.plugin.http_endpoint import HealthChecker, HttpServer
from kubegpu.plugin.metrics import PluginMetrics
from kubegpu.plugin.registrar import KubeletId, Registrar, Registration
from kubegpu.plugin.server import ResourceServer
from kubegpu.plugin.supervise import TaskDown
from tests.builders import make_inventory

GPU = "nvidia.com/gpu"
OLD, NEW = (1, 100), (2, 200)  # two kubelet incarnations (inode, ctime)


@dataclass
class FakeStatus:
    started_at: float = 0.0
    expected: Sequence[str] | None = (GPU,)
    regs: dict[str, Registration] = field(default_factory=lambda: {GPU: Registration()})
    kubelet: KubeletId | None = OLD

    def expected_resources(self) -> Sequence[str] | None:
        return self.expected

    def registration(self, resource: str) -> Registration | None:
        return self.regs.get(resource)

    def current_kubelet(self) -> KubeletId | None:
        return self.kubelet

    def register(self, resource: str = GPU) -> None:
        self.regs[resource] = Registration(registered_with=self.kubelet, registrations=1)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def checker(status: FakeStatus, clock: Clock) -> HealthChecker:
    return HealthChecker(status, grace_s=60, clock=clock)


# ---- health policy ---------------------------------------------------------------------------------


def test_not_registered_is_live_during_the_start_grace_then_fails(clock: Clock) -> None:
    status = FakeStatus()
    health = checker(status, clock)
    clock.now = 10
    assert health.liveness().ok
    assert not health.readiness().ok
    clock.now = 61
    verdict = health.liveness()
    assert not verdict.ok
    assert verdict.text.startswith("unhealthy: nvidia.com/gpu not registered for 61 s (grace 60 s)")


def test_first_sample_counts_the_grace_from_the_daemon_start(clock: Clock) -> None:
    clock.now = 100  # the first probe comes late: the start grace is long over
    assert not checker(FakeStatus(), clock).liveness().ok


def test_registered_with_the_current_kubelet_is_live_and_ready(clock: Clock) -> None:
    status = FakeStatus()
    status.register()
    health = checker(status, clock)
    clock.now = 1000
    assert health.liveness().ok
    ready = health.readiness()
    assert ready.ok and ready.text == "ready\nnvidia.com/gpu: registered\n"


def test_a_kubelet_restart_gets_its_own_grace_and_no_flap(clock: Clock) -> None:
    status = FakeStatus()
    status.register()
    health = checker(status, clock)
    clock.now = 100
    assert health.liveness().ok
    status.kubelet = NEW  # the record still names the old kubelet: it does not count
    clock.now = 200
    health.observe()  # the sampler notices
    clock.now = 250
    live, ready = health.liveness(), health.readiness()
    assert live.ok
    assert not ready.ok
    assert "the kubelet restarted; registering again" in ready.text
    status.register()
    clock.now = 255
    assert health.liveness().ok and health.readiness().ok
    status.kubelet = (3, 300)
    clock.now = 300
    health.observe()
    clock.now = 361
    assert not health.liveness().ok  # never re-registered with the third kubelet


def test_failing_registration_names_the_last_error(clock: Clock) -> None:
    status = FakeStatus()
    status.regs[GPU] = Registration(failures=7, last_error="UNKNOWN: the ResourceName is invalid")
    health = checker(status, clock)
    clock.now = 90
    verdict = health.liveness()
    assert not verdict.ok
    assert "registration failing (7 failures so far), last error: UNKNOWN: the ResourceName is invalid" in (
        verdict.text
    )


def test_missing_kubelet_is_not_registered(clock: Clock) -> None:
    status = FakeStatus(kubelet=None)
    status.regs[GPU] = Registration(registered_with=None)
    verdict = checker(status, clock).readiness()
    assert not verdict.ok and "kubelet.sock does not exist" in verdict.text


def test_discovery_in_progress_is_not_ready_and_fails_liveness_after_the_grace(clock: Clock) -> None:
    status = FakeStatus(expected=None)
    health = checker(status, clock)
    clock.now = 5
    assert health.liveness().ok
    assert health.readiness().text == "not ready: device discovery has not finished\n"
    clock.now = 61
    verdict = health.liveness()
    assert not verdict.ok and "device discovery has not finished after 61 s" in verdict.text


def test_nothing_to_register_is_ready(clock: Clock) -> None:
    health = checker(FakeStatus(expected=()), clock)
    clock.now = 500
    assert health.liveness().ok
    assert health.readiness() == health.readiness()
    assert health.readiness().text == "ready\nno resources to register\n"


def test_a_resource_added_by_a_reload_gets_its_own_grace(clock: Clock) -> None:
    status = FakeStatus()
    status.register()
    health = checker(status, clock)
    clock.now = 500
    health.observe()
    status.expected = (GPU, "nvidia.com/gpu.shared")
    clock.now = 501
    health.observe()
    clock.now = 550
    assert health.liveness().ok
    clock.now = 562
    verdict = health.liveness()
    assert not verdict.ok and "nvidia.com/gpu.shared not registered for 61 s" in verdict.text
    assert "nvidia.com/gpu: registered" in verdict.text


def test_a_background_task_that_is_down_fails_liveness_at_once_naming_it(clock: Clock) -> None:
    status = FakeStatus()
    status.register()
    down: list[TaskDown] = []
    health = HealthChecker(status, grace_s=60, clock=clock, tasks_down=lambda: down)
    assert health.liveness().ok
    down.append(TaskDown("config-watch", 3.0, 2, "OSError: no space left on device", 4.0))
    verdict = health.liveness()
    assert not verdict.ok
    assert verdict.text == (
        "unhealthy: background task config-watch is down for 3 s after 2 failure(s), last: OSError: no space "
        "left on device; restarting in 4 s\n"
    )
    assert health.readiness().ok  # registered: the kubelet's view is still served
    down.clear()
    assert health.liveness().ok


def test_down_time_restarts_after_a_recovery(clock: Clock) -> None:
    status = FakeStatus()
    health = checker(status, clock)
    clock.now = 50
    health.observe()
    status.register()
    clock.now = 55
    health.observe()
    status.kubelet = NEW
    clock.now = 100
    health.observe()
    clock.now = 150  # 150 s after start, but down for only 50 s
    assert health.liveness().ok


# ---- HTTP ------------------------------------------------------------------------------------------


async def fetch(port: int, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split(" ")[1]), headers, body


def get(path: str, *headers: str, method: str = "GET") -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: x\r\n" + "".join(f"{h}\r\n" for h in headers) + "\r\n"
    ).encode()


@pytest.fixture
async def served() -> AsyncIterator[tuple[HttpServer, FakeStatus]]:
    status = FakeStatus(started_at=time.monotonic())
    server = HttpServer(status, PluginMetrics(status=status), port=0, host="127.0.0.1")
    await server.start()
    yield server, status
    await server.close()


async def test_health_endpoints_follow_the_registration(served: tuple[HttpServer, FakeStatus]) -> None:
    server, status = served
    code, headers, body = await fetch(server.port, get("/readyz"))
    assert code == 503 and body.startswith(b"not ready: waiting for nvidia.com/gpu")
    assert headers["content-type"] == "text/plain; charset=utf-8"
    assert int(headers["content-length"]) == len(body) and headers["connection"] == "close"
    assert (await fetch(server.port, get("/healthz")))[0] == 200  # within the start grace
    status.register()
    assert (await fetch(server.port, get("/readyz")))[0] == 200
    code, _, body = await fetch(server.port, get("/healthz?verbose"))  # the query string is ignored
    assert code == 200 and body == b"ok\nnvidia.com/gpu: registered\n"


async def test_metrics_are_served_with_content_negotiation(served: tuple[HttpServer, FakeStatus]) -> None:
    server, status = served
    status.register()
    code, headers, body = await fetch(server.port, get("/metrics"))
    assert code == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    assert b'kubegpu_registered{resource="nvidia.com/gpu"} 1.0' in body
    accept = "Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
    code, headers, body = await fetch(server.port, get("/metrics", accept))
    assert code == 200 and headers["content-type"].startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n")


async def test_head_methods_and_unknown_paths(served: tuple[HttpServer, FakeStatus]) -> None:
    server, _ = served
    code, headers, body = await fetch(server.port, get("/healthz", method="HEAD"))
    assert code == 200 and body == b"" and int(headers["content-length"]) > 0
    code, headers, _ = await fetch(server.port, get("/healthz", method="POST"))
    assert code == 405 and headers["allow"] == "GET, HEAD"
    code, _, body = await fetch(server.port, get("/"))
    assert code == 404 and b"/healthz, /readyz, /metrics" in body


async def test_malformed_and_oversized_requests(served: tuple[HttpServer, FakeStatus]) -> None:
    server, _ = served
    assert (await fetch(server.port, b"GARBAGE\r\n\r\n"))[0] == 400
    assert (await fetch(server.port, b"GET /healthz HTTP/1.1\r\nno-colon\r\n\r\n"))[0] == 400
    huge = get("/healthz", "X-Filler: " + "a" * 10_000)
    assert (await fetch(server.port, huge))[0] == 431


async def test_a_stalled_client_does_not_hold_up_others(served: tuple[HttpServer, FakeStatus]) -> None:
    server, _ = served
    _, idle = await asyncio.open_connection("127.0.0.1", server.port)
    idle.write(b"GET /hea")  # and then nothing
    await idle.drain()
    started = time.monotonic()
    assert (await fetch(server.port, get("/healthz")))[0] == 200
    assert time.monotonic() - started < 1
    idle.close()


async def test_a_standard_client_can_read_it(served: tuple[HttpServer, FakeStatus]) -> None:
    server, status = served
    status.register()

    def read() -> tuple[int, bytes]:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/readyz", timeout=5) as response:
            return response.status, response.read()

    assert await asyncio.to_thread(read) == (200, b"ready\nnvidia.com/gpu: registered\n")


class BrokenMetrics(PluginMetrics):
    async def render(self, accept: str | None = None) -> tuple[bytes, str]:
        raise RuntimeError("boom")


async def test_a_failing_render_is_a_500_and_the_server_keeps_serving() -> None:
    status = FakeStatus(started_at=time.monotonic())
    server = HttpServer(status, BrokenMetrics(), port=0, host="127.0.0.1")
    await server.start()
    try:
        code, _, body = await fetch(server.port, get("/metrics"))
        assert code == 500 and body == b"/metrics failed; see the plugin's log\n"
        assert (await fetch(server.port, get("/healthz")))[0] == 200
    finally:
        await server.close()
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", server.port)


async def test_without_metrics_only_health_is_served() -> None:
    server = HttpServer(FakeStatus(started_at=time.monotonic()), None, port=0, host="127.0.0.1")
    await server.start()
    try:
        code, _, body = await fetch(server.port, get("/metrics"))
        assert code == 404 and body == b"not found; this endpoint serves /healthz, /readyz\n"
    finally:
        await server.close()


# ---- against the real registrar and the kubelet simulator -------------------------------------------


class RegistrarStatus:
    """What the daemon implements: the registrar's view, as StatusSource."""

    def __init__(self, registrar: Registrar) -> None:
        self.registrar = registrar
        self.started_at = time.monotonic()

    def expected_resources(self) -> Sequence[str]:
        return [s.name for s in self.registrar.servers]

    def registration(self, resource: str) -> Registration | None:
        return self.registrar.registration(resource)

    def current_kubelet(self) -> KubeletId | None:
        return self.registrar.current_kubelet()


async def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll: the registrar records a registration after the kubelet's last event about it, so waiting on
    the simulator's events would race."""
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kg-http-", dir="/tmp")) / "device-plugins"
    path.mkdir()
    yield path
    shutil.rmtree(path.parent, ignore_errors=True)


async def test_readiness_follows_a_real_registrar_through_kubelet_restarts(plugin_dir: Path) -> None:
    inventory = make_inventory(2)
    resource = build_resources(inventory)[0]
    registrar = Registrar(plugin_dir, plugin_dir / "kubelet.sock")
    status = RegistrarStatus(registrar)
    server = HttpServer(status, PluginMetrics(status=status), port=0, host="127.0.0.1")
    sim = KubeletSimulator(plugin_dir)
    await registrar.start()
    await server.start()
    try:
        await registrar.set_servers(
            [ResourceServer(resource, plugin_dir, AllocateOptions(), inventory.link_map)]
        )
        code, _, body = await fetch(server.port, get("/readyz"))
        assert code == 503 and b"kubelet.sock does not exist" in body
        await sim.start()
        await until(registrar.all_registered)
        assert (await fetch(server.port, get("/readyz")))[0] == 200
        for _ in range(2):
            await sim.restart()
            await until(registrar.all_registered)
            assert (await fetch(server.port, get("/readyz")))[0] == 200
            assert (await fetch(server.port, get("/healthz")))[0] == 200
        _, _, body = await fetch(server.port, get("/metrics"))
        assert b'kubegpu_registered{resource="nvidia.com/gpu"} 1.0' in body
        await sim.stop()
        code, _, body = await fetch(server.port, get("/readyz"))
        assert code == 503 and b"kubelet.sock does not exist" in body
        assert (await fetch(server.port, get("/healthz")))[0] == 200  # within the grace
        _, _, body = await fetch(server.port, get("/metrics"))
        assert b'kubegpu_registered{resource="nvidia.com/gpu"} 0.0' in body
    finally:
        await server.close()
        await registrar.close()
        await sim.stop()

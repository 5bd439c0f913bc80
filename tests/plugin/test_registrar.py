"""Registrar in-process against the kubelet simulator: back-off, restarts, no-registration mode, lost dir."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from kubegpu.allocation.allocate import AllocateOptions
from kubegpu.allocation.resources import build_resources
from kubegpu.kubeletsim import Container, EventKind, KubeletSimulator, Pod
from kubegpu.plugin.registrar import Registrar, registration_backoff
from kubegpu.plugin.server import ResourceServer
from tests.allocation.test_preferred import replicas
from tests.builders import make_inventory

INVENTORY = make_inventory(4)
RESOURCE = build_resources(INVENTORY)[0]


async def registered(registrar: Registrar, timeout: float = 10.0) -> None:
    """Wait until the registrar has seen every Register answered: the kubelet may list the devices (it dials
    back and opens ListAndWatch while handling Register) before the plugin has read the answer."""
    async with asyncio.timeout(timeout):
        while not registrar.all_registered():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


@pytest.fixture
def plugin_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="kg-reg-", dir="/tmp")) / "dp"
    path.mkdir()
    yield path
    shutil.rmtree(path.parent, ignore_errors=True)


def _server(plugin_dir: Path) -> ResourceServer:
    return ResourceServer(RESOURCE, plugin_dir, AllocateOptions(), INVENTORY.link_map)


@pytest.fixture
async def sim(plugin_dir: Path) -> AsyncIterator[KubeletSimulator]:
    """A kubelet on the directory, started after the registrar (fixtures start in parameter order)."""
    kubelet = KubeletSimulator(plugin_dir)
    await kubelet.start()
    yield kubelet
    await kubelet.stop()


@pytest.fixture
async def registrar(plugin_dir: Path) -> AsyncIterator[Registrar]:
    reg = Registrar(plugin_dir, plugin_dir / "kubelet.sock")
    await reg.start()
    yield reg
    await reg.close()


async def test_waits_for_a_kubelet_that_starts_later(plugin_dir: Path, registrar: Registrar) -> None:
    await registrar.set_servers([_server(plugin_dir)])  # returns after a full reconcile pass
    assert not registrar.all_registered()
    assert (plugin_dir / RESOURCE.socket_name).exists()  # serving before any kubelet exists
    sim = KubeletSimulator(plugin_dir)
    await sim.start()
    try:
        await sim.wait_for(lambda: sim.allocatable().get(RESOURCE.name) == 4, timeout=5)
        await registered(registrar)
        assert registrar.state[RESOURCE.name].registrations == 1
    finally:
        await sim.stop()


async def test_kubelet_restart_restarts_the_server_before_registering(
    plugin_dir: Path, registrar: Registrar, sim: KubeletSimulator
) -> None:
    await registrar.set_servers([_server(plugin_dir)])
    await sim.wait_for(lambda: sim.allocatable().get(RESOURCE.name) == 4, timeout=5)
    for _ in range(3):
        mark = sim.last_seq
        await sim.restart()
        await sim.wait_for_event(EventKind.DEVICES_UPDATED, resource=RESOURCE.name, after=mark, timeout=5)
    # Exactly one registration per kubelet incarnation: no duplicate that the v1.32 kubelet would punish.
    assert len(sim.events(EventKind.REGISTERED, resource=RESOURCE.name)) == 4
    assert sim.allocatable()[RESOURCE.name] == 4


async def test_no_kubelet_socket_serves_without_registering(plugin_dir: Path) -> None:
    reg = Registrar(plugin_dir, None)
    await reg.start()
    try:
        await reg.set_servers([_server(plugin_dir)])
        assert reg.all_registered()  # nothing to register with: serving is all there is
        assert (plugin_dir / RESOURCE.socket_name).exists()
    finally:
        await reg.close()
    assert not (plugin_dir / RESOURCE.socket_name).exists()


class LogEvent(logging.Handler):
    """An asyncio.Event set when a record containing `text` is logged."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.seen = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()


async def test_directory_removed_and_recreated(plugin_dir: Path, registrar: Registrar) -> None:
    sim = KubeletSimulator(plugin_dir)
    await sim.start()
    went_away = LogEvent("went away; waiting for it")
    logging.getLogger("kubegpu.plugin.registrar").addHandler(went_away)
    try:
        await registrar.set_servers([_server(plugin_dir)])
        await sim.wait_for(lambda: sim.allocatable().get(RESOURCE.name) == 4, timeout=5)
        await sim.stop()
        shutil.rmtree(plugin_dir)
        async with asyncio.timeout(5):  # the watcher notices before the kubelet comes back
            await went_away.seen.wait()
        sim = KubeletSimulator(plugin_dir)  # a fresh kubelet re-creates the directory
        await sim.start()
        await sim.wait_for(lambda: sim.allocatable().get(RESOURCE.name) == 4, timeout=10)
        assert (plugin_dir / RESOURCE.socket_name).exists()
    finally:
        logging.getLogger("kubegpu.plugin.registrar").removeHandler(went_away)
        await sim.stop()


async def test_rejected_registration_is_retried_with_backoff(
    plugin_dir: Path, registrar: Registrar, sim: KubeletSimulator
) -> None:
    bad = build_resources(INVENTORY)[0]
    object.__setattr__(bad, "name", "kubernetes.io/gpu")  # the kubelet refuses this name
    server = ResourceServer(bad, plugin_dir, AllocateOptions(), INVENTORY.link_map)
    await registrar.set_servers([server])
    await sim.wait_for(lambda: len(sim.events(EventKind.REGISTRATION_REJECTED)) >= 6, timeout=10)
    state = registrar.state["kubernetes.io/gpu"]
    assert state.last_error == 'UNKNOWN: the ResourceName "kubernetes.io/gpu" is invalid'
    # Retried, but backing off rather than spinning. The first attempts come from start-up wake-ups
    # (set_servers, the watcher, our socket appearing); after them each wait is at least the back-off's
    # lower bound (20 ms doubling, less 20% jitter), and load only makes the gaps longer.
    times = [e.time for e in sim.events(EventKind.REGISTRATION_REJECTED)][:6]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert [gap >= low for gap, low in zip(gaps[-3:], (0.016, 0.032, 0.064), strict=True)] == [True] * 3, gaps


@pytest.mark.parametrize(
    ("pick", "delays"),
    [
        # 20 ms doubling to 5 s, each wait 20% either side, never above 5 s.
        ("low", [0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.0, 4.0]),
        ("high", [0.024, 0.048, 0.096, 0.192, 0.384, 0.768, 1.536, 3.072, 5.0, 5.0]),
    ],
)
def test_registration_backoff_bounds(pick: str, delays: list[float]) -> None:
    backoff = replace(registration_backoff(), uniform=lambda lo, hi: lo if pick == "low" else hi)
    assert [backoff.next_delay() for _ in range(10)] == pytest.approx(delays)
    backoff.reset()
    assert backoff.next_delay() == pytest.approx(delays[0])


async def test_a_kubelet_restart_that_keeps_our_socket_restarts_the_server_before_registering(
    plugin_dir: Path, registrar: Registrar, sim: KubeletSimulator, caplog: pytest.LogCaptureFixture
) -> None:
    # The simulator's usual restart deletes our socket, so this branch never ran in a test: a kubelet whose
    # clean-up did not remove it leaves our server serving, registered with a kubelet that is gone.
    server = _server(plugin_dir)
    await registrar.set_servers([server])
    await sim.wait_for(lambda: sim.allocatable().get(RESOURCE.name) == 4, timeout=5)
    assert server.incarnation == 1
    mark = sim.last_seq
    with caplog.at_level(logging.INFO, logger="kubegpu.plugin.registrar"):
        await sim.restart(keep_plugin_sockets=True)
        await sim.wait_for_event(EventKind.DEVICES_UPDATED, resource=RESOURCE.name, after=mark, timeout=5)
    assert "kubelet restarted: restarting nvidia.com/gpu before registering again" in caplog.messages
    assert server.incarnation == 2  # restarted, so the old kubelet's stream is gone before we register
    assert len(sim.events(EventKind.REGISTERED, resource=RESOURCE.name)) == 2
    assert sim.allocatable()[RESOURCE.name] == 4
    pod = await sim.admit(Pod("after", containers=[Container("c", {RESOURCE.name: 2})]))
    assert len(pod.containers["c"].devices[RESOURCE.name]) == 2
    await registered(registrar)


async def test_a_server_that_restarts_itself_is_registered_again(
    plugin_dir: Path, registrar: Registrar, sim: KubeletSimulator
) -> None:
    server = _server(plugin_dir)
    await registrar.set_servers([server])
    await sim.wait_for(lambda: sim.allocatable().get(RESOURCE.name) == 4, timeout=5)
    # 1,200 replicas: too many for the 64 KiB the server started with, so it serves again, larger.
    mark = sim.last_seq
    await server.update(
        replicas(300, gpus=4)
    )  # wakes the registrar, which restarts the server and registers it
    await sim.wait_for_event(EventKind.REGISTERED, resource=RESOURCE.name, after=mark, timeout=10)
    await sim.wait_for(lambda: sim.allocatable().get(RESOURCE.name) == 1200, timeout=10)
    assert server.incarnation == 2 and server.receive_limit > 65536
    assert len(sim.events(EventKind.REGISTERED, resource=RESOURCE.name)) == 2
    await registered(registrar)


async def test_the_plugin_directory_we_create_is_0750_whatever_the_umask(plugin_dir: Path) -> None:
    fresh = plugin_dir / "not-yet" / "device-plugins"
    previous = os.umask(0)
    try:
        reg = Registrar(fresh, fresh / "kubelet.sock")
        await reg.start()
        await reg.close()
    finally:
        os.umask(previous)
    assert [stat.S_IMODE(p.stat().st_mode) for p in (fresh.parent, fresh)] == [0o750, 0o750]


@pytest.mark.parametrize("yields", [0, 1, 2, 3])
async def test_close_right_after_a_wake_up_ends_the_loop(
    plugin_dir: Path, yields: int, caplog: pytest.LogCaptureFixture
) -> None:
    reg = Registrar(plugin_dir, plugin_dir / "kubelet.sock")
    await reg.start()
    await reg.reconcile()
    for _ in range(3):
        await asyncio.sleep(0)  # let the loop reach its wait
    reg.wake()
    for _ in range(yields):
        await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING, logger="kubegpu.plugin.registrar"):
        await reg.close()
    assert not [m for m in caplog.messages if "did not end" in m]


MANY = ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb"]


@pytest.mark.parametrize("keep_plugin_sockets", [False, True])
async def test_several_resources_register_again_at_once_after_each_kubelet_restart(
    plugin_dir: Path, registrar: Registrar, sim: KubeletSimulator, keep_plugin_sockets: bool
) -> None:
    # Servers restart and register concurrently: each must still restart before it registers with the new
    # kubelet, register exactly once with it, and end with its devices listed, whichever order they finish.
    servers = [
        ResourceServer(replace(RESOURCE, name=name), plugin_dir, AllocateOptions(), INVENTORY.link_map)
        for name in MANY
    ]
    await registrar.set_servers(servers)
    await sim.wait_for(lambda: all(sim.allocatable().get(n) == 4 for n in MANY), timeout=10)
    for restart in range(1, 4):
        mark = sim.last_seq
        await sim.restart(keep_plugin_sockets=keep_plugin_sockets)
        for name in MANY:
            await sim.wait_for_event(EventKind.DEVICES_UPDATED, resource=name, after=mark, timeout=10)
        await sim.wait_for(lambda: all(sim.allocatable().get(n) == 4 for n in MANY), timeout=10)
        assert [len(sim.events(EventKind.REGISTERED, resource=n, after=mark)) for n in MANY] == [1] * 4
        assert [s.incarnation for s in servers] == [restart + 1] * 4  # each restarted once per kubelet
        assert [len(sim.devices(n)) for n in MANY] == [4] * 4
    assert not sim.events(EventKind.STREAM_ENDED)  # no old stream tore a new registration down
    await registered(registrar)
    assert sorted(p.name for p in plugin_dir.glob("*.sock")) == sorted(
        ["kubelet.sock", *(f"nvidia-{n.split('/')[1]}.sock" for n in MANY)]
    )

"""The daemon in this process, against the kubelet simulator on the fake NVML, with failures injected.

The contract tests run the daemon as a process as a node would; these reach inside it: a reload whose
config cannot be served, a parse that overruns its budget, a health thread or a task that dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import shutil
import socket
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from kubegpu.common.backoff import Backoff
from kubegpu.kubeletsim import Container, KubeletSimulator, Pod
from kubegpu.node.nvml.fake_state import StateDir
from kubegpu.plugin.daemon import Daemon, StartupError
from kubegpu.settings.given import read_given
from kubegpu.settings.plugin import PluginSettings, resolve
from kubegpu.settings.setting import PLUGIN
from kubegpu.settings.table import for_command
from tests.contract.conftest import profile_inventory

GPU = "nvidia.com/gpu"
UUIDS = [g.uuid for g in profile_inventory("dgx-a100").gpus]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Node:
    """A daemon, its config file, its fake NVML's state and the simulated kubelet, all in one root."""

    def __init__(self, root: Path, sim: KubeletSimulator, env: dict[str, str]) -> None:
        self.root = root
        self.sim = sim
        self.config = root / "config.yaml"
        self.state = StateDir(root / "nvml")
        self.flags = read_given(for_command(PLUGIN), environ=env)
        self.daemon: Daemon
        self.task: asyncio.Task[int]

    def settings(self) -> PluginSettings:
        return resolve(self.flags)

    def start(self, **daemon_options: Any) -> None:
        options = {"reload_settings": self.settings, **daemon_options}
        self.daemon = Daemon(self.settings(), **options)
        self.task = asyncio.create_task(self.daemon.run())

    async def allocatable(self, count: int, resource: str = GPU, timeout: float = 20.0) -> None:
        await self.sim.wait_for(
            lambda: self.sim.registered(resource) and self.sim.allocatable().get(resource) == count,
            timeout=timeout,
        )

    def counter(self, name: str, **labels: str) -> float | None:
        return self.daemon.metrics.registry.get_sample_value(name, labels)

    def healthz(self) -> tuple[int, str]:
        assert self.daemon.endpoints.http is not None
        try:
            port = self.daemon.endpoints.http.port
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    async def stop(self) -> int:
        self.daemon.stop()
        return await asyncio.wait_for(self.task, 20)


@contextlib.asynccontextmanager
async def node(config: str = "version: v1\n", **env: str) -> AsyncIterator[Node]:
    root = Path(tempfile.mkdtemp(prefix="kg-", dir="/tmp"))  # unix socket paths are short
    sim = KubeletSimulator(root / "device-plugins")
    await sim.start()
    (root / "config.yaml").write_text(config)
    environ = {
        "KUBELET_SOCKET": str(sim.socket_path),
        "CONFIG_FILE": str(root / "config.yaml"),
        "KUBEGPU_FAKE_NVML": "dgx-a100",
        "KUBEGPU_FAKE_NVML_STATE": str(root / "nvml"),
        "KUBEGPU_POD_RESOURCES_SOCKET": "",
        # The metrics these tests read exist only with the HTTP endpoint (plugin/events.py).
        "KUBEGPU_HTTP_PORT": str(free_port()),
        "KUBEGPU_HTTP_ADDRESS": "127.0.0.1",
        **env,
    }
    n = Node(root, sim, environ)
    try:
        yield n
    finally:
        if hasattr(n, "task") and not n.task.done():
            with contextlib.suppress(Exception):
                await n.stop()
        await sim.stop()
        shutil.rmtree(root, ignore_errors=True)


async def until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    """Wait for a condition the daemon reaches on its own (a log line, a task state): checked every 10 ms."""
    async with asyncio.timeout(timeout):
        while not condition():  # noqa: ASYNC110 - the daemon has no event for the test to wait on here
            await asyncio.sleep(0.01)


@pytest.mark.parametrize(
    ("profile", "good", "bad", "error", "resource", "xid_gpu", "before", "after"),
    [
        (
            "a100-mig",
            "version: v1\nflags:\n  migStrategy: mixed\n",
            "version: v1\nflags:\n  migStrategy: single\n",
            "error building device map from config.resources: invalid MIG configuration: error visiting "
            "devices: error visiting device: error visiting device: error visiting MIG device: error "
            "visiting MIG device: more than one MIG device type present on node",
            "nvidia.com/mig-1g.5gb",
            0,  # seven of the eight 1g.5gb devices live on GPU 0
            8,
            1,
        ),
        (
            "dgx-a100",
            "version: v1\n",
            "version: v1\nimex:\n  channelIDs: [0]\n  required: true\n",
            "requested IMEX channel channel0 does not exist",
            GPU,
            2,
            8,
            7,
        ),
    ],
)
async def test_a_config_that_validates_but_does_not_build_keeps_the_old_one_and_its_monitor(
    caplog: pytest.LogCaptureFixture,
    profile: str,
    good: str,
    bad: str,
    error: str,
    resource: str,
    xid_gpu: int,
    before: int,
    after: int,
) -> None:
    async with node(good, KUBEGPU_FAKE_NVML=profile) as n:
        n.start()
        await n.allocatable(before, resource)
        n.config.write_text(bad)
        await n.daemon.reload()
        assert f"config reload failed, keeping the last good config running: {error}" in caplog.text
        # the file watcher may see the write and reload once more: each reload of this file fails
        failed = n.counter("kubegpu_config_reloads_total", result="failed")
        assert failed in (1, 2)
        assert n.counter("kubegpu_config_reload_failures_total", reason="resources") == failed
        assert n.counter("kubegpu_config_last_reload_successful") == 0
        assert n.sim.allocatable()[resource] == before
        n.state.inject_xid(xid_gpu, 79)  # the health monitor still runs, untouched
        await n.allocatable(after, resource)
        n.config.write_text(good + "# a later, good change\n")
        await n.daemon.reload()
        assert n.counter("kubegpu_config_reloads_total", result="applied") in (1, 2)
        assert n.counter("kubegpu_config_last_reload_successful") == 1
        assert n.sim.allocatable()[resource] == after
        assert await n.stop() == 0


async def test_a_cdi_root_that_cannot_be_written_on_reload_keeps_everything_running(
    caplog: pytest.LogCaptureFixture,
) -> None:
    blocker = Path(tempfile.mkdtemp(prefix="kg-", dir="/tmp")) / "not-a-directory"
    blocker.write_text("a file where the CDI root's parent should be\n")
    try:
        async with node(KUBEGPU_CDI_ROOT=str(blocker / "cdi")) as n:
            n.start()
            await n.allocatable(8)
            n.config.write_text("version: v1\nflags:\n  plugin:\n    deviceListStrategy: cdi-annotations\n")
            await n.daemon.reload()
            assert f"unable to write CDI specs to {blocker / 'cdi'}" in caplog.text
            assert n.counter("kubegpu_config_reload_failures_total", reason="cdi") == 1
            allocation = await n.sim.admit(Pod("p", containers=[Container("c", {GPU: 1})]))
            run = allocation.containers["c"].run_options
            assert run is not None and run.envs["NVIDIA_VISIBLE_DEVICES"] in UUIDS  # the old config answers
            n.state.inject_xid(3, 79)  # XIDs still reach the kubelet
            await n.allocatable(7)
            n.config.write_text("version: v1\nflags:\n  plugin:\n    deviceIDStrategy: index\n")
            await n.daemon.reload()  # later configs are not ignored
            assert n.counter("kubegpu_config_reloads_total", result="applied") == 1
            allocation = await n.sim.admit(Pod("q", containers=[Container("c", {GPU: 1})]))
            run = allocation.containers["c"].run_options
            assert run is not None and run.envs["NVIDIA_VISIBLE_DEVICES"].isdigit()
            assert await n.stop() == 0
            assert "Traceback" not in caplog.text
    finally:
        shutil.rmtree(blocker.parent, ignore_errors=True)


async def test_a_config_parse_over_its_budget_keeps_the_old_config_and_allocate_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with node() as n:
        release = threading.Event()
        parsing = threading.Event()

        def slow_parse() -> PluginSettings:
            parsing.set()
            release.wait(30)  # a 10 MB file of unknown keys, say
            return n.settings()

        n.start(reload_settings=slow_parse, config_load_budget_s=0.5)
        await n.allocatable(8)
        reload = asyncio.create_task(n.daemon.reload())
        await asyncio.to_thread(parsing.wait, 10)
        # A parse that hangs is found by its name in a thread dump (py-spy, faulthandler).
        assert "config-parse" in [t.name for t in threading.enumerate()]
        allocation = await n.sim.admit(Pod("p", containers=[Container("c", {GPU: 2})]))  # while it parses
        assert len(allocation.containers["c"].devices[GPU]) == 2
        await reload
        failed = "config reload failed, keeping the last good config running: "
        over = "parsing the config file took longer than its 0.5 s budget"
        assert f"{failed}{over}; fix the file (a ConfigMap holds at most 1 MiB)" in caplog.messages
        assert n.counter("kubegpu_config_reload_failures_total", reason="timeout") == 1
        await n.daemon.reload()  # the first parse still runs: no second thread piles up behind it
        still = "the config file's previous parse is still running, over its 0.5 s budget"
        assert f"{failed}{still}; fix the file (a ConfigMap holds at most 1 MiB) and reload again" in (
            caplog.messages
        )
        assert n.counter("kubegpu_config_reload_failures_total", reason="timeout") == 2
        release.set()
        loader = n.daemon._settings_loader
        assert loader is not None
        await until(lambda: loader.parsing is not None and loader.parsing.done())
        await n.daemon.reload()
        assert n.counter("kubegpu_config_reloads_total", result="applied") == 1
        assert await n.stop() == 0


async def test_undecodable_config_fails_the_reload_and_the_watcher_picks_up_the_next_file(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with node() as n:
        n.start()
        await n.allocatable(8)
        n.config.write_bytes(b"# caf\xe9\nversion: v1\n\xff\xfe\x00garbage")
        await until(lambda: n.counter("kubegpu_config_reloads_total", result="failed") == 1)
        assert n.counter("kubegpu_config_reload_failures_total", reason="invalid_config") == 1
        assert "config reload failed, keeping the last good config running" in caplog.text
        n.config.write_text("version: v1\nflags:\n  plugin:\n    deviceIDStrategy: index\n")
        await until(lambda: n.counter("kubegpu_config_reloads_total", result="applied") == 1)
        allocation = await n.sim.admit(Pod("p", containers=[Container("c", {GPU: 1})]))
        run = allocation.containers["c"].run_options
        assert run is not None and run.envs["NVIDIA_VISIBLE_DEVICES"].isdigit()
        assert n.daemon.supervisor.states()["config-watch"]
        assert await n.stop() == 0


async def test_a_health_thread_that_dies_is_restarted_and_healthz_names_it_while_it_is_down(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with node(KUBEGPU_HTTP_PORT=str(free_port()), KUBEGPU_HTTP_ADDRESS="127.0.0.1") as n:
        # 3 s down: room for the /healthz read on a loaded machine before the restart
        n.start(restart_backoff=lambda: Backoff(initial=3.0, maximum=3.0))
        await n.allocatable(8)
        fake = n.daemon.nvml
        real_wait = fake.nvmlEventSetWait_v2
        broken = [True]

        def wait_once_broken(event_set: object, timeout_ms: int) -> object:
            if broken[0]:
                broken[0] = False
                raise RuntimeError("injected failure in the NVML event wait")
            return real_wait(event_set, timeout_ms)

        fake.nvmlEventSetWait_v2 = wait_once_broken
        await until(lambda: bool(n.daemon.supervisor.down()))
        status, body = await asyncio.to_thread(n.healthz)
        assert status == 503
        assert re.match(
            r"unhealthy: background task nvml-health is down for [0-2] s after 1 failure\(s\), last: ", body
        ), body
        assert "RuntimeError: injected failure in the NVML event wait" in body
        failure = next(r for r in caplog.records if "background task nvml-health failed" in r.getMessage())
        assert failure.levelno == logging.ERROR and failure.exc_info is not None  # logged with its cause
        await until(lambda: n.counter("kubegpu_task_restarts_total", task="nvml-health") == 1)
        await until(lambda: n.daemon.supervisor.down() == [])
        # The new thread watches: an XID reaches the kubelet. Its event set only sees events raised after it
        # is armed, which can trail the task's restart on a loaded machine: inject until one lands.
        async with asyncio.timeout(60):
            while n.sim.allocatable().get(GPU) != 7:
                n.state.inject_xid(6, 79)
                await asyncio.sleep(0.5)
        status, _ = await asyncio.to_thread(n.healthz)
        assert status == 200
        assert await n.stop() == 0


async def test_a_restarted_health_reports_task_catches_up_with_what_it_missed() -> None:
    async with node() as n:
        n.start(restart_backoff=lambda: Backoff(initial=0.01, maximum=0.01))
        await n.allocatable(8)
        real_sync = n.daemon._sync_health
        broken = [True]

        async def sync_once_broken() -> None:
            if broken[0]:
                broken[0] = False
                raise RuntimeError("injected failure while serving a health change")
            await real_sync()

        n.daemon._sync_health = sync_once_broken  # type: ignore[method-assign]
        n.state.inject_xid(1, 79)  # its health change is the one that fails to be served
        await n.allocatable(7)
        assert n.counter("kubegpu_task_restarts_total", task="health-reports") == 1
        assert await n.stop() == 0


async def test_a_task_that_keeps_failing_ends_the_daemon_with_exit_code_1(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken_watch(*args: object, **kwargs: object) -> None:
        raise OSError("injected: cannot watch the config directory")

    monkeypatch.setattr("kubegpu.plugin.daemon.watch_file", broken_watch)
    async with node() as n:
        n.start(restart_backoff=lambda: Backoff(initial=0.01, maximum=0.01))
        assert await asyncio.wait_for(n.task, 30) == 1
        assert (
            "background task config-watch failed (OSError: injected: cannot watch the config directory); "
            in caplog.text
        )
        assert "5 failures in a row: exiting so that the plugin is restarted" in caplog.text
        # The kubelet learns it from the stream's end, a moment after the daemon has returned.
        await n.sim.wait_for(lambda: n.sim.allocatable().get(GPU, 0) == 0 or not n.sim.registered(GPU), 10)


@pytest.mark.parametrize(
    ("address", "cause"),
    [("127.0.0.1", "Address already in use"), ("no-such-host.invalid", "")],
)
async def test_an_http_endpoint_that_cannot_listen_stops_the_start_with_the_cause_and_the_fix(
    address: str, cause: str
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        async with node(KUBEGPU_HTTP_PORT=str(port), KUBEGPU_HTTP_ADDRESS=address) as n:
            n.start()
            with pytest.raises(StartupError) as err:
                await asyncio.wait_for(n.task, 20)
    message = str(err.value)
    assert message.startswith(f"cannot serve the HTTP endpoint on {address}:{port}: {cause}")
    assert message.endswith(
        "; choose a free --http-port (KUBEGPU_HTTP_PORT) and an address of this node for --http-address "
        "(KUBEGPU_HTTP_ADDRESS)"
    )

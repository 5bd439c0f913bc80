"""The daemon's passes (config reload, rediscovery, refresh) and what each says: a failure names its pass
and keeps the last good config serving (only a reload reads the config file, and only a reload counts in the
reload metrics); an apply that fails part-way ends the daemon with 1; requests made during a pass are merged
into the next. What a pass says and does once it succeeds: the discovery line in each of its shapes, the
retries for no GPUs and for MPS daemons not ready yet, the CDI spec it writes.

In this process, with failures put in the preparer, the parser, NVML or the servers' apply on purpose."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import tempfile
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pynvml
import pytest

from kubegpu.node.nvml.fake import FakeNvml
from kubegpu.plugin.prepare import ReloadError
from kubegpu.settings.plugin import PluginSettings
from tests.contract.conftest import profile_inventory
from tests.plugin.test_daemon import GPU, Node, node, until

DAEMON = "kubegpu.plugin.daemon"


@contextlib.asynccontextmanager
async def serving(caplog: pytest.LogCaptureFixture) -> AsyncIterator[Node]:
    """A daemon serving the fake DGX A100's 8 GPUs, its log lines captured."""
    caplog.set_level(logging.INFO, logger=DAEMON)
    async with node() as n:
        n.start()
        await n.allocatable(8)
        yield n


def failures(n: Node, reason: str) -> float | None:
    return n.counter("kubegpu_config_reload_failures_total", reason=reason)


def lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == DAEMON and r.levelno == level]


async def test_a_pass_that_cannot_be_prepared_names_itself_and_keeps_serving(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serving(caplog) as n:

        async def cannot(*args: object, **kwargs: object) -> None:
            raise ReloadError("discovery", "nvml init failed: Unknown Error")

        monkeypatch.setattr(n.daemon._preparer, "prepare", cannot)
        await n.daemon.reload()
        await n.daemon._reconcile(rediscover=True)
        await n.daemon._reconcile(rediscover=False)
        assert lines(caplog, logging.ERROR) == [
            f"{what} failed, keeping the last good config running: nvml init failed: Unknown Error"
            for what in ("config reload", "rediscovery", "refresh")
        ]
        assert failures(n, "discovery") == 1  # the config reload's only
        assert n.counter("kubegpu_config_reloads_total", result="failed") == 1
        await n.allocatable(8)
        assert await n.stop() == 0


async def test_a_bug_while_preparing_keeps_serving_and_counts_an_error_for_a_reload_only(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serving(caplog) as n:

        async def broken(*args: object, **kwargs: object) -> None:
            raise KeyError("a bug")

        monkeypatch.setattr(n.daemon._preparer, "prepare", broken)
        await n.daemon.reload()
        await n.daemon._reconcile(rediscover=True)
        await n.daemon._reconcile(rediscover=False)
        assert lines(caplog, logging.ERROR) == [
            f"{what} failed unexpectedly, keeping the last good config running"
            for what in ("config reload", "rediscovery", "refresh")
        ]
        assert all(r.exc_info for r in caplog.records if r.name == DAEMON and r.levelno == logging.ERROR)
        assert failures(n, "error") == 1
        assert n.counter("kubegpu_config_reloads_total", result="failed") == 1
        await n.allocatable(8)
        assert await n.stop() == 0


async def test_an_apply_that_fails_part_way_ends_the_daemon_with_1(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serving(caplog) as n:

        async def half_applied(*args: object, **kwargs: object) -> None:
            raise OSError("the servers are in an unknown state")

        monkeypatch.setattr(n.daemon.serving, "apply_servers", half_applied)
        await n.daemon._reconcile(rediscover=True)
        assert await asyncio.wait_for(n.task, 20) == 1
        assert lines(caplog, logging.CRITICAL) == [
            "applying the rediscovery failed part-way; exiting to be restarted"
        ]
        (critical,) = [r for r in caplog.records if r.levelno == logging.CRITICAL]
        assert critical.exc_info is not None and isinstance(critical.exc_info[1], OSError)  # the traceback
        assert n.counter("kubegpu_config_reloads_total", result="applied") == 0


async def test_a_rediscovery_asked_for_during_a_pass_is_not_dropped_by_a_later_refresh(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with serving(caplog) as n:
        discovered = caplog.text.count("discovered 8 GPU(s)")
        running = asyncio.create_task(n.daemon._reconcile(rediscover=False))
        rediscovery = asyncio.create_task(n.daemon._reconcile(rediscover=True))
        refresh = asyncio.create_task(n.daemon._reconcile(rediscover=False))
        await asyncio.gather(running, rediscovery, refresh)
        # The running refresh, then one pass for both requests: it must rediscover.
        assert caplog.text.count("discovered 8 GPU(s)") == discovered + 1
        assert await n.stop() == 0


async def test_a_reload_says_in_one_line_what_changed_and_what_is_served(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with serving(caplog) as n:
        n.config.write_text("version: v1\nflags:\n  plugin:\n    deviceIDStrategy: index\n")
        await n.daemon.reload()
        # (The file watcher may reload once more on the write: the first line is this reload's.)
        done = [line for line in lines(caplog, logging.INFO) if line.startswith("reload complete")]
        assert done[0] == (
            'reload complete: config changed: flags.plugin.deviceIDStrategy "uuid" -> "index"; served: '
            "nvidia.com/gpu: update (options)"
        )
        assert await n.stop() == 0


async def test_a_rediscovery_after_a_refused_config_file_serves_the_last_good_config(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Only a config reload reads the config file. A rediscovery (a lost GPU back, the discovery retry) or a
    # refresh that read it too would fail on the file the reload refused, and a GPU that came back would
    # never be served again until someone fixed the file.
    async with serving(caplog) as n:
        n.config.write_text("version: v1\nflags:\n  plugin:\n    deviceIDStrategy: serial\n")
        await n.daemon.reload()
        discovered = caplog.text.count("discovered 8 GPU(s)")
        await n.daemon._reconcile(rediscover=True)
        await n.daemon._reconcile(rediscover=False)
        assert caplog.text.count("discovered 8 GPU(s)") == discovered + 1
        refused = lines(caplog, logging.ERROR)
        # (The file watcher may reload once more on the write: every failure is a config reload's.)
        assert set(refused) == {
            "config reload failed, keeping the last good config running: unable to validate flags: invalid "
            "--device-id-strategy option: serial"
        }
        assert failures(n, "invalid_config") == len(refused)
        assert n.daemon.settings.plugin.deviceIDStrategy == "uuid"
        await n.allocatable(8)
        assert await n.stop() == 0


async def test_each_discovery_says_in_one_line_what_it_found_and_what_is_served(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with serving(caplog) as n:
        n.config.write_text(
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
            "    - name: nvidia.com/gpu\n      replicas: 2\n"
        )
        await n.daemon.reload()
        await n.allocatable(16)
        # (The file watcher may reload once more on the write: the first two lines are the start's and ours.)
        found = [line for line in lines(caplog, logging.INFO) if line.startswith("discovered")]
        assert found[:2] == [
            "discovered 8 GPU(s) (driver 550.90.07, CUDA 12.4); serving nvidia.com/gpu=8",
            "discovered 8 GPU(s) (driver 550.90.07, CUDA 12.4); serving nvidia.com/gpu=16",
        ]
        assert await n.stop() == 0


def discovered(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [line for line in lines(caplog, logging.INFO) if line.startswith("discovered")]


async def test_the_discovery_line_names_every_resource_served(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=DAEMON)
    async with node(KUBEGPU_FAKE_NVML="a100-mig", MIG_STRATEGY="mixed") as n:
        n.start()
        await until(lambda: discovered(caplog) != [])
        assert discovered(caplog) == [
            "discovered 4 GPU(s) (driver 550.90.07, CUDA 12.4); serving nvidia.com/gpu=1, "
            "nvidia.com/mig-1g.5gb=8, nvidia.com/mig-2g.10gb=1, nvidia.com/mig-3g.20gb=3"
        ]
        assert await n.stop() == 0


MPS = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n"
NOT_READY = "not serving nvidia.com/gpu yet: the MPS control daemon is not ready"


def mps_env(**env: str) -> dict[str, str]:
    root = Path(tempfile.mkdtemp(prefix="kg-mps-", dir="/tmp"))
    return {"MPS_ROOT": str(root / "host"), "KUBEGPU_MPS_CONTAINER_ROOT": str(root / "container"), **env}


async def test_the_discovery_line_says_so_when_nothing_is_served_yet(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # GPUs found, but the only resource is MPS and its control daemon does not answer yet: withheld.
    caplog.set_level(logging.INFO, logger=DAEMON)
    async with node(MPS, **mps_env()) as n:
        n.start()
        await until(lambda: discovered(caplog) != [])
        assert discovered(caplog) == ["discovered 8 GPU(s) (driver 550.90.07, CUDA 12.4); serving nothing"]
        assert lines(caplog, logging.WARNING)[0].startswith(NOT_READY)
        assert await n.stop() == 0


async def test_an_mps_resource_is_retried_by_one_task_until_its_daemon_answers(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    ready = threading.Event()  # the control daemon, as the plugin's check sees it

    def alive(root: Path, resource: str, timeout_s: float) -> tuple[bool, str]:
        return (True, "") if ready.is_set() else (False, "no pipe yet")

    monkeypatch.setattr("kubegpu.plugin.prepare.mps_daemon_alive", alive)
    caplog.set_level(logging.INFO, logger=DAEMON)
    async with node(MPS, **mps_env(KUBEGPU_MPS_RETRY_SECONDS="0.05")) as n:
        n.start()
        await until(lambda: caplog.text.count(NOT_READY) >= 4)  # the start and three retries
        assert n.daemon.supervisor.running("mps-retry") and not n.sim.registered(GPU)
        ready.set()
        await n.allocatable(16)
        await until(lambda: not n.daemon.supervisor.running("mps-retry"))
        assert len(discovered(caplog)) == 1  # the retries are refreshes: no rediscovery
        assert await n.stop() == 0


async def test_versions_nvml_cannot_read_are_a_question_mark_in_the_discovery_line(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def not_supported(self: FakeNvml) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    for call in (
        "nvmlSystemGetDriverVersion",
        "nvmlSystemGetCudaDriverVersion",
        "nvmlSystemGetCudaDriverVersion_v2",
    ):
        monkeypatch.setattr(FakeNvml, call, not_supported)
    async with serving(caplog) as n:
        assert discovered(caplog) == ["discovered 8 GPU(s) (driver ?, CUDA ?); serving nvidia.com/gpu=8"]
        assert await n.stop() == 0


async def test_no_gpus_is_said_once_while_the_retry_keeps_looking(caplog: pytest.LogCaptureFixture) -> None:
    # failOnInitError=false on a node without a driver: NVIDIA's line once, not once per retry, and one
    # retry task that keeps running passes.
    caplog.set_level(logging.INFO, logger=DAEMON)
    env = {"FAIL_ON_INIT_ERROR": "false", "KUBEGPU_DISCOVERY_RETRY_SECONDS": "0.05"}
    async with node(KUBEGPU_FAKE_NVML="no-driver", **env) as n:
        n.start()
        await until(lambda: caplog.text.count("(failOnInitError=false: staying up)") >= 4)
        assert [line for line in lines(caplog, logging.WARNING) if "staying up" not in line] == [
            "No devices found. Waiting indefinitely."
        ]
        assert n.daemon.supervisor.running("discovery-retry")
        assert await n.stop() == 0


async def test_a_parser_that_fails_with_an_unexpected_error_refuses_the_config_by_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Whatever the parser raises is a config that cannot be used: the reload names the error's type and text
    # and counts it as an invalid config, and the last good config keeps serving.
    caplog.set_level(logging.INFO, logger=DAEMON)
    async with node() as n:

        def broken_parse() -> PluginSettings:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

        n.start(reload_settings=broken_parse)
        await n.allocatable(8)
        await n.daemon.reload()
        assert lines(caplog, logging.ERROR) == [
            "config reload failed, keeping the last good config running: UnicodeDecodeError: 'utf-8' codec "
            "can't decode byte 0xff in position 0: invalid start byte"
        ]
        assert failures(n, "invalid_config") == 1
        await n.allocatable(8)
        assert await n.stop() == 0


async def test_a_reload_to_a_cdi_strategy_writes_a_spec_for_every_gpu_and_mig_device() -> None:
    root = Path(tempfile.mkdtemp(prefix="kg-cdi-", dir="/tmp"))
    # The driver's MIG capability minors: GPU 0's GPU instance 7 and its compute instance 0.
    caps = root / "driver" / "proc/driver/nvidia-caps"
    caps.mkdir(parents=True)
    (caps / "mig-minors").write_text("gpu0/gi7/access 66\ngpu0/gi7/ci0/access 67\n")
    env = {"KUBEGPU_CDI_ROOT": str(root / "cdi"), "NVIDIA_DRIVER_ROOT": str(root / "driver")}
    inventory = profile_inventory("a100-mig")
    async with node(KUBEGPU_FAKE_NVML="a100-mig", MIG_STRATEGY="mixed", **env) as n:
        n.start()
        await until(lambda: n.daemon.expected_resources() is not None)
        assert not (root / "cdi").exists()  # the envvar strategy needs no spec
        n.config.write_text("version: v1\nflags:\n  plugin:\n    deviceListStrategy: [cdi-annotations]\n")
        await n.daemon.reload()
        spec = json.loads((root / "cdi" / "k8s.device-plugin.nvidia.com-gpu.json").read_text())
        assert spec["kind"] == "k8s.device-plugin.nvidia.com/gpu"
        devices = {d["name"]: d for d in spec["devices"]}
        gpus = [g.uuid for g in inventory.gpus]
        migs = [m.uuid for g in inventory.gpus for m in g.mig_devices]
        assert len(gpus) == 4 and len(migs) == 12
        assert sorted(devices) == sorted([*gpus, *migs, "all"])
        nodes = devices["MIG-52a06433-5415-43f7-8ea9-aa13f22aedbf"]["containerEdits"]["deviceNodes"]
        assert [d["path"] for d in nodes] == [
            "/dev/nvidia0",
            "/dev/nvidia-caps/nvidia-cap66",
            "/dev/nvidia-caps/nvidia-cap67",
        ]
        assert await n.stop() == 0

"""The fault book is what is served: after a successful reload, every fault it holds is in the snapshot the
servers serve and the kubelet is told, whatever the reload changed (nothing, Allocate options, device IDs).

In this process, so the test reads the daemon's own fault book and served snapshot; the health monitor is
kept (the same GPUs after each reload), so only the book can carry a fault across a reload.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from kubegpu.kubeletsim import EventKind
from kubegpu.node.inventory import Health
from kubegpu.plugin.prepare import why_missing
from tests.plugin.test_daemon import GPU, UUIDS, Node, node, until

RELOADED_CONFIGS = [
    "version: v1\n# nothing changed but this line\n",
    "version: v1\nflags:\n  plugin:\n    deviceIDStrategy: index\n",  # new Allocate answers, same list
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n",
]


def served_health(n: Node) -> dict[str, list[Health]]:
    """Per GPU UUID, the health of every device the servers serve for it (a GPU, or its replicas)."""
    out: dict[str, list[Health]] = {}
    for server in n.daemon.registrar.servers:
        for device in server.resource.devices:
            out.setdefault(device.uuid, []).append(device.health)
    return out


async def test_a_successful_reload_serves_every_fault_of_the_fault_book(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="kubegpu.plugin.daemon")
    async with node() as n:
        n.start()
        await n.allocatable(8)
        n.state.inject_xid(2, 79)
        n.state.inject_xid(5, 48)
        await n.allocatable(6)
        # Each health change served says how many devices are left (an update, not a new registration).
        healthy = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"{GPU}: ")]
        assert healthy[-1] == f"{GPU}: 6 of 8 devices healthy"
        assert len(n.sim.events(EventKind.REGISTERED, resource=GPU)) == 1
        faults = n.daemon.faults.snapshot()
        assert sorted(faults) == sorted([UUIDS[2], UUIDS[5]])
        for config, allocatable in zip(RELOADED_CONFIGS, [6, 6, 12], strict=True):
            mark = n.sim.last_seq
            n.config.write_text(config)
            await n.daemon.reload()
            await n.allocatable(allocatable)
            assert n.daemon.faults.snapshot() == faults  # a reload neither clears a fault nor adds one
            health = served_health(n)
            assert sorted(health) == sorted(UUIDS)
            for uuid in UUIDS:
                expected = faults[uuid].health if uuid in faults else Health.ok()
                assert n.daemon.inventory.gpu_by_uuid(uuid).health == expected, uuid
                assert set(health[uuid]) == {expected}, uuid
            # What the kubelet was told since the reload: the faulted GPUs (all their replicas), nothing else.
            for update in n.sim.events(EventKind.DEVICES_UPDATED, resource=GPU, after=mark):
                assert {d.split("::")[0] for d in update.data["unhealthy"]} == set(faults)
        assert n.sim.capacity()[GPU] == 16
        assert await n.stop() == 0


async def lose_at_reload(n: Node, *gpus: int) -> None:
    """The GPUs fall off the bus, then a reload: served Unhealthy, under the same IDs."""
    for gpu in gpus:
        n.state.inject_lost(gpu)
    await n.daemon.reload()
    await n.allocatable(8 - len(gpus))


def clear_faults(n: Node, *gpus: int) -> None:
    """What the monitor does for GPUs whose recovery probes pass (it then signals the change)."""
    for gpu in gpus:
        fault = n.daemon.faults.get(UUIDS[gpu])
        assert fault is not None and n.daemon.faults.clear(UUIDS[gpu], fault)


async def test_a_gpu_lost_with_health_checks_off_is_a_fault_the_reload_serves() -> None:
    # The in-process twin of the contract test: no monitor runs, so the rediscovery alone records the loss.
    async with node(DP_DISABLE_HEALTHCHECKS="all") as n:
        n.start()
        await n.allocatable(8)
        mark = n.sim.last_seq
        n.state.inject_lost(5)
        before = time.monotonic()
        await n.daemon.reload()
        await n.allocatable(7)
        fault = n.daemon.faults.get(UUIDS[5])
        assert fault is not None and fault.reason == "not found by discovery: GPU is lost"  # NVML's word
        # Dated on the monitor's clock when the reload saw the loss: recovery's quiet period counts from it.
        assert before <= fault.last_at <= time.monotonic()
        assert list(n.daemon.faults.snapshot()) == [UUIDS[5]]
        assert served_health(n)[UUIDS[5]] == [fault.health]
        (update, *_) = n.sim.events(EventKind.DEVICES_UPDATED, resource=GPU, after=mark)
        assert update.data["unhealthy"] == [UUIDS[5]]
        assert n.sim.capacity()[GPU] == 8
        assert await n.stop() == 0


async def test_a_lost_gpu_that_recovers_is_rediscovered_without_reloading_the_config(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="kubegpu.plugin.daemon")
    async with node(KUBEGPU_RECOVERY_QUIET_SECONDS="1", KUBEGPU_HEALTH_PROBE_SECONDS="0.1") as n:
        n.start()
        await n.allocatable(8)
        n.state.inject_lost(5)
        await n.daemon.reload()
        await n.allocatable(7)
        n.state.recover(5)
        await n.allocatable(8)
        rediscovered = "discovered 8 GPU(s)"
        await until(lambda: "rediscovering it" in caplog.text and caplog.text.count(rediscovered) == 3)
        assert n.counter("kubegpu_config_reloads_total", result="applied") == 1  # the SIGHUP's only
        assert n.daemon.faults.snapshot() == {}
        assert await n.stop() == 0


async def test_requests_made_during_a_pass_are_all_answered_by_the_next_one() -> None:
    # A rediscovery runs; meanwhile a reload (config and devices) and a refresh (neither) are asked for.
    # The pass after the running one must do what either asked: the refresh must not cancel the reload.
    async with node() as n:
        n.start()
        await n.allocatable(8)
        n.config.write_text("version: v1\nflags:\n  plugin:\n    deviceIDStrategy: index\n")
        running = asyncio.create_task(n.daemon._reconcile(rediscover=True))
        reload = asyncio.create_task(n.daemon.reload())
        refresh = asyncio.create_task(n.daemon._reconcile(rediscover=False))
        await asyncio.gather(running, reload, refresh)
        assert n.daemon.settings.plugin.deviceIDStrategy == "index"
        # The file watcher may reload once more on the write.
        assert n.counter("kubegpu_config_reloads_total", result="applied") in (1, 2)
        assert await n.stop() == 0


async def test_gpus_left_to_dra_stay_left_across_reloads_without_a_retry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Every GPU is `kubegpu dra`'s: nothing to serve, and nothing missing either, after any pass.
    caplog.set_level(logging.INFO, logger="kubegpu.plugin.daemon")
    async with node(KUBEGPU_DRA_GPUS="all") as n:
        n.start()
        await until(lambda: n.daemon.expected_resources() is not None)  # the first discovery has ended
        await n.daemon.reload()  # the config and the devices again
        await n.daemon._reconcile(rediscover=False)  # a refresh: what was left to DRA is kept as it is
        assert sorted(g.uuid for g in n.daemon.serving.to_dra) == sorted(UUIDS)
        assert not n.daemon.supervisor.running("discovery-retry")
        assert "No devices found" not in caplog.text
        assert not n.sim.registered(GPU)
        assert await n.stop() == 0


async def test_a_lost_gpu_whose_fault_was_cleared_stays_unhealthy_through_a_refresh(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The monitor may clear a lost GPU's fault (its probes by UUID pass) a moment before the rediscovery it
    # then asks for has run. A refresh pass in between (an MPS daemon retried) still serves the GPU that
    # discovery does not list as Unhealthy, and records why: no pass may serve a GPU that is gone as Healthy.
    caplog.set_level(logging.WARNING, logger="kubegpu.plugin.daemon")
    async with node(DP_DISABLE_HEALTHCHECKS="all") as n:
        n.start()
        await n.allocatable(8)
        await lose_at_reload(n, 5)
        clear_faults(n, 5)
        await n.daemon._reconcile(rediscover=False)  # before anything else can run: no await in between
        again = n.daemon.faults.get(UUIDS[5])
        assert again is not None and again.reason == "not found by discovery"
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warnings[-2:] == [
            f"GPU 5 ({UUIDS[5]}) not found by discovery: GPU is lost: it stays listed as Unhealthy, "
            "under the same IDs, until it recovers",
            f"GPU 5 ({UUIDS[5]}) not found by discovery: it stays listed as Unhealthy, under the same IDs, "
            "until it recovers",
        ]
        assert served_health(n)[UUIDS[5]] == [again.health]
        await n.allocatable(7)
        assert await n.stop() == 0


async def test_lost_gpus_reported_back_together_are_named_in_one_line_and_rediscovered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The monitor clears the faults of GPUs that pass its recovery probes and signals the change; here its
    # two steps are taken by hand for two GPUs at once (health checks off: nothing else touches the book).
    caplog.set_level(logging.INFO, logger="kubegpu.plugin.daemon")
    async with node(DP_DISABLE_HEALTHCHECKS="all") as n:
        n.start()
        await n.allocatable(8)
        await lose_at_reload(n, 4, 5)
        n.state.recover(4)
        n.state.recover(5)
        clear_faults(n, 4, 5)
        n.daemon.health_watch.changed.set()
        await n.allocatable(8)
        await until(lambda: n.daemon.serving.missing == {})  # found by the rediscovery
        back = [r.getMessage() for r in caplog.records if "recovered after it was lost" in r.getMessage()]
        assert back == [f"GPU 4 ({UUIDS[4]}), 5 ({UUIDS[5]}) recovered after it was lost: rediscovering it"]
        assert n.daemon.faults.snapshot() == {}
        assert await n.stop() == 0


async def test_why_a_gpu_is_missing_is_what_nvml_says_of_its_uuid() -> None:
    # A GPU discovery skipped while NVML still finds it by UUID (one of its reads failed) has no NVML error
    # to quote: the reason is discovery's alone.
    async with node() as n:
        n.start()
        await n.allocatable(8)
        n.state.inject_lost(5)
        assert why_missing(n.daemon._backend.nvml, [UUIDS[3], UUIDS[5]]) == {
            UUIDS[3]: "not found by discovery",
            UUIDS[5]: "not found by discovery: GPU is lost",
        }
        assert await n.stop() == 0

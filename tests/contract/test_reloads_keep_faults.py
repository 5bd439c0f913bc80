"""Reloads never mislead the kubelet: the daemon as a process, reloaded while GPUs are broken or lost."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from kubegpu.demo.simnode import GPU_RESOURCE, SimulatedNode
from kubegpu.kubeletsim import EventKind
from tests.contract.conftest import profile_inventory

UUIDS = [g.uuid for g in profile_inventory("dgx-a100").gpus]
FAST_RECOVERY = {"KUBEGPU_RECOVERY_QUIET_SECONDS": "1", "KUBEGPU_HEALTH_PROBE_SECONDS": "0.1"}


async def reloads_done(node: SimulatedNode, count: int, timeout: float = 20.0) -> None:
    """Wait until the plugin has logged `count` finished reloads (applied or failed)."""
    for _ in range(int(timeout / 0.05)):
        log = node.plugin_log()
        if log.count("reload complete") + log.count("config reload failed") >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{count} reloads not done within {timeout} s:\n{node.plugin_log()[-3000:]}")


def kubelet_saw_gpu_healthy(node: SimulatedNode, uuid: str, after: int) -> list[str]:
    """Every ListAndWatch update since `after` in which GPU `uuid` (or a replica of it) was not Unhealthy.

    Every update lists every device; the simulator records which ones were Unhealthy."""
    return [
        e.message
        for e in node.sim.events(EventKind.DEVICES_UPDATED, resource=GPU_RESOURCE, after=after)
        if uuid not in {d.split("::")[0] for d in e.data["unhealthy"]}
    ]


async def test_an_xid_faulted_gpu_stays_unhealthy_through_reloads_and_config_switches(
    node: SimulatedNode,
) -> None:
    config: Path = node.root / "config.yaml"
    config.write_text("version: v1\n")
    node.start_plugin("--config-file", str(config))
    await node.wait_allocatable(8)
    node.inject("--gpu", "5", "--xid", "79")
    await node.wait_allocatable(7)
    mark = node.sim.last_seq
    node.signal_plugin(signal.SIGHUP)
    await reloads_done(node, 1)
    node.signal_plugin(signal.SIGHUP)
    await reloads_done(node, 2)
    config.write_text("version: v1\nflags:\n  plugin:\n    deviceIDStrategy: index\n")  # the watcher reloads
    await reloads_done(node, 3)
    assert node.sim.allocatable()[GPU_RESOURCE] == 7 and node.sim.capacity()[GPU_RESOURCE] == 8
    # A config-manager switch to time-slicing: new device IDs, GPU 5's replicas unhealthy from the start.
    sharing = "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n"
    config.write_text("version: v1\n" + sharing)
    await reloads_done(node, 4)
    await node.wait_allocatable(14)
    assert node.sim.capacity()[GPU_RESOURCE] == 16
    assert kubelet_saw_gpu_healthy(node, UUIDS[5], after=mark) == []  # not for one update
    statuses = node.sim.events(EventKind.NODE_STATUS, after=mark)
    assert [e.data["allocatable"][GPU_RESOURCE] for e in statuses] == [14]  # 7 throughout, then 14 of 16
    assert node.plugin_log().count("reload complete") == 4


async def test_a_gpu_lost_at_reload_stays_listed_and_comes_back_by_itself() -> None:
    async with SimulatedNode("dgx-a100", env=FAST_RECOVERY) as node:
        node.start_plugin()
        await node.wait_allocatable(8)
        before = sorted(node.sim.devices(GPU_RESOURCE))
        node.inject("--gpu", "5", "--lost")
        await node.wait_allocatable(7)
        mark = node.sim.last_seq
        node.signal_plugin(signal.SIGHUP)
        await reloads_done(node, 1)
        assert "skipping GPU index=5" in node.plugin_log()  # discovery could not read it
        devices = node.sim.devices(GPU_RESOURCE)
        assert sorted(devices) == before and devices[UUIDS[5]].health == "Unhealthy"
        assert node.sim.capacity()[GPU_RESOURCE] == 8 and node.sim.allocatable()[GPU_RESOURCE] == 7
        assert kubelet_saw_gpu_healthy(node, UUIDS[5], after=mark) == []
        node.inject("--gpu", "5", "--recover")  # no second SIGHUP
        await node.wait_allocatable(8, timeout=20)
        assert sorted(node.sim.devices(GPU_RESOURCE)) == before
        log = node.plugin_log()
        assert f"GPU 5 ({UUIDS[5]}) Unhealthy -> Healthy: recovery probes passed" in log
        assert f"GPU 5 ({UUIDS[5]}) recovered after it was lost: rediscovering it" in log


async def test_a_gpu_lost_with_health_checks_off_is_unhealthy_in_the_first_update_after_the_reload() -> None:
    # No health monitor runs, so nothing sees the loss before the reload's own rediscovery does: it alone
    # must record the lost GPU as a fault, or GPU 5 is served Healthy and pods land on a GPU that is gone.
    async with SimulatedNode("dgx-a100", env={"DP_DISABLE_HEALTHCHECKS": "all"}) as node:
        node.start_plugin()
        await node.wait_allocatable(8)
        assert "health checks disabled by DP_DISABLE_HEALTHCHECKS; GPUs stay Healthy" in node.plugin_log()
        mark = node.sim.last_seq
        node.inject("--gpu", "5", "--lost")
        node.signal_plugin(signal.SIGHUP)  # straight after the loss: no probe could have seen it
        await reloads_done(node, 1)
        await node.wait_allocatable(7, timeout=5)
        updates = node.sim.events(EventKind.DEVICES_UPDATED, resource=GPU_RESOURCE, after=mark)
        assert updates and updates[0].data["unhealthy"] == [UUIDS[5]]
        assert kubelet_saw_gpu_healthy(node, UUIDS[5], after=mark) == []
        assert node.sim.capacity()[GPU_RESOURCE] == 8 and node.sim.allocatable()[GPU_RESOURCE] == 7
        assert f"GPU 5 ({UUIDS[5]}) not found by discovery" in node.plugin_log()


async def test_an_unwritable_cdi_root_on_reload_keeps_serving_and_sigterm_exits_cleanly(
    node: SimulatedNode,
) -> None:
    blocker = node.root / "not-a-directory"
    blocker.write_text("a file where the CDI root's parent should be\n")
    node.extra_env["KUBEGPU_CDI_ROOT"] = str(blocker / "cdi")
    config: Path = node.root / "config.yaml"
    config.write_text("version: v1\n")
    node.start_plugin("--config-file", str(config))
    await node.wait_allocatable(8)
    config.write_text("version: v1\nflags:\n  plugin:\n    deviceListStrategy: cdi-annotations\n")
    await reloads_done(node, 1)
    assert f"unable to write CDI specs to {blocker / 'cdi'}" in node.plugin_log()
    node.inject("--gpu", "1", "--xid", "79")  # the health monitor was not stopped
    await node.wait_allocatable(7)
    config.write_text("version: v1\nflags:\n  plugin:\n    deviceIDStrategy: index\n")  # later configs apply
    await reloads_done(node, 2)
    assert "reload complete" in node.plugin_log()
    assert await node.stop_plugin(signal.SIGTERM) == 0
    assert "Traceback" not in node.plugin_log()

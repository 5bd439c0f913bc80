"""The daemon as a node runs it: registration, capacity, Allocate, faults, restarts, signals."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import grpc
import pytest

from kubegpu.api.v1beta1 import api_pb2, api_pb2_grpc
from kubegpu.demo.simnode import GPU_RESOURCE, SimulatedNode
from kubegpu.kubeletsim import Container, EventKind, Pod
from tests.contract.conftest import profile_inventory

DGX_A100 = profile_inventory("dgx-a100")


async def wait_for_log(node: SimulatedNode, text: str, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.05)):
        if text in node.plugin_log():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{text!r} not logged within {timeout} s:\n{node.plugin_log()[-3000:]}")


UUIDS = [g.uuid for g in DGX_A100.gpus]


async def test_registers_all_gpus_with_numa_topology(running: SimulatedNode) -> None:
    sim = running.sim
    assert sim.capacity()[GPU_RESOURCE] == 8
    assert sim.allocatable()[GPU_RESOURCE] == 8
    options = sim.options(GPU_RESOURCE)
    assert (
        options is not None and options.get_preferred_allocation_available and not options.pre_start_required
    )
    devices = sim.devices(GPU_RESOURCE)
    assert sorted(devices) == sorted(UUIDS)
    assert {u: d.numa_nodes for u, d in devices.items()} == {g.uuid: (g.numa_node,) for g in DGX_A100.gpus}
    assert running.plugin_sockets() == ["nvidia-gpu.sock"]


async def test_pod_gets_two_gpus_and_their_uuids(running: SimulatedNode) -> None:
    allocation = await running.sim.admit(Pod("train", containers=[Container("main", {GPU_RESOURCE: 2})]))
    main = allocation.containers["main"]
    chosen = main.devices[GPU_RESOURCE]
    assert len(chosen) == 2 and set(chosen) <= set(UUIDS)
    assert main.run_options is not None
    assert sorted(main.run_options.envs["NVIDIA_VISIBLE_DEVICES"].split(",")) == sorted(chosen)
    (preferred,) = running.sim.rpc_calls("GetPreferredAllocation")
    assert list(preferred.response.container_responses[0].deviceIDs) and preferred.error is None


async def test_preferred_allocation_follows_nvlink_on_dgx1() -> None:
    volta = profile_inventory("dgx1-volta")
    links = volta.link_map()
    async with SimulatedNode("dgx1-volta") as node:
        node.start_plugin()
        await node.wait_allocatable(8)
        allocation = await node.sim.admit(Pod("p", containers=[Container("c", {GPU_RESOURCE: 2})]))
        a, b = (volta.gpu_by_uuid(u).index for u in allocation.containers["c"].devices[GPU_RESOURCE])
        assert links[(a, b)].nvlinks == 2  # a double NVLink pair, the best a DGX-1 pair can get


async def test_xid_marks_the_gpu_unhealthy_and_ignored_xids_do_not(running: SimulatedNode) -> None:
    running.inject("--gpu", "2", "--xid", "13")  # application error: ignored by default
    running.inject("--gpu", "5", "--xid", "79")
    await running.wait_allocatable(7)
    devices = running.sim.devices(GPU_RESOURCE)
    assert devices[UUIDS[5]].health == "Unhealthy"
    assert devices[UUIDS[2]].health == "Healthy"
    assert running.sim.capacity()[GPU_RESOURCE] == 8
    log = running.plugin_log()
    assert (
        "XID 79 (GPU has fallen off the bus)" in log
        and "restart_app (restart the application; the GPU stays Healthy)" in log
    )


async def test_xid_ignored_list_follows_env() -> None:
    async with SimulatedNode("dgx-a100", env={"DP_DISABLE_HEALTHCHECKS": "79"}) as node:
        node.start_plugin()
        await node.wait_allocatable(8)
        node.inject("--gpu", "1", "--xid", "79")
        node.inject("--gpu", "2", "--xid", "48")
        await node.wait_allocatable(7)
        assert node.sim.devices(GPU_RESOURCE)[UUIDS[1]].health == "Healthy"
        assert node.sim.devices(GPU_RESOURCE)[UUIDS[2]].health == "Unhealthy"


async def test_event_wait_error_marks_every_gpu_unhealthy(running: SimulatedNode) -> None:
    running.inject("--wait-error")
    await running.wait_allocatable(0)
    assert running.sim.capacity()[GPU_RESOURCE] == 8


async def test_lost_gpu_is_unhealthy(running: SimulatedNode) -> None:
    running.inject("--gpu", "6", "--lost")
    await running.wait_allocatable(7)
    assert running.sim.devices(GPU_RESOURCE)[UUIDS[6]].health == "Unhealthy"


async def test_kubelet_restart_twenty_times(running: SimulatedNode) -> None:
    running.inject("--gpu", "0", "--xid", "79")
    await running.wait_allocatable(7)
    for _ in range(20):
        mark = running.sim.last_seq
        await running.sim.restart()
        await running.sim.wait_for_event(EventKind.REGISTERED, resource=GPU_RESOURCE, after=mark, timeout=10)
        await running.wait_allocatable(7)  # capacity back every time, the unhealthy GPU still unhealthy
        assert running.sim.capacity()[GPU_RESOURCE] == 8
        assert running.plugin_sockets() == ["nvidia-gpu.sock"]
    assert running.plugin is not None and running.plugin.poll() is None


async def test_sigkill_and_restart_keeps_ids_and_leaves_no_stale_socket(running: SimulatedNode) -> None:
    before = sorted(running.sim.devices(GPU_RESOURCE))
    await running.stop_plugin(signal.SIGKILL)
    await running.sim.wait_for(lambda: running.sim.allocatable().get(GPU_RESOURCE) == 0, timeout=10)
    running.start_plugin()
    await running.wait_allocatable(8)
    assert sorted(running.sim.devices(GPU_RESOURCE)) == before
    assert running.plugin_sockets() == ["nvidia-gpu.sock"]


async def test_sigterm_removes_sockets_and_exits_zero(running: SimulatedNode) -> None:
    assert await running.stop_plugin(signal.SIGTERM) == 0
    assert running.plugin_sockets() == []
    assert (running.plugin_dir / "kubelet.sock").exists()  # never touches the kubelet's


@pytest.mark.parametrize(
    ("env", "args", "expected"),
    [
        ({"DEVICE_ID_STRATEGY": "index"}, [], "index"),
        ({"DEVICE_ID_STRATEGY": "index"}, ["--device-id-strategy", "uuid"], "uuid"),  # CLI beats env
        ({}, ["--device-id-strategy=index"], "index"),
    ],
)
async def test_env_and_flag_precedence(env: dict[str, str], args: list[str], expected: str) -> None:
    async with SimulatedNode("dgx-a100", env=env, plugin_args=args) as node:
        node.start_plugin()
        await node.wait_allocatable(8)
        allocation = await node.sim.admit(Pod("p", containers=[Container("c", {GPU_RESOURCE: 1})]))
        c = allocation.containers["c"]
        (uuid,) = c.devices[GPU_RESOURCE]
        visible = c.run_options.envs["NVIDIA_VISIBLE_DEVICES"]
        assert visible == (str(DGX_A100.gpu_by_uuid(uuid).index) if expected == "index" else uuid)


async def test_pass_device_specs_from_env() -> None:
    async with SimulatedNode("dgx-a100", env={"PASS_DEVICE_SPECS": "true"}) as node:
        node.start_plugin()
        await node.wait_allocatable(8)
        allocation = await node.sim.admit(Pod("p", containers=[Container("c", {GPU_RESOURCE: 1})]))
        c = allocation.containers["c"]
        (uuid,) = c.devices[GPU_RESOURCE]
        minor = DGX_A100.gpu_by_uuid(uuid).minor
        paths = [(d.container_path, d.host_path, d.permissions) for d in c.run_options.devices]
        assert (f"/dev/nvidia{minor}", f"/dev/nvidia{minor}", "rw") in paths


async def test_no_driver_fails_with_cause_and_fix() -> None:
    async with SimulatedNode("no-driver") as node:
        node.start_plugin()
        assert await node.wait_plugin_exit() == 1
        log = node.plugin_log()
        assert "nvml init failed" in log and "Driver Not Loaded" in log
        assert "driver" in log.lower() and node.plugin_sockets() == []


async def test_no_driver_without_fail_on_init_error_stays_up_and_retries() -> None:
    env = {"FAIL_ON_INIT_ERROR": "false", "KUBEGPU_DISCOVERY_RETRY_SECONDS": "0.2"}
    async with SimulatedNode("no-driver", env=env) as node:
        node.start_plugin()
        for _ in range(100):
            if node.plugin_log().count("nvml init failed") >= 2:  # the first try and at least one retry
                break
            await asyncio.sleep(0.1)
        log = node.plugin_log()
        assert "No devices found. Waiting indefinitely." in log
        assert log.count("nvml init failed") >= 2
        assert node.plugin is not None and node.plugin.poll() is None
        assert node.plugin_sockets() == [] and not node.sim.registered(GPU_RESOURCE)
        assert await node.stop_plugin() == 0


async def test_bad_config_file_at_start_exits_naming_the_field(node: SimulatedNode) -> None:
    config = node.root / "config.yaml"
    config.write_text("version: v1\nflags:\n  plugin:\n    deviceIDStrategy: serial\n")
    node.start_plugin("--config-file", str(config))
    assert await node.wait_plugin_exit() == 1
    assert "unable to validate flags: invalid --device-id-strategy option: serial" in node.plugin_log()


async def test_sighup_reload_keeps_last_good_config_and_applies_a_good_one(node: SimulatedNode) -> None:
    config: Path = node.root / "config.yaml"
    config.write_text("version: v1\n")
    node.start_plugin("--config-file", str(config))
    await node.wait_allocatable(8)
    config.write_text("version: v1\nflags:\n  migStrategy: sideways\n")
    node.signal_plugin(signal.SIGHUP)
    for _ in range(100):
        if "keeping the last good config" in node.plugin_log():
            break
        await asyncio.sleep(0.05)
    assert "unknown MIG strategy: sideways" in node.plugin_log()
    assert node.sim.allocatable()[GPU_RESOURCE] == 8
    config.write_text("version: v1\nflags:\n  plugin:\n    deviceIDStrategy: index\n")
    registrations = len(node.sim.events(EventKind.REGISTERED, resource=GPU_RESOURCE))
    node.signal_plugin(signal.SIGHUP)
    await wait_for_log(node, "reload complete")
    # One line saying what changed in the config and in what is served; the start-up dump is not repeated.
    log = node.plugin_log()
    (reload,) = [line for line in log.splitlines() if "reload complete" in line]
    assert reload.endswith(
        'kubegpu.plugin.daemon: reload complete: config changed: flags.plugin.deviceIDStrategy "uuid" -> '
        '"index"; served: nvidia.com/gpu: update (options)'
    ), reload
    assert log.count("Running with config:") == 1
    # Same resources, new Allocate options: applied in place, without re-registering.
    assert len(node.sim.events(EventKind.REGISTERED, resource=GPU_RESOURCE)) == registrations
    assert node.sim.allocatable()[GPU_RESOURCE] == 8
    allocation = await node.sim.admit(Pod("p", containers=[Container("c", {GPU_RESOURCE: 1})]))
    assert allocation.containers["c"].run_options.envs["NVIDIA_VISIBLE_DEVICES"].isdigit()


async def test_bad_requests_get_grpc_errors_and_the_daemon_keeps_serving(running: SimulatedNode) -> None:
    bad_requests = {
        "unknown": [UUIDS[0], "GPU-does-not-exist"],
        "empty": [],
        "duplicates": [UUIDS[1], UUIDS[1]],
        "nine": [*UUIDS, "GPU-one-too-many"],
        "too long": ["GPU-" + "x" * 80],
    }
    async with grpc.aio.insecure_channel(f"unix://{running.plugin_dir / 'nvidia-gpu.sock'}") as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        for name, ids in bad_requests.items():
            request = api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
            )
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Allocate(request)
            assert err.value.details().startswith('invalid allocation request for "nvidia.com/gpu"'), name
        # Ten thousand IDs (110 KB): more than any request for 8 GPUs, refused by size before it is read.
        request = api_pb2.AllocateRequest(
            container_requests=[
                api_pb2.ContainerAllocateRequest(devices_ids=[f"GPU-{i}" for i in range(10_000)])
            ]
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Allocate(request)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(grpc.aio.AioRpcError):
            await stub.GetPreferredAllocation(
                api_pb2.PreferredAllocationRequest(
                    container_requests=[
                        api_pb2.ContainerPreferredAllocationRequest(
                            available_deviceIDs=["nope"], allocation_size=1
                        )
                    ]
                )
            )
    allocation = await running.sim.admit(Pod("after", containers=[Container("c", {GPU_RESOURCE: 8})]))
    assert len(allocation.containers["c"].devices[GPU_RESOURCE]) == 8
    assert running.plugin is not None and running.plugin.poll() is None


async def test_reset_class_fault_recovers_at_the_kubelet() -> None:
    env = {"KUBEGPU_RECOVERY_QUIET_SECONDS": "1.5", "KUBEGPU_HEALTH_PROBE_SECONDS": "0.1"}
    async with SimulatedNode("dgx-a100", env=env) as node:
        node.start_plugin()
        await node.wait_allocatable(8)
        mark = node.sim.last_seq
        node.inject("--gpu", "5", "--xid", "154")  # reboot-class: stays out
        node.inject("--gpu", "4", "--xid", "48")  # reset-class: comes back after the quiet period
        await node.sim.wait_for_event(
            EventKind.DEVICES_UPDATED,
            resource=GPU_RESOURCE,
            after=mark,
            where=lambda e: UUIDS[4] in e.data["unhealthy"],
            timeout=10,
        )
        await node.wait_allocatable(7, timeout=15)
        devices = node.sim.devices(GPU_RESOURCE)
        assert devices[UUIDS[4]].health == "Healthy" and devices[UUIDS[5]].health == "Unhealthy"
        log = node.plugin_log()
        assert "Healthy -> Unhealthy: XID 48 (double-bit ECC error)" in log
        assert "Unhealthy -> Healthy: recovery probes passed" in log


async def test_bad_health_settings_fail_at_start() -> None:
    async with SimulatedNode("dgx-a100", env={"KUBEGPU_RECOVERY_QUIET_SECONDS": "later"}) as node:
        node.start_plugin()
        assert await node.wait_plugin_exit() == 1
        assert "KUBEGPU_RECOVERY_QUIET_SECONDS='later' is not a valid number of seconds" in node.plugin_log()


@pytest.mark.parametrize(
    ("env", "error"),
    [
        (
            # once killed the rediscovery task: the daemon stayed up serving nothing, for ever
            {"KUBEGPU_DISCOVERY_RETRY_SECONDS": "abc"},
            "KUBEGPU_DISCOVERY_RETRY_SECONDS='abc' is not a valid number of seconds: use a finite number "
            "greater than 0, e.g. 30 (the default)",
        ),
        (
            # once killed the health thread (OverflowError): XIDs were never acted on again
            {"KUBEGPU_HEALTH_PROBE_SECONDS": "inf"},
            "KUBEGPU_HEALTH_PROBE_SECONDS='inf' is not a valid number of seconds: use a finite number "
            "greater than 0, e.g. 5 (the default)",
        ),
        (
            {"KUBEGPU_MPS_RETRY_SECONDS": "0"},  # once a busy loop
            "KUBEGPU_MPS_RETRY_SECONDS='0' is not a valid number of seconds: use a finite number "
            "greater than 0, e.g. 30 (the default)",
        ),
    ],
)
async def test_a_bad_setting_stops_the_start_with_one_line_naming_it(env: dict[str, str], error: str) -> None:
    async with SimulatedNode("dgx-a100", env=env) as node:
        node.start_plugin("--fail-on-init-error=false")
        assert await node.wait_plugin_exit() == 1
        log = node.plugin_log()
        (line,) = log.splitlines()  # nothing else: no traceback, no half-started daemon
        assert line.endswith(f" ERROR kubegpu: {error}")
        assert node.plugin_sockets() == [] and not node.sim.registered(GPU_RESOURCE)


async def test_the_start_up_log_shows_each_setting_and_its_source() -> None:
    env = {"KUBEGPU_HEALTH_PROBE_SECONDS": "2", "KUBEGPU_HTTP_PORT": "1"}
    async with SimulatedNode("dgx-a100", env=env) as node:
        node.start_plugin("--http-port", "0")
        await node.wait_allocatable(8)
        log = node.plugin_log()
        block = log.split("Running with settings:\n")[1]
        lines = block.splitlines()
        assert "  env      KUBEGPU_HEALTH_PROBE_SECONDS=2" in lines
        assert "  flag     KUBEGPU_HTTP_PORT=0 (--http-port)" in lines
        assert f"  flag     KUBELET_SOCKET={node.kubelet_socket} (--kubelet-socket)" in lines
        assert "  default  KUBEGPU_DISCOVERY_RETRY_SECONDS=30" in lines
        assert "  env      KUBEGPU_FAKE_NVML=dgx-a100" in lines


async def test_config_file_change_reloads_without_a_signal(node: SimulatedNode) -> None:
    available = node.root / "configs"
    available.mkdir()
    (available / "uuid").write_text("version: v1\n")
    (available / "index").write_text("version: v1\nflags:\n  plugin:\n    deviceIDStrategy: index\n")
    link = node.root / "config.yaml"
    link.symlink_to(available / "uuid")
    node.start_plugin("--config-file", str(link))
    await node.wait_allocatable(8)
    tmp = node.root / "config.yaml.tmp"
    tmp.symlink_to(available / "index")
    tmp.rename(link)  # config-manager's atomic symlink swap
    await wait_for_log(node, "reload complete")
    allocation = await node.sim.admit(Pod("p", containers=[Container("c", {GPU_RESOURCE: 1})]))
    assert allocation.containers["c"].run_options.envs["NVIDIA_VISIBLE_DEVICES"].isdigit()
    assert "changed; reloading" in node.plugin_log()


async def test_nvidias_discovery_and_cdi_flags_are_taken() -> None:
    """A DaemonSet moved over from NVIDIA with these set starts (no `No such option`), and a bad discovery
    strategy in the env var is refused with NVIDIA's text, as NVIDIA refuses it."""
    async with SimulatedNode("t4-pcie") as node:
        node.start_plugin(
            "--device-discovery-strategy", "nvml", "--cdi-disable-hooks", "all", "--cdi-feature-flags",
            "disable-nvsandbox-utils",
        )  # fmt: skip
        await node.wait_allocatable(4)
        assert (
            "--cdi-feature-flags=disable-nvsandbox-utils: these switch features of NVIDIA's CDI library"
            in (node.plugin_log())
        )
        assert await node.stop_plugin() == 0
        node.extra_env["DEVICE_DISCOVERY_STRATEGY"] = "magic"
        node.start_plugin()
        assert await node.wait_plugin_exit() == 1
        assert (
            "unable to validate flags: invalid --device-discovery-strategy option magic" in node.plugin_log()
        )

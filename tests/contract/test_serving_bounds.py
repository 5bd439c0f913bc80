"""The daemon under a hostile client of its socket, a kubelet that keeps plugin sockets, and umask 000."""

from __future__ import annotations

import os
import stat
from collections.abc import Awaitable

import grpc
import pytest

from kubegpu.api.v1beta1 import api_pb2, api_pb2_grpc
from kubegpu.demo.simnode import GPU_RESOURCE, SimulatedNode
from kubegpu.kubeletsim import Container, EventKind, Pod
from tests.allocation.test_cdi import fake_driver_root
from tests.contract.conftest import profile_inventory
from tests.contract.test_plugin_process import wait_for_log

UUIDS = [g.uuid for g in profile_inventory("dgx-a100").gpus]
UNLIMITED = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
FORGED = "2026-01-01T00:00:00.000 ERROR kubegpu: GPU 3 lost"  # with "GPU-x\n", 55 characters: an ID


def allocate(ids: list[str]) -> api_pb2.AllocateRequest:
    return api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)])


def preferred(available: list[str], must: list[str], size: int) -> api_pb2.PreferredAllocationRequest:
    return api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size
            )
        ]
    )


async def refused(call: Awaitable[object]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    return err.value


async def test_hostile_requests_are_refused_clearly_and_the_daemon_keeps_serving(
    running: SimulatedNode,
) -> None:
    socket = f"unix://{running.plugin_dir / 'nvidia-gpu.sock'}"
    async with grpc.aio.insecure_channel(socket, options=UNLIMITED) as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)

        # A device ID holding a newline: NVIDIA's text, with the ID escaped, in the status and the log.
        err = await refused(stub.Allocate(allocate([f"GPU-x\n{FORGED}"])))
        assert err.code() == grpc.StatusCode.UNKNOWN
        assert err.details() == (
            'invalid allocation request for "nvidia.com/gpu": invalid request: unknown device: '
            f"'GPU-x\\n{FORGED}'"
        )
        await wait_for_log(running, "refusing Allocate for nvidia.com/gpu")

        # The fuzzer's 4 MB Allocate: refused by size before it is read.
        err = await refused(stub.Allocate(allocate([f"GPU-{i:036d}" for i in range(95_000)])))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

        # A 20 KB unknown ID: named, cut, and the status stays small (echoed whole it was RESOURCE_EXHAUSTED).
        err = await refused(stub.GetPreferredAllocation(preferred([UUIDS[0], "GPU-" + "x" * 20_000], [], 1)))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "1 unknown device(s): 'GPU-xxxx" in err.details() and "(20004 characters)" in err.details()
        assert len(err.details()) < 300

        # A must-include device outside the available ones: refused, not handed back.
        err = await refused(stub.GetPreferredAllocation(preferred(UUIDS[:2], [UUIDS[5]], 2)))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"must-include device(s) '{UUIDS[5]}' are not among the available devices" in err.details()

        # Bodies that do not decode: INVALID_ARGUMENT each, one warning line in all.
        raw = channel.unary_unary("/v1beta1.DevicePlugin/Allocate")
        for _ in range(200):
            assert (await refused(raw(b"\xff" * 32))).code() == grpc.StatusCode.INVALID_ARGUMENT

    allocation = await running.sim.admit(Pod("after", containers=[Container("c", {GPU_RESOURCE: 8})]))
    assert len(allocation.containers["c"].devices[GPU_RESOURCE]) == 8
    assert running.plugin is not None and running.plugin.poll() is None
    log = running.plugin_log().splitlines()
    assert not [line for line in log if line.startswith(FORGED[:23])]  # no forged line
    levels = [line.split(" ", 2)[1] for line in log if line[:4].isdigit() and line.count(" ") >= 2]
    assert "ERROR" not in levels and not [line for line in log if line.startswith("Traceback")]
    assert sum("is not a valid v1beta1.AllocateRequest" in line for line in log) == 1


async def test_a_kubelet_restart_that_keeps_plugin_sockets_restarts_the_server_before_registering(
    running: SimulatedNode,
) -> None:
    await running.sim.admit(Pod("before", containers=[Container("c", {GPU_RESOURCE: 2})]))
    mark = running.sim.last_seq
    await running.sim.restart(keep_plugin_sockets=True)
    await running.sim.wait_for_event(EventKind.REGISTERED, resource=GPU_RESOURCE, after=mark, timeout=10)
    await running.wait_allocatable(8)
    await wait_for_log(running, "kubelet restarted: restarting nvidia.com/gpu before registering again")
    assert len(running.sim.events(EventKind.REGISTERED, resource=GPU_RESOURCE, after=mark)) == 1
    assert running.plugin_sockets() == ["nvidia-gpu.sock"]
    # The pod from before the restart keeps its 2 GPUs (the checkpoint); the other 6 are allocatable.
    allocation = await running.sim.admit(Pod("after", containers=[Container("c", {GPU_RESOURCE: 6})]))
    assert len(allocation.containers["c"].devices[GPU_RESOURCE]) == 6


async def test_sockets_and_directories_have_their_modes_under_umask_000() -> None:
    async with SimulatedNode("dgx-a100") as node:
        cdi = node.root / "run" / "cdi"
        node.extra_env.update(
            {
                "KUBEGPU_CDI_ROOT": str(cdi),
                "CONTAINER_DRIVER_ROOT": str(fake_driver_root(node.root / "driver-root")),
                "DEVICE_LIST_STRATEGY": "cdi-annotations",
            }
        )
        previous = os.umask(0)  # the plugin inherits it
        try:
            node.start_plugin("--driver-root", "/run/nvidia/driver")
        finally:
            os.umask(previous)
        await node.wait_allocatable(8)
        modes = {
            path.relative_to(node.root).as_posix(): stat.S_IMODE(path.stat().st_mode)
            for path in (node.plugin_dir / "nvidia-gpu.sock", node.root / "run", cdi, *cdi.iterdir())
        }
        assert modes == {
            "device-plugins/nvidia-gpu.sock": 0o600,
            "run": 0o755,
            "run/cdi": 0o755,
            "run/cdi/k8s.device-plugin.nvidia.com-gpu.json": 0o644,
        }

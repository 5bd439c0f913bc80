"""Device health from `kubegpu dra` (a process on the fake NVML) to the kubelet simulator and the pod's
status in the simulated API server: DRAResourceHealth v1alpha1 NodeWatchResources, as a v1.36 kubelet uses it.

Expected values are the kubelet's and NVIDIA's (service name, health names, NVIDIA's messages, the pod
status field's shape), written out here."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import grpc

from kubegpu.api.drahealth.v1alpha1 import api_pb2 as health_pb2
from kubegpu.api.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from kubegpu.demo.dranode import DRIVER, claim_pod
from kubegpu.demo.dranode import SimulatedDraNode as DraNode
from kubegpu.kubeletsim.events import EventKind
from tests.contract.test_dra_driver import inject
from tests.dra_objects import claim, request

FAST = {"health_retry_period": 0.2, "status_sync_period": 0.5}


def allocated_status(node: DraNode, pod: str) -> list[dict[str, Any]] | None:
    statuses = (node.api.get("pods", pod).get("status") or {}).get("containerStatuses") or []
    return statuses[0].get("allocatedResourcesStatus") if statuses else None


def lines(response: health_pb2.NodeWatchResourcesResponse) -> list[tuple[str, str, int, str, int]]:
    return [
        (d.device.pool_name, d.device.device_name, d.health, d.message, d.health_check_timeout_seconds)
        for d in response.devices
    ]


async def next_where(
    stream: Any, predicate: Any, timeout: float = 30.0
) -> health_pb2.NodeWatchResourcesResponse:
    async def find() -> health_pb2.NodeWatchResourcesResponse:
        async for response in stream:
            if predicate(response):
                return response
        raise AssertionError("the health stream ended")

    return await asyncio.wait_for(find(), timeout)


def health_of(response: health_pb2.NodeWatchResourcesResponse, device: str) -> tuple[int, str]:
    (found,) = [(d.health, d.message) for d in response.devices if d.device.device_name == device]
    return found


async def test_xid_unhealthy_on_the_stream_and_in_the_pod_status_and_recovery_healthy_again() -> None:
    async with DraNode("t4-pcie", kubelet="1.36", **FAST) as node:
        node.start_driver()
        await node.wait_registered()
        await node.wait_published(4)
        assert node.sim is not None
        (registered,) = node.sim.events(EventKind.DRA_PLUGIN_REGISTERED)
        assert registered.data["supported_versions"] == [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1alpha1.DRAResourceHealth",
        ]
        pod = claim_pod("train", "c1")
        c1 = node.allocate(claim("c1", [request("gpu")]), pod)
        uid = c1["metadata"]["uid"]
        node.create_pod(pod)
        await node.sim.admit(pod)
        resource_id = f"k8s.gpu.nvidia.com/claim={uid}-gpu-0"
        await node.wait(
            lambda: (
                allocated_status(node, "train")
                == [{"name": "claim:pc-c1", "resources": [{"resourceID": resource_id, "health": "Healthy"}]}]
            ),
            "Healthy in the pod status",
        )

        async with grpc.aio.insecure_channel(f"unix:{node.plugins / DRIVER / 'dra.sock'}") as channel:
            stream = health_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
                health_pb2.NodeWatchResourcesRequest()
            )
            first = await next_where(stream, lambda r: True, 10)  # a new stream gets the full state at once
            assert lines(first) == [("node-a", f"gpu-{i}", health_pb2.HEALTHY, "", 30) for i in range(4)]

            inject(node, "--gpu", "0", "--xid", "48")  # reset-class: recovers once the probes pass
            unhealthy = await next_where(stream, lambda r: health_of(r, "gpu-0")[0] == health_pb2.UNHEALTHY)
            assert health_of(unhealthy, "gpu-0") == (health_pb2.UNHEALTHY, "critical XID 48 reported by NVML")
            assert [health_of(unhealthy, f"gpu-{i}") for i in (1, 2, 3)] == [(health_pb2.HEALTHY, "")] * 3
            await node.wait(
                lambda: (
                    allocated_status(node, "train")
                    == [
                        {
                            "name": "claim:pc-c1",
                            "resources": [
                                {
                                    "resourceID": resource_id,
                                    "health": "Unhealthy",
                                    "message": "critical XID 48 reported by NVML",
                                }
                            ],
                        }
                    ]
                ),
                "Unhealthy with the XID in the pod status",
            )
            recovered = await next_where(stream, lambda r: health_of(r, "gpu-0")[0] == health_pb2.HEALTHY, 40)
            assert health_of(recovered, "gpu-0") == (health_pb2.HEALTHY, "")
            stream.cancel()
        await node.wait(
            lambda: (
                allocated_status(node, "train")
                == [{"name": "claim:pc-c1", "resources": [{"resourceID": resource_id, "health": "Healthy"}]}]
            ),
            "Healthy again in the pod status",
        )


async def test_a_killed_driver_reads_unknown_and_its_successor_gets_the_stream_again() -> None:
    async with DraNode("t4-pcie", kubelet="1.36", **FAST) as node:
        node.start_driver()
        await node.wait_registered()
        await node.wait_published(4)
        assert node.sim is not None and node.sim.dra is not None
        health = node.sim.dra.health
        await node.wait(lambda: health.get(DRIVER, "node-a", "gpu-1") == ("Healthy", ""), "gpu-1 Healthy")
        await node.stop_driver(signal.SIGKILL)
        await node.wait(
            lambda: bool(node.sim and node.sim.events(EventKind.DRA_HEALTH_STREAM_ENDED)), "the stream ended"
        )
        assert health.get(DRIVER, "node-a", "gpu-1") == ("Unknown", "")  # nobody vouches for it now
        node.start_driver()
        await node.wait(
            lambda: health.get(DRIVER, "node-a", "gpu-1") == ("Healthy", ""), "gpu-1 Healthy again"
        )
        inject(node, "--gpu", "1", "--xid", "48")
        await node.wait(
            lambda: (
                health.get(DRIVER, "node-a", "gpu-1") == ("Unhealthy", "critical XID 48 reported by NVML")
            ),
            "gpu-1 Unhealthy through the new process's stream",
        )


async def test_a_kubelet_without_the_health_gate_never_opens_the_stream_and_prepares() -> None:
    async with DraNode("t4-pcie", kubelet="1.34") as node:
        node.start_driver()
        await node.wait_registered()
        await node.wait_published(4)
        assert node.sim is not None
        pod = claim_pod("job", "c1")
        c1 = node.allocate(claim("c1", [request("gpu")]), pod)
        node.create_pod(pod)
        allocation = await node.sim.admit(pod)
        assert allocation.containers["main"].run_options is not None
        assert allocation.containers["main"].run_options.cdi_devices == (
            f"k8s.gpu.nvidia.com/claim={c1['metadata']['uid']}-gpu-0",
        )
        assert node.sim.events(EventKind.DRA_HEALTH_UPDATED) == []
        assert allocated_status(node, "job") is None

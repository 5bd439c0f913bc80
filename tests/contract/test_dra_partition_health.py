"""MIG devices on the DRA health stream (DRAResourceHealth v1alpha1 NodeWatchResources): a DynamicMIG
partition a claim holds, and a static MIG device, follow their parent GPU's health, with NVIDIA's messages.
`kubegpu dra` runs as a process on the fake NVML against the kubelet simulator (a v1.36 kubelet, which
opens the stream) and the fake API server."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from kubegpu.api.drahealth.v1alpha1 import api_pb2 as health_pb2
from kubegpu.api.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from kubegpu.demo.dranode import DRIVER, claim_pod
from kubegpu.demo.dranode import SimulatedDraNode as DraNode
from tests.contract.test_dra_dynamic_mig import GATE, allocate, inject
from tests.contract.test_dra_health import FAST, allocated_status, health_of, next_where

PARTITION = "gpu-2-mig-1g10gb-19-3"  # a 1g.10gb partition of the H100 (mig-dynamic's GPU 2)


def has(device: str, health: int, message: str) -> Any:
    def match(response: health_pb2.NodeWatchResourcesResponse) -> bool:
        return any(
            d.device.device_name == device and d.health == health and d.message == message
            for d in response.devices
        )

    return match


def open_stream(channel: grpc.aio.Channel) -> Any:
    return health_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
        health_pb2.NodeWatchResourcesRequest()
    )


async def test_a_prepared_partition_follows_its_gpu_xid_recovery_and_loss() -> None:
    async with DraNode("mig-dynamic", env=GATE, kubelet="1.36", **FAST) as node:
        node.start_driver()
        await node.wait_registered()
        await node.wait_published(4 * 25)
        assert node.sim is not None
        pod = claim_pod("infer", "part")
        uid = allocate(node, "part", PARTITION, pod)
        node.create_pod(pod)
        await node.sim.admit(pod)
        resource_id = f"k8s.gpu.nvidia.com/claim={uid}-{PARTITION}"

        def pod_health_is(health: str, message: str = "") -> bool:
            resource = {
                "resourceID": resource_id,
                "health": health,
                **({"message": message} if message else {}),
            }
            return allocated_status(node, "infer") == [{"name": "claim:pc-part", "resources": [resource]}]

        await node.wait(
            lambda: pod_health_is("Healthy"),
            "the partition Healthy in the pod status",
        )
        async with grpc.aio.insecure_channel(f"unix:{node.plugins / DRIVER / 'dra.sock'}") as channel:
            stream = open_stream(channel)
            first = await next_where(stream, lambda r: True, 10)
            assert health_of(first, PARTITION) == (health_pb2.HEALTHY, "")

            inject(node, "--gpu", "2", "--xid", "48")  # reset-class: recovers once the probes pass
            unhealthy = await next_where(
                stream, has(PARTITION, health_pb2.UNHEALTHY, "critical XID 48 reported by NVML")
            )
            assert health_of(unhealthy, "gpu-3-mig-1g18gb-19-0") == (health_pb2.HEALTHY, "")  # another GPU's
            await node.wait(
                lambda: pod_health_is("Unhealthy", "critical XID 48 reported by NVML"),
                "the partition Unhealthy with the XID in the pod status",
            )
            await next_where(stream, has(PARTITION, health_pb2.HEALTHY, ""), 40)

            # A GPU lost while the driver runs: NVML's XID 79 (fallen off the bus), on the partition too.
            inject(node, "--gpu", "2", "--lost")
            await next_where(stream, has(PARTITION, health_pb2.UNHEALTHY, "critical XID 79 reported by NVML"))
            stream.cancel()
        # Restarted with the GPU still lost: discovery no longer finds it, nor its partitions; the one a
        # prepared claim holds is streamed `GPU is lost` (not left out, which the kubelet would read Unknown).
        assert await node.stop_driver() == 0
        node.start_driver()
        await node.wait(
            lambda: node.log().count("registered with the kubelet as DRA driver") == 2, "re-registration"
        )
        async with grpc.aio.insecure_channel(f"unix:{node.plugins / DRIVER / 'dra.sock'}") as channel:
            stream = open_stream(channel)
            lost = await next_where(stream, has(PARTITION, health_pb2.UNHEALTHY, "GPU is lost"))
            assert not [
                d
                for d in lost.devices
                if d.device.device_name.startswith("gpu-2-") and d.device.device_name != PARTITION
            ]
            stream.cancel()
        await node.wait(
            lambda: pod_health_is("Unhealthy", "GPU is lost"),
            "the partition Unhealthy, its GPU lost, in the pod status",
        )


async def test_a_static_mig_device_follows_its_gpu_on_the_stream() -> None:
    async with DraNode("a100-mig", kubelet="1.36", **FAST) as node:
        node.start_driver()
        await node.wait_registered()
        await node.wait(
            lambda: any(n.startswith("gpu-1-mig-") for n in node.published()), "GPU 1's MIG devices"
        )
        mig = min(n for n in node.published() if n.startswith("gpu-1-mig-3g20gb-"))
        async with grpc.aio.insecure_channel(f"unix:{node.plugins / DRIVER / 'dra.sock'}") as channel:
            stream = open_stream(channel)
            first = await next_where(stream, lambda r: True, 10)
            assert health_of(first, mig) == (health_pb2.HEALTHY, "")
            inject(node, "--gpu", "1", "--xid", "48")
            unhealthy = await next_where(
                stream, has(mig, health_pb2.UNHEALTHY, "critical XID 48 reported by NVML")
            )
            others = [d for d in unhealthy.devices if d.device.device_name.startswith("gpu-0-")]
            assert others and all(d.health == health_pb2.HEALTHY for d in others)
            await asyncio.wait_for(next_where(stream, has(mig, health_pb2.HEALTHY, ""), 40), 45)
            stream.cancel()

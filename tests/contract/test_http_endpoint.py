"""The daemon's /healthz, /readyz and /metrics, as a kubelet probe and Prometheus see them."""

from __future__ import annotations

import asyncio
import socket
import urllib.error
import urllib.request

from kubegpu.demo.simnode import GPU_RESOURCE, SimulatedNode
from kubegpu.kubeletsim import Container, Pod
from tests.contract.conftest import profile_inventory

UUIDS = [g.uuid for g in profile_inventory("dgx-a100").gpus]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


async def fetch(port: int, path: str) -> tuple[int, str]:
    return await asyncio.to_thread(get, port, path)


async def until(port: int, path: str, code: int, timeout: float = 10.0) -> str:
    for _ in range(int(timeout / 0.1)):
        got, body = await fetch(port, path)
        if got == code:
            return body
        await asyncio.sleep(0.1)
    raise AssertionError(f"{path} never answered {code}; last: {got} {body}")


async def test_probes_and_metrics_follow_registration_health_and_pods() -> None:
    port = free_port()
    args = ["--http-port", str(port), "--http-address", "127.0.0.1", "--health-grace-period", "1"]
    async with SimulatedNode("dgx-a100", plugin_args=args) as node:
        args += ["--pod-resources-socket", str(node.sim.pod_resources_socket)]
        node.plugin_args = args
        node.start_plugin()
        await node.wait_allocatable(8)
        await until(port, "/readyz", 200)
        assert (await fetch(port, "/healthz"))[0] == 200
        assert node.plugin_log().count("serving /healthz, /readyz and /metrics") == 1  # said once

        await node.sim.admit(Pod("train", containers=[Container("main", {GPU_RESOURCE: 2})]))
        node.inject("--gpu", "3", "--xid", "48")
        await node.wait_allocatable(7)
        _, metrics = await fetch(port, "/metrics")
        assert 'kubegpu_devices{health="healthy",resource="nvidia.com/gpu"} 7.0' in metrics
        assert 'kubegpu_devices{health="unhealthy",resource="nvidia.com/gpu"} 1.0' in metrics
        assert f'kubegpu_xid_errors_total{{uuid="{UUIDS[3]}",xid="48"}} 1.0' in metrics
        assert 'kubegpu_allocations_total{resource="nvidia.com/gpu"} 1.0' in metrics
        assert 'pod="train"' in metrics and "kubegpu_pod_device_info" in metrics
        assert 'kubegpu_registered{resource="nvidia.com/gpu"} 1.0' in metrics

        await node.sim.stop()  # the kubelet goes away and does not come back
        await until(port, "/readyz", 503)
        body = await until(port, "/healthz", 503, timeout=15)  # after the 1 s grace period
        assert "nvidia.com/gpu" in body
        await node.sim.start()  # back: registered again, healthy again
        await until(port, "/healthz", 200)
        await until(port, "/readyz", 200)

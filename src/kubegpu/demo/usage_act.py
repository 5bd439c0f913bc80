"""The demo's GPU-use act: who uses what on a time-sliced GPU, and who holds a GPU without using it.

A second simulated node of the same profile runs the plugin with time-slicing (2 replicas, packed) and
/metrics on 127.0.0.1. Two pods land on one GPU; the fake NVML is told they run a process each with
different memory and SM shares, and their cgroups are written where the plugin looks (KUBEGPU_PROC_ROOT);
a third pod holds a GPU and leaves it idle. The plugin's own /metrics then says each pod's memory, its SM
share and the idle holder's idle time. Its plugin starts with the demo's first act, so the act adds about
a second. Skipped on profiles with MIG enabled (time-slicing a MIG GPU is not this act's story) or fewer
than two GPUs.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import time
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

from kubegpu.demo.simnode import GPU_RESOURCE, SimulatedNode
from kubegpu.kubeletsim import Container, Pod
from kubegpu.node.inventory import Inventory

PIDS = {"train": 4242, "serve": 4343}
PROCESSES = {"train": (6144, 55), "serve": (2048, 15)}  # MiB, SM %
GIB = 1024**3


@contextlib.asynccontextmanager
async def usage_node(profile: str, inventory: Inventory) -> AsyncIterator[SimulatedNode | None]:
    if len(inventory.gpus) < 2 or any(g.mig_enabled for g in inventory.gpus):
        yield None
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    async with SimulatedNode(profile) as node:
        config = node.root / "time-slicing.yaml"
        config.write_text(
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
            "    - name: nvidia.com/gpu\n      replicas: 2\n"
        )
        node.extra_env["KUBEGPU_PROC_ROOT"] = str(node.root / "proc")
        node.plugin_args = [
            *("--config-file", str(config), "--shared-devices-allocation-policy", "packed"),
            *("--http-port", str(port), "--http-address", "127.0.0.1", "--metrics-interval", "0.2"),
            *("--pod-resources-socket", str(node.sim.pod_resources_socket)),
        ]
        node.http_port = port  # type: ignore[attr-defined]  # the act reads /metrics here
        node.start_plugin()
        yield node


async def usage_act(
    node: SimulatedNode | None, inventory: Inventory, say: Any, results: dict[str, Any]
) -> None:
    if node is None:
        return
    say.section("GPU use: a shared GPU split between two pods, and an idle holder")
    await node.wait_allocatable(2 * len(inventory.gpus))
    uuids = {}
    for name, namespace in (("train", "ml"), ("serve", "web"), ("notebook", "lab")):
        pod = Pod(name, namespace=namespace, containers=[Container("main", {GPU_RESOURCE: 1})])
        allocation = await node.sim.admit(pod)
        options = allocation.containers["main"].run_options
        uuids[name] = options.envs["NVIDIA_VISIBLE_DEVICES"] if options else ""
        if name in PIDS:  # the process's cgroup, as the kubelet lays it out on the host
            proc = node.root / "proc" / str(PIDS[name])
            proc.mkdir(parents=True)
            (proc / "cgroup").write_text(f"0::/kubepods/burstable/pod{pod.uid}/{'c0' * 32}\n")
    shared = next(g for g in inventory.gpus if g.uuid == uuids["train"])
    say.say(
        f"time-slicing, 2 replicas per GPU: pods ml/train and web/serve share GPU {shared.index}, "
        f"lab/notebook holds GPU {next(g.index for g in inventory.gpus if g.uuid == uuids['notebook'])}"
    )
    args = ["--gpu", str(shared.index), "--utilization", "70"]
    for name, (mib, sm) in PROCESSES.items():
        args += ["--process", f"{PIDS[name]}:{mib}:{sm}"]
    say.command("kubegpu fake-nvml inject " + " ".join(args))
    await asyncio.to_thread(node.inject, *args)
    port: int = node.http_port  # type: ignore[attr-defined]
    memory = await _wait_for_memory(port, shared.uuid)
    say.command(f"curl -s http://127.0.0.1:{port}/metrics | grep -E 'kubegpu_container|idle_seconds'")
    body = await _wait_for_idle(port, "notebook", 1.0)
    idle = _value(body, "kubegpu_device_idle_seconds", pod="notebook") or 0.0
    share = {
        p: _value(body, "kubegpu_container_gpu_utilization_ratio", pod=p, UUID=shared.uuid) for p in PIDS
    }
    for name in PIDS:
        say.say(
            f"{name}: {memory[name] / GIB:.1f} GiB of GPU {shared.index}'s memory, "
            f"{(share[name] or 0) * 100:.0f} % of its SMs (dcgm-exporter gives each the whole GPU's numbers)"
        )
    say.say(
        f"notebook: its GPU idle for {idle:.1f} s (kubegpu_device_idle_seconds; alert after 4 h by default)"
    )
    results["usage"] = {
        "shared_gpu": shared.uuid,
        "memory_bytes": memory,
        "sm_share": share,
        "idle_holder": "lab/notebook",
        "idle_seconds": round(idle, 2),
    }


async def _wait_for_memory(port: int, uuid: str, timeout: float = 15.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        body = await asyncio.to_thread(_metrics, port)
        found = {p: _value(body, "kubegpu_container_gpu_memory_used_bytes", pod=p, UUID=uuid) for p in PIDS}
        if all(found.values()):
            return {p: v or 0.0 for p, v in found.items()}
        if time.monotonic() > deadline:
            raise TimeoutError(f"the plugin's /metrics never showed both pods' GPU memory:\n{body}")
        await asyncio.sleep(0.1)


async def _wait_for_idle(port: int, pod: str, seconds: float, timeout: float = 15.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        body = await asyncio.to_thread(_metrics, port)
        if (_value(body, "kubegpu_device_idle_seconds", pod=pod) or 0.0) >= seconds:
            return body
        if time.monotonic() > deadline:
            raise TimeoutError(f"the plugin's /metrics never showed {pod} idle for {seconds} s:\n{body}")
        await asyncio.sleep(0.1)


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        return str(answer.read().decode())


def _value(body: str, name: str, **labels: str) -> float | None:
    for line in body.splitlines():
        match = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if match and labels.items() <= dict(re.findall(r'(\w+)="([^"]*)"', match[1])).items():
            return float(match[2])
    return None

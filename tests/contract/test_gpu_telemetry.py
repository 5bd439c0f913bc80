"""GPU telemetry on /metrics: dcgm-exporter's series, per-container use on shared GPUs, idle holders.

`kubegpu plugin` runs as its own process on the fake NVML against the kubelet simulator; GPU use is
injected with `kubegpu fake-nvml inject` from another process, and the GPU processes' cgroups live in a
/proc-shaped directory the plugin is pointed at (KUBEGPU_PROC_ROOT), written as the kubelet lays them out.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

from kubegpu.demo.simnode import GPU_RESOURCE, SimulatedNode
from kubegpu.kubeletsim import Container, Pod
from tests.contract.conftest import profile_inventory
from tests.contract.test_http_endpoint import fetch, free_port

T4 = profile_inventory("t4-pcie")
A100 = profile_inventory("dgx-a100")
CONTAINERD_ID = "3f0c9a1b" * 8  # a 64-hex-digit container ID
GIB = 1024**3


def write_cgroup(proc: Path, pid: int, pod_uid: str | None) -> None:
    """/proc/<pid>/cgroup as a cgroup-v2, systemd-driver node writes it (the UID's dashes as _)."""
    (proc / str(pid)).mkdir(parents=True)
    if pod_uid is None:
        path = "/system.slice/containerd.service"
    else:
        slug = pod_uid.replace("-", "_")
        path = (
            f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{slug}.slice/"
            f"cri-containerd-{CONTAINERD_ID}.scope"
        )
    (proc / str(pid) / "cgroup").write_text(f"0::{path}\n")


def series(metrics: str, name: str) -> dict[frozenset[tuple[str, str]], float]:
    """Every sample of `name`: its labels -> value."""
    out = {}
    for line in metrics.splitlines():
        match = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if match:
            labels = frozenset(re.findall(r'(\w+)="([^"]*)"', match[1]))
            out[labels] = float(match[2])
    return out


def sample_of(metrics: str, name: str, **labels: str) -> float | None:
    wanted = set(labels.items())
    found = [v for k, v in series(metrics, name).items() if wanted <= k]
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} series"
    return found[0] if found else None


async def until_metric(
    port: int, name: str, value: float | None, timeout: float = 15.0, **labels: str
) -> str:
    """The first /metrics body where the series has `value` (None: any value)."""
    deadline = time.monotonic() + timeout
    while True:
        _, body = await fetch(port, "/metrics")
        got = sample_of(body, name, **labels)
        if got is not None if value is None else got == value:
            return body
        if time.monotonic() > deadline:
            raise AssertionError(f"{name}{labels} never became {value}; /metrics:\n{body}")
        await asyncio.sleep(0.1)


def plugin_args(port: int, node: SimulatedNode, *extra: str) -> list[str]:
    return [
        "--http-port",
        str(port),
        "--http-address",
        "127.0.0.1",
        "--pod-resources-socket",
        str(node.sim.pod_resources_socket),
        "--metrics-interval",
        "0.2",
        *extra,
    ]


async def test_a_time_sliced_gpu_shared_by_two_pods_shows_each_pods_own_memory(tmp_path: Path) -> None:
    config = tmp_path / "ts.yaml"
    config.write_text(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        "    - name: nvidia.com/gpu\n      replicas: 4\n"
    )
    proc = tmp_path / "proc"
    port = free_port()
    async with SimulatedNode("t4-pcie", env={"KUBEGPU_PROC_ROOT": str(proc)}) as node:
        node.plugin_args = plugin_args(
            port, node, "--config-file", str(config), "--shared-devices-allocation-policy", "packed"
        )
        node.start_plugin()
        await node.wait_allocatable(16)
        train = Pod("train", namespace="ml", containers=[Container("main", {GPU_RESOURCE: 1})])
        serve = Pod("serve", namespace="web", containers=[Container("api", {GPU_RESOURCE: 1})])
        gpus = []
        for pod in (train, serve):
            allocation = await node.sim.admit(pod)
            gpus.append(
                allocation.containers[pod.containers[0].name].run_options.envs["NVIDIA_VISIBLE_DEVICES"]
            )
        assert gpus[0] == gpus[1], f"packed replicas should share one GPU, got {gpus}"
        gpu = next(g for g in T4.gpus if g.uuid == gpus[0])
        write_cgroup(proc, 4242, train.uid)
        write_cgroup(proc, 4343, serve.uid)
        write_cgroup(proc, 5555, None)  # a process outside any pod (e.g. a node agent)
        node.inject(
            "--gpu", str(gpu.index), "--utilization", "70", "--memory-used", "300",
            "--process", "4242:3072:45", "--process", "4343:1024:20", "--process", "5555:512",
        )  # fmt: skip

        on_gpu = {"gpu": str(gpu.index), "UUID": gpu.uuid}
        body = await until_metric(
            port, "kubegpu_container_gpu_memory_used_bytes", 3 * GIB, pod="train", namespace="ml", **on_gpu
        )
        memory = "kubegpu_container_gpu_memory_used_bytes"
        assert sample_of(body, memory, pod="train", namespace="ml", container="main", **on_gpu) == 3 * GIB
        assert sample_of(body, memory, pod="serve", namespace="web", container="api", **on_gpu) == 1 * GIB
        assert sample_of(body, memory, pod="", **on_gpu) == 512 * 1024**2  # counted, not dropped
        assert sample_of(body, "kubegpu_gpu_unattributed_processes", **on_gpu) == 1
        ratio = "kubegpu_container_gpu_utilization_ratio"
        assert sample_of(body, ratio, pod="train", **on_gpu) == 0.45
        assert sample_of(body, ratio, pod="serve", **on_gpu) == 0.2
        # dcgm-exporter's series: one per holder of the GPU, each with the whole GPU's values.
        util = series(body, "DCGM_FI_DEV_GPU_UTIL")
        held = {dict(k)["pod"]: v for k, v in util.items() if dict(k)["UUID"] == gpu.uuid}
        assert held == {"train": 70.0, "serve": 70.0}
        # FB used: the processes' 3072 + 1024 + 512 MiB and 300 MiB besides.
        assert sample_of(body, "DCGM_FI_DEV_FB_USED", pod="train", UUID=gpu.uuid) == 4908.0
        assert sample_of(body, "DCGM_FI_DEV_FB_FREE", pod="train", UUID=gpu.uuid) == 15360.0 - 4908.0


async def test_dcgm_series_and_idle_holders_on_whole_gpus() -> None:
    port = free_port()
    async with SimulatedNode("dgx-a100", env={"KUBEGPU_NODE_NAME": "gpu-node-7"}) as node:
        node.plugin_args = plugin_args(port, node, "--idle-threshold", "10")
        node.start_plugin()
        await node.wait_allocatable(8)
        idle = await node.sim.admit(Pod("notebook", containers=[Container("jupyter", {GPU_RESOURCE: 1})]))
        busy = await node.sim.admit(Pod("trainer", containers=[Container("torch", {GPU_RESOURCE: 1})]))
        idle_uuid = idle.containers["jupyter"].run_options.envs["NVIDIA_VISIBLE_DEVICES"]
        busy_uuid = busy.containers["torch"].run_options.envs["NVIDIA_VISIBLE_DEVICES"]
        idle_gpu = next(g for g in A100.gpus if g.uuid == idle_uuid)
        busy_gpu = next(g for g in A100.gpus if g.uuid == busy_uuid)
        node.inject(
            "--gpu", str(busy_gpu.index), "--utilization", "95", "--power", "310.5", "--sm-clock", "1410"
        )
        node.inject("--gpu", str(idle_gpu.index), "--utilization", "10")  # at the threshold: still idle
        node.inject("--gpu", "7", "--xid", "48")

        body = await until_metric(port, "DCGM_FI_DEV_GPU_UTIL", 95.0, UUID=busy_uuid, pod="trainer")
        # The labels dcgm-exporter writes, with the holder; a free GPU has empty holder labels.
        labels = next(
            dict(k) for k in series(body, "DCGM_FI_DEV_POWER_USAGE") if dict(k)["UUID"] == busy_uuid
        )
        assert labels == {
            "gpu": str(busy_gpu.index),
            "UUID": busy_uuid,
            "pci_bus_id": busy_gpu.pci_bus_id,
            "device": f"nvidia{busy_gpu.minor}",
            "modelName": "NVIDIA A100-SXM4-40GB",
            "Hostname": "gpu-node-7",
            "container": "torch",
            "namespace": "default",
            "pod": "trainer",
        }
        assert sample_of(body, "DCGM_FI_DEV_POWER_USAGE", UUID=busy_uuid) == 310.5
        assert sample_of(body, "DCGM_FI_DEV_SM_CLOCK", UUID=busy_uuid) == 1410.0
        assert "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %)." in body
        assert "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB)." in body
        free = A100.gpus[7]
        assert sample_of(body, "DCGM_FI_DEV_XID_ERRORS", UUID=free.uuid, pod="") == 48.0
        assert sample_of(body, "DCGM_FI_DEV_XID_ERRORS", UUID=busy_uuid) == 0.0

        await asyncio.sleep(1.5)  # idle time is as of the last sample (every 0.2 s here)
        _, body = await fetch(port, "/metrics")
        held_idle = sample_of(body, "kubegpu_device_idle_seconds", pod="notebook", UUID=idle_uuid)
        assert held_idle is not None and held_idle >= 1.0
        held_busy = sample_of(body, "kubegpu_device_idle_seconds", pod="trainer", UUID=busy_uuid)
        assert held_busy is not None and held_busy < 1.0
        assert sample_of(body, "kubegpu_device_idle_seconds", UUID=free.uuid) is None  # not held

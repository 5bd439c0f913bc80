"""`kubectl gpu top` and `kubegpu top` against the fake API server, with plugins behind its pod proxy.

Two simulated GPU nodes (each a real `kubegpu plugin` process on the fake NVML and the kubelet simulator)
serve /metrics on 127.0.0.1; the fake API server holds their pods (status.podIP 127.0.0.1, the `health`
port) and a pending pod, and proxies /api/v1/namespaces/<ns>/pods/<pod>:<port>/proxy/metrics to them as
the real API server does. The tools read it all with a kubeconfig, as on a cluster.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kubegpu.apisim import ApiServerSim
from kubegpu.demo.simnode import GPU_RESOURCE, SimulatedNode
from kubegpu.kubeletsim import Container, Pod
from kubegpu.toolkit.kubectl_plugin import kubectl_gpu
from kubegpu.toolkit.top.cli import top
from tests.contract.conftest import profile_inventory
from tests.contract.test_gpu_telemetry import until_metric
from tests.contract.test_http_endpoint import free_port

A100 = profile_inventory("dgx-a100")
T4 = profile_inventory("t4-pcie")


def plugin_pod(name: str, node: str, port: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "kubegpu",
            "labels": {"app.kubernetes.io/name": "kubegpu", "app.kubernetes.io/component": "device-plugin"},
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "kubegpu-device-plugin-ctr",
                    "image": "kubegpu",
                    "ports": [{"name": "health", "containerPort": port}],
                }
            ],
        },
    }


def pending_pod(name: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {
            "containers": [
                {"name": "main", "image": "cuda", "resources": {"limits": {GPU_RESOURCE: str(gpus)}}}
            ]
        },
    }


class Cluster:
    def __init__(
        self, kubeconfig: Path, api: ApiServerSim, held: dict[str, list[str]], ports: dict[str, int]
    ) -> None:
        self.kubeconfig = kubeconfig
        self.api = api
        self.held = held
        self.ports = ports


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    ports = {"node-a": free_port(), "node-b": free_port()}
    async with (
        SimulatedNode("dgx-a100", env={"KUBEGPU_NODE_NAME": "node-a"}) as a,
        SimulatedNode("t4-pcie", env={"KUBEGPU_NODE_NAME": "node-b"}) as b,
    ):
        for name, node in (("node-a", a), ("node-b", b)):
            node.plugin_args = [
                *("--http-port", str(ports[name]), "--http-address", "127.0.0.1"),
                *("--pod-resources-socket", str(node.sim.pod_resources_socket), "--metrics-interval", "0.2"),
            ]
            node.start_plugin()
        await a.wait_allocatable(8)
        await b.wait_allocatable(4)
        train = await a.sim.admit(
            Pod("train", namespace="ml", containers=[Container("main", {GPU_RESOURCE: 5})])
        )
        notebook = await b.sim.admit(
            Pod("notebook", namespace="lab", containers=[Container("jupyter", {GPU_RESOURCE: 1})])
        )
        held = {
            "train": train.containers["main"].run_options.envs["NVIDIA_VISIBLE_DEVICES"].split(","),
            "notebook": notebook.containers["jupyter"].run_options.envs["NVIDIA_VISIBLE_DEVICES"].split(","),
        }
        for uuid in held["train"]:
            index = next(g.index for g in A100.gpus if g.uuid == uuid)
            await asyncio.to_thread(
                a.inject, "--gpu", str(index), "--utilization", "90", "--memory-used", "20480"
            )
        last = next(g for g in A100.gpus if g.uuid == held["train"][-1])
        await until_metric(ports["node-a"], "DCGM_FI_DEV_GPU_UTIL", 90.0, UUID=last.uuid, pod="train")
        await until_metric(ports["node-b"], "kubegpu_device_idle_seconds", None, pod="notebook")
        with ApiServerSim() as api:
            for name, port in ports.items():
                pod = api.create("pods", plugin_pod(f"kubegpu-device-plugin-{name}", name, port), "kubegpu")
                pod["status"] = {"phase": "Running", "podIP": "127.0.0.1"}
                api.update("pods", pod, status=True)
            pending = api.create("pods", pending_pod("big-train", 5), "ml")
            pending["status"] = {"phase": "Pending"}
            api.update("pods", pending, status=True)
            yield Cluster(api.write_kubeconfig(tmp_path / "kubeconfig"), api, held, ports)


def run(command: Any, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(command, list(args), catch_exceptions=False)
    return result.exit_code, result.output


async def test_kubectl_gpu_top_reads_every_plugin_through_the_pod_proxy(cluster: Cluster) -> None:
    code, out = await asyncio.to_thread(
        run, kubectl_gpu, "--kubeconfig", str(cluster.kubeconfig), "top", "--json"
    )
    assert code == 0, out
    body = json.loads(out)
    assert body["errors"] == []
    gpus = body["gpus"]
    assert len(gpus) == 12  # 8 A100 + 4 T4, one row each (each held by at most one pod)
    by_uuid = {g["uuid"]: g for g in gpus}
    for uuid in cluster.held["train"]:
        row = by_uuid[uuid]
        assert row["node"] == "node-a" and row["holder"] == "ml/train/main" and row["health"] == "Healthy"
        assert row["utilizationPercent"] == 90.0 and row["memoryUsedMiB"] == 20480.0
        assert row["memoryTotalMiB"] == 40960.0 and row["model"] == "NVIDIA A100-SXM4-40GB"
    (notebook,) = cluster.held["notebook"]
    assert by_uuid[notebook]["holder"] == "lab/notebook/jupyter" and by_uuid[notebook]["node"] == "node-b"
    assert by_uuid[notebook]["idleSeconds"] is not None and by_uuid[notebook]["model"] == "Tesla T4"
    free = [g for g in gpus if g["holder"] is None]
    assert len(free) == 6 and all(g["idleSeconds"] is None for g in free)
    # 3 free on each node: the pending 5-GPU pod fits the free GPUs only together.
    assert body["fragmentation"] == {
        "freeGpusByNode": {"node-a": 3, "node-b": 3},
        "largestRequestByNode": {"node-a": 3, "node-b": 3},
        "totalFree": 6,
        "pendingOnlyTogether": [{"namespace": "ml", "pod": "big-train", "gpus": 5}],
        # The DGX A100's 8 GPUs share NVSwitch: one NVLink group, which train's 5 GPUs split.
        "splitNvlinkGroups": [{"node": "node-a", "gpus": [str(i) for i in range(8)], "held": 5, "free": 3}],
    }
    # Each plugin's /metrics went through the API server's pod proxy, port by name.
    proxied = sorted(p for p, _ in cluster.api.requests if "/proxy/" in p)
    assert proxied == [
        f"/api/v1/namespaces/kubegpu/pods/kubegpu-device-plugin-{node}%3A{cluster.ports[node]}/proxy/metrics"
        for node in ("node-a", "node-b")
    ]


async def test_top_idle_lists_only_idle_holders_and_the_table_says_it(cluster: Cluster) -> None:
    await asyncio.sleep(1.2)
    code, out = await asyncio.to_thread(
        run, top, "--kubeconfig", str(cluster.kubeconfig), "--idle", "1s", "--json"
    )
    assert code == 0, out
    rows = json.loads(out)["gpus"]
    assert [(r["holder"], r["node"]) for r in rows] == [("lab/notebook/jupyter", "node-b")]
    assert rows[0]["idleSeconds"] >= 1.0
    code, out = await asyncio.to_thread(run, top, "--kubeconfig", str(cluster.kubeconfig), "--idle", "1h")
    assert code == 0 and "no GPU held that long" in out
    code, out = await asyncio.to_thread(run, top, "--kubeconfig", str(cluster.kubeconfig))
    lines = out.splitlines()
    # Piped: a title, the header and one line per row, tab-separated (the console expands the tabs).
    assert lines[:2] == ["GPUs:", "Node\tGPU\tModel\tHealth\tPod\tUtil\tMemory\tIdle for".expandtabs()]
    first = next(g.index for g in A100.gpus if g.uuid == cluster.held["train"][0])
    row = f"node-a\t{first}\tNVIDIA A100-SXM4-40GB\tHealthy\tml/train/main\t90%\t20.0/40 GiB\t0s"
    assert row.expandtabs() in lines
    assert "free GPUs: node-a 3, node-b 3 (largest request a node can take: 3)" in lines
    assert "NVLink group node-a GPUs 0,1,2,3,4,5,6,7: 5 held, 3 free (no 8-GPU job fits it)" in lines
    assert "pending ml/big-train asks for 5 GPUs: 6 are free, but no node has that many" in lines


async def test_a_plugin_pod_that_cannot_be_reached_is_reported_not_fatal(cluster: Cluster) -> None:
    dead = plugin_pod("kubegpu-device-plugin-node-c", "node-c", free_port())
    pod = cluster.api.create("pods", dead, "kubegpu")
    pod["status"] = {"phase": "Running", "podIP": "127.0.0.1"}
    cluster.api.update("pods", pod, status=True)
    code, out = await asyncio.to_thread(run, top, "--kubeconfig", str(cluster.kubeconfig), "--json")
    assert code == 0, out
    body = json.loads(out)
    assert len(body["gpus"]) == 12
    (error,) = body["errors"]
    assert (
        error == "cannot read /metrics of pod kubegpu/kubegpu-device-plugin-node-c: 503 Service Unavailable"
    )


def test_bad_input_gets_one_line(tmp_path: Path) -> None:
    code, out = run(top, "--idle", "soon", "--kubeconfig", str(tmp_path / "none"))
    assert code == 2 and 'Invalid value for --idle: time: invalid duration "soon" (e.g. 30m, 1h)' in out
    code, out = run(top, "--kubeconfig", str(tmp_path / "none"))
    assert code == 2 and str(tmp_path / "none") in out


def test_nvlink_groups_merge_pairs_and_only_split_ones_are_reported() -> None:
    from kubegpu.toolkit.top.model import NVLINK, GpuRow, NodeMetrics, Sample, fragmentation, nvlink_groups

    def link(a: str, b: str) -> Sample:
        return Sample(NVLINK, {"UUID": a, "peer_UUID": b}, 12.0)

    # Two NVLink pairs bridged by a third link (one group of 4), and a separate pair.
    node = NodeMetrics("n", (link("A", "B"), link("C", "D"), link("B", "C"), link("E", "F")))
    groups = nvlink_groups([node])
    assert sorted(sorted(g) for g in groups["n"]) == [["A", "B", "C", "D"], ["E", "F"]]

    def row(uuid: str, gpu: str, holder: str = "") -> GpuRow:
        return GpuRow("n", gpu, uuid, "m", "Healthy", holder, 0.0, 0.0, 1.0, None)

    rows = [row("A", "0", "ns/a/c"), row("B", "1"), row("C", "2"), row("D", "3")]
    rows += [row("E", "4", "ns/e/c"), row("F", "5", "ns/e/c")]  # a pair held whole: not split
    frag = fragmentation(rows, [], groups)
    assert [(g.gpus, g.held, g.free) for g in frag.split_nvlink_groups] == [(("0", "1", "2", "3"), 1, 3)]

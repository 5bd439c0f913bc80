"""Every example is also a test: each workload under deployments/examples/ runs on the simulated nodes its
header names, and gets what the header promises; each shipped config passes `kubegpu config check` on the
nodes its header names.

A workload's header has one line per node it is checked on:

    #   config time-slicing, node t4-pcie: Running, 1 nvidia.com/gpu per pod
    #   config default, node t4-pcie: Pending: 0/1 nodes are available: 1 node(s) didn't match ...

A node is `kubegpu plugin` with that config on the fake NVML profile, registered with the kubelet
simulator (kubegpu.demo.simnode), labelled by `kubegpu labels` as GFD would label it. Each of the
workload's pods (replicas, parallelism) goes through kube-scheduler's filters (`kubegpu explain`'s) against
that node and the pods already placed; "Running" means every pod fits and the kubelet admits it with the
promised devices from the plugin, "Pending" that the first pod fits nowhere and `kubegpu explain` gives the
scheduler's words. One simulated node per config and profile serves every example that names it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from click.testing import CliRunner

from kubegpu.common import quantity
from kubegpu.demo.simnode import SimulatedNode
from kubegpu.kubeletsim import Container as SimContainer
from kubegpu.kubeletsim import Pod as SimPod
from kubegpu.toolkit.explain.run import explain
from kubegpu.toolkit.manifests import Workload, parse_text
from kubegpu.toolkit.model import Node, ObjectMeta, Pod, PodSpec, RuntimeClass
from kubegpu.toolkit.snapshot import Snapshot

from .conftest import CONFIGS, EXAMPLES, STATIC, VALUES_EXAMPLES

WORKLOADS = sorted(EXAMPLES.glob("*.yml"))
PROMISE = re.compile(
    r"^#\s+config (?P<config>[\w-]+), node (?P<profile>[\w-]+): "
    r"(?:Running, (?P<count>\d+) (?P<resource>\S+) per pod|Pending: (?P<words>.+))$"
)
CONFIG_NODES = re.compile(r"^# Checked with `kubegpu config check` on these simulated nodes: (.+)$")
# What a node has besides GPUs: enough that only the GPUs decide.
NODE_RESOURCES = {"cpu": "128", "memory": "1Ti", "pods": "110", "ephemeral-storage": "1Ti"}
# The chart gives the plugin MPS_ROOT=mps.root whenever it mounts a config.
CHART_FLAGS = ["--mps-root", "/run/nvidia/mps"]


@dataclass(frozen=True)
class Promise:
    config: str
    profile: str
    running: tuple[int, str] | None  # (count, resource) per pod
    pending: str | None  # the scheduler's words


def promises(path: Path) -> list[Promise]:
    out = []
    for line in path.read_text().splitlines():
        m = PROMISE.match(line)
        if m:
            running = (int(m["count"]), m["resource"]) if m["count"] else None
            out.append(Promise(m["config"], m["profile"], running, m["words"]))
    return out


def config_nodes(path: Path) -> list[str]:
    found = [CONFIG_NODES.match(line) for line in path.read_text().splitlines()]
    return [p.strip() for m in found if m for p in m.group(1).split(",")]


CASES = [(path, p) for path in WORKLOADS for p in promises(path)]
CONFIG_CASES = [(path, profile) for path in sorted(CONFIGS.glob("*.yaml")) for profile in config_nodes(path)]


def test_every_example_and_config_says_where_it_is_checked() -> None:
    assert {p.name for p, _ in CASES} == {p.name for p in WORKLOADS}
    assert {p.name for p, _ in CONFIG_CASES} == {p.name for p in CONFIGS.glob("*.yaml")}
    named = {(pr.config, pr.profile) for _, pr in CASES}
    for config, profile in named:  # a workload runs only on a node its config is meant for
        assert (CONFIGS / f"{config}.yaml", profile) in CONFIG_CASES, (config, profile)


# --- the configs ----------------------------------------------------------------------------------------


def config_check(path: Path, profile: str, *more: str, mps_root: bool = True) -> tuple[int, dict[str, Any]]:
    """`kubegpu config check PATH --profile PROFILE` with the flags the chart gives the plugin."""
    from kubegpu.cli.main import main

    args = [
        "config",
        "check",
        str(path),
        "--profile",
        profile,
        "--json",
        *more,
        *(CHART_FLAGS if mps_root else []),
    ]
    result = CliRunner().invoke(main, args)
    return result.exit_code, json.loads(result.output)


@pytest.mark.parametrize(("path", "profile"), CONFIG_CASES, ids=[f"{p.stem}@{n}" for p, n in CONFIG_CASES])
def test_each_config_passes_config_check_on_its_nodes(path: Path, profile: str) -> None:
    code, report = config_check(path, profile)
    assert code == 0 and report["errors"] == [] and report["warnings"] == [], report
    assert report["resources"] and all(report["resources"].values()), report["resources"]


@pytest.mark.parametrize(("path", "profile"), CONFIG_CASES, ids=[f"{p.stem}@{n}" for p, n in CONFIG_CASES])
def test_the_shipped_configmap_passes_config_check_key_by_key(path: Path, profile: str) -> None:
    """What the install guide tells users to run on their ConfigMap: `config check FILE --key NAME`."""
    code, report = config_check(STATIC / "kubegpu-configs.yml", profile, "--key", path.stem)
    assert code == 0 and report["source"] == "ConfigMap" and report["errors"] == [], report
    ((key, one),) = [(c["key"], c) for c in report["configs"]]
    assert key == path.stem and one["errors"] == [] and one["warnings"] == [], one
    assert one["resources"] == config_check(path, profile)[1]["resources"]


def test_the_values_of_the_sharing_example_pass_config_check(tmp_path: Path) -> None:
    """values-sharing.yaml with the example configs in config.map (what its --set-file lines make), as the
    values file a user checks before rolling out: every config, and what an unlabelled node gets."""
    values = yaml.safe_load((VALUES_EXAMPLES / "values-sharing.yaml").read_text())
    values["config"]["map"] = {p.stem: p.read_text() for p in sorted(CONFIGS.glob("*.yaml"))}
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    code, report = config_check(path, "dgx-a100", mps_root=False)  # the values' own mps.root applies
    assert code == 0 and report["source"] == "Helm values" and report["errors"] == [], report
    assert [c["key"] for c in report["configs"]] == ["default", "mig-mixed", "mps", "time-slicing"]
    assert report["unlabelled"] == "default"


def test_the_configmap_shipped_holds_the_checked_configs() -> None:
    (configmap,) = [d for d in yaml.safe_load_all((STATIC / "kubegpu-configs.yml").read_text()) if d]
    assert configmap["data"] == {p.stem: p.read_text() for p in CONFIGS.glob("*.yaml")}


# --- the workloads --------------------------------------------------------------------------------------


@dataclass
class GpuNode:
    """A simulated node with one config, and the Node object the scheduler sees for it."""

    sim: SimulatedNode
    node: Node
    placed: list[Pod] = field(default_factory=list)


class Nodes:
    def __init__(self) -> None:
        self.started: dict[tuple[str, str], GpuNode] = {}

    async def get(self, config: str, profile: str) -> GpuNode:
        key = (config, profile)
        if key not in self.started:
            self.started[key] = await self._start(config, profile)
        return self.started[key]

    async def _start(self, config: str, profile: str) -> GpuNode:
        path = CONFIGS / f"{config}.yaml"
        _, report = config_check(path, profile)
        advertised = {r: len(ids) for r, ids in report["resources"].items()}
        sim = SimulatedNode(profile, plugin_args=["--config-file", str(path)])
        await sim.start_kubelet()
        sim.start_plugin()
        for resource, count in advertised.items():
            await sim.wait_allocatable(count, resource=resource)
        labels = gfd_labels(profile, path)
        allocatable = {**NODE_RESOURCES, **{r: str(n) for r, n in sim.sim.allocatable().items()}}
        node = msgspec.convert(
            {
                "metadata": {
                    "name": f"{profile}-{config}",
                    "labels": {"kubernetes.io/hostname": profile, **labels},
                },
                "status": {
                    "capacity": allocatable,
                    "allocatable": allocatable,
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            },
            Node,
        )
        return GpuNode(sim, node)

    async def close(self) -> None:
        for node in self.started.values():
            await node.sim.close()


def gfd_labels(profile: str, config: Path) -> dict[str, str]:
    """`kubegpu labels` once, on the profile, with the node's config: what NFD would put on the node."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kubegpu",
            "labels",
            "--oneshot",
            "true",
            "--output",
            "-",
            "--no-timestamp",
            "true",
            "--use-node-feature-api",
            "false",  # the labels on stdout, as NFD's features.d file would carry them
            "--config-file",
            str(config),
        ],
        env={**os.environ, "KUBEGPU_FAKE_NVML": profile},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)


@pytest.fixture(scope="module")
async def nodes() -> AsyncIterator[Nodes]:
    pool = Nodes()
    try:
        yield pool
    finally:
        await pool.close()


def workload(path: Path) -> Workload:
    manifests = parse_text(path.read_text(), str(path))
    assert not manifests.problems and len(manifests.workloads) == 1, manifests.problems
    return manifests.workloads[0]


def pod_count(w: Workload) -> int:
    """How many pods the object runs at once: replicas, a Job's parallelism, or 1."""
    counts = {str(path[-1]): value for path, _, value in w.counts}
    return int(counts.get("replicas", counts.get("parallelism", 1)))


def pods_of(w: Workload, count: int) -> list[Pod]:
    spec = msgspec.convert(msgspec.to_builtins(w.spec), PodSpec)
    return [
        Pod(
            metadata=ObjectMeta(name=f"{w.name}-{i}", namespace=w.namespace or "default"),
            spec=msgspec.structs.replace(spec),
        )
        for i in range(count)
    ]


def snapshot(node: GpuNode) -> Snapshot:
    nvidia = msgspec.convert({"metadata": {"name": "nvidia"}, "handler": "nvidia"}, RuntimeClass)
    return Snapshot(
        nodes=[node.node], pods=list(node.placed), runtime_classes=[nvidia], source="simulated node"
    )


def sim_pod(pod: Pod) -> SimPod:
    """What the kubelet's device manager sees of the pod: its containers' extended-resource limits."""

    def containers(group: Any) -> list[SimContainer]:
        return [
            SimContainer(
                c.name, {r: quantity.value(v) for r, v in (c.resources.limits or {}).items() if "/" in r}
            )
            for c in group or []
            if c.resources is not None
        ]

    return SimPod(
        pod.metadata.name,
        containers=containers(pod.spec.containers),
        init_containers=containers(pod.spec.init_containers),
    )


@pytest.mark.parametrize(
    ("path", "promise"), CASES, ids=[f"{p.stem}@{pr.config}@{pr.profile}" for p, pr in CASES]
)
async def test_each_example_gets_what_its_header_promises(nodes: Nodes, path: Path, promise: Promise) -> None:
    node = await nodes.get(promise.config, promise.profile)
    w = workload(path)
    pods = pods_of(w, pod_count(w))
    try:
        if promise.pending is not None:
            assert_pending(node, pods[0], promise.pending, tmp=Path(node.sim.root))
            return
        assert promise.running is not None
        count, resource = promise.running
        for pod in pods:
            verdict = explain(snapshot(node), pod)
            assert verdict.feasible_nodes == [node.node.metadata.name], (verdict.message, verdict.nodes)
            pod.spec.node_name = node.node.metadata.name
            node.placed.append(pod)
            allocation = await node.sim.sim.admit(sim_pod(pod))
            held = allocation.devices(resource)
            assert len(held) == count, (pod.metadata.name, allocation)
            for container in allocation.containers.values():
                assert container.run_options is not None  # started
    finally:
        for pod in node.placed:
            node.sim.sim.remove_pod(pod.metadata.name)
        node.placed.clear()


def assert_pending(node: GpuNode, pod: Pod, words: str, tmp: Path) -> None:
    """`kubegpu explain` on a snapshot of the node says the pod fits nowhere, in the promised words."""
    from kubegpu.toolkit.cli import explain as explain_command

    dump = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {"kind": "Node", **msgspec.to_builtins(node.node)},
            {"kind": "Pod", **msgspec.to_builtins(pod)},
            {"kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia"},
        ],
    }
    file = tmp / "snapshot.json"
    file.write_text(json.dumps(dump))
    result = CliRunner().invoke(
        explain_command, [f"{pod.metadata.namespace}/{pod.metadata.name}", "--snapshot", str(file), "--json"]
    )
    report = json.loads(result.output)
    assert result.exit_code == 1 and report["status"] == "pending-unschedulable", report
    assert report["message"] == words

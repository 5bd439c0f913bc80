"""`kubegpu doctor --cluster` on the fixture cluster: each planted fault is found, with its fix."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

from kubegpu.toolkit.cli import doctor
from kubegpu.toolkit.doctor.cluster import doctor_cluster
from kubegpu.toolkit.model import DaemonSet, Node, Pod, Taint
from kubegpu.toolkit.snapshot import Snapshot, load_snapshot

from .paths import CLUSTER


def run(*extra: str) -> tuple[int, list[dict[str, Any]]]:
    result = CliRunner().invoke(doctor, ["--cluster", "--snapshot", str(CLUSTER), "--json", *extra])
    return result.exit_code, json.loads(result.output)["findings"]


def by_check(findings: list[dict[str, Any]], status: str | None = None) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for f in findings:
        if status is None or f["status"] == status:
            out.setdefault(f["check"], []).append(f)
    return out


def test_every_planted_fault_is_found() -> None:
    code, findings = run()
    assert code == 1
    problems = {(f["check"], f["object"], f["fault"]) for f in findings if f["status"] != "ok"}
    assert ("gpu-capacity", "node/t4-4", 2) in problems
    assert ("unhealthy-gpus", "node/a100-3", 2) in problems
    assert ("stale-mig-resources", "node/a100-mig-2", 2) in problems
    assert (
        "plugin-daemonset-selector",
        "daemonset/kube-system/nvidia-device-plugin-daemonset",
        4,
    ) in problems
    assert ("runtime-class", "1 GPU pod(s)", 1) in problems
    assert ("admission-errors", "node/a100-2", 2) in problems
    pending = {f["object"] for f in findings if f["check"] == "pending-gpu-pods"}
    assert pending == {
        "pod/ml/train-llm-8gpu",
        "pod/ml/infer-mig-3g",
        "pod/research/h100-finetune",
        "pod/ml/notebook-t4",
        "pod/ml/small-1gpu",
    }
    # Nothing is reported about healthy nodes.
    healthy = {"node/a100-1", "node/a100-2", "node/h100-1", "node/h100-2", "node/t4-1"}
    assert not any(
        f["object"] in healthy and f["check"] != "admission-errors" for f in findings if f["status"] != "ok"
    )


def test_crash_loops_are_grouped_by_cause() -> None:
    _, findings = run()
    crashes = by_check(findings, "fail")["plugin-crashloop"]
    assert len(crashes) == 2
    gpu_less = next(f for f in crashes if f["fault"] == 4)
    assert gpu_less["object"] == "3 pods of daemonset/kube-system/nvidia-device-plugin-daemonset"
    assert "cpu-1, cpu-2, cpu-3" in gpu_less["evidence"] and "ERROR_LIBRARY_NOT_FOUND" in gpu_less["evidence"]
    assert "nodeSelector" in gpu_less["fix"]
    driver = next(f for f in crashes if f["fault"] == 2)
    assert driver["object"] == "pod/kube-system/nvidia-device-plugin-daemonset-t4-4"
    assert "modprobe nvidia" in driver["fix"]


def test_uncovered_gpu_node_names_the_missing_toleration() -> None:
    snap = load_snapshot(CLUSTER)
    # The research pool's plugin pods are gone and the DaemonSet no longer tolerates its taint.
    snap.pods = [
        p for p in snap.pods if not p.metadata.name.startswith("nvidia-device-plugin-daemonset-h100")
    ]
    ds = next(d for d in snap.daemonsets if d.metadata.name == "nvidia-device-plugin-daemonset")
    ds.spec.template.spec.tolerations = [
        t for t in ds.spec.template.spec.tolerations or [] if t.key != "dedicated"
    ]
    coverage = [f for f in doctor_cluster(snap) if f.check == "plugin-coverage"]
    assert {f.object for f in coverage} == {"node/h100-1", "node/h100-2"}
    assert all("dedicated=research:NoSchedule" in f.evidence and f.fault == 2 for f in coverage)


def test_healthy_cluster_is_all_ok() -> None:
    node = msgspec.convert(
        {
            "metadata": {
                "name": "g1",
                "labels": {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "2"},
            },
            "status": {
                "capacity": {"nvidia.com/gpu": "2"},
                "allocatable": {"nvidia.com/gpu": "2"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        },
        Node,
    )
    ds = msgspec.convert(
        {
            "metadata": {"name": "nvidia-device-plugin-daemonset", "namespace": "kube-system"},
            "spec": {
                "template": {
                    "spec": {
                        "nodeSelector": {"nvidia.com/gpu.present": "true"},
                        "containers": [{"image": "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"}],
                    }
                }
            },
        },
        DaemonSet,
    )
    plugin_pod = msgspec.convert(
        {
            "metadata": {
                "name": "p",
                "namespace": "kube-system",
                "ownerReferences": [{"kind": "DaemonSet", "name": "nvidia-device-plugin-daemonset"}],
            },
            "spec": {"nodeName": "g1"},
            "status": {"phase": "Running"},
        },
        Pod,
    )
    findings = doctor_cluster(Snapshot(nodes=[node], pods=[plugin_pod], daemonsets=[ds]))
    assert {f.status for f in findings} == {"ok"}


def test_human_output_and_usage() -> None:
    result = CliRunner().invoke(doctor, ["--cluster", "--snapshot", str(CLUSTER)])
    assert result.exit_code == 1 and "failed," in result.output and "stale-mig-resources" in result.output
    result = CliRunner().invoke(doctor, ["--snapshot", str(CLUSTER)])
    assert result.exit_code == 2 and "add --cluster" in result.output
    result = CliRunner().invoke(
        doctor, ["--cluster", "--snapshot", str(CLUSTER.parent / "manifests/broken.yaml")]
    )
    assert result.exit_code == 2 and "kubectl get nodes,pods" in result.output


def test_cordoned_gpu_node_is_not_blamed_on_its_unschedulable_taint() -> None:
    # DaemonSet pods tolerate node.kubernetes.io/unschedulable (the controller adds it), so a cordoned GPU
    # node without a plugin pod is missing it for another reason, never "because of the taint".
    snap = load_snapshot(CLUSTER)
    t4_3 = next(n for n in snap.nodes if n.metadata.name == "t4-3")
    t4_3.spec.taints = [
        *(t4_3.spec.taints or []),
        Taint(key="node.kubernetes.io/unschedulable", effect="NoSchedule"),
    ]
    snap.pods = [p for p in snap.pods if p.spec.node_name != "t4-3" or "device-plugin" not in p.metadata.name]
    coverage = [f for f in doctor_cluster(snap) if f.check == "plugin-coverage" and f.object == "node/t4-3"]
    assert coverage and all("unschedulable" not in f.evidence for f in coverage)


def test_the_labels_and_mps_daemonsets_are_not_taken_for_the_plugin() -> None:
    """They run kubegpu's image too, but not the plugin: a GPU node without an MPS daemon (it only goes to
    nodes labelled mps.capable) or without a labels pod is no plugin-coverage failure."""
    import yaml

    root = CLUSTER.parents[3]
    docs = [
        d
        for name in ("kubegpu-with-config.yml", "mps-control-daemon.yml")
        for d in yaml.safe_load_all((root / "deployments/static" / name).read_text())
        if d and d["kind"] == "DaemonSet"
    ]
    assert {d["metadata"]["name"] for d in docs} == {
        "kubegpu-device-plugin",
        "kubegpu-labels",
        "kubegpu-mps-control-daemon",
    }
    node = msgspec.convert(
        {"metadata": {"name": "g1", "labels": {"nvidia.com/gpu.present": "true"}}, "status": {}}, Node
    )
    plugin_pod = msgspec.convert(
        {
            "metadata": {
                "name": "p",
                "namespace": "kube-system",
                "ownerReferences": [{"kind": "DaemonSet", "name": "kubegpu-device-plugin"}],
            },
            "spec": {"nodeName": "g1"},
        },
        Pod,
    )
    snap = Snapshot(nodes=[node], pods=[plugin_pod], daemonsets=[msgspec.convert(d, DaemonSet) for d in docs])
    coverage = [f for f in doctor_cluster(snap) if f.check == "plugin-coverage"]
    assert [(f.status, f.object) for f in coverage] == [("ok", "daemonset/kube-system/kubegpu-device-plugin")]


@pytest.mark.parametrize(
    ("name", "image", "command", "plugin"),
    [
        ("nvdp-nvidia-device-plugin", "nvcr.io/nvidia/k8s-device-plugin:v0.17.1", None, True),
        (
            "nvdp-nvidia-device-plugin",
            "nvcr.io/nvidia/k8s-device-plugin:v0.17.1",
            ["nvidia-device-plugin"],
            True,
        ),
        (
            "nvdp-gpu-feature-discovery",
            "nvcr.io/nvidia/k8s-device-plugin:v0.17.1",
            ["gpu-feature-discovery"],
            False,
        ),
        (
            "nvdp-mps-control-daemon",
            "nvcr.io/nvidia/k8s-device-plugin:v0.17.1",
            ["mps-control-daemon"],
            False,
        ),
        ("kubegpu-device-plugin", "r/kubegpu:v0.1.0", ["kubegpu", "plugin"], True),
        ("kubegpu-labels", "r/kubegpu:v0.1.0", ["kubegpu", "labels"], False),
        ("kubegpu-mps-control-daemon", "r/kubegpu:v0.1.0", ["python", "-m", "kubegpu.mps", "run"], False),
    ],
)
def test_the_plugin_is_known_by_what_its_image_runs(
    name: str, image: str, command: list[str] | None, plugin: bool
) -> None:
    from kubegpu.toolkit.cluster_facts import is_plugin_daemonset

    container: dict[str, Any] = {"name": "c", "image": image}
    if command:
        container["command"] = command
    ds = msgspec.convert(
        {"metadata": {"name": name}, "spec": {"template": {"spec": {"containers": [container]}}}}, DaemonSet
    )
    assert is_plugin_daemonset(ds) is plugin

"""`kubegpu doctor --cluster --preflight FILE`: the moves from NVIDIA's plugin that would strand GPU nodes are
refused before they are made. The planned DaemonSet is the shipped static manifest, edited as a user's values
would change it; the cluster is a snapshot of a migration in progress."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from kubegpu.toolkit.cli import doctor

ROOT = Path(__file__).parents[2]
STATIC = ROOT / "deployments/static/kubegpu-device-plugin.yml"
NFD_LABELS = "nfd.node.kubernetes.io/feature-labels"


def gpu_node(name: str, labels: dict[str, str], nfd_owns: str | None, taint: bool = False) -> dict[str, Any]:
    node: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
        "spec": {},
        "status": {"capacity": {"nvidia.com/gpu": "8", "cpu": "64"}, "allocatable": {"nvidia.com/gpu": "8"}},
    }
    if nfd_owns is not None:
        node["metadata"]["annotations"] = {NFD_LABELS: nfd_owns}
    if taint:
        node["spec"]["taints"] = [{"key": "dedicated", "value": "research", "effect": "NoSchedule"}]
    return node


def daemonset(name: str, namespace: str, instance: str, image: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/instance": instance},
        },
        "spec": {"template": {"spec": {"containers": [{"name": "c", "image": image}]}}},
    }


NFD_GPU_LABELS = {
    "feature.node.kubernetes.io/pci-10de.present": "true",
    "feature.node.kubernetes.io/cpu-model.vendor_id": "Intel",
    "nvidia.com/gpu.present": "true",
    "nvidia.com/gpu.count": "8",
}
# What nfd-master writes on the node: the labels it owns (its own namespace without the prefix).
NFD_OWNS = "cpu-model.vendor_id,pci-10de.present,nvidia.com/gpu.count,nvidia.com/gpu.present"
NVDP = daemonset(
    "nvdp-nvidia-device-plugin", "nvidia-device-plugin", "nvdp", "nvcr.io/nvidia/k8s-device-plugin:v0.17.1"
)
NVDP_NFD = daemonset(
    "nvdp-node-feature-discovery-worker",
    "nvidia-device-plugin",
    "nvdp",
    "registry.k8s.io/nfd/node-feature-discovery:v0.17.3",
)
OWN_NFD = daemonset(
    "nfd-node-feature-discovery-worker",
    "node-feature-discovery",
    "nfd",
    "registry.k8s.io/nfd/node-feature-discovery:v0.17.3",
)
CPU_NODE = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {"name": "cpu-1", "labels": {"feature.node.kubernetes.io/cpu-model.vendor_id": "Intel"}},
    "status": {"capacity": {"cpu": "32"}},
}


def snapshot(tmp_path: Path, *items: dict[str, Any]) -> Path:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": list(items)}))
    return path


def planned(tmp_path: Path, image: str | None = None, tolerate: str | None = None) -> Path:
    """The shipped DaemonSet, with another image or an extra toleration, as other values would render it."""
    text = STATIC.read_text()
    if image is not None:
        text = text.replace("localhost/kubegpu:0.1.0", image)
    doc = yaml.safe_load(text)
    if tolerate:
        doc["spec"]["template"]["spec"]["tolerations"].append(
            {"key": tolerate, "operator": "Exists", "effect": "NoSchedule"}
        )
    path = tmp_path / "rendered.yaml"
    # As `helm template` prints it: other kinds around the DaemonSet.
    path.write_text(
        "---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {name: x}\n---\n" + yaml.safe_dump(doc)
    )
    return path


def run(*args: str | Path, stdin: str | None = None) -> tuple[int, list[dict[str, Any]]]:
    result = CliRunner().invoke(doctor, ["--cluster", "--json", *map(str, args)], input=stdin)
    assert result.output.startswith("{"), result.output
    return result.exit_code, json.loads(result.output)["findings"]


def problems(findings: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(f["status"], f["check"], f["object"]) for f in findings if f["status"] != "ok"]


GOOD = "REGISTRY/kubegpu:v0.1.0"


def test_nfd_of_nvidias_release_takes_the_labels_the_affinity_needs(tmp_path: Path) -> None:
    cluster = snapshot(
        tmp_path,
        gpu_node("gpu-1", NFD_GPU_LABELS, NFD_OWNS),
        gpu_node("gpu-2", NFD_GPU_LABELS, NFD_OWNS),
        CPU_NODE,
        NVDP,
        NVDP_NFD,
    )
    code, findings = run("--snapshot", cluster, "--preflight", planned(tmp_path, GOOD))
    assert code == 1
    assert problems(findings) == [
        ("fail", "preflight-nodes", "daemonset/kube-system/kubegpu-device-plugin"),
        ("fail", "preflight-nodes", "node/gpu-1"),
        ("fail", "preflight-nodes", "node/gpu-2"),
    ]
    evidence = findings[0]["evidence"]
    assert evidence.startswith("matches 2 node(s) now, but none once NVIDIA's release is uninstalled")
    assert "nvidia-device-plugin/nvdp-node-feature-discovery-worker" in evidence
    assert "feature.node.kubernetes.io/pci-10de.present, nvidia.com/gpu.present" in evidence
    assert "nvidia.com/gpu.present=true" in findings[0]["fix"]


def test_labels_set_by_hand_survive_the_uninstall(tmp_path: Path) -> None:
    # NFD owns pci-10de.present only; nvidia.com/gpu.present was set with kubectl label.
    cluster = snapshot(
        tmp_path, gpu_node("gpu-1", NFD_GPU_LABELS, "pci-10de.present"), CPU_NODE, NVDP, NVDP_NFD
    )
    code, findings = run("--snapshot", cluster, "--preflight", planned(tmp_path, GOOD))
    assert (code, problems(findings)) == (0, [])
    ok = next(f for f in findings if f["check"] == "preflight-nodes")
    assert ok["evidence"] == (
        "would run on 1 node(s), every one of the 1 GPU node(s) with the labels they keep after NVIDIA's "
        "release is uninstalled"
    )


def test_without_nfds_annotation_every_label_in_its_reach_is_taken_as_pruned(tmp_path: Path) -> None:
    cluster = snapshot(tmp_path, gpu_node("gpu-1", NFD_GPU_LABELS, None), NVDP, NVDP_NFD)
    code, findings = run("--snapshot", cluster, "--preflight", planned(tmp_path, GOOD))
    assert code == 1 and ("fail", "preflight-nodes", "node/gpu-1") in problems(findings)


def test_nfd_installed_on_its_own_brings_the_labels_back(tmp_path: Path) -> None:
    cluster = snapshot(tmp_path, gpu_node("gpu-1", NFD_GPU_LABELS, NFD_OWNS), NVDP, NVDP_NFD, OWN_NFD)
    code, findings = run("--snapshot", cluster, "--preflight", planned(tmp_path, GOOD))
    assert code == 0
    (warning,) = [f for f in findings if f["status"] == "warn"]
    assert warning["object"] == "node/gpu-1"
    assert (
        "NFD node-feature-discovery/nfd-node-feature-discovery-worker should set them again"
        in warning["evidence"]
    )


def test_after_the_uninstall_a_daemonset_matching_no_node_fails(tmp_path: Path) -> None:
    pruned = gpu_node("gpu-1", {}, None)  # the labels are gone, the GPUs are still advertised
    cluster = snapshot(tmp_path, pruned, CPU_NODE)
    code, findings = run("--snapshot", cluster, "--preflight", planned(tmp_path, GOOD))
    assert code == 1
    assert problems(findings) == [
        ("fail", "preflight-nodes", "daemonset/kube-system/kubegpu-device-plugin"),
        ("fail", "preflight-nodes", "node/gpu-1"),
    ]
    assert findings[0]["evidence"].startswith(
        "matches no node: no node has the labels its affinity needs (feature.node.kubernetes.io/cpu-model."
        "vendor_id, feature.node.kubernetes.io/pci-10de.present, nvidia.com/gpu.present)"
    )


def test_a_taint_the_daemonset_does_not_tolerate(tmp_path: Path) -> None:
    labels = {"nvidia.com/gpu.present": "true"}
    cluster = snapshot(tmp_path, gpu_node("gpu-1", labels, None), gpu_node("gpu-2", labels, None, taint=True))
    code, findings = run("--snapshot", cluster, "--preflight", planned(tmp_path, GOOD))
    assert code == 1 and problems(findings) == [("fail", "preflight-nodes", "node/gpu-2")]
    assert findings[0]["fix"] == "add to tolerations {key: dedicated, operator: Exists, effect: NoSchedule}"
    code, _ = run("--snapshot", cluster, "--preflight", planned(tmp_path, GOOD, tolerate="dedicated"))
    assert code == 0


@pytest.mark.parametrize(
    ("image", "status", "words"),
    [
        (
            "REGISTRY/kubegpu:v0.17.1",
            "fail",
            "would pull REGISTRY/kubegpu:v0.17.1: the tag NVIDIA's plugin runs now",
        ),
        (
            "REGISTRY/kubegpu:v0.20.0",
            "fail",
            "would pull REGISTRY/kubegpu:v0.20.0: a release tag, not kubegpu's",
        ),
        ("nvcr.io/nvidia/k8s-device-plugin:v0.1.0", "fail", "NVIDIA's image, which has no kubegpu command"),
        ("REGISTRY/kubegpu", "warn", "REGISTRY/kubegpu has no tag, so every node pulls :latest"),
        (
            "registry:5000/kubegpu:dev",
            "warn",
            "registry:5000/kubegpu:dev is not tagged with this kubegpu's version",
        ),
        ("REGISTRY/kubegpu:0.1.0", "ok", "pulls REGISTRY/kubegpu:0.1.0"),
        ("REGISTRY/kubegpu@sha256:" + "a" * 64, "ok", "pulls REGISTRY/kubegpu@sha256:"),
    ],
)
def test_the_image_tag_is_kubegpus(tmp_path: Path, image: str, status: str, words: str) -> None:
    cluster = snapshot(tmp_path, gpu_node("gpu-1", {"nvidia.com/gpu.present": "true"}, None), NVDP)
    code, findings = run("--snapshot", cluster, "--preflight", planned(tmp_path, image))
    (finding,) = [f for f in findings if f["check"] == "preflight-image"]
    assert finding["status"] == status and words in finding["evidence"], finding
    assert code == (1 if status == "fail" else 0)
    if "release" in words or "runs now" in words:
        assert finding["fix"].startswith("--set image.tag=0.1.0")


def test_stdin_and_bad_input(tmp_path: Path) -> None:
    cluster = snapshot(tmp_path, gpu_node("gpu-1", {"nvidia.com/gpu.present": "true"}, None))
    code, _ = run("--snapshot", cluster, "--preflight", "-", stdin=planned(tmp_path, GOOD).read_text())
    assert code == 0
    result = CliRunner().invoke(doctor, ["--preflight", str(STATIC)])
    assert result.exit_code == 2 and "add --cluster" in result.output
    other = tmp_path / "labels.yaml"
    other.write_text(copy.deepcopy((ROOT / "deployments/static/kubegpu-labels.yml").read_text()))
    result = CliRunner().invoke(doctor, ["--cluster", "--snapshot", str(cluster), "--preflight", str(other)])
    assert result.exit_code == 2
    assert "holds no device-plugin DaemonSet (DaemonSets: kubegpu-labels)" in result.output

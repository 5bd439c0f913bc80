"""The example workloads and plugin configs: `kubegpu lint` finds nothing in the workloads, the configs are
valid NVIDIA v1 configs, and `kubegpu doctor --cluster` accepts our DaemonSet where the seed's failed."""

from __future__ import annotations

import json
from pathlib import Path

from .conftest import CONFIGS, EXAMPLES, ROOT, STATIC, kubegpu, load_docs

WORKLOADS = sorted(EXAMPLES.glob("*.yml"))
FIXTURE_CLUSTER = ROOT / "tests/fixtures/toolkit/cluster.json"


def test_the_examples_are_the_ones_the_issue_asks_for() -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for p in WORKLOADS for d in load_docs(p)}
    assert kinds == {
        ("Pod", "gpu-test"),
        ("Job", "train-resnet"),
        ("Deployment", "inference"),
        ("Pod", "mig-test"),
    }
    (pod,) = load_docs(EXAMPLES / "gpu-test.yml")
    assert pod["spec"]["containers"][0]["command"] == ["nvidia-smi"]
    (job,) = load_docs(EXAMPLES / "training-job.yml")
    assert "nvidia.com/gpu.product" in job["spec"]["template"]["spec"]["nodeSelector"]


def test_lint_finds_nothing_in_the_example_workloads() -> None:
    config = CONFIGS / "time-slicing.yaml"  # what the inference example runs on
    code, report = kubegpu("lint", *WORKLOADS, "--plugin-config", config)
    assert report["findings"] == [] and code == 0, report
    assert report["summary"]["objects"] == 4


def test_lint_is_really_looking(tmp_path: Path) -> None:
    (pod,) = load_docs(EXAMPLES / "gpu-test.yml")
    resources = pod["spec"]["containers"][0]["resources"]
    resources["requests"] = resources.pop("limits")  # the classic: GPUs in requests only
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(pod))
    code, report = kubegpu("lint", broken)
    assert code == 1 and [f["rule"] for f in report["findings"]] == ["KG001"]


def test_example_configs_are_valid_nvidia_v1_configs() -> None:
    from kubegpu.settings.nvidia_config import load_config_file

    names = {p.stem for p in CONFIGS.glob("*.yaml")}
    assert names == {"default", "time-slicing", "mps", "mig-mixed"}
    for path in CONFIGS.glob("*.yaml"):
        config, warnings = load_config_file(path)
        assert warnings == [], (path.name, warnings)
        assert config.version == "v1"


def test_doctor_accepts_our_daemonset_on_the_fixture_cluster(tmp_path: Path) -> None:
    """Fault 4 (a plugin DaemonSet without a node selector lands on GPU-less nodes and crash-loops): swap the
    fixture cluster's DaemonSet and pods for ours, and `kubegpu doctor --cluster` finds the selector right
    and no GPU node that our affinity or tolerations keep the plugin off (taints the seed's users added
    aside: those need their own tolerations, docs/install.md says how)."""
    _, before = kubegpu("doctor", "--cluster", "--snapshot", FIXTURE_CLUSTER)
    assert any(
        f["check"] == "plugin-daemonset-selector" and f["status"] == "fail" for f in before["findings"]
    )
    snapshot = json.loads(FIXTURE_CLUSTER.read_text())
    (ours,) = load_docs(STATIC / "kubegpu-device-plugin.yml")
    seed = [
        i for i in snapshot["items"] if i["kind"] == "DaemonSet" and "device-plugin" in i["metadata"]["name"]
    ]
    assert seed, "the fixture cluster should hold the seed's plugin DaemonSet"
    snapshot["items"] = [i for i in snapshot["items"] if i not in seed] + [ours]
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(snapshot))
    _, report = kubegpu("doctor", "--cluster", "--snapshot", path)
    ours_ref = "daemonset/kube-system/kubegpu-device-plugin"
    selector = [f for f in report["findings"] if f["check"] == "plugin-daemonset-selector"]
    assert selector == [{**selector[0], "object": ours_ref, "status": "ok"}], selector
    coverage = [f for f in report["findings"] if f["check"] == "plugin-coverage"]
    assert coverage and not [f for f in coverage if "does not match the node's labels" in f["evidence"]]

"""The guide's move from NVIDIA's plugin (docs/install.md, section 7), run as written: its `helm template`
with an NVIDIA values file that pins `image.tag`, then its pre-flight against a cluster in the middle of the
move. The pre-flight passes only where the guide's steps were followed."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from .conftest import ROOT, helm

GUIDE = (ROOT / "docs/install.md").read_text()
SECTION = GUIDE[GUIDE.index("\n## 7.") : GUIDE.index("\n## 8.")]

# What `helm get values nvdp` shows for a typical NVIDIA install, after step 1's clean-up.
NVDP_VALUES = {
    "image": {"repository": "nvcr.io/nvidia/k8s-device-plugin", "tag": "v0.17.1"},
    "gfd": {"enabled": True},
    "migStrategy": "mixed",
}


def commands(step: str) -> list[list[str]]:
    """The commands of the console block in step `step` of the section, continuation lines joined."""
    body = SECTION[SECTION.index(f"\n{step}. ") :]
    block = re.search(r"```console\n(.*?)```", body, re.DOTALL)
    assert block, f"step {step} has no console block"
    text = block.group(1).replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    return [shlex.split(line[2:]) for line in lines if line.startswith("$ ")]


def render(argv: list[str], values: Path, registry: str = "registry.test") -> str:
    """Run a `helm template ... > FILE` line of the guide with our values file; helm's output."""
    assert argv[0] == "helm" and argv[-2] == ">", argv
    args = [str(values) if a == "nvdp-values.yaml" else a.replace("REGISTRY", registry) for a in argv[1:-2]]
    return helm(*args)


def cluster(tmp_path: Path) -> Path:
    """Two GPU nodes labelled by hand (step 2's second way) and NVIDIA's plugin still running."""
    nodes = [
        {
            "kind": "Node",
            "metadata": {"name": f"gpu-{i}", "labels": {"nvidia.com/gpu.present": "true"}},
            "status": {"capacity": {"nvidia.com/gpu": "8"}},
        }
        for i in (1, 2)
    ]
    nvdp = {
        "kind": "DaemonSet",
        "metadata": {
            "name": "nvdp-nvidia-device-plugin",
            "namespace": "nvidia-device-plugin",
            "labels": {"app.kubernetes.io/instance": "nvdp"},
        },
        "spec": {
            "template": {
                "spec": {"containers": [{"name": "c", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.1"}]}
            }
        },
    }
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [*nodes, nvdp]}))
    return path


def preflight(rendered: str, snapshot: Path) -> tuple[int, list[dict[str, Any]]]:
    (argv,) = commands("4")
    assert argv[:4] == ["kubegpu", "doctor", "--cluster", "--preflight"], argv
    proc = subprocess.run(
        [sys.executable, "-m", "kubegpu", *argv[1:-1], "-", "--snapshot", str(snapshot), "--json"],
        input=rendered,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)["findings"]


def test_the_guides_render_resets_nvidias_tag_and_the_preflight_passes(tmp_path: Path) -> None:
    values = tmp_path / "nvdp-values.yaml"
    values.write_text(yaml.safe_dump(NVDP_VALUES))
    (argv,) = commands("3")
    rendered = render(argv, values)
    images = set(re.findall(r"image: (\S+)", rendered))
    assert images == {"registry.test/kubegpu:0.1.0"}
    code, findings = preflight(rendered, cluster(tmp_path))
    assert code == 0 and {f["status"] for f in findings} == {"ok"}, findings


def test_without_the_tag_the_preflight_stops_the_move(tmp_path: Path) -> None:
    """What the guide warns of: `--set image.repository` alone keeps NVIDIA's pinned tag."""
    values = tmp_path / "nvdp-values.yaml"
    values.write_text(yaml.safe_dump(NVDP_VALUES))
    (argv,) = commands("3")
    at = argv.index("image.tag=0.1.0")
    without_tag = argv[: at - 1] + argv[at + 1 :]  # the `--set image.tag=...` pair dropped
    rendered = render(without_tag, values)
    assert "registry.test/kubegpu:v0.17.1" in rendered
    code, findings = preflight(rendered, cluster(tmp_path))
    assert code == 1
    failed = [f for f in findings if f["status"] == "fail"]
    assert [f["check"] for f in failed] == ["preflight-image"] * len(failed) and failed
    assert "registry.test/kubegpu:v0.17.1: the tag NVIDIA's plugin runs now" in failed[0]["evidence"]


def test_the_guides_install_uses_the_flags_it_checked() -> None:
    (render_argv,) = commands("3")
    install = [c for c in commands("6") if c[:2] == ["helm", "upgrade"]]
    assert install, "step 6 installs with helm upgrade --install"
    flags = {a for a in render_argv if "=" in a and a.startswith("image.")}
    assert flags == {"image.repository=REGISTRY/kubegpu", "image.tag=0.1.0"}
    assert flags <= set(install[0])
    chart = (ROOT / "deployments/helm/kubegpu/Chart.yaml").read_text()
    assert 'appVersion: "0.1.0"' in chart  # the tag the guide sets is the chart's

"""The DRA examples (deployments/examples/dra/) are tests too: each is a valid Kubernetes 1.34 object set,
`kubegpu lint` finds nothing in it, and on every simulated node its header names the scheduler's structured
allocator gives what the header promises, through `kubegpu explain` on a snapshot of that node:

    #   node hgx-h100: allocated gpu-0   (an optional remark in parentheses)
    #   node t4-pcie: Pending: 0/1 nodes are available: 1 cannot allocate all claims.

The node's GPUs come from the real discovery code on the fake NVML profile of that name, as the devices
`kubegpu dra` publishes (kubegpu.dra.devices: NVIDIA's DRA driver's names and attributes); the
DeviceClasses are the ones the chart renders with dra.enabled.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubegpu.dra.devices import device_entries
from kubegpu.node.discovery import discover, nvml_session
from kubegpu.node.nvml.backend import load_nvml
from kubegpu.settings.dra_selection import parse_gpu_selection
from kubegpu.settings.env import NvmlSelection

from .conftest import EXAMPLES, kubegpu, load_docs, render
from .test_kubernetes_schemas import check

DRA_EXAMPLES = sorted((EXAMPLES / "dra").glob("*.yml"))
PROMISE = re.compile(
    r"^#\s+node (?P<profile>[\w-]+): (?:allocated (?P<device>\S+)(?:\s+\(.*\))?|Pending: (?P<words>.+))$"
)
CASES = [
    (path, m["profile"], m["device"], m["words"])
    for path in DRA_EXAMPLES
    for m in map(PROMISE.match, path.read_text().splitlines())
    if m
]


def node_snapshot(profile: str) -> list[dict[str, Any]]:
    backend = load_nvml(NvmlSelection.fake(profile))
    with nvml_session(backend):
        inventory = discover(backend)
    devices = device_entries(inventory, parse_gpu_selection("all"))  # what `kubegpu dra` publishes
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": profile, "labels": {"nvidia.com/gpu.present": "true"}},
        "status": {
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    resource_slice = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{profile}-gpu.nvidia.com-x1"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "pool": {"name": profile, "generation": 1, "resourceSliceCount": 1},
            "nodeName": profile,
            "devices": devices,
        },
    }
    classes = [o for o in render({"dra": {"enabled": True}}) if o["kind"] == "DeviceClass"]
    return [node, resource_slice, *classes]


def test_every_dra_example_says_where_it_is_checked() -> None:
    assert DRA_EXAMPLES, "deployments/examples/dra/ holds the DRA examples"
    assert {p for p, *_ in CASES} == set(DRA_EXAMPLES)


def test_the_dra_examples_are_valid_kubernetes_134_objects() -> None:
    objects = [(f"dra/{p.name}", d) for p in DRA_EXAMPLES for d in load_docs(p)]
    pods = [o for _, o in objects if o["kind"] == "Pod"]
    assert pods and all(p["spec"]["resourceClaims"] for p in pods)
    # Pods with resourceClaims: 1.34, where resource.k8s.io/v1 is served.
    import kubernetes_validate

    errors = check([(s, o) for s, o in objects if o["kind"] != "Pod"])
    for source, pod in [(s, o) for s, o in objects if o["kind"] == "Pod"]:
        try:
            kubernetes_validate.validate(pod, "1.34.0", strict=True)
        except kubernetes_validate.ValidationError as err:
            errors.append(f"{source}: {err.message}")
    assert errors == []


def test_lint_finds_nothing_in_the_dra_examples() -> None:
    code, report = kubegpu("lint", *DRA_EXAMPLES)
    assert (code, report["findings"]) == (0, []), report
    assert report["summary"]["objects"] == sum(1 for p in DRA_EXAMPLES for _ in load_docs(p))


@pytest.mark.parametrize(
    ("path", "profile", "device", "words"), CASES, ids=[f"{p.stem}@{n}" for p, n, *_ in CASES]
)
def test_each_dra_example_gets_what_its_header_promises(
    tmp_path: Path, path: Path, profile: str, device: str | None, words: str | None
) -> None:
    docs = list(load_docs(path))
    (pod,) = [d for d in docs if d["kind"] == "Pod"]
    namespace = pod["metadata"].get("namespace", "default")
    for d in docs:  # kubectl apply puts the namespaced objects into the pod's namespace
        d["metadata"].setdefault("namespace", namespace)
    pod["status"] = {"phase": "Pending"}
    snapshot = tmp_path / "snapshot.yaml"
    snapshot.write_text(yaml.safe_dump_all([*node_snapshot(profile), *docs]))
    code, report = kubegpu("explain", f"{namespace}/{pod['metadata']['name']}", "--snapshot", snapshot)
    if device is not None:
        assert code == 0 and report["feasible_nodes"] == [profile], report
        (node,) = report["dra"]["nodes"]
        assert [a.rsplit("/", 1)[1] for a in node["allocation"]] == [device]
    else:
        assert code == 1 and report["message"] == words, report

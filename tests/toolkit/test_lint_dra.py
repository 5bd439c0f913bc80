"""`kubegpu lint` on DRA objects (ResourceClaims, ResourceClaimTemplates, DeviceClasses) and the pods that
use them, through the click command, with and without a cluster snapshot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubegpu.toolkit.cli import lint
from kubegpu.toolkit.dra_facts import Reference, references
from tests import dra_objects as dra

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deployments/examples/dra/gpu-claim.yml"


def run(*args: str | Path) -> tuple[int, Any]:
    result = CliRunner().invoke(lint, [*map(str, args), "--json"])
    return result.exit_code, json.loads(result.output)


def write(tmp_path: Path, name: str, docs: list[dict[str, Any]]) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


def claim_v1(name: str, *requests: dict[str, Any], namespace: str = "ml") -> dict[str, Any]:
    return dra.claim(name, list(requests), namespace=namespace)


def node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"pool": "a100"}}}


def snapshot(tmp_path: Path, items: list[dict[str, Any]]) -> Path:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    return path


def cluster(tmp_path: Path, gpus_per_node: int = 2, classes: bool = True) -> Path:
    items = [node("gpu-1"), node("gpu-2")]
    items += [dra.resource_slice(n, [dra.gpu(m) for m in range(gpus_per_node)]) for n in ("gpu-1", "gpu-2")]
    if classes:
        items += [
            dra.device_class(
                "gpu.nvidia.com",
                "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
            )
        ]
    return snapshot(tmp_path, items)


def test_the_dra_example_is_clean() -> None:
    code, report = run(EXAMPLE)
    assert (code, report["findings"]) == (0, []), report
    assert report["summary"]["objects"] == 2


def test_index_and_minor_broken_cel_and_an_unknown_class(tmp_path: Path) -> None:
    bad = claim_v1(
        "pick-gpu",
        dra.request("gpu", selectors=['device.attributes["gpu.nvidia.com"].index == 0']),
        dra.request("big", device_class_name="gpus.nvidia.com", count=2),
        dra.request("mem", selectors=['device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")']),
    )
    klass = dra.device_class("by-minor", "'minor' in device.attributes['gpu.nvidia.com']")
    code, report = run(write(tmp_path, "claims.yaml", [bad, klass]))
    assert code == 1
    got = [
        (f["rule"], f["severity"], f["object"], f["path"], f["line"], f["message"])
        for f in report["findings"]
    ]
    assert got == [
        (
            "KG018",
            "error",
            "ResourceClaim/ml/pick-gpu",
            "spec.devices.requests[0].exactly.selectors[0].cel.expression",
            14,
            "request 'gpu' selector #0 reads attribute 'index' of gpu.nvidia.com, which the driver does not "
            "publish: NVIDIA's DRA driver stopped publishing `index` (it is not stable across reboots); "
            "every device fails the selector with a CEL error and the claim never allocates",
        ),
        (
            "KG019",
            "warning",
            "ResourceClaim/ml/pick-gpu",
            "spec.devices.requests[1].exactly.deviceClassName",
            17,
            "request 'big' names DeviceClass 'gpus.nvidia.com', which is not in these files or NVIDIA's "
            "classes (known: by-minor, gpu.nvidia.com, mig.nvidia.com); the scheduler cannot allocate the "
            "claim",
        ),
        (
            "KG017",
            "error",
            "ResourceClaim/ml/pick-gpu",
            "spec.devices.requests[2].exactly.selectors[0].cel.expression",
            24,
            "request 'mem' selector #0 does not compile, so the API server refuses the object: compilation "
            "failed: ERROR: <input>:1:67: Syntax error: unexpected end of input",
        ),
        (
            "KG018",
            "error",
            "DeviceClass/by-minor",
            "spec.selectors[0].cel.expression",
            33,
            "class selector #0 reads attribute 'minor' of gpu.nvidia.com, which the driver does not publish: "
            "NVIDIA's DRA driver stopped publishing `minor` (the minor number lives only in the device name, "
            "gpu-<minor>); every device fails the selector with a CEL error and the claim never allocates",
        ),
    ]
    fixes = {f["rule"]: f["fix"] for f in report["findings"]}
    assert fixes["KG018"] == (
        "select a GPU by `uuid`, `productName`, `resource.kubernetes.io/pciBusID` or its memory instead; to "
        "get a particular GPU, name its uuid"
    )


def test_typos_in_attribute_and_standard_names(tmp_path: Path) -> None:
    typo = claim_v1(
        "typo",
        dra.request(
            "gpu",
            selectors=[
                "device.attributes['gpu.nvidia.com'].productname == 'NVIDIA A100-SXM4-80GB'",
                "device.attributes['resource.kubernetes.io'].pcieRoot == 'pci0000:00' && "
                "device.attributes['resource.kubernetes.io'].numaNode == 0",
                "device.capacity['gpu.nvidia.com'].memorySlice3.compareTo(quantity('1')) == 0",
            ],
        ),
    )
    code, report = run(write(tmp_path, "typo.yaml", [typo]))
    assert code == 1
    assert [(f["rule"], f["path"].rsplit(".", 3)[-3]) for f in report["findings"]] == [
        ("KG018", "selectors[0]"),
        ("KG018", "selectors[1]"),
    ]
    assert "reads attribute 'productname' of gpu.nvidia.com" in report["findings"][0]["message"]
    assert "reads attribute 'numaNode' of resource.kubernetes.io" in report["findings"][1]["message"]


def test_v1beta1_claims_templates_and_first_available(tmp_path: Path) -> None:
    beta = {
        "apiVersion": "resource.k8s.io/v1beta1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "beta", "namespace": "ml"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "deviceClassName": "gpu.nvidia.com",
                            "selectors": [
                                {"cel": {"expression": "device.attributes['gpu.nvidia.com'].minor == 1"}}
                            ],
                        },
                        {
                            "name": "either",
                            "firstAvailable": [
                                {"name": "mig", "deviceClassName": "mig.nvidia.com"},
                                {"name": "full", "deviceClassName": "a100"},
                            ],
                        },
                    ]
                }
            }
        },
    }
    code, report = run(write(tmp_path, "beta.yaml", [beta]))
    assert code == 1
    assert [(f["rule"], f["path"]) for f in report["findings"]] == [
        ("KG018", "spec.spec.devices.requests[0].selectors[0].cel.expression"),
        ("KG019", "spec.spec.devices.requests[1].firstAvailable[1].deviceClassName"),
    ]
    assert report["findings"][1]["message"].startswith("request 'either/full' names DeviceClass 'a100'")


def test_with_a_snapshot_the_clusters_classes_and_attributes_decide(tmp_path: Path) -> None:
    snap = cluster(tmp_path)
    claims = [
        claim_v1("mig", dra.request("mig", device_class_name="mig.nvidia.com")),
        claim_v1(
            "ok", dra.request("gpu", selectors=["device.attributes['gpu.nvidia.com'].brand == 'Nvidia'"])
        ),
    ]
    code, report = run(write(tmp_path, "c.yaml", claims), "--snapshot", snap)
    assert code == 1
    (finding,) = report["findings"]
    assert (finding["rule"], finding["severity"], finding["message"]) == (
        "KG019",
        "error",
        "request 'mig' names DeviceClass 'mig.nvidia.com', which is not in the cluster (known: "
        "gpu.nvidia.com); the scheduler cannot allocate the claim",
    )


def test_an_attribute_the_clusters_slices_publish_is_accepted(tmp_path: Path) -> None:
    items = [node("gpu-1"), dra.resource_slice("gpu-1", [dra.gpu(0, nvlinkDomain=None)])]
    items[1]["spec"]["devices"][0].pop("nvlinkDomain")
    items[1]["spec"]["devices"][0]["attributes"]["nvlinkDomain"] = {"int": 3}
    claim = claim_v1(
        "nv", dra.request("gpu", selectors=["device.attributes['gpu.nvidia.com'].nvlinkDomain == 3"])
    )
    code, report = run(write(tmp_path, "nv.yaml", [claim]), "--snapshot", snapshot(tmp_path, items))
    assert (code, report["findings"]) == (0, []), report
    code, report = run(write(tmp_path, "nv.yaml", [claim]))  # without the snapshot: not NVIDIA's name
    assert code == 1 and [f["rule"] for f in report["findings"]] == ["KG018"]


def test_more_devices_than_any_node_has(tmp_path: Path) -> None:
    snap = cluster(tmp_path, gpus_per_node=2)
    claims = [
        claim_v1("four", dra.request("gpu", count=4)),
        claim_v1("two", dra.request("gpu", count=2)),
        claim_v1(
            "h100",
            dra.request(
                "gpu", selectors=["device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100'"]
            ),
        ),
        claim_v1("all", dra.request("gpu", mode="All")),
    ]
    code, report = run(write(tmp_path, "counts.yaml", claims), "--snapshot", snap)
    assert code == 1
    got = [(f["rule"], f["object"], f["path"], f["message"]) for f in report["findings"]]
    assert got == [
        (
            "KG020",
            "ResourceClaim/ml/four",
            "spec.devices.requests[0].exactly.count",
            "request 'gpu' wants 4 device(s) of class 'gpu.nvidia.com'; the most any of the 2 node(s) has is "
            "2 (gpu-1)",
        ),
        (
            "KG020",
            "ResourceClaim/ml/h100",
            "spec.devices.requests[0].exactly.count",
            "request 'gpu' wants 1 device(s) of class 'gpu.nvidia.com' that pass its selectors; the most any "
            "of the 2 node(s) has is 0",
        ),
    ]
    assert report["findings"][0]["fix"] == (
        "ask for at most that many per claim (several pods, or a node with more GPUs), or loosen the "
        "selectors"
    )


def test_pods_that_name_missing_claims_templates_and_requests(tmp_path: Path) -> None:
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu", "namespace": "ml"},
        "spec": {"spec": {"devices": {"requests": [dra.request("gpu")]}}},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {
            "resourceClaims": [
                {"name": "gpu", "resourceClaimTemplateName": "one-gpu"},
                {"name": "extra", "resourceClaimTemplateName": "two-gpus"},
            ],
            "containers": [
                {
                    "name": "main",
                    "image": "cuda",
                    "resources": {"claims": [{"name": "gpu", "request": "gpus"}, {"name": "gpus"}]},
                }
            ],
        },
    }
    code, report = run(write(tmp_path, "pod.yaml", [template, pod]))
    assert code == 1
    got = [(f["rule"], f["severity"], f["container"], f["path"], f["message"]) for f in report["findings"]]
    assert got == [
        (
            "KG021",
            "warning",
            None,
            "spec.resourceClaims[1].resourceClaimTemplateName",
            "pod claim 'extra' names ResourceClaimTemplate 'two-gpus', which is not in these files; the pod "
            "stays Pending until it exists",
        ),
        (
            "KG021",
            "error",
            "main",
            "spec.containers[0].resources.claims[0].request",
            "container asks for request 'gpus' of claim 'gpu', which has only gpu; the container gets no "
            "device",
        ),
        (
            "KG021",
            "error",
            "main",
            "spec.containers[0].resources.claims[1].name",
            "container claim 'gpus' is not one of the pod's spec.resourceClaims (gpu, extra); the API server "
            "refuses the pod",
        ),
    ]


def test_a_pods_missing_template_is_an_error_when_the_snapshot_lists_templates(tmp_path: Path) -> None:
    items = [node("gpu-1"), {"apiVersion": "v1", "kind": "ResourceClaimTemplateList", "items": []}]
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump_all(items))
    pod = yaml.safe_load_all(EXAMPLE.read_text())
    (workload,) = [d for d in pod if d["kind"] == "Pod"]
    code, report = run(write(tmp_path, "pod.yaml", [workload]), "--snapshot", path)
    assert code == 1
    (finding,) = report["findings"]
    assert (finding["rule"], finding["severity"]) == ("KG021", "error")
    assert finding["message"] == (
        "pod claim 'gpu' names ResourceClaimTemplate 'gpu-40gi', which is not in the cluster; the pod stays "
        "Pending until it exists"
    )


NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True)
DOMAINS = st.sampled_from(["gpu.nvidia.com", "resource.kubernetes.io", "dra.example.com"])


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])  # a shared CI machine stalls
@given(
    what=st.sampled_from(["attributes", "capacity"]),
    domain=DOMAINS,
    name=NAMES,
    quote=st.sampled_from(["'", '"']),
    form=st.sampled_from(["dot", "index", "in"]),
)
def test_every_way_of_naming_an_attribute_is_found(
    what: str, domain: str, name: str, quote: str, form: str
) -> None:
    q = quote
    if form == "dot":
        text = f"device.{what}[{q}{domain}{q}].{name} == 1"
    elif form == "index":
        text = f"device.{what}[ {q}{domain}{q} ][{q}{name}{q}] == 1"
    else:
        text = f"{q}{name}{q} in device.{what}[{q}{domain}{q}]"
    assert references(f"true && {text} || false") == [Reference(what, domain, name)]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.sampled_from(["gpu.nvidia.com"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["devices", "requests", "exactly", "selectors", "cel", "expression", "name",
                         "deviceClassName", "count", "firstAvailable", "spec", "allocationMode"]),
        inner,
        max_size=4,
    ),
    max_leaves=12,
)  # fmt: skip


@settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)  # each example compiles CEL and composes YAML: ~0.3 s
@given(kind=st.sampled_from(["ResourceClaim", "ResourceClaimTemplate", "DeviceClass"]), spec=JSON)
def test_lint_reads_any_shape_of_dra_object_without_crashing(kind: str, spec: Any) -> None:
    """Whatever a hand-written object holds where a claim's fields go, lint answers with findings (or none),
    never a traceback; the API server's own validation is what refuses the shape."""
    from kubegpu.toolkit.lint.run import lint as run_lint
    from kubegpu.toolkit.manifests import parse_text

    doc = {"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": {"name": "x", "namespace": "ml"}}
    doc["spec"] = spec
    findings = run_lint(parse_text(json.dumps(doc), "x.json"))
    assert all(f.rule in ("KG017", "KG018", "KG019") for f in findings)


def test_the_dra_rules_find_nothing_without_dra_objects_or_claims_so_lint_skips_them(tmp_path: Path) -> None:
    """lint leaves the DRA rules (and CEL, 0.4 s to import) out for files without DRA objects or pods that
    name claims: here every rule of check_dra runs on such a file, with a cluster snapshot holding slices
    and classes, and finds nothing; and a lint of such a file does not import CEL."""
    import subprocess
    import sys

    from kubegpu.toolkit.cluster_facts import ClusterFacts
    from kubegpu.toolkit.lint.dra import check_dra
    from kubegpu.toolkit.manifests import parse_text
    from kubegpu.toolkit.snapshot import load_snapshot
    from tests.toolkit.lint_corpus import corpus_yaml

    text = corpus_yaml(400).replace("resourceClaims", "notClaims").replace("resource.k8s.io/", "example.com/")
    manifests = parse_text(text, "pods.yaml")
    assert manifests.workloads and not manifests.dra
    assert not any(w.spec.resource_claims for w in manifests.workloads)
    facts = ClusterFacts.of(load_snapshot(cluster(tmp_path)))
    for options in (None, facts):
        findings: list[Any] = []
        check_dra(manifests, options, findings)
        assert findings == []
    (tmp_path / "pods.yaml").write_text(text)
    probe = (
        "import sys; from kubegpu.toolkit.cli import lint; from click.testing import CliRunner; "
        f"CliRunner().invoke(lint, [{str(tmp_path / 'pods.yaml')!r}]); "
        "print('kubegpu.resourceapi.cel' in sys.modules, 'kubernetes' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]

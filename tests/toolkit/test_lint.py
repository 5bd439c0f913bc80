"""`kubegpu lint` on real manifest files, through the click command as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from click.testing import CliRunner

from kubegpu.toolkit.cli import lint
from kubegpu.toolkit.cluster_facts import ClusterFacts
from kubegpu.toolkit.lint.run import LintOptions
from kubegpu.toolkit.lint.run import lint as run_lint
from kubegpu.toolkit.manifests import parse_text
from kubegpu.toolkit.snapshot import load_snapshot

from .paths import CLUSTER, MANIFESTS


def run(*args: str, stdin: str | None = None) -> tuple[int, Any]:
    result = CliRunner().invoke(lint, [*args, "--json"], input=stdin)
    return result.exit_code, json.loads(result.output)


def rules_by_object(findings: list[dict[str, Any]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for f in findings:
        out.setdefault(f["object"], []).append(f["rule"])
    return out


def test_the_classic_mistakes_are_errors_with_lines() -> None:
    code, data = run(str(MANIFESTS / "bad-workloads.yaml"))
    assert code == 1
    found = {(f["object"], f["rule"], f["line"], f["container"]) for f in data["findings"]}
    assert found == {
        ("Pod/ml/requests-only", "KG001", 13, "cuda"),
        ("Deployment/ml/mismatch", "KG002", 33, "trainer"),
        ("Job/ml/half-gpu", "KG003", 51, "notebook"),
        ("CronJob/ml/nightly-eval", "KG007", 70, "warmup"),
    }
    assert data["summary"]["errors"] == 3 and data["summary"]["warnings"] == 1
    mismatch = next(f for f in data["findings"] if f["rule"] == "KG002")
    assert "requests 1 but limits 2" in mismatch["message"]
    assert mismatch["path"] == "spec.template.spec.containers[0].resources.requests.nvidia.com/gpu"


def test_good_workloads_pass_and_other_kinds_are_counted() -> None:
    code, data = run(str(MANIFESTS / "good-workloads.yaml"))
    assert code == 0
    assert data["findings"] == []
    assert data["summary"]["objects"] == 2
    assert data["summary"]["skipped_kinds"] == {"Service": 1}


def test_json_list_sharing_mig_env_and_typos() -> None:
    code, data = run(str(MANIFESTS / "sharing-and-mig.json"))
    assert code == 1  # the bad cpu quantity and the unknown resource are errors
    by_object = rules_by_object(data["findings"])
    assert by_object == {
        "Pod/ml/two-replicas": ["KG005"],
        "Pod/ml/two-mig-types": ["KG007", "KG008", "KG006", "KG004"],
        "Pod/ml/typo": ["KG009"],
    }
    shared = by_object and next(f for f in data["findings"] if f["rule"] == "KG005")
    assert shared["severity"] == "warning"  # time-slicing without failRequestsGreaterThanOne still runs


def test_shared_above_one_is_an_error_when_the_plugin_rejects_it(tmp_path: Any) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "version: v1\nsharing:\n  timeSlicing:\n    failRequestsGreaterThanOne: true\n"
        "    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
    )
    _, data = run(str(MANIFESTS / "sharing-and-mig.json"), "--plugin-config", str(config))
    shared = next(f for f in data["findings"] if f["rule"] == "KG005")
    assert shared["severity"] == "error"
    assert "maximum request size for shared resources is 1; found 2" in shared["message"]


def test_mps_nodes_reject_more_than_one_replica_by_default() -> None:
    # The fixture cluster, with the A100 pool labelled as MPS-shared by GFD.
    cluster = load_snapshot(CLUSTER)
    for node in cluster.nodes:
        if node.metadata.name.startswith("a100-") and node.metadata.labels is not None:
            node.metadata.labels["nvidia.com/gpu.sharing-strategy"] = "mps"
    text = (
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: c\n"
        "    resources: {limits: {nvidia.com/gpu: 2}}\n"
    )
    findings = run_lint(parse_text(text, "p.yaml"), LintOptions(cluster=ClusterFacts.of(cluster)))
    kg005 = [f for f in findings if f.rule == "KG005"]
    assert kg005 and kg005[0].severity == "error"
    assert "failRequestsGreaterThanOne" in kg005[0].message


def test_broken_documents_are_reported_not_crashed_on() -> None:
    code, data = run(str(MANIFESTS / "broken.yaml"))
    assert code == 1
    first, second = data["findings"]
    assert first["rule"] == second["rule"] == "KG000"
    assert first["object"] == "Pod/selector-bool"
    assert "Expected `str`, got `bool`" in first["message"] and first["line"] == 6
    assert second["line"] == 15 and "invalid YAML" in second["message"]


def test_snapshot_checks_against_the_real_cluster() -> None:
    code, data = run(str(MANIFESTS / "snapshot-sensitive.yaml"), "--snapshot", str(CLUSTER))
    assert code == 1
    assert rules_by_object(data["findings"]) == {
        "Pod/ml/no-toleration": ["KG010"],
        "Pod/ml/no-runtime-class": ["KG011"],
        "Pod/ml/too-big": ["KG012"],
        "Pod/ml/wrong-mig": ["KG009"],
        "Pod/ml/t4-selector-typo": ["KG013"],
    }
    toleration = next(f for f in data["findings"] if f["rule"] == "KG010")
    assert "{key: nvidia.com/gpu, operator: Equal, value: present, effect: NoSchedule}" in toleration["fix"]


def test_without_snapshot_those_files_are_clean() -> None:
    code, data = run(str(MANIFESTS / "snapshot-sensitive.yaml"))
    assert code == 0 and data["findings"] == []


def test_stdin_and_human_output() -> None:
    text = (MANIFESTS / "bad-workloads.yaml").read_text()
    result = CliRunner().invoke(lint, ["-"], input=text)
    assert result.exit_code == 1
    assert "<stdin>:13" in result.output and "KG001" in result.output
    assert "4 object(s) checked: 3 error(s), 1 warning(s)." in result.output


def test_bad_usage_exits_2() -> None:
    result = CliRunner().invoke(lint, ["/nonexistent/file.yaml"])
    assert result.exit_code == 2 and "cannot read /nonexistent/file.yaml" in result.output
    result = CliRunner().invoke(lint, [str(MANIFESTS / "good-workloads.yaml"), "--snapshot", "/nope.json"])
    assert result.exit_code == 2 and "kubectl get nodes,pods" in result.output


@pytest.mark.parametrize(
    "name",
    [
        "Example.com/gpu",
        "example..com/gpu",
        "-example.com/gpu",
        "x" * 250 + "/gpu",
        "example.com/gpu\\n",
    ],
)
def test_names_the_api_server_refuses_are_not_extended_resources(name: str) -> None:
    # The API server's rule, not a looser copy: each of these is rejected at admission.
    text = (
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: c\n"
        f'    resources: {{limits: {{"{name}": 1}}}}\n'
    )
    findings = run_lint(parse_text(text, "p.yaml"), LintOptions())
    assert [(f.rule, f.severity) for f in findings] == [("KG009", "error")]
    assert "is not a valid extended resource name" in findings[0].message


REFUSED_CONFIGS = [
    (
        '    - name: nvidia.com/gpu\n      replicas: "two"\n',
        # NVIDIA's text: encoding/json's error, with the context of the field holding the sharing block.
        "sharing.timeSlicing.resources.0.replicas: json: cannot unmarshal string into Go struct field "
        'Sharing.sharing.timeSlicing of type int (got "two")',
    ),
    (
        "    - name: nvidia.com/gpu\n",
        'sharing.timeSlicing.resources.0: no replicas specified (got {"name": "nvidia.com/gpu"})',
    ),
    (
        "    - name: nvidia.com/gpu\n      replicas: 1\n",
        'sharing.timeSlicing.resources.0: number of replicas must be >= 2 (got {"name": "nvidia.com/gpu", '
        '"replicas": 1})',
    ),
]


@pytest.mark.parametrize(("resources", "problem"), REFUSED_CONFIGS)
def test_plugin_config_the_plugin_refuses_is_refused_with_its_text(
    tmp_path: Any, resources: str, problem: str
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nsharing:\n  timeSlicing:\n    resources:\n" + resources)
    result = CliRunner().invoke(
        lint, [str(MANIFESTS / "good-workloads.yaml"), "--plugin-config", str(config)]
    )
    assert result.exit_code == 2
    assert result.output == f"error: invalid config file {config}: {problem}\n"
    # The plugin, started with the same file, stops with the same text.
    plugin = subprocess.run(
        [sys.executable, "-m", "kubegpu", "plugin", "--config-file", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert plugin.returncode == 1
    assert plugin.stderr.rstrip("\n").endswith(f"ERROR kubegpu: invalid config file {config}: {problem}")


@pytest.mark.parametrize(
    ("sharing", "fails_above_one"),
    [
        # MPS rejects requests above 1 unless told otherwise (NVIDIA v0.20); time-slicing accepts them.
        ("  mps:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n", True),
        ("  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n", False),
        (
            "  mps:\n    failRequestsGreaterThanOne: false\n"
            "    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n",
            False,
        ),
        # Both blocks: the plugin shares with MPS.
        (
            "  timeSlicing:\n    failRequestsGreaterThanOne: false\n"
            "    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n"
            "  mps:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n",
            True,
        ),
    ],
)
def test_plugin_config_defaults_are_the_plugins(tmp_path: Any, sharing: str, fails_above_one: bool) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nsharing:\n" + sharing)
    _, data = run(str(MANIFESTS / "sharing-and-mig.json"), "--plugin-config", str(config))
    shared = next(f for f in data["findings"] if f["rule"] == "KG005")
    assert shared["severity"] == ("error" if fails_above_one else "warning")


def test_plugin_config_without_sharing_leaves_the_finding_a_warning(tmp_path: Any) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags:\n  migStrategy: single\n")
    _, data = run(str(MANIFESTS / "sharing-and-mig.json"), "--plugin-config", str(config))
    shared = next(f for f in data["findings"] if f["rule"] == "KG005")
    assert shared["severity"] == "warning"


def test_a_resource_a_device_class_bridges_is_not_reported_missing() -> None:
    """With a DeviceClass whose extendedResourceName is nvidia.com/gpu (KEP-5004), a DRA-only cluster serves
    a `nvidia.com/gpu: 1` pod through a claim the scheduler makes: no KG009."""
    text = (
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: c\n"
        "    resources: {limits: {nvidia.com/gpu: 1}}\n"
    )
    gpu_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpu.nvidia.com"},
        "spec": {"extendedResourceName": "nvidia.com/gpu"},
    }
    bridged = ClusterFacts(dra={"DeviceClass": [gpu_class]})
    assert [f.rule for f in run_lint(parse_text(text, "p.yaml"), LintOptions(cluster=bridged))] == []
    unbridged = ClusterFacts(dra={"DeviceClass": [{**gpu_class, "spec": {}}]})
    found = run_lint(parse_text(text, "p.yaml"), LintOptions(cluster=unbridged))
    assert [f.rule for f in found] == ["KG009"]

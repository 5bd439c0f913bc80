"""`kubectl gpu`: the installed `kubectl-gpu` script, found and run by the real kubectl (the one the venv step
extracts next to helm), against API servers on 127.0.0.1 chosen by kubeconfig, context and namespace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kubegpu.toolkit.kubectl_plugin import kubectl_gpu

from .listing_api import ListingApiServer, kubeconfig
from .paths import CLUSTER, MANIFESTS

BIN = Path(sys.executable).parent
KUBECTL = BIN / "kubectl"
PLUGIN = BIN / "kubectl-gpu"


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ListingApiServer]]:
    for path, what in (
        (KUBECTL, "make .venv/bin/kubegpu (kubectl comes with helm)"),
        (PLUGIN, "pip install -e ."),
    ):
        if not path.exists():
            pytest.fail(f"{path} is missing: {what}", pytrace=False)
    empty = tmp_path_factory.mktemp("prod") / "cluster.json"
    empty.write_text(
        json.dumps(
            {"apiVersion": "v1", "kind": "List", "items": [{"kind": "Node", "metadata": {"name": "p1"}}]}
        )
    )
    running = {"lab": ListingApiServer(CLUSTER, "lab-token"), "prod": ListingApiServer(empty, "prod-token")}
    for server in running.values():
        server.start()
    yield running
    for server in running.values():
        server.stop()


@pytest.fixture(scope="module")
def config(servers: dict[str, ListingApiServer], tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("kube") / "config"
    return kubeconfig(path, {"lab": (servers["lab"], "ml"), "prod": (servers["prod"], None)}, current="lab")


def kubectl(
    *args: str | Path, config: Path | None = None, home: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBECTL_PLUGINS_PATH")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["HOME"] = str(home or Path("/nonexistent"))
    if config is not None:
        env["KUBECONFIG"] = str(config)
    return subprocess.run(
        [str(KUBECTL), *map(str, args)], env=env, capture_output=True, text=True, timeout=120
    )


def as_json(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.stdout.startswith("{"), proc.stderr
    return json.loads(proc.stdout)


def test_kubectl_finds_the_plugin_and_its_help_names_it_as_typed() -> None:
    listed = kubectl("plugin", "list")
    assert str(PLUGIN) in listed.stdout, listed.stdout + listed.stderr
    help_ = kubectl("gpu", "--help")
    assert help_.returncode == 0
    assert help_.stdout.startswith("Usage: kubectl gpu [OPTIONS] COMMAND [ARGS]...")
    for command in ("explain", "doctor", "lint"):
        assert f"  {command} " in help_.stdout
    assert kubectl("gpu", "explain", "--help").stdout.startswith("Usage: kubectl gpu explain [OPTIONS] POD")
    assert kubectl("gpu", "--version").stdout.strip() == "kubectl-gpu, version 0.1.0"


def test_explain_reads_the_current_context_and_its_namespace(
    config: Path, servers: dict[str, ListingApiServer]
) -> None:
    before = len(servers["prod"].requests)
    live = kubectl("gpu", "explain", "train-llm-8gpu", "--json", config=config)
    assert live.returncode == 1, live.stderr
    from_file = subprocess.run(
        [
            sys.executable,
            "-m",
            "kubegpu",
            "explain",
            "ml/train-llm-8gpu",
            "--snapshot",
            str(CLUSTER),
            "--json",
        ],
        capture_output=True,
        text=True,
    )
    assert as_json(live) == json.loads(from_file.stdout)
    assert as_json(live)["status"] == "pending-unschedulable"
    assert len(servers["prod"].requests) == before  # the current context is lab
    paths = {p for p, _ in servers["lab"].requests}
    assert {"/api/v1/nodes", "/api/v1/pods", "/apis/apps/v1/daemonsets"} <= paths


@pytest.mark.parametrize(
    "args",
    [
        ["explain", "-n", "research", "h100-finetune"],
        ["explain", "h100-finetune", "--namespace", "research"],
        ["-n", "research", "explain", "pod/h100-finetune"],
        ["-n", "ml", "explain", "-n", "research", "pods/h100-finetune"],
        ["explain", "research/h100-finetune"],
    ],
)
def test_explain_takes_the_namespace_as_kubectl_does(config: Path, args: list[str]) -> None:
    # In this process (kubectl itself is run above): the forms of POD and -n, before or after `explain`.
    result = CliRunner().invoke(kubectl_gpu, ["--kubeconfig", str(config), *args, "--json"])
    assert result.exit_code == 1, result.output
    assert json.loads(result.output)["pod"] == "research/h100-finetune"


def test_a_namespace_given_twice_must_agree(config: Path) -> None:
    result = CliRunner().invoke(
        kubectl_gpu, ["--kubeconfig", str(config), "explain", "-n", "ml", "research/h100-finetune"]
    )
    assert result.exit_code == 2
    assert "research/h100-finetune names namespace 'research' but -n says 'ml'" in result.output


def test_context_and_kubeconfig_flags_choose_the_cluster(
    config: Path, servers: dict[str, ListingApiServer], tmp_path: Path
) -> None:
    before = len(servers["prod"].requests)
    # No KUBECONFIG: the flag names the file; --context names the other cluster, where the pod is not.
    proc = kubectl("gpu", "explain", "ml/train-llm-8gpu", "--kubeconfig", config, "--context", "prod")
    assert proc.returncode == 2
    assert "pod ml/train-llm-8gpu is not in live cluster" in proc.stderr
    assert len(servers["prod"].requests) > before
    unknown = kubectl("gpu", "--context", "staging", "doctor", config=config)
    assert unknown.returncode == 2
    assert "context 'staging' is not in the kubeconfig (contexts: lab, prod)" in unknown.stderr


def test_doctor_is_the_cluster_doctor(config: Path) -> None:
    proc = kubectl("gpu", "doctor", "--json", config=config)
    assert proc.returncode == 1
    problems = {(f["check"], f["object"]) for f in as_json(proc)["findings"] if f["status"] == "fail"}
    assert ("plugin-daemonset-selector", "daemonset/kube-system/nvidia-device-plugin-daemonset") in problems
    assert ("gpu-capacity", "node/t4-4") in problems


def test_lint_checks_against_the_live_cluster_unless_local(config: Path) -> None:
    manifest = MANIFESTS / "snapshot-sensitive.yaml"
    live = kubectl("gpu", "lint", manifest, "--json", config=config)
    assert live.returncode == 1
    rules = sorted((f["object"], f["rule"]) for f in as_json(live)["findings"])
    assert rules == [
        ("Pod/ml/no-runtime-class", "KG011"),
        ("Pod/ml/no-toleration", "KG010"),
        ("Pod/ml/t4-selector-typo", "KG013"),
        ("Pod/ml/too-big", "KG012"),
        ("Pod/ml/wrong-mig", "KG009"),
    ]
    local = kubectl("gpu", "lint", "--local", manifest, "--json", config=config)
    assert local.returncode == 0 and as_json(local)["findings"] == []


def test_lint_names_objects_in_the_namespace_given(tmp_path: Path) -> None:
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: c\n    image: x\n"
        "    resources: {requests: {nvidia.com/gpu: 1}}\n"
    )
    result = CliRunner().invoke(kubectl_gpu, ["lint", "--local", "-n", "team-a", str(manifest), "--json"])
    assert [f["object"] for f in json.loads(result.output)["findings"]] == ["Pod/team-a/p"]


def test_an_unreachable_cluster_is_a_usage_error_naming_the_way_out(tmp_path: Path) -> None:
    server = ListingApiServer(CLUSTER, "t")
    server.start()
    dead = kubeconfig(tmp_path / "config", {"gone": (server, None)}, current="gone")
    server.stop()
    proc = kubectl("gpu", "doctor", config=dead)
    assert proc.returncode == 2
    assert "cannot reach the API server" in proc.stderr and "--snapshot FILE" in proc.stderr


def test_kubegpu_commands_take_the_same_kubeconfig_flags(
    config: Path, servers: dict[str, ListingApiServer]
) -> None:
    from kubegpu.toolkit.cli import doctor, explain

    before = len(servers["prod"].requests)
    result = CliRunner().invoke(
        explain, ["ml/train-llm-8gpu", "--kubeconfig", str(config), "--context", "prod"]
    )
    assert result.exit_code == 2 and "is not in live cluster" in result.output
    assert len(servers["prod"].requests) > before
    result = CliRunner().invoke(doctor, ["--context", "prod"])
    assert (
        result.exit_code == 2
        and "--kubeconfig and --context choose a cluster; add --cluster" in result.output
    )

"""`kubegpu explain` on the fixture cluster: the scheduler's summary line, per-node reasons, fixes."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

from kubegpu.toolkit.cli import explain
from kubegpu.toolkit.explain.run import explain as run_explain
from kubegpu.toolkit.model import Event, Pod, condition
from kubegpu.toolkit.snapshot import Snapshot, load_snapshot

from .paths import CLUSTER

PENDING = ["ml/train-llm-8gpu", "ml/infer-mig-3g", "research/h100-finetune", "ml/notebook-t4"]


def run(pod: str, *extra: str) -> tuple[int, Any]:
    result = CliRunner().invoke(explain, [pod, "--snapshot", str(CLUSTER), "--json", *extra])
    return result.exit_code, json.loads(result.output)


@pytest.mark.parametrize("pod_ref", PENDING)
def test_summary_matches_what_the_scheduler_recorded(cluster: Snapshot, pod_ref: str) -> None:
    namespace, name = pod_ref.split("/")
    pod = cluster.find_pod(namespace, name)
    assert pod is not None
    recorded = condition(pod, "PodScheduled")
    assert recorded is not None and recorded.message
    code, data = run(pod_ref)
    assert code == 1
    assert data["message"] == recorded.message
    assert data["status"] == "pending-unschedulable"


def test_eight_gpu_job_fixes_name_nodes_unhealthy_gpus_and_fragmentation() -> None:
    _, data = run("ml/train-llm-8gpu")
    fixes = {f["kind"]: f for f in data["fixes"]}
    assert set(fixes) == {"free-gpus", "unhealthy-gpus", "fragmentation"}
    free = fixes["free-gpus"]["nodes"]
    # Only nodes with 8 allocatable GPUs can ever take it; the one with the most free comes first.
    assert [(r["node"], r["gpus_to_free"]) for r in free] == [("a100-2", 5), ("a100-1", 6), ("a100-4", 7)]
    assert free[0]["holders"] == ["ml/embed-1x-pqrst", "ml/llama-sft-4x-klmno"]
    assert fixes["unhealthy-gpus"]["nodes"] == [
        {
            "node": "a100-3",
            "resource": "nvidia.com/gpu",
            "unhealthy": 2,
            "free_now": 2,
            "free_if_healthy": 4,
            "would_fit": False,
        }
    ]
    assert (
        "14 nvidia.com/gpu are free across the 8 node(s) that offer it" in fixes["fragmentation"]["summary"]
    )
    rows = {r["size"]: r for r in data["fragmentation"]["nvidia.com/gpu"]}
    # Free on schedulable nodes: a100 2+3+2+1, h100-2 4, t4-2 1, a100-mig-2 5 (t4-3 is cordoned).
    assert {s: (r["free"], r["fits"], r["stranded"], r["percent"]) for s, r in rows.items()} == {
        1: (18, 18, 0, 0.0),
        2: (18, 7, 4, 22.2),
        4: (18, 2, 10, 55.6),
        8: (18, 0, 18, 100.0),
    }


def test_per_node_reasons() -> None:
    _, data = run("ml/train-llm-8gpu")
    nodes = {n["node"]: n for n in data["nodes"]}
    assert nodes["cpu-1"]["reasons"] == [
        "Insufficient cpu",
        "Insufficient memory",
        "Insufficient nvidia.com/gpu",
    ]
    assert nodes["h100-2"]["plugin"] == "TaintToleration"
    assert nodes["t4-3"]["reasons"] == ["node(s) were unschedulable"]
    assert nodes["a100-3"]["gpus"]["nvidia.com/gpu"] == {
        "capacity": 8,
        "allocatable": 6,
        "requested": 4,
        "free": 2,
    }


def test_missing_toleration_and_selector_fixes() -> None:
    _, data = run("research/h100-finetune")
    toleration = next(f for f in data["fixes"] if f["kind"] == "toleration")
    assert toleration["nodes"] == [{"node": "h100-2"}]  # h100-1 is full
    assert 'value: "research", effect: NoSchedule' in toleration["summary"]
    _, data = run("ml/notebook-t4")
    kinds = [f["kind"] for f in data["fixes"]]
    assert kinds[0] == "toleration" and "nvidia.com/gpu=present:NoSchedule" in data["fixes"][0]["summary"]


def test_mig_request_and_uncordon() -> None:
    _, data = run("ml/infer-mig-3g")
    assert data["gpu_resources"] == ["nvidia.com/mig-3g.20gb"]
    assert data["fragmentation"]["nvidia.com/mig-3g.20gb"][0]["free"] == 1
    assert "uncordon" not in [f["kind"] for f in data["fixes"]]  # t4-3 has no MIG either


def test_a_pod_that_fits_exits_zero_and_lists_nodes() -> None:
    code, data = run("ml/small-1gpu")
    assert code == 0 and data["message"] is None and data["status"] == "would-fit"
    assert data["feasible_nodes"] == ["a100-1", "a100-2", "a100-3", "a100-4", "t4-2", "a100-mig-2"]


def test_bound_and_rejected_pods_are_explained_not_filtered_blindly() -> None:
    code, data = run("ml/llama-sft-4x-klmno")
    assert code == 0 and data["status"] == "bound"
    code, data = run("ml/llama-sft-4x-old12")
    assert code == 0 and data["status"] == "admission-rejected"
    assert "re-registered" in data["notes"][0]


def test_human_output_and_input_errors() -> None:
    result = CliRunner().invoke(explain, ["ml/train-llm-8gpu", "--snapshot", str(CLUSTER)])
    assert result.exit_code == 1
    assert "0/15 nodes are available: 1 node(s) were unschedulable" in result.output.replace("\n", "")
    assert "Cluster-wide fragmentation of nvidia.com/gpu" in result.output
    result = CliRunner().invoke(explain, ["ml/nope", "--snapshot", str(CLUSTER)])
    assert result.exit_code == 2 and "pod ml/nope is not in" in result.output
    assert "Pending pods in ml: infer-mig-3g, notebook-t4, small-1gpu, train-llm-8gpu" in result.output
    result = CliRunner().invoke(explain, ["ml/train-llm-8gp", "--snapshot", str(CLUSTER)])
    assert "did you mean train-llm-8gpu?" in result.output
    result = CliRunner().invoke(explain, ["no-namespace", "--snapshot", str(CLUSTER)])
    assert result.exit_code == 2 and "NAMESPACE/NAME" in result.output


def _pod(spec: dict[str, Any], name: str = "x") -> Pod:
    return msgspec.convert(
        {"metadata": {"name": name, "namespace": "t"}, "spec": spec, "status": {"phase": "Pending"}}, Pod
    )


def test_daemonset_pod_pinned_by_match_fields(cluster: Snapshot) -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["h100-1"]}]}
                ]
            }
        }
    }
    pod = _pod(
        {
            "affinity": affinity,
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        }
    )
    result = run_explain(cluster, pod)
    assert result.message == (
        "0/15 nodes are available: 1 node(s) had untolerated taint {dedicated: research}, "
        "14 node(s) didn't satisfy plugin(s) [NodeAffinity]."
    )


def test_conflicting_name_terms_fail_in_prefilter(cluster: Snapshot) -> None:
    term = {
        "matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["a"]},
            {"key": "metadata.name", "operator": "In", "values": ["b"]},
        ]
    }
    affinity = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
    }
    result = run_explain(cluster, _pod({"affinity": affinity, "containers": [{"name": "c"}]}))
    assert result.message == "0/15 nodes are available: pod affinity terms conflict."


def test_no_nodes(cluster: Snapshot) -> None:
    empty = Snapshot(pods=[_pod({"containers": [{"name": "c"}]})])
    assert run_explain(empty, empty.pods[0]).message == "no nodes available to schedule pods"


def test_recorded_message_falls_back_to_failed_scheduling_events() -> None:
    snap = load_snapshot(CLUSTER, keep=[("ml", "small-1gpu")])
    pod = snap.find_pod("ml", "small-1gpu")
    assert isinstance(pod, Pod)
    snap.events.append(
        msgspec.convert(
            {
                "involvedObject": {"kind": "Pod", "name": "small-1gpu", "namespace": "ml"},
                "reason": "FailedScheduling",
                "type": "Warning",
                "message": "0/15 nodes are available: 15 Insufficient nvidia.com/gpu.",
            },
            Event,
        )
    )
    result = run_explain(snap, pod)
    assert result.recorded_message == "0/15 nodes are available: 15 Insufficient nvidia.com/gpu."
    assert result.status == "would-fit"  # the cluster has changed since: GPUs were freed

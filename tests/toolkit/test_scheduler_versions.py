"""kube-scheduler 1.29 to 1.36 as it words FailedScheduling: the filter summary, then the post-filter part
(preemption's verdict, and since 1.34 the DynamicResources plugin's), read by `explain` and `doctor`."""

from __future__ import annotations

import pytest

from kubegpu.toolkit.doctor.cluster import doctor_cluster
from kubegpu.toolkit.explain.run import explain
from kubegpu.toolkit.model import Pod, condition
from kubegpu.toolkit.render import print_explanation
from kubegpu.toolkit.scheduling import filter_summary
from kubegpu.toolkit.snapshot import Snapshot, load_snapshot

from .paths import CLUSTER

# What the fixture cluster's train-llm-8gpu gets from the filters (FitError's first sentence).
SUMMARY = (
    "0/15 nodes are available: 1 node(s) were unschedulable, 12 Insufficient nvidia.com/gpu, 2 node(s) had "
    "untolerated taint {dedicated: research}, 3 Insufficient cpu, 3 Insufficient memory."
)
# Each version's whole message, written out. PostFilter messages are joined by ", " and FitError adds a
# period after them (hence preemption's "pod.."); DynamicResources' PostFilter runs first since 1.34.
RECORDED = {
    "1.29-1.33 preemption": SUMMARY
    + " preemption: 0/15 nodes are available: 15 No preemption victims found for incoming pod..",
    "1.29-1.33 preemption not helpful": SUMMARY
    + " preemption: 0/15 nodes are available: 3 No preemption victims found for incoming pod, 12 Preemption "
    "is not helpful for scheduling..",
    "1.34-1.36 DRA and preemption": SUMMARY + " no new claims to deallocate, preemption: 0/15 nodes are "
    "available: 15 No preemption victims found for incoming pod..",
    "1.34-1.36 as the issue quotes it": SUMMARY + " no new claims to deallocate, preemption: 0/15 nodes are "
    "available: 15 No preemption victims found for incoming pod.",
    "no post-filter part": SUMMARY,
}


@pytest.mark.parametrize(
    ("message", "summary"),
    [
        (
            "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes are available: "
            "1 No preemption victims found for incoming pod..",
            "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.",
        ),
        (
            "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. no new claims to deallocate, "
            "preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod.",
            "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.",
        ),
        (
            "0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: 0/3 "
            "nodes are available: 3 Preemption is not helpful for scheduling..",
            "0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims.",
        ),
        ("no nodes available to schedule pods", "no nodes available to schedule pods"),
        (
            "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
            "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
        ),
    ],
)
def test_the_filter_summary_of_each_format(message: str, summary: str) -> None:
    assert filter_summary(message) == summary


def recorded_as(message: str) -> tuple[Snapshot, Pod]:
    snap = load_snapshot(CLUSTER, keep=[("ml", "train-llm-8gpu")])
    pod = snap.find_pod("ml", "train-llm-8gpu")
    assert isinstance(pod, Pod)
    scheduled = condition(pod, "PodScheduled")
    assert scheduled is not None
    scheduled.message = message
    return snap, pod


@pytest.mark.parametrize("version", RECORDED)
def test_explain_sees_an_unchanged_cluster_whatever_the_scheduler_version(
    version: str, capsys: pytest.CaptureFixture[str]
) -> None:
    snap, pod = recorded_as(RECORDED[version])
    result = explain(snap, pod)
    assert result.message == SUMMARY
    assert result.recorded_message == RECORDED[version]
    assert not any("has changed" in note for note in result.notes)
    print_explanation(result)
    shown = capsys.readouterr().out
    assert "Last recorded by the scheduler" not in shown and "has changed" not in shown


def test_explain_still_says_when_the_cluster_changed() -> None:
    snap, pod = recorded_as(
        "0/15 nodes are available: 15 Insufficient nvidia.com/gpu. no new claims to deallocate, preemption: "
        "0/15 nodes are available: 15 No preemption victims found for incoming pod.."
    )
    result = explain(snap, pod)
    assert any("the cluster has changed since that attempt" in note for note in result.notes)


@pytest.mark.parametrize("version", RECORDED)
def test_doctor_quotes_the_filter_summary_without_a_dangling_post_filter_part(version: str) -> None:
    snap, _ = recorded_as(RECORDED[version])
    (finding,) = [f for f in doctor_cluster(snap) if f.object == "pod/ml/train-llm-8gpu"]
    assert finding.evidence.endswith(f"; scheduler: {SUMMARY}")

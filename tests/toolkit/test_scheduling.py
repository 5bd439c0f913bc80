"""The scheduler primitives: tolerations, node affinity operators, pod requests, reason ordering."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from kubegpu.toolkit import pod_requests as res
from kubegpu.toolkit.model import Node, Pod, PodSpec, Taint, Toleration
from kubegpu.toolkit.scheduling import (
    PodQuery,
    Rejection,
    histogram,
    node_states,
    run_filters,
    selector_matches,
    tolerates,
)


def node(name: str, labels: dict[str, str] | None = None, **status: Any) -> Node:
    alloc = {"cpu": "4", "memory": "8Gi", "pods": "3", **status.get("allocatable", {})}
    return msgspec.convert(
        {
            "metadata": {"name": name, "labels": labels or {}},
            "status": {"allocatable": alloc, "capacity": alloc},
        },
        Node,
    )


def spec(**fields: Any) -> PodSpec:
    return msgspec.convert(fields, PodSpec)


@pytest.mark.parametrize(
    ("tol", "taint", "expected"),
    [
        ({"key": "k", "operator": "Exists"}, {"key": "k", "value": "v", "effect": "NoSchedule"}, True),
        (
            {"operator": "Exists"},
            {"key": "any", "effect": "NoExecute"},
            True,
        ),  # empty key + Exists: everything
        ({"key": "k", "value": "v"}, {"key": "k", "value": "v", "effect": "NoSchedule"}, True),  # "" is Equal
        ({"key": "k", "value": "w"}, {"key": "k", "value": "v", "effect": "NoSchedule"}, False),
        (
            {"key": "k", "operator": "Exists", "effect": "NoExecute"},
            {"key": "k", "effect": "NoSchedule"},
            False,
        ),
        (
            {"key": "k", "operator": "Gt", "value": "1"},
            {"key": "k", "value": "2", "effect": "NoSchedule"},
            False,
        ),
    ],
)
def test_toleration_semantics(tol: dict[str, str], taint: dict[str, str], expected: bool) -> None:
    assert tolerates(msgspec.convert(tol, Toleration), msgspec.convert(taint, Taint)) is expected


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}
    }


def expr(key: str, op: str, *values: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": key, "operator": op, "values": list(values)}]}


@pytest.mark.parametrize(
    ("term", "expected"),
    [
        (expr("gpu", "In", "a100", "h100"), True),
        (expr("gpu", "NotIn", "t4"), True),
        (expr("missing", "NotIn", "x"), True),  # NotIn matches an absent label
        (expr("gpu", "Exists"), True),
        (expr("gpu", "DoesNotExist"), False),
        (expr("mem", "Gt", "40000"), True),
        (expr("mem", "Lt", "40000"), False),
        (expr("gpu", "Gt", "1"), False),  # a non-integer label never satisfies Gt
        (expr("gpu", "In"), False),  # invalid (no values): the term matches nothing
        ({}, False),  # an empty term matches nothing
        ({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}, True),
        ({"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}]}, False),
    ],
)
def test_required_affinity_operators(term: dict[str, Any], expected: bool) -> None:
    n = node("n1", {"gpu": "a100", "mem": "81920"})
    assert selector_matches(spec(affinity=affinity(term)), n) is expected


def test_terms_are_ored_and_node_selector_anded() -> None:
    n = node("n1", {"gpu": "a100", "zone": "a"})
    assert selector_matches(spec(affinity=affinity(expr("gpu", "In", "t4"), expr("zone", "In", "a"))), n)
    assert not selector_matches(spec(nodeSelector={"gpu": "a100", "zone": "b"}), n)


def test_pod_requests_follow_init_sidecar_and_overhead_rules() -> None:
    s = spec(
        initContainers=[
            {"name": "sidecar", "restartPolicy": "Always", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
            {"name": "init", "resources": {"requests": {"cpu": "3"}, "limits": {"nvidia.com/gpu": "2"}}},
        ],
        containers=[
            {"name": "a", "resources": {"requests": {"cpu": "500m"}, "limits": {"nvidia.com/gpu": "1"}}},
            {"name": "b", "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}}},
        ],
        overhead={"cpu": "100m", "memory": "64Mi"},
    )
    # GPUs: sum(app 1 + sidecar 1) = 2 vs init step (2 + sidecar 1) = 3 -> 3. CPU: max(0.75, 3) + overhead.
    assert res.pod_requests(s) == {"nvidia.com/gpu": 3, "cpu": 3100, "memory": 2**30 + 64 * 2**20}


def test_pod_requests_count_only_names_the_api_server_takes_as_extended() -> None:
    limits = {"nvidia.com/gpu": "1", "Example.com/gpu": "1", "example..com/gpu": "1", "vendor.io/fpga": "2"}
    s = spec(containers=[{"name": "a", "resources": {"limits": limits}}])
    assert res.pod_requests(s) == {"nvidia.com/gpu": 1, "vendor.io/fpga": 2}


def test_histogram_sorts_like_go_sort_strings() -> None:
    rejections = [Rejection("X", ("Insufficient nvidia.com/gpu",))] * 10 + [Rejection("Y", ("b",))] * 2
    assert histogram(rejections) == ["10 Insufficient nvidia.com/gpu", "2 b"]


def test_too_many_pods_and_terminated_pods_free_their_slot() -> None:
    n = node("n1")
    pods = [
        msgspec.convert(
            {
                "metadata": {"name": f"p{i}", "namespace": "t"},
                "spec": {"nodeName": "n1"},
                "status": {"phase": phase},
            },
            Pod,
        )
        for i, phase in enumerate(["Running", "Running", "Running", "Succeeded"])
    ]
    pending = msgspec.convert({"metadata": {"name": "new", "namespace": "t"}, "spec": {}}, Pod)
    states = node_states([n], pods)
    assert states["n1"].pod_count == 3
    assert run_filters(PodQuery.of(pending), states).message == "0/1 nodes are available: 1 Too many pods."

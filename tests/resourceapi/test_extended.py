"""The extended-resource bridge's pure parts (resourceapi.extended) against the v1.36 scheduler's rules
(`extendeddynamicresources.go`: createRequestsAndMappings, filterExtendedResources; `extended/`:
DeviceClassMapping). Expected names and shapes are upstream's, written out."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.resourceapi import (
    class_mapping,
    extended_claim,
    is_extended_claim_of,
    requests_and_mappings,
    routes,
)

GPU = "nvidia.com/gpu"
MAPPING = {GPU: "gpu.nvidia.com", "example.com/fpga": "fpga.example.com"}


def device_class(
    name: str, resource: str | None = None, created: str = "2026-01-01T00:00:00Z"
) -> dict[str, Any]:
    spec = {"extendedResourceName": resource} if resource else {}
    return {"metadata": {"name": name, "creationTimestamp": created}, "spec": spec}


def container(name: str, limits: dict[str, str], *, sidecar: bool = False) -> dict[str, Any]:
    return {"name": name, "resources": {"limits": limits}, **({"restartPolicy": "Always"} if sidecar else {})}


def pod(containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "train", "namespace": "ml", "uid": "0c4d5a7e-1111-2222-3333-444455556666"},
        "spec": {"initContainers": init or [], "containers": containers},
    }


def exact(name: str, count: int, cls: str = "gpu.nvidia.com") -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": cls, "allocationMode": "ExactCount", "count": count}}


def test_explicit_and_implicit_names_and_the_newest_class_wins() -> None:
    assert class_mapping([device_class("gpu.nvidia.com", GPU), device_class("mig.nvidia.com")]) == {
        GPU: "gpu.nvidia.com",
        "deviceclass.resource.kubernetes.io/mig.nvidia.com": "mig.nvidia.com",
    }
    older, newer = "2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z"
    assert class_mapping([device_class("a", GPU, newer), device_class("b", GPU, older)]) == {GPU: "a"}
    assert class_mapping([device_class("b", GPU, newer), device_class("a", GPU, newer)]) == {GPU: "a"}


def test_the_node_advertising_the_resource_keeps_it_and_an_unserved_one_fits_nowhere() -> None:
    asking = pod([container("main", {GPU: "1", "example.com/fpga": "1", "cpu": "2"})])
    [fpga, gpu] = routes(asking, {GPU: "4"}, {GPU: "gpu.nvidia.com"})
    assert (gpu.through_dra, gpu.fits_nowhere, gpu.allocatable) == (False, False, 4)  # the device plugin's
    assert (fpga.through_dra, fpga.fits_nowhere) == (False, True)
    [gpu] = routes(pod([container("main", {GPU: "1"})]), {GPU: "0"}, {GPU: "gpu.nvidia.com"})
    assert gpu.through_dra  # advertised as 0: DRA serves it


def test_one_request_per_container_and_resource_named_by_indices() -> None:
    asking = pod(
        [container("a", {"cpu": "1", GPU: "2"}), container("b", {GPU: "1", "example.com/fpga": "1"})],
        init=[container("setup", {"cpu": "1"})],
    )
    requests, mappings = requests_and_mappings(asking, [GPU, "example.com/fpga"], MAPPING)
    # j: the resource's index among the container's sorted request names (cpu < nvidia.com/gpu)
    assert requests == [
        exact("container-1-request-1", 2),
        exact("container-2-request-0", 1, "fpga.example.com"),
        exact("container-2-request-1", 1),
    ]
    assert mappings == [
        {"containerName": "b", "resourceName": "example.com/fpga", "requestName": "container-2-request-0"},
        {"containerName": "a", "resourceName": GPU, "requestName": "container-1-request-1"},
        {"containerName": "b", "resourceName": GPU, "requestName": "container-2-request-1"},
    ]


def test_init_containers_reuse_later_requests_and_share_the_largest_of_their_own() -> None:
    asking = pod(
        [container("main", {GPU: "1"})],
        init=[
            container("warm", {GPU: "3"}),
            container("check", {GPU: "2"}),
            container("log", {GPU: "1"}, sidecar=True),
        ],
    )
    requests, mappings = requests_and_mappings(asking, [GPU], MAPPING)
    # warm reuses the sidecar's and main's requests (1 + 1) and asks 1 more; check needs none of its own.
    assert requests == [
        exact("container-0-request-0", 1),
        exact("container-2-request-0", 1),
        exact("container-3-request-0", 1),
    ]
    assert [(m["containerName"], m["requestName"]) for m in mappings] == [
        ("log", "container-2-request-0"),
        ("main", "container-3-request-0"),
        ("warm", "container-2-request-0"),
        ("warm", "container-3-request-0"),
        ("warm", "container-0-request-0"),
        ("check", "container-2-request-0"),
        ("check", "container-3-request-0"),
    ]


def test_the_special_claim_and_how_it_is_found_again() -> None:
    asking = pod([container("main", {GPU: "1"})])
    claim = extended_claim(asking, [exact("container-0-request-0", 1)])
    assert claim == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "generateName": "train-extended-resources-",
            "namespace": "ml",
            "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": "train",
                    "uid": "0c4d5a7e-1111-2222-3333-444455556666",
                    "controller": True,
                }
            ],
        },
        "spec": {"devices": {"requests": [exact("container-0-request-0", 1)]}},
    }
    assert is_extended_claim_of(claim, asking)
    claim["metadata"]["annotations"]["resource.kubernetes.io/extended-resource-claim"] = "false"
    assert not is_extended_claim_of(claim, asking)


RESOURCES = [GPU, "example.com/fpga", "cpu"]
containers_st = st.lists(
    st.tuples(
        st.dictionaries(st.sampled_from(RESOURCES), st.integers(0, 4), max_size=3),
        st.booleans(),  # a sidecar, when an init container
    ),
    min_size=0,
    max_size=4,
)


@settings(max_examples=300, deadline=None)
@given(
    init=containers_st, regular=containers_st.filter(bool), bridged=st.sets(st.sampled_from(RESOURCES[:2]))
)
def test_every_container_ask_is_covered_by_uniquely_named_requests(
    init: list[tuple[dict[str, int], bool]], regular: list[tuple[dict[str, int], bool]], bridged: set[str]
) -> None:
    def make(prefix: str, items: list[tuple[dict[str, int], bool]], is_init: bool) -> list[dict[str, Any]]:
        return [
            container(f"{prefix}{i}", {r: str(n) for r, n in asks.items()}, sidecar=is_init and side)
            for i, (asks, side) in enumerate(items)
        ]

    asking = pod(make("c", regular, False), init=make("i", init, True))
    requests, mappings = requests_and_mappings(asking, bridged, MAPPING)
    names = [r["name"] for r in requests]
    assert names == sorted(names) and len(set(names)) == len(names)
    assert all(re.fullmatch(r"container-\d+-request-\d+", n) for n in names)
    by_name = {r["name"]: r for r in requests}
    assert all(
        r["exactly"]["count"] > 0
        and r["exactly"]["deviceClassName"]
        == MAPPING[next(m["resourceName"] for m in mappings if m["requestName"] == r["name"])]
        for r in requests
    )
    for c in [*asking["spec"]["initContainers"], *asking["spec"]["containers"]]:
        for resource in RESOURCES:
            asked = int(c["resources"]["limits"].get(resource, "0"))
            mine = [
                m["requestName"]
                for m in mappings
                if (m["containerName"], m["resourceName"]) == (c["name"], resource)
            ]
            if resource not in bridged or asked == 0:
                assert mine == []
                continue
            assert mine and all(n in by_name for n in mine)
            assert sum(by_name[n]["exactly"]["count"] for n in set(mine)) >= asked  # it gets at least its ask
    # Long-lived containers never share a request: each of theirs is its own.
    long_lived = [c["name"] for c in asking["spec"]["containers"]] + [
        c["name"] for c in asking["spec"]["initContainers"] if c.get("restartPolicy") == "Always"
    ]
    owners: dict[str, set[str]] = {}
    for m in mappings:
        if m["containerName"] in long_lived:
            owners.setdefault(m["requestName"], set()).add(m["containerName"])
    assert all(len(o) == 1 for o in owners.values())

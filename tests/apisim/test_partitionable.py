"""The simulated API server on partitionable devices and consumable capacity: the fields stored and served
in v1, v1beta2 and v1beta1 (devices' fields under `basic:`, a request's `capacity` inline), and the
validation errors of `pkg/apis/resource/validation` written out."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kubegpu.apisim import ApiServerSim
from kubegpu.resourceapi import Allocator, Holdings, parse_claim, parse_class, parse_slice
from tests.resourceapi.partitionable import (
    claim,
    counted,
    counter_slice,
    device_class,
    device_slice,
    exact,
    shared,
)


def message(err: ApiException) -> str:
    return str(json.loads(err.body)["message"])


def causes(err: ApiException) -> list[str]:
    return [f"{c['field']}: {c['message']}" for c in json.loads(err.body)["details"]["causes"]]


@pytest.fixture
def api() -> Iterator[ApiServerSim]:
    with ApiServerSim(kubernetes_version="1.36.0") as server:
        yield server


@pytest.fixture
def k8s(api: ApiServerSim) -> Iterator[client.ApiClient]:
    with client.ApiClient(client.Configuration(host=api.url)) as api_client:
        yield api_client


def create(k8s: client.ApiClient, body: dict[str, Any]) -> Any:
    return client.ResourceV1Api(k8s).create_resource_slice(body)


MEMORY_POLICY = {"default": "0", "validRange": {"min": "0", "max": "80Gi", "step": "1Mi"}}


def test_counters_and_shared_devices_are_stored_and_served_in_every_version(api: ApiServerSim) -> None:
    api.create("resourceslices", counter_slice("counters", {"gpu-0-counter-set": {"memory-slice-0": "1"}}))
    devices = [
        counted("gpu-0-mig-1g10gb-19-0", **{"gpu-0-counter-set": {"memory-slice-0": "1"}}),
        shared("gpu-1", {"memory": {"value": "80Gi", "requestPolicy": MEMORY_POLICY}}),
    ]
    api.create("resourceslices", device_slice("devices", devices, slice_count=2))
    api.create("resourceclaims", claim("c", exact(capacity={"memory": "4Gi"})))
    with client.ApiClient(client.Configuration(host=api.url)) as k8s:
        beta1 = client.CustomObjectsApi(k8s)
        old = beta1.get_cluster_custom_object("resource.k8s.io", "v1beta1", "resourceslices", "devices")
        assert old["spec"]["devices"][0]["basic"]["consumesCounters"] == [
            {"counterSet": "gpu-0-counter-set", "counters": {"memory-slice-0": {"value": "1"}}}
        ]
        assert old["spec"]["devices"][1]["basic"]["allowMultipleAllocations"] is True
        assert old["spec"]["devices"][1]["basic"]["capacity"]["memory"]["requestPolicy"] == MEMORY_POLICY
        counters = beta1.get_cluster_custom_object("resource.k8s.io", "v1beta2", "resourceslices", "counters")
        assert counters["spec"]["sharedCounters"] == [
            {"name": "gpu-0-counter-set", "counters": {"memory-slice-0": {"value": "1"}}}
        ]
        old_claim = beta1.get_namespaced_custom_object(
            "resource.k8s.io", "v1beta1", "default", "resourceclaims", "c"
        )
        assert old_claim["spec"]["devices"]["requests"][0]["capacity"] == {"requests": {"memory": "4Gi"}}
        # Written in v1beta1, read in v1: the same object.
        body = device_slice("written-old", [shared("gpu-2", {"memory": {"value": "1Gi"}})])
        body["apiVersion"] = "resource.k8s.io/v1beta1"
        body["spec"]["devices"] = [
            {"name": "gpu-2", "basic": {k: v for k, v in body["spec"]["devices"][0].items() if k != "name"}}
        ]
        beta1.create_cluster_custom_object("resource.k8s.io", "v1beta1", "resourceslices", body)
    assert api.get("resourceslices", "written-old", namespace="")["spec"]["devices"] == [
        {"name": "gpu-2", "allowMultipleAllocations": True, "capacity": {"memory": {"value": "1Gi"}}}
    ]


def test_counter_sets_are_validated(k8s: client.ApiClient) -> None:
    body = counter_slice(
        "bad",
        {"Set_1": {"memory": "1"}, "set-2": {}, **{f"s{i}": {"c": "1"} for i in range(3)}},
    )
    body["spec"]["sharedCounters"].append({"name": "s0", "counters": {"Bad_Name": {"value": "1"}}})
    with pytest.raises(ApiException) as err:
        create(k8s, body)
    assert causes(err.value) == [
        'spec.sharedCounters[0].name: Invalid value: "Set_1": a lowercase RFC 1123 label must consist of '
        "lower case alphanumeric characters or '-', and must start and end with an alphanumeric character "
        "(e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
        "spec.sharedCounters[1].counters: Required value",
        'spec.sharedCounters[5].counters: Invalid value: "Bad_Name": a lowercase RFC 1123 label must consist '
        "of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character "
        "(e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
        'spec.sharedCounters[5]: Duplicate value: "s0"',
    ]
    nine = counter_slice("nine", {f"s{i}": {"c": "1"} for i in range(9)})
    with pytest.raises(ApiException) as err:
        create(k8s, nine)
    assert message(err.value) == (
        'ResourceSlice.resource.k8s.io "nine" is invalid: '
        "spec.sharedCounters: Too many: 9: must have at most 8 items"
    )


def test_counters_and_devices_never_share_a_slice(k8s: client.ApiClient) -> None:
    body = counter_slice("both", {"s": {"c": "1"}})
    body["spec"]["devices"] = [{"name": "gpu-0"}]
    with pytest.raises(ApiException) as err:
        create(k8s, body)
    assert message(err.value) == (
        'ResourceSlice.resource.k8s.io "both" is invalid: spec: Invalid value: "": '
        "only one of `sharedCounters` or `devices` is allowed"
    )


def test_counter_consumption_is_validated(k8s: client.ApiClient) -> None:
    three = counted("gpu-0", a={"c": "1"}, b={"c": "1"}, c={"c": "1"})
    twice = {
        "name": "gpu-1",
        "consumesCounters": [{"counterSet": "a", "counters": {"c": {"value": "1"}}}] * 2,
    }
    empty = {"name": "gpu-2", "consumesCounters": [{"counterSet": "", "counters": {}}]}
    with pytest.raises(ApiException) as err:
        create(k8s, device_slice("bad", [three, twice, empty]))
    assert causes(err.value) == [
        "spec.devices[0].consumesCounters: Too many: 3: must have at most 2 items",
        'spec.devices[1].consumesCounters[1]: Duplicate value: "a"',
        "spec.devices[2].consumesCounters[0].counterSet: Required value",
        "spec.devices[2].consumesCounters[0].counters: Required value",
    ]


P0, P1, P2, P3 = (f"spec.devices[{i}].capacity[memory].requestPolicy" for i in range(4))
P4 = "spec.devices[4].capacity[shares].requestPolicy"


def test_request_policies_are_validated_with_the_api_server_words(k8s: client.ApiClient) -> None:
    exclusive = {"name": "gpu-0", "capacity": {"memory": {"value": "8Gi", "requestPolicy": MEMORY_POLICY}}}
    both = shared(
        "gpu-1",
        {
            "memory": {
                "value": "8Gi",
                "requestPolicy": {"default": "1Gi", "validValues": ["1Gi"], "validRange": {"min": "1Gi"}},
            }
        },
    )
    no_default = shared(
        "gpu-2", {"memory": {"value": "8Gi", "requestPolicy": {"validRange": {"min": "1Gi"}}}}
    )
    out_of_range = shared(
        "gpu-3",
        {
            "memory": {
                "value": "8Gi",
                "requestPolicy": {
                    "default": "16Gi",
                    "validRange": {"min": "9Gi", "max": "10Gi", "step": "3Gi"},
                },
            }
        },
    )
    values = shared(
        "gpu-4", {"shares": {"value": "4", "requestPolicy": {"default": "3", "validValues": ["2", "1", "8"]}}}
    )
    with pytest.raises(ApiException) as err:
        create(k8s, device_slice("bad", [exclusive, both, no_default, out_of_range, values]))
    assert causes(err.value) == [
        P0 + ": Forbidden: allowMultipleAllocations must be true",
        P1 + ": Forbidden: exactly one policy can be specified, cannot "
        'specify "validValues" and "validRange" at the same time',
        P2 + ".default: Required value: required when validRange is defined",
        P3 + '.validRange.min: Invalid value: "9Gi": min is larger than capacity value: 8Gi',
        P3 + '.validRange.max: Invalid value: "10Gi": max is larger than capacity value: 8Gi',
        P3 + '.validRange.default: Invalid value: "16Gi": default is more than max: 10Gi',
        P3 + '.validRange.step: Invalid value: "3Gi": one step 12Gi is larger than capacity value: 8Gi',
        P3 + '.validRange.step: Invalid value: "16Gi": value is not a '
        "multiple of a given step (3Gi) from (9Gi)",
        P3 + '.validRange.step: Invalid value: "10Gi": value is not a '
        "multiple of a given step (3Gi) from (9Gi)",
        P4 + '.validValues[1]: Invalid value: "1": values must be sorted in ascending order',
        P4 + '.validValues[2]: Invalid value: "8": option is larger than capacity value: 4',
        P4 + '.validValues: Invalid value: "3": default value is not valid according to the requestPolicy',
    ]


def test_nvidia_consumable_shares_shapes_are_accepted(k8s: client.ApiClient) -> None:
    memory = shared(
        "gpu-0",
        {
            "memory": {
                "value": "81920Mi",
                "requestPolicy": MEMORY_POLICY
                | {"validRange": {"min": "0", "max": "81920Mi", "step": "1Mi"}},
            }
        },
    )
    shares = shared(
        "gpu-1",
        {
            "memory": {
                "value": "81920Mi",
                "requestPolicy": {
                    "default": "0",
                    "validRange": {"min": "0", "max": "81920Mi", "step": "1Mi"},
                },
            },
            "shares": {
                "value": "4",
                "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "4", "step": "1"}},
            },
        },
    )
    assert create(k8s, device_slice("ok", [memory, shares])).metadata.name == "ok"


def test_share_ids_must_be_lowercase_uuids(api: ApiServerSim) -> None:
    created = api.create("resourceclaims", claim("c"))
    for share_id, text in [
        ("abc", "error validating uid: invalid UUID length: 3"),
        ("0000000g-0000-4000-8000-000000000001", "error validating uid: invalid UUID format"),
        (
            "0000000A-0000-4000-8000-000000000001",
            "uid must be in RFC 4122 normalized form, `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` with lowercase "
            "hexadecimal characters",
        ),
    ]:
        result = {
            "request": "req-0",
            "driver": "driver-a",
            "pool": "pool-1",
            "device": "gpu-0",
            "shareID": share_id,
        }
        body = {**created, "status": {"allocation": {"devices": {"results": [result]}}}}
        with pytest.raises(Exception) as err:
            api.update("resourceclaims", body, status=True)
        assert f'status.allocation.devices.results[0].shareID: Invalid value: "{share_id}": {text}' in str(
            err.value
        )
    result = {
        "request": "req-0",
        "driver": "driver-a",
        "pool": "pool-1",
        "device": "gpu-0",
        "shareID": "00000000-0000-4000-8000-000000000001",
        "consumedCapacity": {"memory": "4Gi"},
    }
    body = {**created, "status": {"allocation": {"devices": {"results": [result]}}}}
    stored = api.update("resourceclaims", body, status=True)
    assert stored["status"]["allocation"]["devices"]["results"] == [result]


def test_gates_set_off_drop_their_fields() -> None:
    gates = {"DRAPartitionableDevices": False, "DRAConsumableCapacity": False}
    with ApiServerSim(kubernetes_version="1.34.0", feature_gates=gates) as api:
        device = {
            **counted("gpu-0", s={"c": "1"}),
            **shared(
                "gpu-0",
                {"memory": {"value": "1Gi", "requestPolicy": MEMORY_POLICY | {"validRange": {"min": "0"}}}},
            ),
        }
        stored = api.create("resourceslices", device_slice("s", [device]))
        assert stored["spec"]["devices"] == [{"name": "gpu-0", "capacity": {"memory": {"value": "1Gi"}}}]
        c = api.create("resourceclaims", claim("c", exact(capacity={"memory": "1Gi"})))
        assert "capacity" not in c["spec"]["devices"]["requests"][0]["exactly"]


def test_the_allocators_shares_are_written_back_and_read_again(api: ApiServerSim) -> None:
    """The scheduler's loop on the simulator: allocate from the API's objects, write the status, repeat."""
    api.create("deviceclasses", device_class())
    memory = {
        "value": "80Gi",
        "requestPolicy": {"default": "80Gi", "validRange": {"min": "1Mi", "step": "1Mi"}},
    }
    api.create("resourceslices", device_slice("gpus", [shared("gpu-0", {"memory": memory})]))
    outcomes = []
    for name, asked in (("a", "50Gi"), ("b", "30Gi"), ("c", "1Mi")):
        created = api.create("resourceclaims", claim(name, exact(capacity={"memory": asked})))
        allocated = [
            parse_claim(c) for c in api.list("resourceclaims") if (c.get("status") or {}).get("allocation")
        ]
        result = Allocator(
            [parse_claim(created)],
            [parse_class(c) for c in api.list("deviceclasses")],
            [parse_slice(s) for s in api.list("resourceslices")],
            Holdings.of_claims(allocated),
        ).allocate("node-1")
        if result is not None:
            created["status"] = {"allocation": result[0]}
            api.update("resourceclaims", created, status=True)
        outcomes.append(None if result is None else result[0]["devices"]["results"][0]["consumedCapacity"])
    assert outcomes == [{"memory": "50Gi"}, {"memory": "30Gi"}, None]

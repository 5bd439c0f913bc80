"""The API server's checks of `pod.status.extendedResourceClaimStatus` (KEP-5004), written by the official
client as the scheduler writes it: accepted when it names the pod's containers and requests, refused with
the apiserver's field errors when not."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kubegpu.apisim import ApiServerSim

LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start "
    "and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
MAPPING = {"containerName": "main", "resourceName": "nvidia.com/gpu", "requestName": "container-0-request-0"}


def pod(api: ApiServerSim) -> dict[str, Any]:
    return api.create(
        "pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "train"},
            "spec": {
                "containers": [
                    {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                ]
            },
        },
        namespace="default",
    )


def patch(k8s: client.ApiClient, status: dict[str, Any]) -> Any:
    return client.CoreV1Api(k8s).patch_namespaced_pod_status(
        "train", "default", {"status": {"extendedResourceClaimStatus": status}}
    )


def causes(err: ApiException) -> list[str]:
    return [f"{c['field']}: {c['message']}" for c in json.loads(err.body)["details"]["causes"]]


def test_the_scheduler_status_is_stored(api: ApiServerSim, k8s: client.ApiClient) -> None:
    pod(api)
    status = {"requestMappings": [MAPPING], "resourceClaimName": "train-extended-resources-x7k9p"}
    patch(k8s, status)
    assert api.get("pods", "train")["status"]["extendedResourceClaimStatus"] == status


def test_a_status_that_names_nothing_of_the_pod_is_refused(api: ApiServerSim, k8s: client.ApiClient) -> None:
    pod(api)
    bad = [
        {**MAPPING, "containerName": "sidecar"},
        {**MAPPING, "resourceName": "example.com/fpga"},
        {**MAPPING, "requestName": "Request_0"},
        MAPPING,
        MAPPING,
    ]
    with pytest.raises(ApiException) as err:
        patch(k8s, {"requestMappings": bad, "resourceClaimName": "Bad_Name"})
    assert err.value.status == 422
    rm = "status.extendedResourceClaimStatus.requestMappings"
    assert causes(err.value) == [
        f'{rm}[0].containerName: Invalid value: "sidecar": must match the name of an entry in '
        "spec.initContainers.name or spec.containers.name",
        f'{rm}[1].resourceName: Invalid value: "example.com/fpga": must match the extended resource name of '
        "an entry in spec.initContainers.resources.requests or spec.containers.resources.requests",
        f'{rm}[2].requestName: Invalid value: "Request_0": ' + LABEL_MSG,
        f'{rm}[4].containerName: Duplicate value: "main"',
        f'{rm}[4].resourceName: Duplicate value: "nvidia.com/gpu"',
        f'{rm}[4].requestName: Duplicate value: "container-0-request-0"',
        'status.extendedResourceClaimStatus.resourceClaimName: Invalid value: "Bad_Name": ' + SUBDOMAIN_MSG,
    ]
    assert "extendedResourceClaimStatus" not in (api.get("pods", "train").get("status") or {})
    with pytest.raises(ApiException) as err:
        patch(k8s, {"requestMappings": []})
    assert causes(err.value) == [
        "status.extendedResourceClaimStatus.requestMappings: Required value: at least one request mapping is "
        "required",
        "status.extendedResourceClaimStatus.resourceClaimName: Required value",
    ]

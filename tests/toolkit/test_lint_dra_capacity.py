"""`kubegpu lint` KG022: capacity requests against the request policy the cluster's devices publish
(NVIDIA's `--consumable-shares` shapes), through the click command with a snapshot; findings written out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests import dra_objects as dra
from tests.toolkit.test_lint_dra import claim_v1, node, run, snapshot, write

GPU_CLASS = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"


def shared_gpu(minor: int, mode: str) -> dict[str, Any]:
    gpu = dra.gpu(minor)
    gpu["allowMultipleAllocations"] = True
    memory = {
        "value": "80Gi",
        "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": "80Gi", "step": "1Gi"}},
    }
    gpu["capacity"] = {"memory": memory}
    if mode == "shares":
        gpu["capacity"]["shares"] = {
            "value": "4",
            "requestPolicy": {"default": "1", "validValues": ["1", "2", "4"]},
        }
    return gpu


def asking(name: str, **capacity: str) -> dict[str, Any]:
    request = dra.request("gpu")
    request["exactly"]["capacity"] = {"requests": dict(capacity)}
    return claim_v1(name, request)


def test_capacity_requests_are_checked_against_the_published_request_policy(tmp_path: Path) -> None:
    snap = snapshot(
        tmp_path,
        [
            node("gpu-1"),
            dra.resource_slice("gpu-1", [shared_gpu(0, "shares"), shared_gpu(1, "memory")]),
            dra.device_class("gpu.nvidia.com", GPU_CLASS),
        ],
    )
    claims = [
        asking("fits", memory="8Gi"),
        asking("too-big", memory="96Gi"),
        asking("rounded", memory="1500Mi"),
        asking("three-shares", shares="3"),
        asking("five-shares", shares="5"),
        asking("unknown", bandwidth="1"),
    ]
    code, report = run(write(tmp_path, "claims.yaml", claims), "--snapshot", snap)
    assert code == 1
    got = [(f["rule"], f["severity"], f["object"], f["path"], f["message"]) for f in report["findings"]]
    assert got == [
        (
            "KG022",
            "error",
            "ResourceClaim/ml/too-big",
            "spec.devices.requests[0].exactly.capacity.requests",
            "request 'gpu' asks for capacity memory: 96Gi, which no device of class 'gpu.nvidia.com' "
            "that passes its selectors takes "
            "(gpu-1/gpu-0: memory: 96Gi is not allowed by the device's request policy; "
            "gpu-1/gpu-1: memory: 96Gi is not allowed by the device's request policy); "
            "the claim can never be allocated",
        ),
        (
            "KG022",
            "warning",
            "ResourceClaim/ml/rounded",
            "spec.devices.requests[0].exactly.capacity.requests",
            "request 'gpu' asks for capacity memory: 1500Mi, which the devices' request policy rounds up: "
            "gpu-1/gpu-0: memory 1.5Gi is consumed as 2Gi; gpu-1/gpu-1: memory 1.5Gi is consumed as 2Gi",
        ),
        (
            "KG022",
            "warning",
            "ResourceClaim/ml/three-shares",
            "spec.devices.requests[0].exactly.capacity.requests",
            "request 'gpu' asks for capacity shares: 3, which the devices' request policy rounds up: "
            "gpu-1/gpu-0: shares 3 is consumed as 4",
        ),
        (
            "KG022",
            "error",
            "ResourceClaim/ml/five-shares",
            "spec.devices.requests[0].exactly.capacity.requests",
            "request 'gpu' asks for capacity shares: 5, which no device of class 'gpu.nvidia.com' "
            "that passes its selectors takes "
            "(gpu-1/gpu-0: shares: 5 is not allowed by the device's request policy; "
            "gpu-1/gpu-1: the device publishes no capacity shares); the claim can never be allocated",
        ),
        (
            "KG022",
            "error",
            "ResourceClaim/ml/unknown",
            "spec.devices.requests[0].exactly.capacity.requests",
            "request 'gpu' asks for capacity bandwidth: 1, which no device of class 'gpu.nvidia.com' "
            "that passes its selectors takes "
            "(gpu-1/gpu-0: the device publishes no capacity bandwidth; "
            "gpu-1/gpu-1: the device publishes no capacity bandwidth); the claim can never be allocated",
        ),
    ]
    assert report["findings"][0]["fix"] == (
        "ask for what the devices' capacity and requestPolicy allow (kubectl get resourceslices -o yaml: "
        "capacity.<name>.value and .requestPolicy), or pick devices that publish that capacity"
    )


def test_without_a_snapshot_only_capacities_nvidia_never_publishes_are_said(tmp_path: Path) -> None:
    claims = [asking("any", memory="96Gi"), asking("shares", shares="1"), asking("typo", memroy="1Gi")]
    _, report = run(write(tmp_path, "claims.yaml", claims))
    got = [
        (f["severity"], f["object"], f["path"], f["message"])
        for f in report["findings"]
        if f["rule"] == "KG022"
    ]
    assert got == [
        (
            "warning",
            "ResourceClaim/ml/typo",
            "spec.devices.requests[0].exactly.capacity.requests.memroy",
            "request 'gpu' asks for capacity 'memroy', which NVIDIA's DRA driver does not publish; no device "
            "takes the request",
        )
    ]

"""The per-node account of why a pod's claims (do not) fit: one verdict per device and request."""

from __future__ import annotations

from kubegpu.resourceapi import explain, holders, parse_claim, parse_class, parse_slice
from tests.dra_objects import claim, device_class, gpu, request, resource_slice


def test_every_device_gets_the_reason_that_rules_it_out() -> None:
    xid = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
    slice_a = resource_slice(
        "node-a",
        [gpu(0, memory="40Gi"), gpu(1, taints=[xid]), gpu(2), gpu(3, product="NVIDIA H100 80GB HBM3")],
    )
    slice_b = resource_slice("node-b", [gpu(0), gpu(1)])
    other = claim("train", namespace="ml")
    other["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-2"}
                ]
            }
        }
    }
    wanted = claim(
        "infer",
        [
            request(
                count=2,
                selectors=['device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("40Gi"))'],
            )
        ],
    )
    a, b = explain(
        [parse_claim(wanted)],
        [
            parse_class(
                device_class(expression='device.attributes["gpu.nvidia.com"].productName.contains("A100")')
            )
        ],
        [parse_slice(slice_a), parse_slice(slice_b)],
        ["node-a", {"metadata": {"name": "node-b", "labels": {}}}],
        held_by=holders([parse_claim(other)]),
    )
    assert (a.node, a.fits, a.summary) == ("node-a", False, "cannot allocate all claims")  # the scheduler's
    (account,) = a.requests
    assert (account.claim, account.request, account.device_class, account.wanted) == (
        "default/infer",
        "gpu",
        "gpu.nvidia.com",
        "2",
    )
    assert [str(v) for v in account.verdicts] == [
        "gpu.nvidia.com/node-a/gpu-0: request selector (claim default/infer selector #0 is false: "
        'device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("40Gi")))',
        "gpu.nvidia.com/node-a/gpu-1: tainted (not tolerated: gpu.nvidia.com/xid=79:NoSchedule)",
        "gpu.nvidia.com/node-a/gpu-2: in use (allocated to claim ml/train)",
        "gpu.nvidia.com/node-a/gpu-3: class selector (class gpu.nvidia.com selector #0 is false: "
        'device.attributes["gpu.nvidia.com"].productName.contains("A100"))',
    ]
    assert account.matching == 0
    assert [(p.id, p.generation, p.devices, p.incomplete) for p in a.pools] == [
        ("gpu.nvidia.com/node-a", 1, 4, False)
    ]
    assert (b.node, b.fits, b.summary, b.requests[0].matching) == ("node-b", True, "", 2)
    assert [r["device"] for r in b.allocation[0]["devices"]["results"]] == ["gpu-0", "gpu-1"]


def test_a_selector_error_is_the_nodes_summary() -> None:
    broken = claim("c", [request(selectors=['device.attributes["gpu.nvidia.com"].minor == 0'])])
    (account,) = explain(
        [parse_claim(broken)],
        [parse_class(device_class())],
        [parse_slice(resource_slice("node-a", [gpu(0)]))],
        ["node-a"],
    )
    assert account.summary == "claim default/c: selector #0: CEL runtime error: no such key: minor"
    assert account.requests[0].verdicts[0].verdict == "selector error"

"""The DRA driver's device health for the kubelet: the mapping from the served inventory (the fault book's
faults on the discovered GPUs) to NodeWatchResources lines, and when the broadcast sends them.

Expected messages are NVIDIA's DRA driver's (site docs, "GPU health checking": `critical XID <code> reported
by NVML`, `GPU is lost`, `device health is not monitored`), written out here."""

from __future__ import annotations

import asyncio
import contextlib

from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.api.drahealth.v1alpha1 import api_pb2 as health_pb2
from kubegpu.dra.devices import device_entries, device_table
from kubegpu.dra.health_stream import DeviceHealthReport, HealthBroadcast, health_reports
from kubegpu.node.discovery import discover, nvml_session
from kubegpu.node.inventory import Health, Inventory
from kubegpu.node.nvml.backend import load_nvml
from kubegpu.settings.dra_selection import parse_gpu_selection
from kubegpu.settings.env import NvmlSelection

ALL = parse_gpu_selection("all")
HEALTHY, UNHEALTHY, UNKNOWN = 1, 2, 0  # the proto's HealthStatus numbers


def discovered(profile: str) -> Inventory:
    backend = load_nvml(NvmlSelection.fake(profile))
    with nvml_session(backend):
        return discover(backend)


def by_name(inventory: Inventory, *, monitored: bool = True) -> dict[str, tuple[str, int, str]]:
    table = device_table(inventory, ALL)
    reports = health_reports(table, pool="node-a", driver_name="gpu.nvidia.com", monitored=monitored)
    return {r.device: (r.pool, r.health, r.message) for r in reports}


def test_healthy_devices_are_healthy_without_a_message_named_as_the_slice_names_them() -> None:
    assert by_name(discovered("t4-pcie")) == {f"gpu-{i}": ("node-a", HEALTHY, "") for i in range(4)}


def test_a_critical_xid_names_the_xid_as_nvidia_does() -> None:
    inventory = discovered("t4-pcie")
    gpu1 = inventory.gpus[1].uuid
    served = inventory.with_gpu_health({gpu1: Health.failed("XID 48 (DBE); action: RESET_GPU", 48)})
    assert by_name(served) == {
        "gpu-0": ("node-a", HEALTHY, ""),
        "gpu-1": ("node-a", UNHEALTHY, "critical XID 48 reported by NVML"),
        "gpu-2": ("node-a", HEALTHY, ""),
        "gpu-3": ("node-a", HEALTHY, ""),
    }


def test_a_fault_without_an_xid_is_a_lost_gpu() -> None:
    inventory = discovered("t4-pcie")
    served = inventory.with_gpu_health({inventory.gpus[3].uuid: Health.failed("NVML cannot find the GPU")})
    assert by_name(served)["gpu-3"] == ("node-a", UNHEALTHY, "GPU is lost")


def test_a_fault_of_a_mig_gpu_makes_every_mig_device_on_it_unhealthy() -> None:
    inventory = discovered("a100-mig")
    gpu1 = next(g for g in inventory.gpus if g.minor == 1)
    served = by_name(inventory.with_gpu_health({gpu1.uuid: Health.failed("lost", 79)}))
    assert {n: h for n, h in served.items() if h[1] != HEALTHY} == {
        "gpu-1-mig-3g20gb-9-0": ("node-a", UNHEALTHY, "critical XID 79 reported by NVML"),
        "gpu-1-mig-3g20gb-9-3": ("node-a", UNHEALTHY, "critical XID 79 reported by NVML"),
    }
    assert len(served) == 13


def test_unmonitored_health_is_unknown_whatever_the_inventory_says() -> None:
    inventory = discovered("t4-pcie")
    served = inventory.with_gpu_health({inventory.gpus[0].uuid: Health.failed("lost", 79)})
    assert set(by_name(served, monitored=False).values()) == {
        ("node-a", UNKNOWN, "device health is not monitored")
    }


def test_the_proto_numbers_are_the_kubelets() -> None:
    assert (health_pb2.UNKNOWN, health_pb2.HEALTHY, health_pb2.UNHEALTHY) == (UNKNOWN, HEALTHY, UNHEALTHY)


A100_MIG = discovered("a100-mig")


@settings(max_examples=60, deadline=None)
@given(
    faults=st.dictionaries(
        st.sampled_from([g.uuid for g in A100_MIG.gpus]),
        st.one_of(st.none(), st.integers(min_value=1, max_value=200)),
    )
)
def test_the_stream_and_the_slice_never_disagree(faults: dict[str, int | None]) -> None:
    # Any faults (with or without an XID) on any GPUs: a device is Unhealthy on the stream exactly when the
    # slice taints it, and the message names what the taint names.
    served = A100_MIG.with_gpu_health({u: Health.failed("fault", xid) for u, xid in faults.items()})
    taints = {e["name"]: e.get("taints", []) for e in device_entries(served, ALL)}
    stream = by_name(served)
    assert stream.keys() == taints.keys()
    for name, (_, health, message) in stream.items():
        match taints[name]:
            case []:
                assert (health, message) == (HEALTHY, "")
            case [{"key": "gpu.nvidia.com/xid", "value": xid}]:
                assert (health, message) == (UNHEALTHY, f"critical XID {xid} reported by NVML")
            case [{"key": "gpu.nvidia.com/gpu-lost"}]:
                assert (health, message) == (UNHEALTHY, "GPU is lost")
            case other:
                raise AssertionError(f"unexpected taints {other}")


# ---- the broadcast -------------------------------------------------------------------------------------

GPU0 = DeviceHealthReport("node-a", "gpu-0", HEALTHY)
GPU0_XID = DeviceHealthReport("node-a", "gpu-0", UNHEALTHY, "critical XID 79 reported by NVML")


async def next_message(stream: object, timeout: float = 1.0) -> health_pb2.NodeWatchResourcesResponse:
    return await asyncio.wait_for(stream.__anext__(), timeout)  # type: ignore[attr-defined]


async def test_nothing_is_sent_until_health_is_armed_then_the_full_state_then_every_change() -> None:
    broadcast = HealthBroadcast(clock=lambda: 1_700_000_000.0)
    broadcast.update((GPU0,))
    stream = broadcast.watch(resend_period=60)
    pending = asyncio.ensure_future(next_message(stream, 5))
    await asyncio.sleep(0.05)
    assert not pending.done()  # the health thread is not armed: the kubelet keeps them Unknown
    broadcast.set_alive(True)
    first = await pending
    assert [
        (
            d.device.pool_name,
            d.device.device_name,
            d.health,
            d.message,
            d.last_updated_time,
            d.health_check_timeout_seconds,
        )
        for d in first.devices
    ] == [("node-a", "gpu-0", HEALTHY, "", 1_700_000_000, 30)]
    assert broadcast.update((GPU0_XID,))
    second = await next_message(stream)
    assert [(d.health, d.message) for d in second.devices] == [
        (UNHEALTHY, "critical XID 79 reported by NVML")
    ]
    assert not broadcast.update((GPU0_XID,))  # unchanged: nothing is sent
    quiet = asyncio.ensure_future(next_message(stream, 5))
    await asyncio.sleep(0.05)
    assert not quiet.done()
    quiet.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await quiet
    await stream.aclose()


async def test_resent_while_alive_and_not_while_the_health_thread_is_down() -> None:
    broadcast = HealthBroadcast()
    broadcast.update((GPU0,))
    broadcast.set_alive(True)
    stream = broadcast.watch(resend_period=0.05)
    await next_message(stream)
    await next_message(stream)  # the resend keeps the kubelet's timeout from turning it Unknown
    broadcast.set_alive(False)
    await asyncio.sleep(0.06)  # a resend that may already be due
    silent = asyncio.ensure_future(next_message(stream, 5))
    await asyncio.sleep(0.2)
    assert not silent.done()
    broadcast.set_alive(True)
    assert [d.health for d in (await silent).devices] == [HEALTHY]
    await stream.aclose()
    assert broadcast.open_streams == 0

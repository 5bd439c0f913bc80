"""Prepare and Unprepare with ConsumableShares, without gRPC: whatever sequence of claims comes, a device is
never prepared for two claims that may not share it (a whole claim and any other, or two configs that differ),
and a claim is refused only for that; NVIDIA's texts written out."""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubegpu.dra.checkpoint import Checkpoint
from kubegpu.dra.prepare import Preparer
from kubegpu.node.nvml import fake_smi
from kubegpu.settings.feature_gates import parse_feature_gates
from tests.builders import gpu_uuid
from tests.dra.test_mps_daemon import FakeApi, daemons
from tests.dra.test_prepare import allocated, make, ref

GATES = parse_feature_gates("ConsumableShares=true,TimeSlicingSettings=true")
INTERVALS = (None, "Short", "Long")  # None: no config


def shared_claim(name: str, uid: str, interval: str | None, share: bool) -> dict[str, Any]:
    config = []
    if interval is not None:
        sharing = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}
        config = [{"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com",
                   "parameters": {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                                  "sharing": sharing}}}]  # fmt: skip
    obj = allocated(name, uid, ["gpu-0"], config=config)
    if share:
        result = obj["status"]["allocation"]["devices"]["results"][0]
        result.update(shareID=str(uuid.uuid4()), consumedCapacity={"memory": "1Gi"})
    return obj


def holders(checkpoint: Checkpoint) -> list[tuple[str | None, bool]]:
    """(config interval, held as a share) of each claim holding gpu-0."""
    out = []
    for claim in checkpoint.claims.values():
        for device in claim.devices:
            if device.device == "gpu-0":
                interval = (claim.sharing.get("gpu-0") or {}).get("interval")
                out.append((interval, device.share_id is not None))
    return out


operations = st.lists(
    st.one_of(
        st.tuples(st.just("prepare"), st.sampled_from(INTERVALS), st.booleans()),
        st.tuples(st.just("unprepare"), st.integers(min_value=0, max_value=7), st.just(False)),
    ),
    max_size=12,
)


async def play(root: Path, ops: list[tuple[str, Any, bool]]) -> None:
    preparer, reader = make(root)
    preparer.gates, preparer.shares = GATES, "memory"
    prepared: list[str] = []
    for i, (op, arg, share) in enumerate(ops):
        if op == "unprepare":
            if prepared:
                name = prepared.pop(arg % len(prepared))
                assert (await preparer.unprepare([ref(name, f"u-{name}")]))[f"u-{name}"] == ""
            continue
        name = f"c{i}"
        reader.objects[name] = shared_claim(name, f"u-{name}", arg, share)
        before = holders(preparer.checkpoint)
        may = not before or (share and all(s and interval == arg for interval, s in before))
        error = (await preparer.prepare([ref(name, f"u-{name}")]))[f"u-{name}"].error
        assert (error == "") == may, (before, arg, share, error)
        if may:
            prepared.append(name)
        elif share and all(s for _, s in before):
            assert error.startswith(f"unable to prepare claim u-{name}: requested device gpu-0 has "
                                    "conflicting configuration with already prepared claim u-c")  # fmt: skip
        else:
            assert "device gpu-0 is already prepared for claim default/c" in error
        after = holders(preparer.checkpoint)
        assert len(after) <= 1 or (all(s for _, s in after) and len({i for i, _ in after}) == 1), after


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations)
def test_no_sequence_of_claims_prepares_a_device_for_two_that_may_not_share_it(
    ops: list[tuple[str, Any, bool]],
) -> None:
    with tempfile.TemporaryDirectory(prefix="kg-shares-") as root:
        asyncio.run(play(Path(root), ops))


# ---- MPS on a shared GPU: one daemon for the device, stopped with its last holder ------------------------


def mps_sharer(name: str, uid: str) -> dict[str, Any]:
    obj = allocated(name, uid, ["gpu-0"], config=[{"source": "FromClaim", "requests": ["gpu"], "opaque": {
        "driver": "gpu.nvidia.com", "parameters": {"apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}}}])  # fmt: skip
    result = obj["status"]["allocation"]["devices"]["results"][0]
    result.update(shareID=str(uuid.uuid4()), consumedCapacity={"memory": "1Gi"})
    return obj


def with_mps(preparer: Preparer, root: Path) -> FakeApi:
    """MPSSupport on, against an API server whose daemon is always ready; the daemons' calls recorded."""
    name = "/apis/apps/v1/namespaces/nvidia-dra/deployments/mps-control-daemon-gpu-c3a6e328500d"
    pod = {"metadata": {"name": "p"}, "status": {"containerStatuses": [{"ready": True}]}}
    api = FakeApi(
        {name: {"status": {"readyReplicas": 1}}, "/api/v1/namespaces/nvidia-dra/pods": {"items": [pod]}}
    )
    fake_smi.install(root / "plugin" / "driver-root", root / "smi.log")
    preparer.gates, preparer.shares = parse_feature_gates("ConsumableShares=true,MPSSupport=true"), "memory"
    preparer.mps = daemons(root / "plugin", api, [])
    return api


async def test_a_shared_daemon_is_kept_while_an_orphan_spec_names_its_device(tmp_path: Path) -> None:
    """After a lost checkpoint entry, a claim known only from its CDI spec may still use the device's
    daemon: unpreparing the other sharer keeps it; once nobody holds the device it is stopped."""
    preparer, reader = make(tmp_path)
    with_mps(preparer, tmp_path)
    for name in ("a", "b"):
        reader.objects[name] = mps_sharer(name, f"u-{name}")
        assert (await preparer.prepare([ref(name, f"u-{name}")]))[f"u-{name}"].error == ""
    daemon_dir = tmp_path / "plugin" / "mps" / "gpu-c3a6e328500d"  # sha256(gpu_uuid(0))[:12]
    assert daemon_dir.is_dir()
    preparer.checkpoint.remove("u-b")  # b's entry lost, its spec left: an orphan to the next process

    restarted, _ = make(tmp_path)
    api = with_mps(restarted, tmp_path)
    assert (await restarted.unprepare([ref("a", "u-a")]))["u-a"] == ""
    assert restarted.orphans == {"u-b": ("gpu-0",)}
    assert [c for c in api.calls if c[0] == "DELETE"] == []
    assert daemon_dir.is_dir()
    assert fake_smi.compute_modes(tmp_path / "smi.log") == {gpu_uuid(0): "EXCLUSIVE_PROCESS"}

    again, reader = make(tmp_path / "second")
    api = with_mps(again, tmp_path / "second")
    for name in ("a", "b"):
        reader.objects[name] = mps_sharer(name, f"u-{name}")
        assert (await again.prepare([ref(name, f"u-{name}")]))[f"u-{name}"].error == ""
    assert (await again.unprepare([ref("a", "u-a")]))["u-a"] == ""
    assert [c for c in api.calls if c[0] == "DELETE"] == []  # b holds it
    assert (await again.unprepare([ref("b", "u-b")]))["u-b"] == ""
    assert [c[0] for c in api.calls if c[0] == "DELETE"] == ["DELETE"]
    assert fake_smi.compute_modes(tmp_path / "second" / "smi.log") == {gpu_uuid(0): "DEFAULT"}

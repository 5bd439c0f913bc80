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
from kubegpu.settings.feature_gates import parse_feature_gates
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

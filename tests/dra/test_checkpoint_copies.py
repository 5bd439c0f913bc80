"""The checkpoint's two copies under any damage: whatever bytes replace one file, the other holds the
claims; whatever replaces both, loading never raises and says the checkpoint is lost."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.dra.checkpoint import COMPLETED, Checkpoint, PreparedClaim, PreparedDevice

BOOT = "6e1f0c55-0000-4000-8000-000000000001"
CLAIM = PreparedClaim("u1", "default", "c", COMPLETED, (PreparedDevice(("gpu",), "node-a", "gpu-0", ("x",)),))


def damaged(data: bytes, which: tuple[str, ...]) -> Checkpoint:
    with tempfile.TemporaryDirectory(prefix="kg-ckpt-") as tmp:
        root = Path(tmp)
        Checkpoint(root / "checkpoint.json", BOOT).put(CLAIM)
        for name in which:
            (root / name).write_bytes(data)
        again = Checkpoint(root / "checkpoint.json", BOOT)
        again.load()
        return again


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=300), st.sampled_from(["checkpoint.json", "checkpoint.json.copy"]))
def test_one_damaged_copy_loses_nothing(data: bytes, which: str) -> None:
    loaded = damaged(data, (which,))
    assert loaded.claims == {"u1": CLAIM} and not loaded.lost


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=300))
def test_both_damaged_never_raises_and_says_lost(data: bytes) -> None:
    loaded = damaged(data, ("checkpoint.json", "checkpoint.json.copy"))
    assert loaded.claims == {} and loaded.lost

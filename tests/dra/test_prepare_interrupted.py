"""A Prepare cut short at each step (after the PrepareStarted record, during the CDI spec write, before the
PrepareCompleted record), driven through Prepare itself: what it left on disk is a PrepareStarted entry, and
a new driver process on the same files rolls it back and prepares the claim again before answering, so it
never answers CDI IDs whose spec is not on disk."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kubegpu.dra import claim_cdi
from kubegpu.dra.checkpoint import Checkpoint, PreparedClaim
from tests.dra.test_prepare import BOOT, allocated, make, ref


class Crash(BaseException):
    """The process dying at this point (SIGKILL, OOM): nothing after it runs, no handler sees it."""


class CrashingCheckpoint(Checkpoint):
    """Dies instead of recording PrepareCompleted."""

    def put(self, claim: PreparedClaim) -> None:
        if claim.state == "PrepareCompleted":
            raise Crash
        super().put(claim)


def on_disk(tmp_path: Path) -> dict[str, str]:
    raw = json.loads((tmp_path / "plugin" / "checkpoint.json").read_text())
    return {c["uid"]: c["state"] for c in json.loads(raw["data"])["preparedClaims"]}


def crash_before_spec(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def write(*args: Any, **kwargs: Any) -> bool:
        raise Crash

    monkeypatch.setattr(claim_cdi, "write_atomic", write)


def crash_during_spec(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def write(path: Path, data: bytes, **kwargs: Any) -> bool:
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / f".{path.name}.partial.tmp").write_bytes(data[: len(data) // 2])
        raise Crash

    monkeypatch.setattr(claim_cdi, "write_atomic", write)


@pytest.mark.parametrize(
    "step", ["after the started record", "during the spec write", "before the completed record"]
)
async def test_a_prepare_cut_short_leaves_started_and_a_new_driver_prepares_again_before_answering(
    step: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    preparer, reader = make(tmp_path)
    reader.objects["c"] = allocated("c", "u1", ["gpu-1"])
    spec = tmp_path / "cdi" / "k8s.gpu.nvidia.com-claim_u1.json"
    with monkeypatch.context() as patch:
        if step == "after the started record":
            crash_before_spec(patch, tmp_path)
        elif step == "during the spec write":
            crash_during_spec(patch, tmp_path)
        else:
            crashing = CrashingCheckpoint(preparer.checkpoint.path, BOOT)
            crashing.load()
            preparer.checkpoint = crashing
        with pytest.raises(Crash):
            await preparer.prepare([ref("c", "u1")])
    assert on_disk(tmp_path) == {"u1": "PrepareStarted"}  # written by Prepare before it touched anything
    assert spec.exists() == (step == "before the completed record")

    new, new_reader = make(tmp_path)  # the next driver process, on the same files
    new_reader.objects["c"] = allocated("c", "u1", ["gpu-1"])
    out = await new.prepare([ref("c", "u1")])
    assert out["u1"].error == ""
    assert [(d.device, d.cdi_ids) for d in out["u1"].devices] == [
        ("gpu-1", ("k8s.gpu.nvidia.com/claim=u1-gpu-1",))
    ]
    assert new_reader.gets == 1  # rolled back and read again, not answered from the unfinished entry
    assert [d["name"] for d in json.loads(spec.read_text())["devices"]] == ["u1-gpu-1"]
    assert on_disk(tmp_path) == {"u1": "PrepareCompleted"}
    assert await new.unprepare([ref("c", "u1")]) == {"u1": ""}
    assert not spec.exists() and on_disk(tmp_path) == {}

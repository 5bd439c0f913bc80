"""What a driver finds on disk that its checkpoint does not account for, and how it says so: why the claims
must be rebuilt (the checkpoint unreadable, missing, or specs it does not name), the warning naming each
orphan and its devices, new claims refused until the API server answered (with why it did not), and each
orphan settled: rebuilt, or its spec removed with the reason logged."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from kubegpu.dra.checkpoint import COMPLETED, Checkpoint, PreparedClaim
from kubegpu.dra.claims import ApiUnavailable
from kubegpu.dra.node_lock import LockTimeout
from kubegpu.dra.prepare import Preparer
from kubegpu.dra.rebuild import rebuild
from tests.dra.test_prepare import BOOT, allocated, make, ref
from tests.dra.test_rebuild import ListingReader, lose_the_checkpoint

SPEC = "k8s.gpu.nvidia.com-claim_{}.json"
RETRY = "the kubelet will retry"
LOG = "kubegpu.dra.prepare"


def refused(name: str, why: str) -> str:
    return (
        f"claim default/{name}: not prepared yet: the driver's checkpoint was lost and the claims prepared "
        f"on this node are not yet rebuilt from the API server ({why}); {RETRY}"
    )


def messages(caplog: pytest.LogCaptureFixture, logger: str = LOG) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == logger]


def specs(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "cdi").iterdir())


async def prepared_then_restarted(tmp_path: Path, *, keep: tuple[str, ...]) -> Preparer:
    """u1 (gpu-0) and u2 (gpu-1) prepared, then a new driver whose checkpoint names only `keep`."""
    first, reader = make(tmp_path)
    reader.objects["c1"] = allocated("c1", "u1", ["gpu-0"])
    reader.objects["c2"] = allocated("c2", "u2", ["gpu-1"])
    await first.prepare([ref("c1", "u1"), ref("c2", "u2")])
    for uid in ("u1", "u2"):
        if uid not in keep:
            first.checkpoint.remove(uid)
    restarted, _ = make(tmp_path)
    return restarted


async def test_specs_the_checkpoint_does_not_name_are_orphans_named_in_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    preparer = await prepared_then_restarted(tmp_path, keep=("u1",))
    (tmp_path / "cdi" / SPEC.format("u0")).write_text("{not json")  # a spec cut short: no devices known
    two = {"devices": [{"name": "u3-gpu-2"}, {"name": "u3-gpu-3"}]}  # from a node with more GPUs
    (tmp_path / "cdi" / SPEC.format("u3")).write_text(json.dumps(two))
    with caplog.at_level(logging.WARNING, logger=LOG):
        await preparer.recover()
        for _ in range(2):  # the next calls do not look again while the checkpoint does not change
            assert await preparer.unprepare([ref("never", "u9")]) == {"u9": ""}
    assert messages(caplog) == [
        (
            "WARNING",
            "3 CDI spec(s) on disk belong to claims the checkpoint does not name (u0: no readable devices, "
            "u2: gpu-1, u3: gpu-2, gpu-3): their devices stay held until the API server confirms the claims",
        )
    ]
    assert preparer.orphans == {"u0": (), "u2": ("gpu-1",), "u3": ("gpu-2", "gpu-3")}
    assert preparer.lost == "other" and preparer.orphans_found.is_set()


async def test_a_checkpoint_that_names_every_spec_finds_nothing_to_rebuild(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    preparer = await prepared_then_restarted(tmp_path, keep=("u1", "u2"))
    with caplog.at_level(logging.WARNING, logger=LOG):
        await preparer.recover()
    assert (preparer.orphans, preparer.lost, preparer.orphans_found.is_set()) == ({}, None, False)
    assert messages(caplog) == []


@pytest.mark.parametrize("gone", ["checkpoint.json", "checkpoint.json.copy"])
async def test_one_copy_of_the_checkpoint_gone_loses_nothing(tmp_path: Path, gone: str) -> None:
    preparer = await prepared_then_restarted(tmp_path, keep=("u1", "u2"))
    (tmp_path / "plugin" / gone).unlink()
    restarted, reader = make(tmp_path)
    await restarted.recover()
    assert (restarted.orphans, restarted.lost, restarted.orphans_found.is_set()) == ({}, None, False)
    assert sorted(restarted.checkpoint.claims) == ["u1", "u2"] == sorted(preparer.checkpoint.claims)
    reader.objects["c3"] = allocated("c3", "u3", ["gpu-0"])
    out = await restarted.prepare([ref("c3", "u3")])  # refused for gpu-0, not for a lost checkpoint
    assert out["u3"].error == "claim default/c3: device gpu-0 is already prepared for claim default/c1 (u1)"


@pytest.mark.parametrize("damage", ["missing", "unreadable"])
async def test_a_lost_checkpoint_without_specs_still_asks_the_api_server_first(
    tmp_path: Path, damage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, reader = make(tmp_path)
    reader.objects["c1"] = allocated("c1", "u1", ["gpu-0"])
    await first.prepare([ref("c1", "u1")])
    (tmp_path / "cdi" / SPEC.format("u1")).unlink()  # the CDI root wiped with it: nothing on disk says u1
    for name in ("checkpoint.json", "checkpoint.json.copy"):
        path = tmp_path / "plugin" / name
        path.unlink() if damage == "missing" else path.write_text("{}")
    preparer, _ = make(tmp_path, intact=False)
    await preparer.recover()
    assert (preparer.orphans, preparer.lost, preparer.orphans_found.is_set()) == ({}, damage, True)
    listing = ListingReader()
    listing.objects = {"c1": reader.objects["c1"]}
    preparer.reader = listing
    reasons: list[str] = []
    monkeypatch.setattr(preparer, "rebuilding", reasons.append)  # the metrics' hook
    listing.objects["c2"] = allocated("c2", "u2", ["gpu-0"])
    out = await preparer.prepare([ref("c2", "u2")])  # no confirm wired: it cannot know gpu-0 is taken
    assert out["u2"].error == refused("c2", "the API server has not been asked yet")
    assert await rebuild(preparer) == 1
    assert reasons == [damage]
    assert sorted(preparer.checkpoint.claims) == ["u1"] and specs(tmp_path) == [SPEC.format("u1")]
    out = await preparer.prepare([ref("c2", "u2")])
    assert out["u2"].error == "claim default/c2: device gpu-0 is already prepared for claim default/c1 (u1)"


async def test_a_missing_checkpoint_stays_the_reason_when_another_process_writes_one(tmp_path: Path) -> None:
    preparer, reader = await lose_the_checkpoint(tmp_path)  # both copies gone, u1 and u2's specs left
    assert preparer.lost == "missing"
    (tmp_path / "cdi" / SPEC.format("u2")).unlink()  # and u2's spec went with them
    # Another driver process (a rolling update) writes a checkpoint meanwhile, naming a claim of its own.
    Checkpoint(preparer.checkpoint.path, BOOT).put(PreparedClaim("u3", "default", "c3", COMPLETED))
    reader.down = True
    out = await preparer.prepare([ref("c4", "u4")])  # reads the new file: u1 is still an orphan
    assert preparer.orphans == {"u1": ("gpu-0",)}
    assert preparer.lost == "missing"  # not "other": u2's spec may be lost too, only the API server knows
    assert out["u4"].kind == "rebuilding"
    reader.down = False
    assert await rebuild(preparer) == 2  # u1 from its spec, u2 from the API server alone
    assert sorted(preparer.checkpoint.claims) == ["u1", "u2", "u3"]
    assert specs(tmp_path) == [SPEC.format("u1"), SPEC.format("u2")]


class Confirm:
    """A rebuild that fails as told."""

    def __init__(self, error: BaseException | None = None, hang_s: float = 0.0) -> None:
        self.error, self.hang_s, self.calls = error, hang_s, 0

    async def __call__(self) -> int:
        self.calls += 1
        await asyncio.sleep(self.hang_s)
        if self.error is not None:
            raise self.error
        return 0


WHY = {
    "api": (
        Confirm(
            ApiUnavailable(f"cannot list the resourceclaims: the API server answered no list; {RETRY}", "x")
        ),
        "cannot list the resourceclaims: the API server answered no list",
    ),
    "lock": (
        Confirm(LockTimeout("timed out after 0.3 s waiting for pu.lock")),
        "timed out after 0.3 s waiting for pu.lock",
    ),
    "hangs": (Confirm(hang_s=5.0), "the API server did not answer within 0.5 s"),
}


@pytest.mark.parametrize("case", list(WHY))
async def test_a_rebuild_that_fails_refuses_the_new_claims_with_why(tmp_path: Path, case: str) -> None:
    preparer, reader = await lose_the_checkpoint(tmp_path)
    confirm, why = WHY[case]
    preparer.confirm = confirm
    preparer.reader.timeout = 0.5
    reader.objects["c3"] = allocated("c3", "u3", ["gpu-0"])
    reader.objects["c4"] = allocated("c4", "u4", ["gpu-1"])
    gets = reader.gets
    out = await preparer.prepare([ref("c3", "u3"), ref("c4", "u4")])
    assert {u: (o.error, o.kind) for u, o in out.items()} == {
        "u3": (refused("c3", why), "rebuilding"),
        "u4": (refused("c4", why), "rebuilding"),
    }
    assert confirm.calls == 1 and reader.gets == gets  # no claim read, none prepared
    assert preparer.failures.counts == {"rebuilding": 2}
    assert sorted(preparer.checkpoint.claims) == [] and preparer.lost == "missing"


async def test_orphans_the_api_server_does_not_hold_here_are_removed_with_why_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    preparer, reader = await lose_the_checkpoint(tmp_path)
    del reader.objects["c2"]  # deleted while the driver was down
    reader.objects["c1"] = allocated("c1", "u1", ["gpu-0"], reserved=False)  # its pod is gone
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOG):
        assert await rebuild(preparer) == 2
    assert sorted(messages(caplog)) == [  # in the order the specs are listed: any
        (
            "INFO",
            "removed the CDI spec of claim u1, prepared before the checkpoint was lost: claim default/c1 is "
            "not reserved for any pod (status.reservedFor is empty)",
        ),
        (
            "INFO",
            "removed the CDI spec of claim u2, prepared before the checkpoint was lost: the API server has "
            "no claim with this UID allocated on this node",
        ),
    ]
    assert preparer.settled == {"removed": 2}
    assert (preparer.orphans, preparer.orphan_sharing, preparer.lost) == ({}, {}, None)
    assert specs(tmp_path) == [] and preparer.checkpoint.claims == {}

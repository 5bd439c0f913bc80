"""What every Prepare/Unprepare call is screened for (no UID, a UID twice, more claims than a kubelet
sends), that every claim of any call is answered exactly once, and that a bad call's failures are counted
and logged as one line."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubegpu.dra.claim_calls import ClaimRef, Failure, FailureCounts, screen, too_many
from tests.dra.test_prepare import allocated, make, ref


def test_no_uid_and_a_uid_twice_are_refused_each_once() -> None:
    refused = screen(
        [ClaimRef("default", "u1", "a"), ClaimRef("default", "u1", "b"), ClaimRef("ns", "", "c\nforged")]
    )
    assert refused == {
        "u1": Failure(
            "duplicate",
            "claim UID u1 appears 2 times in one call (claim default/a, claim default/b); send each claim "
            "once",
        ),
        "": Failure("no-uid", "claim ns/'c\\nforged' has no UID; send the claim's metadata.uid"),
    }


def test_a_call_over_the_limit_is_refused_whole_and_one_at_the_limit_is_not() -> None:
    assert too_many(128) is None
    assert too_many(129) == (
        "the call names 129 claims, more than the 128 one call may hold (a kubelet sends one pod's claims "
        "for a driver per call); no claim of it was handled"
    )


def test_failures_are_counted_by_kind_and_logged_once_per_call(caplog: pytest.LogCaptureFixture) -> None:
    counts = FailureCounts(logging.getLogger("test.failures"))
    failures = {f"u{i}": Failure("gone", f"claim default/c{i} not found") for i in range(1000)}
    failures["x"] = Failure("api", "cannot read claim default/x")
    with caplog.at_level(logging.WARNING):
        for _ in range(10):
            counts.report("NodePrepareResources", 1002, failures)
    assert counts.counts == {"gone": 10_000, "api": 10}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 5  # five a minute, the rest held back
    assert lines[0] == (
        "NodePrepareResources: 1001 of 1002 claim(s) failed (api 1, gone 1000); the first: claim default/c0 "
        "not found"
    )


uids = st.sampled_from(["u1", "u2", "u3", "", "gone"])
names = st.sampled_from(["c1", "c2", "c3", "x"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(uids, names), max_size=6), st.booleans())
async def test_every_claim_of_any_call_is_answered_once_and_no_device_twice(
    tmp_path_factory: pytest.TempPathFactory, claims: list[tuple[str, str]], unprepare_first: bool
) -> None:
    preparer, reader = make(Path(tmp_path_factory.mktemp("calls")))
    for i, device in ((1, "gpu-0"), (2, "gpu-0"), (3, "gpu-1")):  # c1 and c2 want the same GPU
        reader.objects[f"c{i}"] = allocated(f"c{i}", f"u{i}", [device])
    refs = [ClaimRef("default", uid, name) for uid, name in claims]
    if unprepare_first:
        assert set(await preparer.unprepare(refs)) == {r.uid for r in refs}
    out = await preparer.prepare(refs)
    assert set(out) == {r.uid for r in refs}
    for uid, outcome in out.items():
        assert bool(outcome.error) != bool(outcome.devices)
        if outcome.devices:  # only a claim named once, under its own name, is prepared
            assert [(r.uid, r.name) for r in refs if r.uid == uid] == [(uid, f"c{uid[1]}")]
    held = [d.device for c in preparer.checkpoint.claims.values() for d in c.devices]
    assert len(held) == len(set(held))
    assert sorted(
        p.name for p in (preparer.specs.root.iterdir() if preparer.specs.root.exists() else [])
    ) == sorted(f"k8s.gpu.nvidia.com-claim_{uid}.json" for uid in preparer.checkpoint.claims)


async def test_unprepare_checks_namespace_and_name_and_keeps_the_claim(tmp_path: Path) -> None:
    preparer, reader = make(tmp_path)
    reader.objects["c"] = allocated("c", "u1", ["gpu-0"])
    await preparer.prepare([ref("c", "u1")])
    answer = await preparer.unprepare([ClaimRef("other", "u1", "c"), ClaimRef("default", "u9", "never")])
    assert answer == {
        "u1": "claim other/c: UID u1 belongs to claim default/c on this node, not to this one; nothing was "
        "unprepared",
        "u9": "",
    }
    assert list(preparer.checkpoint.claims) == ["u1"]
    assert (tmp_path / "cdi" / "k8s.gpu.nvidia.com-claim_u1.json").exists()
    wrong = await preparer.prepare([ClaimRef("default", "u1", "d")])
    assert wrong["u1"].error == (
        "claim default/d: UID u1 belongs to claim default/c on this node, not to this one; nothing was "
        "prepared"
    )

"""A restarted driver reads each device's share ID back from its checkpoint (ConsumableShares): a device held
as a share by a claim prepared before the restart is still shared with a claim of the same config, and one
held whole is still refused to any other claim; Unprepare after the restart leaves the other share's
device alone."""

from __future__ import annotations

import json
from pathlib import Path

from kubegpu.settings.feature_gates import parse_feature_gates
from tests.dra.test_prepare import make, ref
from tests.dra.test_prepare_shares import shared_claim

GATES = parse_feature_gates("ConsumableShares=true")


def shares_on_disk(tmp_path: Path) -> dict[str, list[str | None]]:
    """Each claim's share IDs as the checkpoint file holds them."""
    raw = json.loads((tmp_path / "plugin" / "checkpoint.json").read_text())
    return {
        c["uid"]: [d["share_id"] for d in c["devices"]] for c in json.loads(raw["data"])["preparedClaims"]
    }


async def test_a_share_prepared_before_a_restart_is_still_shared_after_it(tmp_path: Path) -> None:
    first, reader = make(tmp_path, gates=GATES, shares="memory")
    reader.objects["a"] = shared_claim("a", "u-a", None, share=True)
    assert (await first.prepare([ref("a", "u-a")]))["u-a"].error == ""
    share = reader.objects["a"]["status"]["allocation"]["devices"]["results"][0]["shareID"]
    assert shares_on_disk(tmp_path) == {"u-a": [share]}

    restarted, reader = make(tmp_path, gates=GATES, shares="memory")
    assert [d.share_id for d in restarted.checkpoint.claims["u-a"].devices] == [share]
    reader.objects["b"] = shared_claim("b", "u-b", None, share=True)
    assert (await restarted.prepare([ref("b", "u-b")]))["u-b"].error == ""
    assert await restarted.unprepare([ref("a", "u-a")]) == {"u-a": ""}
    assert sorted(restarted.checkpoint.claims) == ["u-b"]


async def test_a_device_held_whole_before_a_restart_is_still_refused_after_it(tmp_path: Path) -> None:
    first, reader = make(tmp_path, gates=GATES, shares="memory")
    reader.objects["a"] = shared_claim("a", "u-a", None, share=False)
    assert (await first.prepare([ref("a", "u-a")]))["u-a"].error == ""
    assert shares_on_disk(tmp_path) == {"u-a": [None]}

    restarted, reader = make(tmp_path, gates=GATES, shares="memory")
    reader.objects["b"] = shared_claim("b", "u-b", None, share=True)
    assert (await restarted.prepare([ref("b", "u-b")]))["u-b"].error == (
        "claim default/b: device gpu-0 is already prepared for claim default/a (u-a)"
    )

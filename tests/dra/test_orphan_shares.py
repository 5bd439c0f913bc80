"""Orphans (claims known only from their CDI spec after the checkpoint was lost) with ConsumableShares: once
the API server told an orphan's configs, a new claim shares its device by NVIDIA's rule (the same config) and
is refused otherwise (NVIDIA's conflict text); an orphan whose config is not known, or that holds its device
whole, keeps it to itself. Unpreparing a claim keeps the time slice an orphan still uses, and an orphan's
Unprepare says which of its devices another claim keeps.

The orphans here stay orphans because the rebuild cannot prepare them again: nvidia-smi fails to set their
time slice (a fault injected on purpose), as it may on a node whose GPU is in trouble."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from kubegpu.dra.prepare import Preparer
from kubegpu.dra.rebuild import rebuild
from kubegpu.node.inventory import Inventory
from kubegpu.node.nvml import fake_smi
from tests.builders import make_inventory
from tests.dra.test_prepare import make, ref
from tests.dra.test_rebuild import ListingReader
from tests.dra.test_unprepare_paths import LONG, messages, sharing_claim, time_sliced

SHORT = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}}
LONG_SUMMARY = {"strategy": "TimeSlicing", "interval": "Long"}
MAY_BE_IN_USE = (
    "its CDI spec is on disk but the checkpoint entry is lost and the API server has not yet confirmed the "
    "claim; the kubelet will retry"
)


async def orphans_of(
    root: Path, objects: dict[str, dict[str, Any]], inventory: Inventory | None = None
) -> tuple[Preparer, ListingReader]:
    """Prepare `objects` (by claim name, UID u-<name>), lose the checkpoint (both copies), and start a new
    driver whose rebuild cannot prepare them again (nvidia-smi fails): each is left an orphan."""
    first, reader = make(root, inventory)
    time_sliced(first, root, shares=True)
    reader.objects.update(objects)
    out = await first.prepare([ref(name, f"u-{name}") for name in objects])
    assert {o.error for o in out.values()} == {""}
    for name in ("checkpoint.json", "checkpoint.json.copy"):
        (root / "plugin" / name).unlink()

    preparer, _ = make(root, inventory, intact=False)
    time_sliced(preparer, root, shares=True)
    listing = ListingReader()
    listing.objects = dict(objects)
    preparer.reader = listing
    preparer.confirm = lambda: rebuild(preparer)
    await preparer.recover()
    (root / "smi.log.fail").write_text("Unable to set the time slice: Unknown Error\n")
    assert await rebuild(preparer) == 0
    (root / "smi.log.fail").unlink()
    assert preparer.lost is None and sorted(preparer.orphans) == sorted(f"u-{name}" for name in objects)
    return preparer, listing


async def test_orphans_with_known_configs_share_by_nvidias_rule_and_keep_their_time_slice(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    preparer, listing = await orphans_of(
        tmp_path,
        {
            "o": sharing_claim("o", "u-o", "gpu-0", LONG, share="s-o"),
            "o2": sharing_claim("o2", "u-o2", "gpu-0", LONG, share="s-o2"),
            "w": sharing_claim("w", "u-w", "gpu-1", LONG),  # held whole: its config shares nothing
        },
    )
    assert preparer.orphan_sharing == {"u-o": {"gpu-0": LONG_SUMMARY}, "u-o2": {"gpu-0": LONG_SUMMARY}}

    listing.objects.update(
        n2=sharing_claim("n2", "u-n2", "gpu-0", SHORT, share="s-n2"),
        n3=sharing_claim("n3", "u-n3", "gpu-1", LONG, share="s-n3"),
        n4=sharing_claim("n4", "u-n4", "gpu-0", LONG),
        n1=sharing_claim("n1", "u-n1", "gpu-0", LONG, share="s-n1"),
    )
    out = await preparer.prepare([ref(name, f"u-{name}") for name in ("n2", "n3", "n4", "n1")])
    assert {uid: o.error for uid, o in out.items()} == {
        "u-n2": "unable to prepare claim u-n2: requested device gpu-0 has conflicting configuration with "
        "already prepared claim u-o",
        "u-n3": f"claim default/n3: device gpu-1 may be in use by claim u-w: {MAY_BE_IN_USE}",
        "u-n4": f"claim default/n4: device gpu-0 may be in use by claim u-o: {MAY_BE_IN_USE}",  # whole
        "u-n1": "",
    }

    smi_log = tmp_path / "smi.log"
    before = fake_smi.calls(smi_log)
    caplog.set_level(logging.INFO)
    assert await preparer.unprepare([ref("n1", "u-n1")]) == {"u-n1": ""}
    assert fake_smi.calls(smi_log) == before  # the orphans may still use gpu-0's time slice
    assert "claim default/n1: device gpu-0 is still used by another claim: kept" in messages(caplog)

    # The kubelet prepares o again (its pod still runs): a claim like any other from now on.
    assert (await preparer.prepare([ref("o", "u-o")]))["u-o"].error == ""
    assert preparer.orphans == {"u-o2": ("gpu-0",), "u-w": ("gpu-1",)}
    assert list(preparer.orphan_sharing) == ["u-o2"]

    caplog.clear()
    assert await preparer.unprepare([ref("o2", "u-o2")]) == {"u-o2": ""}
    assert preparer.orphans == {"u-w": ("gpu-1",)} and preparer.orphan_sharing == {}
    assert messages(caplog) == [
        "claim default/o2: device gpu-0 is still used by another claim: kept",
        "unprepared claim default/o2 (u-o2) (known from its CDI spec only)",
    ]


async def test_an_orphan_whose_config_is_unknown_holds_a_shared_device_whatever_the_others_say(
    tmp_path: Path,
) -> None:
    """o's config for gpu-0 is known and the same as n's; z's is not (z holds gpu-2 whole, so the rebuild
    does not learn its configs): n must wait for z to be settled, whichever orphan is looked at first."""
    z = sharing_claim("z", "u-z", "gpu-0", LONG, share="s-z")
    results = z["status"]["allocation"]["devices"]["results"]
    results.append({"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-2"})
    preparer, listing = await orphans_of(
        tmp_path, {"o": sharing_claim("o", "u-o", "gpu-0", LONG, share="s-o"), "z": z}, make_inventory(3)
    )
    assert list(preparer.orphan_sharing) == ["u-o"]
    listing.objects["n"] = sharing_claim("n", "u-n", "gpu-0", LONG, share="s-n")
    out = await preparer.prepare([ref("n", "u-n")])
    assert out["u-n"].error == f"claim default/n: device gpu-0 may be in use by claim u-z: {MAY_BE_IN_USE}"

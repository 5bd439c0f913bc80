"""Claims prepared before the checkpoint was lost: their CDI specs hold their devices until the API server
has settled them (rebuilt as prepared, or their spec removed), Unprepare removes them by UID meanwhile, and
admin access is the one way two claims share a device."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kubegpu.dra.claims import ApiUnavailable
from kubegpu.dra.rebuild import rebuild
from tests.dra.test_prepare import Reader, allocated, make, ref

SPEC = "k8s.gpu.nvidia.com-claim_{}.json"


class ListingReader(Reader):
    """`Reader`, plus the node's claims listed from the same dict, or the API server down."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    def on_node(self, pool: str) -> dict[str, dict[str, Any]]:
        if self.down:
            raise ApiUnavailable(
                "cannot list the resourceclaims: the API server refused the connection (is it down?)",
                "connection",
            )
        return {o["metadata"]["uid"]: o for o in self.objects.values()}


async def lose_the_checkpoint(tmp_path: Path) -> tuple[Any, ListingReader]:
    """Prepare u1 (gpu-0) and u2 (gpu-1), then start a new driver whose checkpoint (both copies) is gone."""
    first, reader = make(tmp_path)
    reader.objects["c1"] = allocated("c1", "u1", ["gpu-0"])
    reader.objects["c2"] = allocated("c2", "u2", ["gpu-1"])
    assert {u: o.error for u, o in (await first.prepare([ref("c1", "u1"), ref("c2", "u2")])).items()} == {
        "u1": "",
        "u2": "",
    }
    for name in ("checkpoint.json", "checkpoint.json.copy"):
        (tmp_path / "plugin" / name).unlink()
    preparer, _ = make(tmp_path, intact=False)
    listing = ListingReader()
    listing.objects = dict(reader.objects)
    preparer.reader = listing
    preparer.confirm = lambda: rebuild(preparer)  # as the daemon wires it
    await preparer.recover()
    return preparer, listing


async def test_an_orphan_spec_holds_its_device_until_the_api_server_settles_it(tmp_path: Path) -> None:
    preparer, reader = await lose_the_checkpoint(tmp_path)
    assert preparer.orphans == {"u1": ("gpu-0",), "u2": ("gpu-1",)}
    assert preparer.orphans_found.is_set()
    reader.objects["thief"] = allocated("thief", "u3", ["gpu-0"])
    reader.down = True
    out = await preparer.prepare([ref("thief", "u3")])
    assert out["u3"].error == (
        "claim default/thief: not prepared yet: the driver's checkpoint was lost and the claims prepared on "
        "this node are not yet rebuilt from the API server (cannot list the resourceclaims: the API server "
        "refused the connection (is it down?)); the kubelet will retry"
    )
    with pytest.raises(ApiUnavailable):
        await rebuild(preparer)
    assert set(preparer.orphans) == {"u1", "u2"}
    reader.down = False
    del reader.objects["c2"]  # deleted meanwhile: its spec goes
    assert await rebuild(preparer) == 2
    assert preparer.orphans == {}
    assert sorted(p.name for p in (tmp_path / "cdi").iterdir()) == [SPEC.format("u1")]
    assert {u: (c.state, c.name) for u, c in preparer.checkpoint.claims.items()} == {
        "u1": ("PrepareCompleted", "c1")
    }
    again = await preparer.prepare([ref("thief", "u3")])
    assert (
        again["u3"].error == "claim default/thief: device gpu-0 is already prepared for claim default/c1 (u1)"
    )
    assert await preparer.unprepare([ref("c1", "u1")]) == {"u1": ""}
    assert list((tmp_path / "cdi").iterdir()) == []


async def test_unprepare_of_an_orphan_removes_its_spec_by_uid(tmp_path: Path) -> None:
    preparer, reader = await lose_the_checkpoint(tmp_path)
    reader.down = True
    assert await preparer.unprepare([ref("c1", "u1")]) == {"u1": ""}
    assert sorted(p.name for p in (tmp_path / "cdi").iterdir()) == [SPEC.format("u2")]
    assert preparer.orphans == {"u2": ("gpu-1",)}


async def test_a_claim_prepared_again_after_the_loss_answers_as_before_and_stops_being_an_orphan(
    tmp_path: Path,
) -> None:
    preparer, reader = await lose_the_checkpoint(tmp_path)
    spec = json.loads((tmp_path / "cdi" / SPEC.format("u1")).read_text())
    reader.objects["c1"] = allocated("c1", "u1", ["gpu-0"])
    out = await preparer.prepare([ref("c1", "u1")])
    assert [(d.device, d.cdi_ids) for d in out["u1"].devices] == [
        ("gpu-0", ("k8s.gpu.nvidia.com/claim=u1-gpu-0",))
    ]
    assert json.loads((tmp_path / "cdi" / SPEC.format("u1")).read_text()) == spec
    assert preparer.orphans == {}  # the Prepare had the API server asked first: u2 was rebuilt too
    assert sorted(preparer.checkpoint.claims) == ["u1", "u2"]


async def test_admin_access_shares_a_device_either_way(tmp_path: Path) -> None:
    preparer, reader = make(tmp_path)
    admin = allocated("admin", "ua", ["gpu-0"])
    admin["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    reader.objects["admin"] = admin
    reader.objects["user"] = allocated("user", "uu", ["gpu-0"])
    reader.objects["other"] = allocated("other", "uo", ["gpu-0"])
    out = await preparer.prepare([ref("admin", "ua"), ref("user", "uu"), ref("other", "uo")])
    assert {u: o.error for u, o in out.items()} == {
        "ua": "",
        "uu": "",  # the admin claim does not hold the device for itself
        "uo": "claim default/other: device gpu-0 is already prepared for claim default/user (uu)",
    }
    restarted, _ = make(tmp_path)  # the admin flag is in the checkpoint
    assert [d.admin_access for d in restarted.checkpoint.claims["ua"].devices] == [True]

"""The plugin's side of DRA coexistence as a pure function: which GPUs (and links) it keeps."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kubegpu.plugin.coexist import describe, leave_to_dra
from kubegpu.settings.dra_selection import parse_gpu_selection
from tests.builders import make_inventory


def test_none_keeps_everything_unchanged() -> None:
    inventory = make_inventory(4)
    left = leave_to_dra(inventory, parse_gpu_selection(""))
    assert left.inventory is inventory and left.gpus == ()


def test_selected_gpus_and_their_links_go() -> None:
    inventory = make_inventory(4, nvlinks={(0, 1): 12, (2, 3): 12})
    left = leave_to_dra(inventory, parse_gpu_selection("1,GPU-00000003-1111-2222-3333-000000000003"))
    assert [g.index for g in left.inventory.gpus] == [0, 2]
    assert [g.index for g in left.gpus] == [1, 3]
    assert [(link.a, link.b) for link in left.inventory.links] == [(0, 2)]
    assert left.inventory.driver_version == "550.90.07" and left.inventory.cuda_driver_version == "12.4"


def test_the_log_line_names_each_gpu() -> None:
    inventory = make_inventory(2)
    selection = parse_gpu_selection("all")
    assert describe(leave_to_dra(inventory, selection).gpus, selection) == (
        "leaving 2 GPU(s) to DRA (KUBEGPU_DRA_GPUS=all): GPU 0 (GPU-00000000-1111-2222-3333-000000000000), "
        "GPU 1 (GPU-00000001-1111-2222-3333-000000000001); the device plugin does not serve them, their MIG "
        "devices or replicas"
    )
    assert describe((), parse_gpu_selection("7")) == (
        "no GPU matches KUBEGPU_DRA_GPUS=7: the device plugin serves every GPU"
    )


@given(st.integers(1, 8), st.sets(st.integers(0, 9)))
def test_every_gpu_is_on_exactly_one_side(count: int, chosen: set[int]) -> None:
    inventory = make_inventory(count)
    left = leave_to_dra(inventory, parse_gpu_selection(",".join(map(str, sorted(chosen)))))
    kept = {g.index for g in left.inventory.gpus}
    gone = {g.index for g in left.gpus}
    assert kept | gone == set(range(count)) and not kept & gone
    assert gone == chosen & set(range(count))
    assert all(link.a in kept and link.b in kept for link in left.inventory.links)

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.inventory import Inventory
from kubegpu.preferred import PreferredAllocationError, preferred_devices, set_score
from kubegpu.resources import build_resources
from tests.builders import gpu_uuid, make_inventory

# DGX-1 (V100) hybrid cube mesh: direct NVLink lane counts.
DGX1 = {
    (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2, (2, 3): 2,
    (2, 6): 1, (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2, (5, 7): 1, (6, 7): 2,
}  # fmt: skip


def _choose(inventory: Inventory, available: list[int], must: list[int], size: int) -> list[int]:
    resource = build_resources(inventory)[0]
    ids = preferred_devices(
        resource, inventory.link_map(), [gpu_uuid(i) for i in available], [gpu_uuid(i) for i in must], size
    )
    return [int(i.split("-")[-1], 16) for i in ids]


def test_pair_on_dgx1_is_a_double_nvlink() -> None:
    chosen = _choose(make_inventory(8, DGX1), list(range(8)), [], 2)
    assert DGX1.get(tuple(sorted(chosen)), 0) == 2


def test_must_include_comes_first() -> None:
    chosen = _choose(make_inventory(8, DGX1), list(range(8)), [5], 2)
    assert chosen[0] == 5 and tuple(sorted(chosen)) in {(1, 5), (5, 6)}


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_optimal_against_exhaustive_oracle_on_dgx1(data: st.DataObject) -> None:
    inventory = make_inventory(8, DGX1)
    links = inventory.link_map()
    available = data.draw(st.lists(st.integers(0, 7), min_size=1, max_size=8, unique=True))
    size = data.draw(st.integers(1, len(available)))
    must = data.draw(st.lists(st.sampled_from(available), max_size=size, unique=True))
    chosen = _choose(inventory, available, must, size)
    assert len(chosen) == size and set(must) <= set(chosen) and set(chosen) <= set(available)
    best = max(
        set_score(list(c), links) for c in itertools.combinations(available, size) if set(must) <= set(c)
    )
    assert set_score(chosen, links) == best


def test_errors() -> None:
    inventory = make_inventory(4)
    resource = build_resources(inventory)[0]
    with pytest.raises(PreferredAllocationError, match="unknown device"):
        preferred_devices(resource, {}, ["GPU-x"], [], 1)
    with pytest.raises(PreferredAllocationError, match="not enough available devices"):
        preferred_devices(resource, {}, [gpu_uuid(0)], [], 2)
    with pytest.raises(PreferredAllocationError, match="must be positive"):
        preferred_devices(resource, {}, [gpu_uuid(0)], [], 0)


def test_gpu_without_link_information_does_not_fail() -> None:
    inventory = make_inventory(4, {(0, 1): 4})
    inventory = Inventory(gpus=inventory.gpus, links=tuple(x for x in inventory.links if 3 not in (x.a, x.b)))
    assert sorted(_choose(inventory, [0, 1, 2, 3], [3], 2)) in ([0, 3], [1, 3], [2, 3])
    assert sorted(_choose(inventory, [0, 1, 2, 3], [], 2)) == [0, 1]

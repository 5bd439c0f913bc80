"""What GetPreferredAllocation remembers per topology (the score matrix, its symmetries, the answers
given) changes no answer, and a question asked again is not searched again."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.allocation import preferred
from kubegpu.allocation.preferred import preferred_devices
from kubegpu.allocation.resources import build_resources
from kubegpu.node.inventory import GpuLink, Inventory, LinkLevel
from tests.builders import make_gpus


def random_inventory(seed: int, count: int = 16) -> Inventory:
    rng = random.Random(seed)
    levels = [LinkLevel.SINGLE, LinkLevel.HOSTBRIDGE, LinkLevel.SYSTEM]
    links = tuple(
        GpuLink(a, b, rng.choice(levels), rng.choice([0, 0, 1, 2, 4]))
        for a in range(count)
        for b in range(a + 1, count)
    )
    return Inventory(gpus=make_gpus(count), links=links)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 3), st.data())
def test_remembered_answers_are_the_searched_ones(seed: int, data: st.DataObject) -> None:
    inventory = random_inventory(seed)
    resource = build_resources(inventory)[0]
    uuids = [g.uuid for g in inventory.gpus]
    available = data.draw(st.lists(st.sampled_from(uuids), min_size=2, max_size=16, unique=True))
    must = data.draw(st.lists(st.sampled_from(available), max_size=2, unique=True))
    size = data.draw(st.integers(max(1, len(must)), len(available)))
    remembered = preferred_devices(resource, inventory.link_map(), available, must, size)
    again = preferred_devices(resource, inventory.link_map(), available, must, size)
    cold = preferred_devices(resource, dataclasses.replace(inventory).link_map(), available, must, size)
    assert remembered == again == cold


def test_a_question_asked_again_is_not_searched_again(monkeypatch: pytest.MonkeyPatch) -> None:
    inventory = random_inventory(7)
    resource = build_resources(inventory)[0]
    uuids = [g.uuid for g in inventory.gpus]
    searched = []
    real = preferred.solve
    monkeypatch.setattr(preferred, "solve", lambda *a, **k: searched.append(1) or real(*a, **k))
    first = preferred_devices(resource, inventory.link_map(), uuids[:12], [], 7)
    assert preferred_devices(resource, inventory.link_map(), uuids[:12], [], 7) == first
    assert len(searched) == 1
    # A new snapshot (a reload, a health change) is a new link map: its topology is built anew.
    preferred_devices(resource, dataclasses.replace(inventory).link_map(), uuids[:12], [], 7)
    assert len(searched) == 2


def test_the_link_map_is_built_once_per_snapshot() -> None:
    inventory = random_inventory(1)
    assert inventory.link_map() is inventory.link_map()
    assert dataclasses.replace(inventory).link_map() is not inventory.link_map()
    assert dataclasses.replace(inventory) == inventory  # what is derived is not part of the value

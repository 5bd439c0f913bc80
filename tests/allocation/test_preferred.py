"""GetPreferredAllocation: the exact search against the exhaustive oracle, tie-breaks, lost GPUs, replicas."""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import Callable
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.allocation.best_set import best_set, exhaustive_best_set
from kubegpu.allocation.preferred import (
    PreferredAllocationError,
    greedy_devices,
    pair_score,
    preferred_devices,
    set_score,
    validate_container_count,
)
from kubegpu.allocation.resources import Device, Resource, build_resources
from kubegpu.node.discovery import discover, nvml_session
from kubegpu.node.inventory import GpuLink, Health, Inventory, LinkLevel
from kubegpu.node.nvml.backend import load_nvml
from kubegpu.settings.env import NvmlSelection
from tests.builders import gpu_uuid, make_gpus, make_inventory

# DGX-1 (V100) hybrid cube mesh: direct NVLink lane counts.
DGX1 = {
    (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2, (2, 3): 2,
    (2, 6): 1, (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2, (5, 7): 1, (6, 7): 2,
}  # fmt: skip


@cache
def profile(name: str) -> Inventory:
    """The real discovery code on a fake node profile: the links a node of that kind reports."""
    backend = load_nvml(NvmlSelection.fake(name))
    with nvml_session(backend.nvml):
        return discover(backend)


def dgx1_with_numa() -> Inventory:
    """DGX-1 lanes on top of its PCIe layout: GPUs 0-3 on CPU 0, 4-7 on CPU 1."""
    inventory = make_inventory(8, DGX1)
    links = tuple(
        GpuLink(x.a, x.b, LinkLevel.NODE if x.a // 4 == x.b // 4 else LinkLevel.SYSTEM, x.nvlinks)
        for x in inventory.links
    )
    return Inventory(gpus=inventory.gpus, links=links)


def generated_16(seed: int) -> Inventory:
    """A 16-GPU node: two 8-GPU NVLink boards (random lane counts) joined over PCIe, or a random mix."""
    rng = random.Random(seed)
    links = []
    for a, b in itertools.combinations(range(16), 2):
        same_board = a // 8 == b // 8
        level = (
            rng.choice(list(LinkLevel)) if seed % 2 else (LinkLevel.NODE if same_board else LinkLevel.SYSTEM)
        )
        lanes = rng.choice([0, 0, 1, 2, 4, 12]) if seed % 2 or same_board else 0
        links.append(GpuLink(a, b, level, lanes))
    return Inventory(gpus=make_gpus(16), links=tuple(links))


def pcie_16() -> Inventory:
    """16 PCIe GPUs: pairs behind one switch, two switches per root port, 8 GPUs per CPU (every part
    interchangeable with its sibling: the case symmetry pruning is for)."""

    def level(a: int, b: int) -> LinkLevel:
        if a // 8 != b // 8:
            return LinkLevel.SYSTEM
        if a // 2 == b // 2:
            return LinkLevel.SINGLE
        return LinkLevel.MULTIPLE if a // 4 == b // 4 else LinkLevel.NODE

    links = tuple(GpuLink(a, b, level(a, b), 0) for a, b in itertools.combinations(range(16), 2))
    return Inventory(gpus=make_gpus(16), links=links)


def symmetric_16(seed: int) -> Inventory:
    """16 GPUs in `parts` identical boards: the same random NVLink lanes and levels inside every board,
    one level between boards (NVSwitch or PCIe halves). Seeds vary the board size (2, 4 or 8), so
    groups of every size are interchangeable, with structure inside them that a swap must keep."""
    rng = random.Random(seed)
    size = (2, 4, 8)[seed % 3]
    inside = {
        p: (rng.choice([LinkLevel.SINGLE, LinkLevel.MULTIPLE, LinkLevel.NODE]), rng.choice([0, 0, 2, 4]))
        for p in itertools.combinations(range(size), 2)
    }
    links = []
    for a, b in itertools.combinations(range(16), 2):
        if a // size == b // size:
            level, lanes = inside[(a % size, b % size)]
        else:
            level, lanes = (LinkLevel.NODE if a // 8 == b // 8 else LinkLevel.SYSTEM), 0
        links.append(GpuLink(a, b, level, lanes))
    return Inventory(gpus=make_gpus(16), links=tuple(links))


TOPOLOGIES = {
    "dgx1": dgx1_with_numa,
    "dgx-a100": lambda: profile("dgx-a100"),
    "hgx-h100": lambda: profile("hgx-h100"),
    "t4-pcie": lambda: profile("t4-pcie"),
    "generated-16-boards": lambda: generated_16(0),
    "generated-16-mixed": lambda: generated_16(1),
    "pcie-16": pcie_16,
    "symmetric-16-pairs": lambda: symmetric_16(0),
    "symmetric-16-quads": lambda: symmetric_16(1),
    "symmetric-16-boards": lambda: symmetric_16(2),
}
SYMMETRIC = ["pcie-16", "symmetric-16-pairs", "symmetric-16-quads", "symmetric-16-boards", "dgx-a100"]


def _score(inventory: Inventory) -> Callable[[int, int], int]:
    links = inventory.link_map()
    return lambda a, b: pair_score(links.get((a, b)))


def _choose(inventory: Inventory, available: list[int], must: list[int], size: int, **kw: str) -> list[int]:
    resource = build_resources(inventory)[0]
    uuids = {g.index: g.uuid for g in inventory.gpus}
    ids = preferred_devices(
        resource, inventory.link_map(), [uuids[i] for i in available], [uuids[i] for i in must], size, **kw
    )
    index = {g.uuid: g.index for g in inventory.gpus}
    return [index[i] for i in ids]


def _oracle(inventory: Inventory, available: list[int], must: list[int], size: int) -> list[int]:
    candidates = sorted(set(available) - set(must))
    return sorted([*must, *exhaustive_best_set(_score(inventory), must, candidates, size - len(must))])


@pytest.mark.parametrize(
    "name",
    ["dgx1", "dgx-a100", "hgx-h100", "t4-pcie", "generated-16-boards", "pcie-16", "symmetric-16-quads"],
)
def test_every_size_on_a_free_node_is_the_oracles_set(name: str) -> None:
    inventory = TOPOLOGIES[name]()
    gpus = [g.index for g in inventory.gpus]
    for size in range(1, len(gpus) + 1):
        assert sorted(_choose(inventory, gpus, [], size)) == _oracle(inventory, gpus, [], size), size


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(TOPOLOGIES)), st.data())
def test_optimal_and_same_tie_break_as_the_oracle_with_random_masks(name: str, data: st.DataObject) -> None:
    inventory = TOPOLOGIES[name]()
    gpus = [g.index for g in inventory.gpus]
    # Up to 12 GPUs free on the 16-GPU nodes: the oracle must stay fast enough for a unit test.
    available = data.draw(
        st.lists(st.sampled_from(gpus), min_size=1, max_size=min(len(gpus), 12), unique=True)
    )
    size = data.draw(st.integers(1, len(available)))
    must = data.draw(st.lists(st.sampled_from(available), max_size=size, unique=True))
    chosen = _choose(inventory, available, must, size)
    assert chosen[: len(must)] == must  # must-include devices first
    assert len(chosen) == size and set(chosen) <= set(available)
    links = inventory.link_map()
    best = max(
        set_score(list(c), links) for c in itertools.combinations(available, size) if set(must) <= set(c)
    )
    assert set_score(chosen, links) == best  # the best score there is
    assert sorted(chosen) == _oracle(inventory, available, must, size)  # and the same tie-break


@settings(max_examples=15, deadline=None)
@given(
    st.lists(st.integers(0, 1900), min_size=120, max_size=120),
    st.lists(st.integers(0, 15), max_size=4, unique=True),
    st.integers(1, 12),
)
def test_best_set_matches_the_oracle_on_arbitrary_16_gpu_weights(
    weights: list[int], must: list[int], extra: int
) -> None:
    pairs = dict(zip(itertools.combinations(range(16), 2), weights, strict=True))

    def score(a: int, b: int) -> int:
        return pairs[(min(a, b), max(a, b))]

    candidates = [i for i in range(16) if i not in must]
    needed = max(0, min(extra, len(candidates)) - len(must))  # 0: nothing to add
    assert best_set(score, must, candidates, needed) == exhaustive_best_set(score, must, candidates, needed)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(SYMMETRIC), st.data())
def test_symmetric_nodes_keep_the_optimum_and_the_lowest_indices(name: str, data: st.DataObject) -> None:
    """Interchangeable groups are pruned: on nodes built of identical parts, with some of them busy and
    some devices required (which breaks some swaps and keeps others), the answer is still the oracle's."""
    inventory = TOPOLOGIES[name]()
    gpus = [g.index for g in inventory.gpus]
    busy = data.draw(st.lists(st.sampled_from(gpus), max_size=len(gpus) - 1, unique=True))
    available = [g for g in gpus if g not in busy]
    if len(available) > 12:  # the oracle must stay fast enough for a unit test: at most C(12, 6) sets
        available = data.draw(st.permutations(available))[:12]
    size = data.draw(st.integers(1, len(available)))
    must = data.draw(st.lists(st.sampled_from(available), max_size=min(size, 3), unique=True))
    chosen = _choose(inventory, available, must, size)
    assert chosen[: len(must)] == must
    assert sorted(chosen) == _oracle(inventory, available, must, size)


def test_pcie_16_sets_written_out() -> None:
    """The 16 x PCIe node's answers, worked out by hand: whole switches first, then whole root ports, and
    of equal ones the lowest indices (the symmetry pruning must keep exactly these)."""
    inventory = pcie_16()
    free = list(range(16))
    assert _choose(inventory, free, [], 2) == [0, 1]
    assert sorted(_choose(inventory, free, [], 3)) == [0, 1, 2]
    assert sorted(_choose(inventory, free, [], 6)) == [0, 1, 2, 3, 4, 5]
    assert sorted(_choose(inventory, free, [], 10)) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    # GPU 9 required: its switch partner 8 first, then the rest of its root port (10, 11).
    assert sorted(_choose(inventory, free, [9], 4)) == [8, 9, 10, 11]
    # With 0-3 busy, CPU 0's other root port (4-7) is taken whole, before either of CPU 1's.
    assert sorted(_choose(inventory, list(range(4, 16)), [], 4)) == [4, 5, 6, 7]


def test_pair_on_dgx1_is_a_double_nvlink() -> None:
    chosen = _choose(make_inventory(8, DGX1), list(range(8)), [], 2)
    assert DGX1.get(tuple(sorted(chosen)), 0) == 2


def test_must_include_comes_first() -> None:
    chosen = _choose(make_inventory(8, DGX1), list(range(8)), [5], 2)
    assert chosen[0] == 5 and tuple(sorted(chosen)) in {(1, 5), (5, 6)}


def test_one_gpu_on_t4_keeps_the_switch_pair_free() -> None:
    # GPUs 0-1 share a PCIe switch; 2 and 3 do not. NVIDIA takes GPU 0 and splits the pair; we take GPU 2,
    # leaving {0, 1, 3} (score 70) rather than {1, 2, 3} (40), so a later 2-GPU pod still gets the switch.
    inventory = profile("t4-pcie")
    assert _choose(inventory, [0, 1, 2, 3], [], 1) == [2]
    assert sorted(_choose(inventory, [0, 1, 3], [], 2)) == [0, 1]


def test_equal_sets_go_to_the_lowest_indices() -> None:
    inventory = make_inventory(6)  # every pair SYSTEM, no NVLink: every set and leftover ties
    assert sorted(_choose(inventory, [5, 3, 1, 4], [], 2)) == [1, 3]


def test_whole_gpus_ignore_the_shared_policy() -> None:
    inventory = dgx1_with_numa()
    assert _choose(inventory, list(range(8)), [], 3, policy="packed") == _choose(
        inventory, list(range(8)), [], 3
    )


def test_errors() -> None:
    inventory = make_inventory(4)
    resource = build_resources(inventory)[0]
    with pytest.raises(PreferredAllocationError, match="unknown device"):
        preferred_devices(resource, {}, ["GPU-x"], [], 1)
    with pytest.raises(
        PreferredAllocationError, match=r"^not enough available devices to satisfy allocation$"
    ):
        preferred_devices(resource, {}, [gpu_uuid(0)], [], 2)
    with pytest.raises(PreferredAllocationError, match="must be positive"):
        preferred_devices(resource, {}, [gpu_uuid(0)], [], 0)


def test_gpu_without_link_information_does_not_fail(caplog: pytest.LogCaptureFixture) -> None:
    inventory = make_inventory(4, {(0, 1): 4})
    inventory = Inventory(gpus=inventory.gpus, links=tuple(x for x in inventory.links if 3 not in (x.a, x.b)))
    with caplog.at_level(logging.WARNING, logger="kubegpu.allocation.preferred"):
        assert sorted(_choose(inventory, [0, 1, 2, 3], [3], 2)) in ([0, 3], [1, 3], [2, 3])
        assert sorted(_choose(inventory, [0, 1, 2, 3], [], 2)) == [0, 1]
    warnings = [r.getMessage() for r in caplog.records if "no link information" in r.getMessage()]
    assert len(warnings) == 1 and "[3]" in warnings[0]  # once per distinct set of GPUs, not per request


def test_lost_gpu_with_no_links_at_all_still_allocates() -> None:
    inventory = Inventory(gpus=make_gpus(8), links=())  # e.g. every link read failed after an XID 79
    assert sorted(_choose(inventory, list(range(8)), [], 3)) == [0, 1, 2]


def test_more_than_16_gpus_runs_with_a_budget_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    rng = random.Random(7)
    pairs = {p: rng.randint(0, 500) for p in itertools.combinations(range(24), 2)}

    def score(a: int, b: int) -> int:
        return pairs[(min(a, b), max(a, b))]

    with caplog.at_level(logging.WARNING, logger="kubegpu.allocation.preferred"):
        chosen = best_set(score, [], list(range(24)), 10, node_budget=3)
    assert len(chosen) == 10 and len(set(chosen)) == 10
    assert "not proven optimal" in caplog.text


# -- replicas and MIG: NVIDIA's greedy policy ----------------------------------------------------------


def replicas(per_gpu: int, gpus: int = 3) -> Resource:
    return Resource(
        "nvidia.com/gpu",
        tuple(
            Device(f"{gpu_uuid(g)}::{r}", gpu_uuid(g), str(g), g, Health.ok(), 0, (f"/dev/nvidia{g}",))
            for g in range(gpus)
            for r in range(per_gpu)
        ),
    )


def _gpus_of(ids: list[str]) -> list[int]:
    return [int(i.split("::")[0].split("-")[-1], 16) for i in ids]


def test_distributed_spreads_and_packed_fills() -> None:
    resource = replicas(4)
    free = [d.id for d in resource.devices]
    assert _gpus_of(preferred_devices(resource, {}, free, [], 3)) == [0, 1, 2]
    assert _gpus_of(preferred_devices(resource, {}, free, [], 3, policy="packed")) == [0, 0, 0]
    assert _gpus_of(preferred_devices(resource, {}, free, [], 3, policy="bogus")) == [0, 1, 2]


def test_distributed_prefers_the_least_used_gpu_and_packed_the_most_used() -> None:
    resource = replicas(4)
    # GPU 0 has 3 replicas in use, GPU 1 one, GPU 2 none.
    free = [d.id for d in resource.devices if d.id not in {f"{gpu_uuid(0)}::{r}" for r in range(3)}]
    free.remove(f"{gpu_uuid(1)}::0")
    # After one pick GPUs 1 and 2 both have one in use: the tie goes to the GPU not yet picked from [v0.20].
    assert _gpus_of(preferred_devices(resource, {}, free, [], 2)) == [2, 1]
    assert _gpus_of(preferred_devices(resource, {}, free, [], 3)) == [2, 1, 2]
    assert _gpus_of(preferred_devices(resource, {}, free, [], 2, policy="packed")) == [0, 1]


def test_required_replicas_come_first_and_count_as_allocated() -> None:
    resource = replicas(2, gpus=2)
    free = [d.id for d in resource.devices]
    must = [f"{gpu_uuid(1)}::1"]
    out = preferred_devices(resource, {}, free, must, 2)
    assert out[0] == must[0] and _gpus_of(out) == [1, 0]


def test_greedy_not_enough_has_nvidias_text() -> None:
    resource = replicas(2, gpus=1)
    with pytest.raises(
        PreferredAllocationError, match=r"^not enough available devices to satisfy allocation$"
    ):
        greedy_devices(resource, [], [resource.devices[0].id], 2, "distributed")


@given(
    st.integers(1, 6),
    st.integers(1, 4),
    st.sampled_from(["distributed", "packed"]),
    st.data(),
)
def test_greedy_balances_or_packs(per_gpu: int, gpus: int, policy: str, data: st.DataObject) -> None:
    resource = replicas(per_gpu, gpus)
    size = data.draw(st.integers(1, per_gpu * gpus))
    out = preferred_devices(resource, {}, [d.id for d in resource.devices], [], size, policy=policy)
    assert len(out) == len(set(out)) == size
    counts = [_gpus_of(out).count(g) for g in range(gpus)]
    if policy == "distributed":
        assert max(counts) - min(counts) <= 1
    else:  # fill GPUs in order: as few GPUs as the size allows
        assert sum(1 for c in counts if c) == -(-size // per_gpu)


def test_mig_devices_take_the_greedy_path() -> None:
    mig = Resource(
        "nvidia.com/mig-1g.5gb",
        tuple(
            Device(f"MIG-{g}-{m}", f"MIG-{g}-{m}", f"{g}:{m}", g, Health.ok(), 0, (f"/dev/nvidia{g}",))
            for g in range(2)
            for m in range(3)
        ),
    )
    assert not mig.is_whole_gpus
    out = preferred_devices(mig, {}, [d.id for d in mig.devices], [], 2)
    assert out == ["MIG-0-0", "MIG-0-1"]  # each MIG device is its own physical device: kubelet order


# -- requests the kubelet never sends: refused, naming the problem ---------------------------------------

PREFIX = 'invalid preferred allocation request for "nvidia.com/gpu": '


def four_gpus() -> Resource:
    return build_resources(make_inventory(4))[0]


def refusal(resource: Resource, available: list[str], must: list[str], size: int) -> str:
    with pytest.raises(PreferredAllocationError) as err:
        preferred_devices(resource, {}, available, must, size)
    return str(err.value)


def test_must_include_outside_the_available_devices_is_refused() -> None:
    # The kubelet always lists must-include devices among the available ones; NVIDIA answers such a request
    # with an empty list, and we used to hand the outside device back as if it were free.
    assert refusal(four_gpus(), [gpu_uuid(0), gpu_uuid(1)], [gpu_uuid(3)], 2) == (
        PREFIX + f"must-include device(s) '{gpu_uuid(3)}' are not among the available devices; "
        "the kubelet lists every must-include device as available"
    )
    replicated = replicas(2, gpus=2)
    outside = f"{gpu_uuid(1)}::1"
    with pytest.raises(PreferredAllocationError, match="not among the available devices"):
        preferred_devices(replicated, {}, [f"{gpu_uuid(0)}::0"], [outside], 1)


@pytest.mark.parametrize("where", ["available", "must-include"])
def test_duplicate_ids_are_refused(where: str) -> None:
    twice = [gpu_uuid(1), gpu_uuid(1)]
    available = [gpu_uuid(0), *twice] if where == "available" else [gpu_uuid(0), gpu_uuid(1)]
    must = twice if where == "must-include" else []
    assert refusal(four_gpus(), available, must, 2) == (
        PREFIX + f"device '{gpu_uuid(1)}' is listed more than once among the {where} devices"
    )


def test_unknown_ids_are_named_quoted_and_cut_never_echoed_whole() -> None:
    huge = "GPU-" + "x" * 20_000
    message = refusal(four_gpus(), [huge, "GPU-a\nFAKE LOG LINE", "b", "c"], [], 1)
    assert message == (
        PREFIX + "4 unknown device(s): 'GPU-" + "x" * 60 + "'... (20004 characters), "
        "'GPU-a\\nFAKE LOG LINE', 'b' and 1 more"
    )


def test_more_ids_than_the_node_has_are_refused_before_looking_at_them() -> None:
    message = refusal(four_gpus(), [f"GPU-{i}" for i in range(10_000)], [], 1)
    assert message == (
        PREFIX + "10000 available devices listed but this node advertises only 4 for nvidia.com/gpu"
    )


def test_more_must_include_devices_than_the_size_is_refused() -> None:
    ids = [gpu_uuid(i) for i in range(4)]
    assert refusal(four_gpus(), ids, ids[:3], 2) == (
        PREFIX + "3 must-include devices do not fit an allocation size of 2"
    )


def test_a_size_beyond_the_available_devices_keeps_nvidias_text() -> None:
    assert (
        refusal(four_gpus(), [gpu_uuid(0), gpu_uuid(1)], [], 3)
        == "not enough available devices to satisfy allocation"
    )  # NVIDIA's text


def test_a_non_positive_size_is_refused() -> None:
    assert refusal(four_gpus(), [gpu_uuid(0)], [], 0) == PREFIX + "allocation size must be positive, got 0"


ids_of_four = st.sampled_from([gpu_uuid(i) for i in range(4)])
any_id = ids_of_four | st.text(max_size=70)


@settings(max_examples=300)
@given(st.lists(any_id, max_size=8), st.lists(any_id, max_size=5), st.integers(-2, 8))
def test_any_request_gets_a_valid_answer_or_a_clear_refusal(
    available: list[str], must: list[str], size: int
) -> None:
    resource = four_gpus()
    try:
        out = preferred_devices(resource, {}, available, must, size)
    except PreferredAllocationError as err:
        text = str(err)
        assert text == "not enough available devices to satisfy allocation" or text.startswith(PREFIX)
        assert text.isprintable() and len(text) < 400
        return
    # Accepted: exactly `size` distinct available devices, every must-include one first.
    assert len(out) == len(set(out)) == size
    assert set(out) <= set(available)
    assert out[: len(must)] == must


# -- scores, warnings and the greedy path's counts, written out --------------------------------------


def test_pair_and_set_scores_are_nvidias_numbers() -> None:
    links = make_inventory(3, {(0, 1): 2}, level=LinkLevel.NODE).link_map()
    assert pair_score(None) == 0  # no link information: unconnected
    assert pair_score(links[(0, 1)]) == 20 + 2 * 100
    assert pair_score(links[(1, 0)]) == 220
    assert set_score([0, 1, 2], links) == 220 + 20 + 20
    assert set_score([0, 2], {}) == 0


def test_two_resources_on_one_link_map_keep_their_own_gpus() -> None:
    # Two resources over disjoint GPUs of one node (e.g. custom names per GPU model) share its link map.
    inventory = make_inventory(4, {(0, 1): 1, (2, 3): 4})
    devices = build_resources(inventory)[0].devices
    low, high = Resource("nvidia.com/low", devices[:2]), Resource("nvidia.com/high", devices[2:])
    links = inventory.link_map()
    assert preferred_devices(low, links, [gpu_uuid(0), gpu_uuid(1)], [], 2) == [gpu_uuid(0), gpu_uuid(1)]
    assert preferred_devices(high, links, [gpu_uuid(3), gpu_uuid(2)], [], 1) == [gpu_uuid(2)]


def test_gpus_without_links_are_said_once_with_the_whole_text(caplog: pytest.LogCaptureFixture) -> None:
    linked, unlinked = make_inventory(2), Inventory(gpus=make_gpus(2), links=())
    with caplog.at_level(logging.WARNING, logger="kubegpu.allocation.preferred"):
        assert _choose(linked, [0, 1], [], 1) == [0]  # every GPU linked: nothing to say, nothing said
        assert caplog.messages == []
        assert _choose(unlinked, [0, 1], [], 1) == [0]
        assert caplog.messages == [
            "no link information for GPU(s) [0, 1] (unreadable or fallen off the bus); scoring them as "
            "unconnected instead of failing the allocation"
        ]
        assert _choose(unlinked, [0, 1], [], 1) == [0]
    assert len(caplog.messages) == 1


def test_a_container_count_over_the_devices_is_refused() -> None:
    validate_container_count(four_gpus(), 4)
    with pytest.raises(PreferredAllocationError) as err:
        validate_container_count(four_gpus(), 5)
    assert str(err.value) == (
        PREFIX
        + "5 container requests but this node advertises only 4 devices for nvidia.com/gpu (the kubelet "
        "sends one per call)"
    )
    empty = Resource("nvidia.com/gpu", ())
    validate_container_count(empty, 1)  # a request of one container always gets an answer or its refusal
    with pytest.raises(
        PreferredAllocationError, match="2 container requests but this node advertises only 0"
    ):
        validate_container_count(empty, 2)


def test_more_must_include_ids_than_the_node_has_are_refused() -> None:
    message = refusal(four_gpus(), [gpu_uuid(0)], [f"GPU-{i}" for i in range(5)], 5)
    assert (
        message == PREFIX + "5 must-include devices listed but this node advertises only 4 for nvidia.com/gpu"
    )


def uneven(free: dict[int, int], total: dict[int, int]) -> tuple[Resource, list[str]]:
    """A resource whose GPUs have different replica counts (`total`: two sharing entries for one name, or
    whole GPUs next to replicas), and the first `free[g]` replicas of each GPU g free."""
    resource = Resource(
        "nvidia.com/gpu",
        tuple(
            Device(f"{gpu_uuid(g)}::{r}", gpu_uuid(g), str(g), g, Health.ok(), 0, (f"/dev/nvidia{g}",))
            for g, count in total.items()
            for r in range(count)
        ),
    )
    return resource, [f"{gpu_uuid(g)}::{r}" for g, count in free.items() for r in range(count)]


def test_greedy_counts_what_is_in_use_per_gpu_whatever_its_replica_count() -> None:
    # GPU 0: 4 replicas, all free (0 in use); GPU 1: 2 replicas, 1 free (1 in use).
    resource, free = uneven({0: 4, 1: 1}, {0: 4, 1: 2})
    assert _gpus_of(preferred_devices(resource, {}, free, [], 1)) == [0]
    # GPU 0: 4 replicas, 2 free (2 in use); GPU 1: 1 replica, free (0 in use).
    resource, free = uneven({0: 2, 1: 1}, {0: 4, 1: 1})
    assert _gpus_of(preferred_devices(resource, {}, free, [], 1)) == [1]
    assert _gpus_of(preferred_devices(resource, {}, free, [], 1, policy="packed")) == [0]


def test_distributed_counts_each_pick_as_one_more_in_use() -> None:
    # GPU 0 has none in use, GPU 1 two: GPU 0 takes two picks before the tie (2 and 2), which goes to
    # GPU 1, picked from less often.
    resource, free = uneven({0: 4, 1: 2}, {0: 4, 1: 4})
    assert _gpus_of(preferred_devices(resource, {}, free, [], 3)) == [0, 0, 1]
    # GPU 1 one in use: 0, then the tie (1 and 1) to GPU 1, then 0, then the tie (2 and 2) to GPU 1 again,
    # picked from once against GPU 0's twice.
    resource, free = uneven({0: 4, 1: 3}, {0: 4, 1: 4})
    assert _gpus_of(preferred_devices(resource, {}, free, [], 4)) == [0, 1, 0, 1]

"""Interchangeable groups of GPUs: which swaps a node has, which a request keeps, what they prune."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.allocation.best_set import _Objective, _Search, exhaustive_best_set
from kubegpu.allocation.symmetry import group_swaps, lex_leader_pool, node_swaps, request_swaps

# Scores as preferred.py gives them: one switch 50, several switches 40, same CPU 20, across CPUs 10.
SWITCH, SWITCHES, CPU, ACROSS = 50, 40, 20, 10


def pcie_16() -> list[list[int]]:
    """Pairs behind one switch, two switches per root port, 8 GPUs per CPU."""
    w = [[0] * 16 for _ in range(16)]
    for a, b in itertools.combinations(range(16), 2):
        if a // 8 != b // 8:
            x = ACROSS
        elif a // 2 == b // 2:
            x = SWITCH
        else:
            x = SWITCHES if a // 4 == b // 4 else CPU
        w[a][b] = w[b][a] = x
    return w


PCIE_16_SWAPS = {
    ((0, 8), (1, 9), (2, 10), (3, 11), (4, 12), (5, 13), (6, 14), (7, 15)),  # the two CPUs' halves
    ((0, 4), (1, 5), (2, 6), (3, 7)),  # CPU 0's two root ports
    ((8, 12), (9, 13), (10, 14), (11, 15)),  # CPU 1's
    ((0, 2), (1, 3)),  # the switches under each root port
    ((4, 6), (5, 7)),
    ((8, 10), (9, 11)),
    ((12, 14), (13, 15)),
}


def test_pcie_16_has_a_swap_at_every_level_but_single_gpus() -> None:
    assert set(group_swaps(pcie_16(), [0] * 16)) == PCIE_16_SWAPS
    assert set(node_swaps(pcie_16())) == PCIE_16_SWAPS  # remembered, and the same


def test_scores_with_the_required_devices_break_the_swaps_that_move_them() -> None:
    # A required device linked better to GPUs 0 and 1 than to the rest: no swap may move 0 or 1.
    wr = [60 if a in (0, 1) else 0 for a in range(16)]
    assert set(group_swaps(pcie_16(), wr)) == {
        ((8, 12), (9, 13), (10, 14), (11, 15)),
        ((4, 6), (5, 7)),
        ((8, 10), (9, 11)),
        ((12, 14), (13, 15)),
    }


def test_groups_must_match_inside_not_just_in_size() -> None:
    # Two quads on one NVSwitch-less board: GPUs 0-3 a ring of NVLinks, 4-7 a chain: no swap between them.
    w = [[0] * 8 for _ in range(8)]
    for a, b in itertools.combinations(range(8), 2):
        w[a][b] = w[b][a] = CPU
    for a, b in [(0, 1), (1, 2), (2, 3), (3, 0), (4, 5), (5, 6), (6, 7)]:
        w[a][b] = w[b][a] = 120
    assert group_swaps(w, [0] * 8) == ()


def test_a_request_keeps_the_swaps_its_availability_and_required_devices_leave_intact() -> None:
    swaps = tuple(sorted(PCIE_16_SWAPS))
    # GPU 3 busy: every swap that moves it is gone; the others are renumbered over the 15 candidates.
    candidates = [g for g in range(16) if g != 3]
    assert set(request_swaps(swaps, candidates, [])) == {
        ((7, 11), (8, 12), (9, 13), (10, 14)),  # CPU 1's root ports: GPUs 8-11 <-> 12-15
        ((3, 5), (4, 6)),  # GPUs 4, 5 <-> 6, 7
        ((7, 9), (8, 10)),
        ((11, 13), (12, 14)),
    }
    # GPU 9 required (not a candidate): a swap must map the required devices onto themselves too.
    candidates = [g for g in range(16) if g != 9]
    assert set(request_swaps(swaps, candidates, [9])) == {
        ((0, 4), (1, 5), (2, 6), (3, 7)),
        ((0, 2), (1, 3)),
        ((4, 6), (5, 7)),
        ((11, 13), (12, 14)),  # GPUs 12, 13 <-> 14, 15
    }
    # GPU 9 required and 11 busy: swapping them would turn a required device into a busy one.
    candidates = [g for g in range(16) if g not in (9, 11)]
    assert set(request_swaps(swaps, candidates, [9])) == {
        ((0, 4), (1, 5), (2, 6), (3, 7)),
        ((0, 2), (1, 3)),
        ((4, 6), (5, 7)),
        ((10, 12), (11, 13)),  # GPUs 12, 13 <-> 14, 15
    }


def test_lex_leader_drops_mirror_images_and_keeps_the_lower_one() -> None:
    swap = (((0, 2), (1, 3)),)  # switch {0, 1} <-> switch {2, 3}
    # Taking from the higher switch while the lower one's first GPU is out: the mirror set is better.
    assert lex_leader_pool(swap, False, 4, chosen=[2], pool=[1, 3]) is None
    # GPU 0 out: GPU 2 must stay out too; GPUs 1 and 3 are still open.
    assert lex_leader_pool(swap, False, 4, chosen=[], pool=[1, 2, 3]) == [1, 3]
    # GPU 0 taken: nothing is decided yet about the rest.
    assert lex_leader_pool(swap, False, 4, chosen=[0], pool=[1, 2, 3]) == [1, 2, 3]
    # Searching the set left out, the order flips: leaving out 0 but not 2 loses to its mirror.
    assert lex_leader_pool(swap, True, 4, chosen=[0], pool=[1, 3]) is None
    # Leaving out 2 decides nothing yet: 0 may be left out as well, and then the next pair decides.
    assert lex_leader_pool(swap, True, 4, chosen=[2], pool=[0, 1, 3]) == [0, 1, 3]
    # Keeping 2 (not left out) forces 0 to be kept too.
    assert lex_leader_pool(swap, True, 4, chosen=[], pool=[0, 1, 3]) == [1, 3]


def symmetric_weights(seed: int) -> list[list[int]]:
    """16 GPUs in identical boards of 2, 4 or 8 (one random NVLink pattern inside, replicated), boards
    joined on one CPU or across CPUs: interchangeable groups at two or three levels."""
    rng = random.Random(seed)
    size = (2, 4, 8)[seed % 3]
    inside = {
        p: rng.choice([SWITCHES, SWITCH, 100, 240, 420]) for p in itertools.combinations(range(size), 2)
    }
    w = [[0] * 16 for _ in range(16)]
    for a, b in itertools.combinations(range(16), 2):
        between = CPU if a // 8 == b // 8 else ACROSS  # boards on one CPU, or across CPUs
        w[a][b] = w[b][a] = inside[(a % size, b % size)] if a // size == b // size else between
    return w


def _search_from_the_worst_start(w: list[list[int]], wr: list[int], needed: int) -> tuple[int, ...]:
    """The greedy start is often the optimum already, which would hide a wrong prune: start the search
    from the lowest-scoring set instead, so it has to reach the best set through the symmetry pruning."""
    objective = _Objective.build(w, wr)
    left_out = needed > 16 - needed
    searched = objective.complement() if left_out else objective
    k = min(needed, 16 - needed)
    search = _Search(searched, k, None, group_swaps(w, wr))
    worst = min(itertools.combinations(range(16), k), key=lambda c: searched.value(list(c)))
    search.best_value, search.best = searched.value(list(worst)), list(worst)
    found = set(search.run())
    return tuple(i for i in range(16) if (i in found) != left_out)


@pytest.mark.parametrize("seed", range(6))
def test_the_pruned_search_from_a_poor_start_ends_at_the_oracles_set(seed: int) -> None:
    w = symmetric_weights(seed)
    for needed in range(1, 16):
        want = exhaustive_best_set(lambda a, b: w[a][b], [], list(range(16)), needed)
        assert _search_from_the_worst_start(w, [0] * 16, needed) == want, needed


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 15))
def test_with_a_required_device_too(seed: int, needed: int) -> None:
    w = symmetric_weights(seed)
    wr = [w[0][a] if a != 0 else 0 for a in range(16)]  # a required device beside GPU 0: some swaps break

    def score(a: int, b: int) -> int:
        return w[a][b] if a < 16 and b < 16 else wr[a if b == 16 else b]

    assert _search_from_the_worst_start(w, wr, needed) == exhaustive_best_set(
        score, [16], list(range(16)), needed
    )

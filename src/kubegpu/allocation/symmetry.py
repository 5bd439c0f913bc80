"""Interchangeable groups of GPUs, so the exact search can skip sets that are mirror images of each other.

Nodes are built from identical parts: two GPUs behind one PCIe switch, two switches under one root port,
two NUMA halves. Swapping two such parts (each GPU with its counterpart) changes no set's own or leftover
score, only which indices it holds, and the tie-break prefers the lower indices. So among sets that a swap
maps into each other only one can be the best: the one holding the lower position where they first differ
(the lex leader). The search drops every branch whose sets all lose that comparison, and every GPU whose
taking would make them lose it.

The parts are found as the topology's tree: in a group of GPUs, the links better than the group's weakest
one split it into parts (connected components) that reach each other by that weakest score only, and each
part splits again the same way. Every part is then linked to everything outside it by one score per
outside GPU, so two parts of one group are interchangeable when the map between them by rank of index
keeps every score inside them and every score with the required devices. Single GPUs are left to the
search's twin rule, which covers them.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from itertools import compress, pairwise
from operator import itemgetter
from typing import Any

# One swap: its position pairs (p, q), p < q, ordered by p, the order in which the tie-break compares.
Swap = tuple[tuple[int, int], ...]

UNDECIDED = -1


def group_swaps(w: list[list[int]], wr: list[int]) -> tuple[Swap, ...]:
    """Swaps of interchangeable groups of two or more positions, given pair scores `w` (symmetric, 0 on the
    diagonal) and scores with the required devices `wr`; each maps a group onto the next interchangeable
    one. About 16 x 16 comparisons for 16 GPUs: it runs for every search that branches."""
    swaps: list[Swap] = []
    stack = [list(range(len(wr)))]
    while stack:
        parts = _parts(w, stack.pop())
        if len(parts) == 1:
            continue  # nothing splits it: no smaller interchangeable groups inside
        classes: list[tuple[itemgetter[Any], list[list[int]]]] = []
        for part in parts:
            if len(part) == 1:
                continue  # single GPUs: the twin rule's
            stack.append(part)
            get = itemgetter(*part)
            for first, members in classes:
                if _interchangeable(w, wr, first, members[0], get, part):
                    members.append(part)
                    break
            else:
                classes.append((get, [part]))
        for _, members in classes:
            swaps += (_swap(a, b) for a, b in pairwise(members))
    return tuple(swaps)


def _parts(w: list[list[int]], group: list[int]) -> list[list[int]]:
    """The connected components of `group` over its links better than its weakest, by lowest position.

    Written for C-level loops (itemgetter, compress, set unions): this runs per request."""
    if len(group) < 2:
        return [group]
    get = itemgetter(*group)
    rows = [get(w[a]) for a in group]  # each row's scores within the group, in the group's order
    weakest = min(min(row[:k] + row[k + 1 :]) for k, row in enumerate(rows))
    above = functools.partial(operator.lt, weakest)
    strong = {a: set(compress(group, map(above, row))) for a, row in zip(group, rows, strict=True)}
    parts: list[list[int]] = []
    unseen = set(group)
    for a in group:  # in order, so parts come by lowest member
        if a not in unseen:
            continue
        part, frontier = {a}, strong[a] - {a}
        while frontier:
            part |= frontier
            frontier = set().union(*map(strong.__getitem__, frontier)) - part
        unseen -= part
        parts.append(sorted(part))
    return parts


def _interchangeable(
    w: list[list[int]],
    wr: list[int],
    get_a: itemgetter[Any],
    a: list[int],
    get_b: itemgetter[Any],
    b: list[int],
) -> bool:
    """Whether mapping `a` onto `b` by rank keeps every score inside them and with the required devices."""
    return (
        len(a) == len(b)
        and get_a(wr) == get_b(wr)
        and all(get_a(w[i]) == get_b(w[j]) for i, j in zip(a, b, strict=True))
    )


def _swap(a: list[int], b: list[int]) -> Swap:
    return tuple(sorted((min(i, j), max(i, j)) for i, j in zip(a, b, strict=True)))


def lex_leader_pool(
    swaps: tuple[Swap, ...], left_out: bool, n: int, chosen: list[int], pool: list[int]
) -> list[int] | None:
    """The members of `pool` still worth deciding on, or None when no completion can be the best.

    `chosen` are taken, `pool` undecided, every other position is out. `left_out`: the search is for the
    set left out, whose tie-break runs the other way (the lower position is better left in).
    """
    state = [0] * n
    for v in chosen:
        state[v] = 1
    for v in pool:
        state[v] = UNDECIDED
    lead = 0 if left_out else 1  # what the lower position of a pair holds in the better of two mirror sets
    trail = 1 - lead
    dropped = False
    changed = True
    while changed:
        changed = False
        for swap in swaps:
            for p, q in swap:
                xp, xq = state[p], state[q]
                if xp == UNDECIDED:
                    if xq == lead and lead == 0:
                        state[p] = 0  # q out, so p must be out too, or the mirror set wins here
                        changed = dropped = True
                        continue
                    break
                if xq == UNDECIDED:
                    if xp == trail and trail == 0:
                        state[q] = 0  # p out, so q must be out too, or the mirror set wins here
                        changed = dropped = True
                        continue
                    break
                if xp != xq:
                    if xp == lead:
                        break  # this set is the better of the two
                    return None  # its mirror is better, whatever is taken of the rest
    return [v for v in pool if state[v] == UNDECIDED] if dropped else pool


# The node's swaps depend only on its links: found once per distinct score matrix, then filtered per request.
_NODE_SWAPS: dict[tuple[tuple[int, ...], ...], tuple[Swap, ...]] = {}
NODE_SWAPS_KEPT = 8  # distinct matrices remembered (a node has one; a rediscovery may bring another)


def node_swaps(scores: list[list[int]]) -> tuple[Swap, ...]:
    """`group_swaps` of a whole node (nothing required yet), remembered by its score matrix."""
    key = tuple(map(tuple, scores))
    swaps = _NODE_SWAPS.get(key)
    if swaps is None:
        if len(_NODE_SWAPS) >= NODE_SWAPS_KEPT:
            _NODE_SWAPS.clear()
        swaps = _NODE_SWAPS[key] = group_swaps(scores, [0] * len(scores))
    return swaps


def request_swaps(
    swaps: tuple[Swap, ...], candidates: Sequence[int], required: Sequence[int]
) -> tuple[Swap, ...]:
    """The node's swaps that still hold for one request, over the positions of `candidates`.

    `candidates` and `required` are node positions, `candidates` sorted. A swap holds when it maps the
    candidates onto themselves and the required devices onto themselves: then it keeps every score
    among the candidates and each one's score with the required devices.
    """
    where = {p: k for k, p in enumerate(candidates)}
    held = set(required)
    out = []
    for swap in swaps:
        pairs = []
        for p, q in swap:
            a, b = where.get(p), where.get(q)
            if (a is None) != (b is None) or (p in held) != (q in held):
                break
            if a is not None and b is not None:
                pairs.append((a, b))
        else:
            if pairs:
                out.append(tuple(pairs))
    return tuple(out)

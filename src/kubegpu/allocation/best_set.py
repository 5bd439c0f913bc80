"""The exact search for the best set of GPUs: branch and bound on one objective, and the exhaustive oracle.

The preference between sets (`selection_key`: own score, then leftover score, then index order) is
folded into one integer per set (`_Objective`), so the optimum is unique; the search starts from a greedy
set improved by swaps, prunes with a bound that credits each GPU half of its best partners' scores,
searches the smaller side (the GPUs to take or the GPUs to leave out), and takes GPUs with identical
links (twins: one PCIe switch, one NVSwitch and NUMA node) in order. Larger interchangeable groups (two
switch pairs under one root port, two NUMA halves: `symmetry.py`) are pruned the same way: of sets that a
swap of such groups maps into each other only the lowest-indexed can win, so the others are skipped.
Twins and groups are worked out only once the search branches. Up to 16 candidates it always runs to the
proven optimum; beyond that it has a node budget, and a result not proven optimal is logged. The tests and
the benchmark hold `best_set` to the oracle, `exhaustive_best_set`.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kubegpu.allocation.symmetry import Swap, group_swaps, lex_leader_pool

log = logging.getLogger(__name__)

# Up to this many candidate GPUs the search always runs to the proven optimum.
EXACT_CANDIDATE_LIMIT = 16
# Beyond it the search stops after this many nodes and returns the best set found so far (logged).
SEARCH_NODE_BUDGET = 50_000


def selection_key(
    score: Callable[[int, int], int], required: Sequence[int], chosen: Sequence[int], leftover: Sequence[int]
) -> tuple[int, int, tuple[int, ...]]:
    """The order of preference between candidate sets, largest first (the rule in `preferred`'s docstring)."""
    own = [*required, *chosen]
    own_score = sum(score(a, b) for a, b in itertools.combinations(own, 2))
    leftover_score = sum(score(a, b) for a, b in itertools.combinations(leftover, 2))
    return own_score, leftover_score, tuple(-i for i in sorted(chosen))


def exhaustive_best_set(
    score: Callable[[int, int], int], required: Sequence[int], candidates: Sequence[int], needed: int
) -> tuple[int, ...]:
    """The oracle: try every set. The tests and the benchmark hold `best_set` to it."""
    best_key: tuple[int, int, tuple[int, ...]] | None = None
    best: tuple[int, ...] = ()
    for combo in itertools.combinations(sorted(candidates), needed):
        taken = set(combo)
        key = selection_key(score, required, combo, [c for c in candidates if c not in taken])
        if best_key is None or key > best_key:
            best_key, best = key, combo
    return best


@dataclass(frozen=True, slots=True)
class _Objective:
    """`selection_key` folded into one integer per set: F(S) = sum lin[i] + sum quad[i][j], i, j in S.

    With w the pair scores among candidates, wr[i] the score of candidate i with the required devices and
    deg[i] the sum of w[i][j] over all candidates j:
      own(S)      = score(required) + sum wr[i] + sum w[i][j]
      leftover(S) = score(candidates) - sum deg[i] + sum w[i][j]
      lex(S)      = sum 2^(n-1-i)   (larger for the lexicographically smaller set of positions)
    F = M1 * own + M2 * leftover + lex (constants dropped), with M2 > every lex and M1 > M2 * every leftover,
    so F orders sets exactly as `selection_key` does, and no two sets tie.
    """

    lin: list[int]
    quad: list[list[int]]
    # The pair scores and the scores with the required devices, for the search's symmetry pruning.
    w: list[list[int]]
    wr: list[int]
    left_out: bool = False  # the objective of the set left out (`complement`)

    @classmethod
    def build(cls, w: list[list[int]], wr: list[int]) -> _Objective:
        n = len(wr)
        degree = [sum(row) for row in w]
        m2 = 1 << n
        m1 = m2 * (sum(degree) // 2 + 1)
        lin = [m1 * wr[i] - m2 * degree[i] + (1 << (n - 1 - i)) for i in range(n)]
        quad = [[(m1 + m2) * x for x in row] for row in w]
        return cls(lin, quad, w, wr)

    def complement(self) -> _Objective:
        """The same objective over the set left out: F(C - T) = F(C) + sum lin'[t] + sum quad[t][u].

        Choosing 12 of 16 is then a search for the best 4 to leave out, which is much smaller.
        """
        lin = [-(x + sum(row)) for x, row in zip(self.lin, self.quad, strict=True)]
        return _Objective(lin, self.quad, self.w, self.wr, not self.left_out)

    def pairs(self, members: Sequence[int]) -> int:
        return sum(self.quad[a][b] for a, b in itertools.combinations(members, 2))

    def value(self, members: Sequence[int]) -> int:
        return sum(self.lin[i] for i in members) + self.pairs(members)


def _twins(w: list[list[int]], wr: list[int]) -> list[frozenset[int]]:
    """Per position, its twins: the positions with the same pair scores to every other candidate and to the
    required devices (GPUs behind one switch, on one NVSwitch and NUMA node). Swapping twins changes only
    the lex term, so a set holding a twin but not a better one (higher lin) is never the best."""
    classes: dict[tuple[int, tuple[int, ...]], list[list[int]]] = {}
    for i, row in enumerate(w):
        # Twins have the same multiset of weights: only those are compared in full.
        shape = classes.setdefault((wr[i], tuple(sorted(row))), [])
        for members in shape:
            if _same_but_for_each_other(w, i, members[0]):
                members.append(i)
                break
        else:
            shape.append([i])
    of = [frozenset[int]()] * len(wr)
    for shape in classes.values():
        for members in shape:
            for i in members:
                of[i] = frozenset(members) - {i}
    return of


def _same_but_for_each_other(w: list[list[int]], i: int, j: int) -> bool:
    a, b = list(w[i]), list(w[j])
    a[i], b[j] = b[i], a[j]  # the pair's own entries: w[i][j] on both sides, the diagonal aside
    return a == b


def _pair_matrix(score: Callable[[int, int], int], cand: Sequence[int]) -> list[list[int]]:
    n = len(cand)
    w = [[0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            w[i][j] = w[j][i] = score(cand[i], cand[j])
    return w


def best_set(
    score: Callable[[int, int], int],
    required: Sequence[int],
    candidates: Sequence[int],
    needed: int,
    node_budget: int | None = None,
) -> tuple[int, ...]:
    """The sorted candidates completing `required` to the best set of its size: the oracle's answer.

    Exact branch and bound: `node_budget` None (the default up to EXACT_CANDIDATE_LIMIT candidates) means no
    limit; with a budget the best set found when it runs out is returned, and logged as not proven optimal.
    """
    cand = sorted(candidates)
    wr = [sum(score(a, r) for r in required) for a in cand]
    return tuple(cand[i] for i in sorted(solve(_pair_matrix(score, cand), wr, needed, node_budget)))


def solve(
    w: list[list[int]],
    wr: list[int],
    needed: int,
    node_budget: int | None = None,
    swaps: tuple[Swap, ...] | None = None,
) -> set[int]:
    """The positions of the best `needed` candidates, given pair scores `w` and scores with the required.

    `swaps`: the interchangeable groups among the candidates (`symmetry.request_swaps`); None finds them
    from `w` and `wr` when the search first branches.
    """
    n = len(wr)
    if needed <= 0:
        return set()
    if needed >= n:
        return set(range(n))
    objective = _Objective.build(w, wr)
    if node_budget is None and n > EXACT_CANDIDATE_LIMIT:
        node_budget = SEARCH_NODE_BUDGET
    # Search the smaller side: the set to take, or the set to leave out.
    left_out = needed > n - needed
    search = _Search(
        objective.complement() if left_out else objective, min(needed, n - needed), node_budget, swaps
    )
    found = set(search.run())
    if search.exhausted:
        log.warning(
            "preferred allocation of %d among %d GPUs: search stopped after %d nodes; "
            "returning the best set found, not proven optimal",
            needed,
            n,
            search.nodes,
        )
    return {i for i in range(n) if (i in found) != left_out}


class _Search:
    """Depth-first branch and bound over candidate positions, seeded with greedy + swap local search."""

    def __init__(
        self, objective: _Objective, needed: int, node_budget: int | None, swaps: tuple[Swap, ...] | None
    ) -> None:
        self.f = objective
        self.needed = needed
        self.budget = node_budget
        self.nodes = 0
        self.exhausted = False
        self.swaps = swaps
        self.twins: list[frozenset[int]] | None = None
        self.best_value, self.best = self._incumbent()

    def run(self) -> list[int]:
        n = len(self.f.lin)
        self._dfs(0, [], list(range(n)), list(self.f.lin))
        return self.best

    def _incumbent(self) -> tuple[int, list[int]]:
        """A good first set makes the bound prune early; often it already is the optimum."""
        lin, quad = self.f.lin, self.f.quad
        n = len(lin)
        gain = list(lin)  # F(S + v) - F(S) for v outside S; for v in S, F(S) - F(S - v)
        chosen: list[int] = []
        for _ in range(self.needed):
            v = max((u for u in range(n) if u not in chosen), key=gain.__getitem__)
            chosen.append(v)
            for u in range(n):
                if u != v:
                    gain[u] += quad[v][u]
        improved = True
        while improved:  # best improving swap until none is left: a local optimum
            improved = False
            outside = [u for u in range(n) if u not in chosen]
            delta, i, j = max((gain[j] - gain[i] - quad[i][j], i, j) for i in chosen for j in outside)
            if delta > 0:
                for u in range(n):
                    gain[u] += quad[j][u] - quad[i][u]
                chosen[chosen.index(i)] = j
                improved = True
        return self.f.value(chosen), chosen

    def _dfs(self, value: int, chosen: list[int], pool: list[int], gain: list[int]) -> None:
        if self.exhausted:
            return
        self.nodes += 1
        if self.budget is not None and self.nodes > self.budget:
            self.exhausted = True
            return
        r = self.needed - len(chosen)
        if r == len(pool):  # everything left must be taken
            self._offer(value + sum(gain[u] for u in pool) + self.f.pairs(pool), chosen + pool)
            return
        if r == 1:  # exact: the best single addition
            u = max(pool, key=gain.__getitem__)
            self._offer(value + gain[u], [*chosen, u])
            return
        if r == 2:  # exact: the best pair, cheaper than bounding
            quad = self.f.quad
            best, a, b = max(
                (gain[a] + gain[b] + quad[a][b], a, b) for i, a in enumerate(pool) for b in pool[i + 1 :]
            )
            self._offer(value + best, [*chosen, a, b])
            return
        if self.swaps is None:  # found once the search branches: most requests never get here
            self.swaps = group_swaps(self.f.w, self.f.wr)
        if self.swaps:
            kept = lex_leader_pool(self.swaps, self.f.left_out, len(self.f.lin), chosen, pool)
            if kept is None or len(kept) < r:
                return  # only sets a swap of interchangeable GPUs improves on: none of them is the best
            pool = kept
        pool = self._viable(value, pool, gain, r)
        if len(pool) < r:
            return  # no completion beats the incumbent (ties are impossible: F is injective)
        if len(pool) == r:
            self._offer(value + sum(gain[v] for v in pool) + self.f.pairs(pool), chosen + pool)
            return
        u = pool[0]  # the best-ranked member, so also the best of its twins in the pool
        rest = pool[1:]
        row = self.f.quad[u]
        taken = list(gain)
        for v in rest:
            taken[v] += row[v]
        self._dfs(value + gain[u], [*chosen, u], rest, taken)
        # Without u, none of its (worse) twins either: swapping one for u would be strictly better.
        if self.twins is None:  # found once the search branches: most requests never get here
            self.twins = _twins(self.f.w, self.f.wr)
        twins = self.twins[u]
        self._dfs(value, chosen, [v for v in rest if v not in twins] if twins else rest, gain)

    def _viable(self, value: int, pool: list[int], gain: list[int], r: int) -> list[int]:
        """The members of the pool that can still be in a completion better than the incumbent, best first.

        A member outside the top r - 1 whose bound cannot close the gap to the incumbent is in no better
        completion. Dropping members tightens the others' bounds (fewer partners), so repeat until stable.
        """
        while True:
            ranked = sorted(self._bounds(pool, gain, r), reverse=True)
            if len(ranked) < r:
                return []
            slack = 2 * (self.best_value - value) - sum(b for b, _ in ranked[: r - 1])
            viable = [v for b, v in ranked if b > slack]
            if len(viable) == len(pool) or len(viable) < r:
                return viable
            pool = viable

    def _bounds(self, pool: list[int], gain: list[int], r: int) -> list[tuple[int, int]]:
        """Twice each member's best possible contribution to a completion of r more members.

        A completion S adds sum gain[v] + sum quad[a][b] over its pairs; each pair is at most half of what
        each end could get from its r-1 best partners in the pool, so 2*gain[v] + top(r-1 weights of v)
        summed over the r best members bounds twice the completion.
        """
        quad, top = self.f.quad, r - 1
        # Sorting a row's pool weights in C beats a Python walk over pre-sorted neighbours. The member's own
        # entry is 0 and weights are never negative, so leaving it in cannot raise the sum.
        return [
            (2 * gain[v] + sum(sorted(map(quad[v].__getitem__, pool), reverse=True)[:top]), v) for v in pool
        ]

    def _offer(self, value: int, members: list[int]) -> None:
        if value > self.best_value:
            self.best_value, self.best = value, list(members)

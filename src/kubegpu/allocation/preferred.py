"""GetPreferredAllocation: which devices to give a container.

Whole GPUs (every device a full, unshared GPU): the set is chosen by link topology with NVIDIA's pair scores
(go-gpuallocator): a set scores the sum over its pairs of NVLink 100 per lane plus the PCIe/P2P level score
(same board 60, one switch 50, several switches 40, host bridge 30, same CPU 20, across CPUs 10). Where NVIDIA
runs a best-effort heuristic we return a set with the best possible score among those that contain every
must-include device, found by an exact branch-and-bound search (`best_set`), proven in the tests against the
exhaustive oracle (`exhaustive_best_set`).

The answer is unique and deterministic. Among sets of equal score, in order:
  1. the set whose *leftover* (the available devices it does not take) scores highest wins: this keeps
     well-connected GPUs together and free for the next request instead of splitting them;
  2. then the set whose sorted GPU indices are lexicographically smallest.
`bench/preferred_bench.py` shows what rule 1 buys over NVIDIA's policy on a sequence of requests.

The search folds score, leftover score and index order into one integer per set (`_Objective`), so the
optimum is unique; it starts from a greedy set improved by swaps, prunes with a bound that credits each
GPU half of its best partners' scores, searches the smaller side (the GPUs to take or the GPUs to leave
out), and takes GPUs with identical links (twins: one PCIe switch, one NVSwitch and NUMA node) in order.
Up to 16 candidates it always runs to the proven optimum (about 1 ms at worst for 16 GPUs on a small
machine); beyond that it has a node budget, and a result not proven optimal is logged.

A GPU without link information (its links could not be read, or it fell off the bus) scores 0 with every
other GPU: the allocation still succeeds and the gap is logged once per distinct set of such GPUs.

Replicas (time-slicing, MPS) and MIG devices take NVIDIA's greedy path instead (`greedy_devices`): the
`distributed` policy spreads picks over the least-used GPUs, `packed` fills the most-used ones first.
Whole GPUs ignore the policy, as with NVIDIA.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kubegpu.allocation.device_ids import any_annotated, backing_id
from kubegpu.allocation.resources import Resource
from kubegpu.node.inventory import GpuLink, LinkLevel
from kubegpu.settings.choices import DISTRIBUTED, PACKED

log = logging.getLogger(__name__)

NVLINK_LANE_SCORE = 100
LEVEL_SCORE = {
    LinkLevel.INTERNAL: 60,
    LinkLevel.SINGLE: 50,
    LinkLevel.MULTIPLE: 40,
    LinkLevel.HOSTBRIDGE: 30,
    LinkLevel.NODE: 20,
    LinkLevel.SYSTEM: 10,
}
# Up to this many candidate GPUs the search always runs to the proven optimum.
EXACT_CANDIDATE_LIMIT = 16
# Beyond it the search stops after this many nodes and returns the best set found so far (logged).
SEARCH_NODE_BUDGET = 50_000

NOT_ENOUGH_DEVICES = "not enough available devices to satisfy allocation"  # NVIDIA's text

_warned_missing: frozenset[int] = frozenset()


class PreferredAllocationError(ValueError):
    pass


def pair_score(link: GpuLink | None) -> int:
    if link is None:
        return 0
    return LEVEL_SCORE.get(link.level, 0) + NVLINK_LANE_SCORE * link.nvlinks


def set_score(indices: Sequence[int], links: Mapping[tuple[int, int], GpuLink]) -> int:
    return sum(pair_score(links.get((a, b))) for a, b in itertools.combinations(indices, 2))


def preferred_devices(
    resource: Resource,
    links: Mapping[tuple[int, int], GpuLink],
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    policy: str = DISTRIBUTED,
) -> list[str]:
    """Device IDs for one container request, must-include devices first."""
    unknown = [d for d in [*available, *must_include] if resource.device(d) is None]
    if unknown:
        raise PreferredAllocationError(
            f'preferred allocation request for "{resource.name}" names unknown device(s): '
            + ", ".join(unknown[:5])
        )
    required = list(dict.fromkeys(must_include))
    taken = set(required)
    candidates = [d for d in dict.fromkeys(available) if d not in taken]
    if size <= 0:
        raise PreferredAllocationError(f"allocation size must be positive, got {size}")
    if len(required) > size or len(required) + len(candidates) < size:
        raise PreferredAllocationError(NOT_ENOUGH_DEVICES)
    needed = size - len(required)
    if needed == 0:
        return required
    if not _aligned(resource, candidates):
        return greedy_devices(resource, required, candidates, needed, policy)
    return required + _best_gpu_set(resource, links, required, candidates, needed)


def _aligned(resource: Resource, candidates: Sequence[str]) -> bool:
    """NVIDIA's condition for the topology path: full GPUs only and no replica among the candidates."""
    return resource.is_whole_gpus and not any_annotated(candidates)


# -- whole GPUs: exact best set ---------------------------------------------------------------------


def _best_gpu_set(
    resource: Resource,
    links: Mapping[tuple[int, int], GpuLink],
    required: list[str],
    candidates: list[str],
    needed: int,
) -> list[str]:
    index_of = {d: resource.device(d).gpu_index for d in [*required, *candidates]}  # type: ignore[union-attr]
    by_index = {index_of[d]: d for d in candidates}
    cand = sorted(by_index)
    indices = [*cand, *(index_of[d] for d in required)]
    scores = _link_scores(indices, links)
    _warn_missing_links(indices, scores, links)
    n = len(cand)
    w = [row[:n] for row in scores[:n]]
    wr = [sum(row[n:]) for row in scores[:n]]
    return [by_index[cand[i]] for i in sorted(_solve(w, wr, needed))]


def _link_scores(indices: Sequence[int], links: Mapping[tuple[int, int], GpuLink]) -> list[list[int]]:
    """Pair scores between GPUs by position in `indices` (`pair_score` inlined: this runs per request)."""
    n = len(indices)
    out = [[0] * n for _ in range(n)]
    level_score, lane = LEVEL_SCORE.get, NVLINK_LANE_SCORE
    for i in range(n):
        row = out[i]
        for j in range(i + 1, n):
            link = links.get((indices[i], indices[j]))
            if link is not None:
                row[j] = out[j][i] = level_score(link.level, 0) + lane * link.nvlinks
    return out


def _warn_missing_links(
    indices: Sequence[int], scores: list[list[int]], links: Mapping[tuple[int, int], GpuLink]
) -> None:
    global _warned_missing
    if len(indices) < 2:
        return
    missing: frozenset[int] = frozenset()
    if not all(any(row) for row in scores):  # a real link scores at least 10: some GPU may have none
        linked = {a for a, _ in links}
        missing = frozenset(i for i in indices if i not in linked)
    # Once per distinct set: a lost GPU would otherwise log on every pod's request.
    if missing and missing != _warned_missing:
        log.warning(
            "no link information for GPU(s) %s (unreadable or fallen off the bus); "
            "scoring them as unconnected instead of failing the allocation",
            sorted(missing),
        )
    _warned_missing = missing


def selection_key(
    score: Callable[[int, int], int], required: Sequence[int], chosen: Sequence[int], leftover: Sequence[int]
) -> tuple[int, int, tuple[int, ...]]:
    """The order of preference between candidate sets, largest first (the rule in the module docstring)."""
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
    # Per position, its twins: the positions with the same pair scores to every other candidate and to the
    # required devices (GPUs behind one switch, on one NVSwitch and NUMA node). Swapping twins changes only
    # the lex term, so a set holding a twin but not a better one (higher lin) is never the best.
    twins: list[frozenset[int]]

    @classmethod
    def build(cls, w: list[list[int]], wr: list[int]) -> _Objective:
        n = len(wr)
        degree = [sum(row) for row in w]
        m2 = 1 << n
        m1 = m2 * (sum(degree) // 2 + 1)
        lin = [m1 * wr[i] - m2 * degree[i] + (1 << (n - 1 - i)) for i in range(n)]
        quad = [[(m1 + m2) * x for x in row] for row in w]
        return cls(lin, quad, _twins(w, wr))

    def complement(self) -> _Objective:
        """The same objective over the set left out: F(C - T) = F(C) + sum lin'[t] + sum quad[t][u].

        Choosing 12 of 16 is then a search for the best 4 to leave out, which is much smaller.
        """
        lin = [-(x + sum(row)) for x, row in zip(self.lin, self.quad, strict=True)]
        return _Objective(lin, self.quad, self.twins)

    def pairs(self, members: Sequence[int]) -> int:
        return sum(self.quad[a][b] for a, b in itertools.combinations(members, 2))

    def value(self, members: Sequence[int]) -> int:
        return sum(self.lin[i] for i in members) + self.pairs(members)


def _twins(w: list[list[int]], wr: list[int]) -> list[frozenset[int]]:
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
    return tuple(cand[i] for i in sorted(_solve(_pair_matrix(score, cand), wr, needed, node_budget)))


def _solve(w: list[list[int]], wr: list[int], needed: int, node_budget: int | None = None) -> set[int]:
    """The positions of the best `needed` candidates, given pair scores `w` and scores with the required."""
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
    search = _Search(objective.complement() if left_out else objective, min(needed, n - needed), node_budget)
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

    def __init__(self, objective: _Objective, needed: int, node_budget: int | None) -> None:
        self.f = objective
        self.needed = needed
        self.budget = node_budget
        self.nodes = 0
        self.exhausted = False
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
        twins = self.f.twins[u]
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


# -- replicas and MIG: NVIDIA's greedy policy --------------------------------------------------------


def greedy_devices(
    resource: Resource, required: Sequence[str], candidates: Sequence[str], needed: int, policy: str
) -> list[str]:
    """NVIDIA's greedy path (v0.20): `required` followed by `needed` picks from `candidates`, one at a time.

    Per physical device: total = its devices in the resource, available = its candidates not yet picked,
    allocated = total - available. `distributed` picks the least allocated, `packed` the most; ties go to
    the device picked from least often in this call, then to the earlier candidate (the kubelet's order;
    Go's unstable sort leaves that last tie open). An unknown policy behaves as `distributed`.
    """
    if len(candidates) < needed:
        raise PreferredAllocationError(NOT_ENOUGH_DEVICES)
    total: dict[str, int] = {}
    for device in resource.devices:
        total[backing_id(device.id)] = total.get(backing_id(device.id), 0) + 1
    available: dict[str, int] = {}
    for c in candidates:
        available[backing_id(c)] = available.get(backing_id(c), 0) + 1
    picked_from: dict[str, int] = dict.fromkeys(available, 0)
    sign = -1 if policy == PACKED else 1
    pool = list(candidates)
    picks: list[str] = []

    def rank(device_id: str) -> tuple[int, int]:
        gpu = backing_id(device_id)
        return sign * (total[gpu] - available[gpu]), picked_from[gpu]

    for _ in range(needed):
        pool.sort(key=rank)  # stable: equal ranks keep their order
        pick = pool.pop(0)
        gpu = backing_id(pick)
        available[gpu] -= 1
        picked_from[gpu] += 1
        picks.append(pick)
    return [*required, *picks]

"""GetPreferredAllocation: which devices to give a container.

Whole GPUs (every device a full, unshared GPU): the set is chosen by link topology with NVIDIA's pair scores
(go-gpuallocator): a set scores the sum over its pairs of NVLink 100 per lane plus the PCIe/P2P level score
(same board 60, one switch 50, several switches 40, host bridge 30, same CPU 20, across CPUs 10). Where NVIDIA
runs a best-effort heuristic we return a set with the best possible score among those that contain every
must-include device, found by an exact branch-and-bound search (`best_set.py`), proven in the tests
against the exhaustive oracle.

The answer is unique and deterministic. Among sets of equal score, in order:
  1. the set whose *leftover* (the available devices it does not take) scores highest wins: this keeps
     well-connected GPUs together and free for the next request instead of splitting them;
  2. then the set whose sorted GPU indices are lexicographically smallest.
`bench/preferred_bench.py` shows what rule 1 buys over NVIDIA's policy on a sequence of requests.

A GPU without link information (its links could not be read, or it fell off the bus) scores 0 with every
other GPU: the allocation still succeeds and the gap is logged once per distinct set of such GPUs.

Replicas (time-slicing, MPS) and MIG devices take NVIDIA's greedy path instead (`greedy_devices`): the
`distributed` policy spreads picks over the least-used GPUs, `packed` fills the most-used ones first.
Whole GPUs ignore the policy, as with NVIDIA.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter

from kubegpu.allocation.best_set import solve
from kubegpu.allocation.device_ids import any_annotated, backing_id
from kubegpu.allocation.resources import Resource
from kubegpu.allocation.symmetry import Swap, node_swaps, request_swaps
from kubegpu.common.quoting import quote_id, quote_ids
from kubegpu.node.inventory import GpuLink, LinkLevel
from kubegpu.settings.choices import DISTRIBUTED, PACKED

log = logging.getLogger(__name__)

NVLINK_LANE_SCORE = 100
LEVEL_SCORE = {  # every LinkLevel
    LinkLevel.INTERNAL: 60,
    LinkLevel.SINGLE: 50,
    LinkLevel.MULTIPLE: 40,
    LinkLevel.HOSTBRIDGE: 30,
    LinkLevel.NODE: 20,
    LinkLevel.SYSTEM: 10,
}

NOT_ENOUGH_DEVICES = "not enough available devices to satisfy allocation"  # NVIDIA's text

_warned_missing: frozenset[int] = frozenset()


class PreferredAllocationError(ValueError):
    pass


def pair_score(link: GpuLink | None) -> int:
    if link is None:
        return 0
    return LEVEL_SCORE[link.level] + NVLINK_LANE_SCORE * link.nvlinks


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
    validate_preferred_request(resource, available, must_include, size)
    required = list(must_include)
    taken = set(required)
    candidates = [d for d in available if d not in taken]
    needed = size - len(required)
    if needed == 0:
        return required
    if not _aligned(resource, candidates):
        return greedy_devices(resource, required, candidates, needed, policy)
    return required + _best_gpu_set(resource, links, required, candidates, needed)


def validate_container_count(resource: Resource, count: int) -> None:
    """Refuse a request of more container entries than the node has devices (each needs at least one).

    The kubelet sends one per call; each entry costs a search, so their number is bounded before any runs.
    """
    if count > max(1, len(resource.devices)):
        raise PreferredAllocationError(
            f'invalid preferred allocation request for "{resource.name}": {count} container requests but '
            f"this node advertises only {len(resource.devices)} devices for {resource.name} "
            "(the kubelet sends one per call)"
        )


def validate_preferred_request(
    resource: Resource, available: Sequence[str], must_include: Sequence[str], size: int
) -> None:
    """Raise PreferredAllocationError naming the first way the request differs from what a kubelet sends.

    The kubelet lists distinct device IDs it got from us, every must-include device among the available
    ones (it passes the free devices plus the reusable ones), and asks for at least as many as it must
    include. NVIDIA checks none of this: a must-include device outside the available ones comes back in its
    answer on the greedy path and yields an empty answer on the topology path. Counts are checked before
    any ID is looked at, and IDs are quoted and cut in the message (a client decides their length and
    content).
    """
    prefix = f'invalid preferred allocation request for "{resource.name}": '
    if size <= 0:
        raise PreferredAllocationError(prefix + f"allocation size must be positive, got {size}")
    for what, ids in (("available", available), ("must-include", must_include)):
        if len(ids) > len(resource.devices):
            raise PreferredAllocationError(
                prefix + f"{len(ids)} {what} devices listed but this node advertises only "
                f"{len(resource.devices)} for {resource.name}"
            )
    unknown = [d for d in [*available, *must_include] if resource.device(d) is None]
    if unknown:
        raise PreferredAllocationError(prefix + f"{len(unknown)} unknown device(s): {quote_ids(unknown)}")
    for what, ids in (("available", available), ("must-include", must_include)):
        seen: set[str] = set()
        for device_id in ids:
            if device_id in seen:
                raise PreferredAllocationError(
                    prefix + f"device {quote_id(device_id)} is listed more than once among the {what} devices"
                )
            seen.add(device_id)
    listed = set(available)
    outside = [d for d in must_include if d not in listed]
    if outside:
        raise PreferredAllocationError(
            prefix + f"must-include device(s) {quote_ids(outside)} are not among the available devices; "
            "the kubelet lists every must-include device as available"
        )
    if len(must_include) > size:
        raise PreferredAllocationError(
            prefix + f"{len(must_include)} must-include devices do not fit an allocation size of {size}"
        )
    if size > len(available):
        raise PreferredAllocationError(NOT_ENOUGH_DEVICES)


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
    # Scores over every GPU of the resource and its interchangeable groups depend only on the node's
    # topology: built once per link map (one per inventory) and GPU set, then filtered per request. So
    # does the answer to a request (which GPUs are free and held, how many more): remembered too, as the
    # kubelet asks the same question for every pod of a size while the node's free GPUs stay the same.
    topology = _node_topology(resource, links)
    position = {g: k for k, g in enumerate(topology.node)}
    where = [position[i] for i in cand]
    held = [position[index_of[d]] for d in required]
    question = (tuple(where), tuple(held), needed)
    answer = topology.answers.get(question)
    if answer is None:
        answer = _search(topology, where, held, needed, [*cand, *(index_of[d] for d in required)], links)
        if len(topology.answers) >= ANSWERS_KEPT:
            topology.answers.clear()
        topology.answers[question] = answer
    return [by_index[cand[i]] for i in answer]


def _search(
    topology: _Topology,
    where: list[int],
    held: list[int],
    needed: int,
    gpus: list[int],
    links: Mapping[tuple[int, int], GpuLink],
) -> tuple[int, ...]:
    """The positions among the candidates (`where`) of the best set, sorted: the exact search."""
    node_scores = topology.scores
    if held or len(where) < len(topology.node):
        pick = itemgetter(*where, *held)
        scores = (
            [list(pick(node_scores[p])) for p in [*where, *held]] if len(where) + len(held) > 1 else [[0]]
        )
    else:
        scores = node_scores  # every GPU is a candidate, in node order
    _warn_missing_links(gpus, scores, links)
    n = len(where)
    w = [row[:n] for row in scores[:n]]
    wr = [sum(row[n:]) for row in scores[:n]]
    swaps = request_swaps(topology.swaps, where, held)
    return tuple(sorted(solve(w, wr, needed, swaps=swaps)))


@dataclass(frozen=True, slots=True)
class _Topology:
    links: Mapping[tuple[int, int], GpuLink]  # kept, so its identity cannot be reused by another mapping
    node: tuple[int, ...]  # the GPU indices of the resource, sorted
    scores: list[list[int]]
    swaps: tuple[Swap, ...]
    # (free positions, held positions, how many more) -> the chosen positions among the free ones
    answers: dict[tuple[tuple[int, ...], tuple[int, ...], int], tuple[int, ...]]


_TOPOLOGIES: list[_Topology] = []
TOPOLOGIES_KEPT = 4  # a node has one inventory at a time; a reload or rediscovery brings the next
ANSWERS_KEPT = 4096  # per topology: 16 GPUs have 65,536 free sets, few of which a node ever shows


def _node_topology(resource: Resource, links: Mapping[tuple[int, int], GpuLink]) -> _Topology:
    """The resource's GPUs in order, their pair scores, the node's interchangeable groups and the answers
    given so far, remembered by the link map's identity (`Inventory.link_map` returns one mapping per
    snapshot) and the GPU set: rebuilding and re-hashing the score matrix on every request, and searching
    again for a question already answered, were most of a 16-GPU request's time."""
    node = tuple(sorted({d.gpu_index for d in resource.devices}))
    for known in _TOPOLOGIES:
        if known.links is links and known.node == node:
            return known
    scores = _link_scores(node, links)
    topology = _Topology(links, node, scores, node_swaps(scores), {})
    del _TOPOLOGIES[TOPOLOGIES_KEPT - 1 :]
    _TOPOLOGIES.insert(0, topology)
    return topology


def _link_scores(indices: Sequence[int], links: Mapping[tuple[int, int], GpuLink]) -> list[list[int]]:
    """Pair scores between GPUs by position in `indices` (`pair_score` inlined: this runs per request)."""
    n = len(indices)
    out = [[0] * n for _ in range(n)]
    level_score, lane = LEVEL_SCORE.__getitem__, NVLINK_LANE_SCORE
    for i in range(n):
        row = out[i]
        for j in range(i + 1, n):
            link = links.get((indices[i], indices[j]))
            if link is not None:
                row[j] = out[j][i] = level_score(link.level) + lane * link.nvlinks
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

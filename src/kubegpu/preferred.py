"""GetPreferredAllocation: which devices to give a container.

For whole GPUs the set is chosen by link topology with NVIDIA's pair scores (go-gpuallocator): the sum over
pairs of the link score, NVLink 100 per lane plus the PCIe/P2P level score. Unlike NVIDIA's best-effort
heuristic we search for the best-scoring set exactly when the search space is small (always on 8-GPU nodes).
Ties go to the set that leaves the best-connected GPUs free for later requests, then to the lowest indices,
so the answer is deterministic.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Mapping, Sequence

from kubegpu.inventory import GpuLink, LinkLevel
from kubegpu.resources import Resource

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
# Beyond this many candidate sets we fall back to a greedy choice (16 GPUs choose 8 is 12,870).
EXHAUSTIVE_LIMIT = 20_000


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
) -> list[str]:
    """Device IDs for one container request, must-include devices first."""
    unknown = [d for d in [*available, *must_include] if resource.device(d) is None]
    if unknown:
        raise PreferredAllocationError(
            f'preferred allocation request for "{resource.name}" names unknown device(s): '
            + ", ".join(unknown[:5])
        )
    required = list(dict.fromkeys(must_include))
    candidates = [d for d in dict.fromkeys(available) if d not in set(required)]
    if size <= 0:
        raise PreferredAllocationError(f"allocation size must be positive, got {size}")
    if len(required) > size or len(required) + len(candidates) < size:
        raise PreferredAllocationError("not enough available devices to satisfy allocation")
    needed = size - len(required)
    if needed == 0:
        return required
    if not resource.is_whole_gpus:
        return required + candidates[:needed]
    return required + _best_gpu_set(resource, links, required, candidates, needed)


def _best_gpu_set(
    resource: Resource,
    links: Mapping[tuple[int, int], GpuLink],
    required: list[str],
    candidates: list[str],
    needed: int,
) -> list[str]:
    index_of = {d: resource.device(d).gpu_index for d in [*required, *candidates]}  # type: ignore[union-attr]
    missing = sorted({i for i in index_of.values() if not _has_links(i, links)})
    if missing and len(index_of) > 1:
        log.warning(
            "no link information for GPU(s) %s (unreadable or fallen off the bus); "
            "scoring them as unconnected instead of failing the allocation",
            missing,
        )
    req_idx = [index_of[d] for d in required]
    cand = sorted(candidates, key=lambda d: index_of[d])
    if math.comb(len(cand), needed) > EXHAUSTIVE_LIMIT:
        return _greedy(cand, req_idx, needed, index_of, links)

    best_key: tuple[int, int, tuple[int, ...]] | None = None
    best: tuple[str, ...] = ()
    for combo in itertools.combinations(cand, needed):
        chosen = req_idx + [index_of[d] for d in combo]
        leftover = [index_of[d] for d in cand if d not in combo]
        # Maximise our score, then the leftover's (keeps well-connected GPUs free), then lowest indices.
        key = (set_score(chosen, links), set_score(leftover, links), tuple(-i for i in sorted(chosen)))
        if best_key is None or key > best_key:
            best_key, best = key, combo
    return list(best)


def _greedy(
    cand: list[str],
    req_idx: list[int],
    needed: int,
    index_of: Mapping[str, int],
    links: Mapping[tuple[int, int], GpuLink],
) -> list[str]:
    chosen_idx = list(req_idx)
    picked: list[str] = []
    pool = list(cand)
    for _ in range(needed):
        best = max(pool, key=lambda d: (sum(pair_score(links.get((index_of[d], c))) for c in chosen_idx),))
        picked.append(best)
        chosen_idx.append(index_of[best])
        pool.remove(best)
    return picked


def _has_links(index: int, links: Mapping[tuple[int, int], GpuLink]) -> bool:
    return any(a == index for a, _ in links)

"""GetPreferredAllocation's compute with what depends only on the node's topology remembered, against
rebuilding and searching it per request.

Remembered per link map (which `Inventory.link_map` builds once per snapshot): the pair-score matrix over
every GPU, its interchangeable groups, and the answer to each question asked (which GPUs are free and
held, how many more), since the kubelet asks the same one for every pod of a size while the free GPUs stay
the same. The baseline, in the same run and interleaved call by call: the same request on a copy of the
inventory, so the link map, the score matrix and its hash are rebuilt and the search runs every time, as
on every request before. Measured in
process (CPU time, `time.process_time_ns`), so a loaded machine moves both sides alike; the round trip is
`bench/preferred_bench.py`'s.

    python -m bench.preferred_topology_cache [--repeats 200]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from bench.common import Result, Row, interruptible, percentile, ratio
from bench.preferred_bench import TOPOLOGIES, inventory_of
from kubegpu.allocation.preferred import preferred_devices
from kubegpu.allocation.resources import build_resources

MEASURED = ("16 x PCIe (switch pairs, 2 NUMA)", "16 GPUs NVSwitch (2 NUMA)", "DGX-1 (8, cube mesh)")


def measure(topology: str, repeats: int) -> dict[str, float]:
    count, links = TOPOLOGIES[topology]()
    inventory = inventory_of(count, links)
    resource = build_resources(inventory)[0]
    uuids = [g.uuid for g in inventory.gpus]
    cached: list[float] = []
    rebuilt: list[float] = []
    for _ in range(repeats):
        for size in range(2, count):
            fresh = dataclasses.replace(inventory)  # same content, its own link map: the topology rebuilt
            started = time.process_time_ns()
            preferred_devices(resource, fresh.link_map(), uuids, [], size)
            rebuilt.append((time.process_time_ns() - started) / 1e6)
            started = time.process_time_ns()
            preferred_devices(resource, inventory.link_map(), uuids, [], size)
            cached.append((time.process_time_ns() - started) / 1e6)
    return {"cached_p50_ms": percentile(cached, 0.5), "rebuilt_p50_ms": percentile(rebuilt, 0.5)}


def run(repeats: int) -> Result:
    rows, metrics = [], {}
    for topology in MEASURED:
        m = measure(topology, repeats)
        metrics[topology] = {k: round(v, 4) for k, v in m.items()}
        rows.append(
            Row(
                f"GetPreferredAllocation compute (in process, CPU time, every size), {topology}, p50",
                f"{m['cached_p50_ms']:.3f} ms",
                f"{m['rebuilt_p50_ms']:.3f} ms (the topology rebuilt per request, interleaved)",
                ratio(m["cached_p50_ms"], m["rebuilt_p50_ms"]),
                "< 1x baseline",
                m["cached_p50_ms"] < m["rebuilt_p50_ms"],
            )
        )
    return Result(
        "preferred_topology_cache",
        metrics,
        target="the remembered topology is cheaper than rebuilding it",
        passed=all(r.passed for r in rows),
        rows=rows,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=200, help="rounds over every size")
    args = parser.parse_args()
    interruptible()
    run(args.repeats).save()

"""Where the daemon's resident memory goes at import: RSS added by each module, grouped by package.

Method: the import machinery's module loader is wrapped so each module's execution reads /proc/self/statm
before and after; a module's own share is its increment less its imports' (which are counted where they
are first imported). Page-granular and order-dependent (a module pays for the heap growth it triggers), so
read it as a map of the big items, not as exact sizes; bench/rss.py measures the daemon itself.

    python -m bench.import_rss                      # the daemon's real-node path
    python -m bench.import_rss kubegpu.node.nvml.fake --top 40
"""

from __future__ import annotations

import argparse
import importlib
import importlib._bootstrap as bootstrap  # the loader step to wrap has no public hook
import os
import sys
from typing import Any

DAEMON_PATH = ("kubegpu.cli.main", "kubegpu.plugin.cli", "kubegpu.plugin.daemon")
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


def measure(modules: tuple[str, ...]) -> tuple[float, dict[str, float]]:
    """(total RSS after importing `modules`, each loaded module's own MB)."""
    load = bootstrap._load_unlocked  # CPython's private loader step
    children: list[float] = []
    own: dict[str, float] = {}

    def wrapped(spec: Any) -> Any:
        start = rss_mb()
        children.append(0.0)
        try:
            return load(spec)
        finally:
            inner = children.pop()
            grown = rss_mb() - start
            own[spec.name] = grown - inner
            if children:
                children[-1] += grown

    bootstrap._load_unlocked = wrapped
    try:
        for name in modules:
            importlib.import_module(name)
    finally:
        bootstrap._load_unlocked = load
    return rss_mb(), own


def grouped(own: dict[str, float]) -> dict[str, float]:
    """Own MB by top-level package (kubegpu by its subpackage)."""
    out: dict[str, float] = {}
    for name, mb in own.items():
        parts = name.split(".")
        key = ".".join(parts[:2]) if parts[0] == "kubegpu" else parts[0]
        out[key] = out.get(key, 0.0) + mb
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("modules", nargs="*", help="imported after the daemon's path")
    parser.add_argument("--top", type=int, default=25, help="packages to list")
    args = parser.parse_args()
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    total, own = measure((*DAEMON_PATH, *args.modules))
    print(f"RSS after the imports: {total:.1f} MB ({len(sys.modules)} modules)")
    for package, mb in sorted(grouped(own).items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"{mb:6.2f} MB  {package}")

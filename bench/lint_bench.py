"""`kubegpu lint` on 60,000 pods (a 12 MB multi-document YAML file), as a process.

Baseline, in the same run: a process that reads the same file with PyYAML's C loader (`yaml.load_all` on
CSafeLoader), the least any YAML-reading lint must do, with no line numbers and no checks. Both are timed as
the child's CPU time (user + system, `resource.getrusage(RUSAGE_CHILDREN)`), so the other processes of a
shared machine move neither much; wall time is reported too. Before the documents were streamed (each
one's node tree dropped once read, composed again only for a finding's line), built by a fast path and
the collector paused: 20.5 s on the issue's machine, 25 s of CPU here.

    python -m bench.lint_bench [--pods 60000] [--runs 2]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import Result, Row, interruptible, ratio

TARGET_S = 5.0
BASELINE = (
    "import sys, yaml; n = sum(1 for _ in yaml.load_all(open(sys.argv[1]).read(), Loader=yaml.CSafeLoader))"
)


def pods_file(path: Path, pods: int) -> None:
    docs = (
        f"apiVersion: v1\nkind: Pod\nmetadata:\n  name: pod-{i}\n  namespace: ns-{i % 50}\nspec:\n"
        f"  containers:\n  - name: c\n    image: nvcr.io/nvidia/cuda:12.4.0-base\n    resources:\n"
        f"      limits:\n        nvidia.com/gpu: {1 + i % 4}\n"
        for i in range(pods)
    )
    path.write_text("---\n".join(docs))


def child_seconds(args: list[str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def run(pods: int, runs: int) -> Result:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "pods.yaml"
        pods_file(path, pods)
        size_mb = path.stat().st_size / 1e6
        lint, base = [], []
        for _ in range(runs):  # interleaved
            lint.append(child_seconds([sys.executable, "-m", "kubegpu", "lint", str(path)]))
            base.append(child_seconds([sys.executable, "-c", BASELINE, str(path)]))
    lint_cpu, lint_wall = min(c for c, _ in lint), min(w for _, w in lint)
    base_cpu = min(c for c, _ in base)
    row = Row(
        f"kubegpu lint, {pods:,} pods ({size_mb:.1f} MB of YAML): CPU time (wall {lint_wall:.1f} s), "
        f"best of {runs}",
        f"{lint_cpu:.2f} s",
        f"{base_cpu:.2f} s (yaml.load_all with the C loader, no checks)",
        ratio(lint_cpu, base_cpu),
        f"<= {TARGET_S:g} s",
        lint_cpu <= TARGET_S,
    )
    return Result(
        "lint_bench",
        {
            "pods": pods,
            "mb": round(size_mb, 1),
            "lint_cpu_s": round(lint_cpu, 2),
            "lint_wall_s": round(lint_wall, 2),
            "baseline_cpu_s": round(base_cpu, 2),
            "runs": runs,
        },
        target=f"lint of {pods:,} pods in <= {TARGET_S:g} s",
        passed=row.passed,
        rows=[row],
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, default=60_000)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    interruptible()
    run(args.pods, args.runs).save()

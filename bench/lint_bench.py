"""`kubegpu lint` on 60,000 pods (a 12 MB multi-document YAML file), as a process.

Baseline, in the same run: a process that reads the same file with PyYAML's C loader (`yaml.load_all` on
CSafeLoader), the least any YAML-reading lint must do, with no line numbers and no checks. Both are timed as
the child's CPU time (user + system, `resource.getrusage(RUSAGE_CHILDREN)`), so the other processes of a
shared machine move neither much; wall time is reported too. Before the documents were streamed (each
one's node tree dropped once read, composed again only for a finding's line), built by a fast path and
the collector paused: 20.5 s on the issue's machine, 25 s of CPU here.

The same pods as one JSON List (`kubectl get -o json`) are timed too, against `json.load` of that file.

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
# The same pods as one v1 List in JSON (`kubectl get pods -o json`), against Python's own JSON parser.
JSON_BASELINE = "import sys, json; n = len(json.load(open(sys.argv[1]))['items'])"


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


def json_file(path: Path, yaml_path: Path) -> None:
    import json

    import yaml

    items = list(yaml.load_all(yaml_path.read_text(), Loader=yaml.CSafeLoader))
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=2))


Times = list[tuple[float, float]]  # (CPU seconds, wall seconds) of each run


def timed(path: Path, baseline: str, runs: int) -> tuple[Times, Times]:
    lint, base = [], []
    for _ in range(runs):  # interleaved
        lint.append(child_seconds([sys.executable, "-m", "kubegpu", "lint", str(path)]))
        base.append(child_seconds([sys.executable, "-c", baseline, str(path)]))
    return lint, base


def run(pods: int, runs: int) -> Result:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "pods.yaml"
        pods_file(path, pods)
        size_mb = path.stat().st_size / 1e6
        lint, base = timed(path, BASELINE, runs)
        as_json = Path(tmp) / "pods.json"
        json_file(as_json, path)
        json_mb = as_json.stat().st_size / 1e6
        json_lint, json_base = timed(as_json, JSON_BASELINE, runs)
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
    json_cpu, json_base_cpu = min(c for c, _ in json_lint), min(c for c, _ in json_base)
    json_row = Row(
        f"kubegpu lint, the same pods as a JSON List ({json_mb:.1f} MB): CPU time, best of {runs}",
        f"{json_cpu:.2f} s",
        f"{json_base_cpu:.2f} s (json.load, no checks)",
        ratio(json_cpu, json_base_cpu),
        f"<= {TARGET_S:g} s",
        json_cpu <= TARGET_S,
    )
    return Result(
        "lint_bench",
        {
            "pods": pods,
            "mb": round(size_mb, 1),
            "lint_cpu_s": round(lint_cpu, 2),
            "lint_wall_s": round(lint_wall, 2),
            "baseline_cpu_s": round(base_cpu, 2),
            "json_lint_cpu_s": round(json_cpu, 2),
            "json_baseline_cpu_s": round(json_base_cpu, 2),
            "runs": runs,
        },
        target=f"lint of {pods:,} pods in <= {TARGET_S:g} s",
        passed=row.passed and json_row.passed,
        rows=[row, json_row],
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

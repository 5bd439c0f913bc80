"""Benchmark: `kubegpu --help` wall time against `python -c 'import click'`, interleaved in the same run.

The root help lists every subcommand without importing any of them (cli/main.py keeps their one-line help),
so it should cost little more than starting Python with click. Target: the median under 1 s, absolute, as
the issue asks; the ratio to the baseline says how much of it is ours.

    python -m bench.cli_help [--runs 15]

Results go to bench/results/cli_help.json with rows for the README table.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import statistics
import subprocess
import time

from bench.common import Result, Row, ratio

COMMANDS = {
    "kubegpu --help": [sys.executable, "-m", "kubegpu", "--help"],
    "python -c 'import click'": [sys.executable, "-c", "import click"],
}
TARGET_S = 1.0


def timed(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, timeout=60)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="runs of each command, interleaved")
    args = parser.parse_args()
    for argv in COMMANDS.values():  # warm the page cache: the first start reads every file from disk
        timed(argv)
    samples: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.runs):
        for name, argv in COMMANDS.items():
            samples[name].append(timed(argv))
    ours = statistics.median(samples["kubegpu --help"])
    base = statistics.median(samples["python -c 'import click'"])
    worst = max(samples["kubegpu --help"])
    result = Result(
        "cli_help",
        metrics={
            "help_p50_s": round(ours, 4),
            "help_max_s": round(worst, 4),
            "import_click_p50_s": round(base, 4),
            "ratio_p50": ratio(ours, base),
            "runs": args.runs,
        },
        target=f"median < {TARGET_S:g} s",
        passed=ours < TARGET_S,
    )
    result.rows.append(
        Row(
            f"`kubegpu --help`, p50 / max ({args.runs} runs)",
            f"{ours * 1000:.0f} / {worst * 1000:.0f} ms",
            f"{base * 1000:.0f} ms (`python -c 'import click'`)",
            ratio(ours, base),
            f"< {TARGET_S:g} s",
            ours < TARGET_S,
        )
    )
    result.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())

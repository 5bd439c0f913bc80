"""Run every benchmark with modest sizes and print the README table (also written to results/summary.md).

Each benchmark runs in its own process (`python -m bench.<name> ...`) so one cannot disturb the next, and
one that fails or hangs (SIGINT after `--timeout`, so it still cleans up; SIGKILL 15 s later) is reported
as a failed row while the others still run. Each saves its JSON in bench/results/; this script reads them
back and builds one markdown table: metric, value, baseline (measured in the same run), ratio
(ours / baseline), target, pass. The defaults finish in well under 3 minutes on 2 cores.

    python bench/run_all.py        (what `make bench` runs)
    python -m bench.run_all [--restarts 50] [--injections 70] [--runs 10] [--allocates 20000]

Exit code 1 when a benchmark failed to run; a missed target is shown in the table, not in the exit code.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script (`python bench/run_all.py`): make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import contextlib
import datetime
import os
import platform
import signal
import subprocess
import time

from bench.common import (
    REPO_ROOT,
    RESULTS_DIR,
    Result,
    Row,
    cpu_count,
    interruptible,
    markdown_table,
    ms,
)

ALLOCATE_TARGET = 1.25


def allocate_rows(result: Result) -> list[Row]:
    """allocate_latency.py predates table rows: build them from its metrics."""
    m = result.metrics
    ours, echo = m["kubegpu"], m["grpc_echo"]
    assert isinstance(ours, dict) and isinstance(echo, dict)
    rows = []
    for q in ("p50", "p99"):
        r = float(m[f"ratio_{q}"])  # type: ignore[arg-type]
        rows.append(
            Row(
                f"Allocate round trip, {q}",
                ms(ours[f"{q}_ms"]),
                f"{ms(echo[f'{q}_ms'])} (bare grpcio echo)",
                r,
                f"<= {ALLOCATE_TARGET:g}x baseline",
                r <= ALLOCATE_TARGET,
            )
        )
    return rows


def stop_group(proc: subprocess.Popen[bytes], grace: float = 15.0) -> None:
    """Wait `grace` seconds for a SIGINTed benchmark, then SIGKILL its process group (its children too)."""
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run_one(name: str, args: list[str], timeout: float) -> tuple[list[Row], float]:
    """Run one benchmark in its own process; its table rows (a failure row if it did not finish)."""
    (RESULTS_DIR / f"{name}.json").unlink(missing_ok=True)
    print(f"--- {name} {' '.join(args)}", flush=True)
    started = time.monotonic()
    # Own session: a Ctrl-C at the terminal reaches the benchmark once, through us, not twice.
    argv = [sys.executable, "-m", f"bench.{name}", *args]
    proc = subprocess.Popen(argv, cwd=REPO_ROOT, start_new_session=True)
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # asyncio.run cancels the main task: finally blocks clean up
        stop_group(proc)
        code = None
    except BaseException:  # Ctrl-C here: let the benchmark clean up too
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)
        stop_group(proc)
        raise
    elapsed = time.monotonic() - started
    if code != 0 or not (RESULTS_DIR / f"{name}.json").exists():
        why = f"timed out after {timeout:g} s" if code is None else f"exit code {code}"
        return [Row(f"{name}: did not finish ({why})", "error", passed=False)], elapsed
    result = Result.load(name)
    return (result.rows or allocate_rows(result)), elapsed


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=20, help="allocate_latency rounds (x 250 calls)")
    parser.add_argument("--restarts", type=int, default=50, help="kubelet restarts per plugin")
    parser.add_argument("--injections", type=int, default=70, help="XID injections")
    parser.add_argument("--runs", type=int, default=10, help="cold starts")
    parser.add_argument("--allocates", type=int, default=20_000, help="Allocates for the RSS benchmark")
    parser.add_argument("--timeout", type=float, default=150, help="seconds allowed per benchmark")
    args = parser.parse_args()
    interruptible()  # also gives the benchmarks a working SIGINT: an ignored one would be inherited
    plan = {
        "allocate_latency": ["--rounds", str(args.rounds), "--batch", "250"],
        "preferred_bench": ["--rounds", "10", "--batch", "20", "--requests", "240", "--jobs", "400"],
        "preferred_topology_cache": ["--repeats", "100"],
        "restart_recovery": ["--restarts", str(args.restarts)],
        "xid_latency": ["--injections", str(args.injections)],
        "cold_start": ["--runs", str(args.runs)],
        "rss": ["--allocates", str(args.allocates)],
        "serving_bounds": ["--rounds", "3"],
        "largest_config": ["--rounds", "2"],
        "sharing_bench": ["--runs", "200"],
        "metrics_bench": ["--scrapes", "300"],
        "telemetry_bench": ["--rounds", "200", "--batch", "25"],
        "recovery_latency": ["--rounds", "2"],
        "fault_suite": ["--restarts", "100", "--kills", "10", "--recreates", "10", "--storm-seconds", "3"],
        "toolkit_bench": [],
        "lint_bench": ["--runs", "2"],
        "hostile_config_bench": ["--runs", "3"],
        "slice_publish": ["--rounds", "60"],
        "cli_help": ["--runs", "15"],
        "dra_bench": ["--rounds", "10", "--batch", "100"],
        "dra_big_calls": ["--samples", "40"],
        "dra_shares_bench": ["--rounds", "10", "--batch", "25"],
        "dra_explain_bench": ["--nodes", "1000"],
        "dra_health_latency": ["--injections", "21"],
    }
    rows: list[Row] = []
    failed = False
    started = time.monotonic()
    for name, bench_args in plan.items():
        got, elapsed = run_one(name, bench_args, args.timeout)
        failed |= any(r.value == "error" for r in got)
        rows += got
        print(f"    ({elapsed:.1f} s)", flush=True)
    total = time.monotonic() - started
    table = markdown_table(rows)
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    header = (
        f"Measured by `bench/run_all.py` ({total:.0f} s) on {when}: {cpu_count()} CPUs, "
        f"Python {platform.python_version()}, {platform.system()} {platform.machine()}. "
        "Baselines run in the same run; ratio = ours / baseline. Sizes: "
        + ", ".join(f"{name} {' '.join(a)}" for name, a in plan.items())
        + ". Details: `bench/results/*.json`."
    )
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / "summary.md").write_text(f"# Benchmarks\n\n{header}\n\n{table}\n")
    print()
    print(table)
    print(f"\n{header}\nwritten to {RESULTS_DIR / 'summary.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Shared helpers for benchmarks: percentiles, result records and table rows, short socket dirs, children."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO_ROOT = Path(__file__).resolve().parent.parent
MB = 1024 * 1024


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary_ms(samples: list[float]) -> dict[str, float]:
    """n, p50, p99, max and mean in milliseconds of samples taken in seconds."""
    return {
        "n": len(samples),
        "p50_ms": round(percentile(samples, 0.5) * 1e3, 3),
        "p99_ms": round(percentile(samples, 0.99) * 1e3, 3),
        "max_ms": round(max(samples) * 1e3, 3) if samples else float("nan"),
        "mean_ms": round(statistics.fmean(samples) * 1e3, 3) if samples else float("nan"),
    }


def ratio(ours: float, baseline: float) -> float:
    return round(ours / baseline, 3) if baseline else float("nan")


def short_tmpdir(prefix: str) -> Path:
    """Unix socket paths must stay under 108 bytes, so keep benchmark dirs short."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


@dataclass
class Row:
    """One line of the README table: what was measured, against what, and whether it met its target."""

    metric: str
    value: str
    baseline: str = ""
    ratio: float | None = None
    target: str = ""
    passed: bool | None = None


def latency_rows(
    metric: str,
    ours: dict[str, float],
    base: dict[str, float],
    base_notes: tuple[str, str],
    target: str,
    passed: bool,
) -> list[Row]:
    """The p50 row and the p99/max row (judged against `target`) of a latency measured against a baseline."""
    p50_note, p99_note = (f" ({note})" if note else "" for note in base_notes)
    return [
        Row(
            f"{metric}, p50",
            ms(ours["p50_ms"]),
            f"{ms(base['p50_ms'])}{p50_note}",
            ratio(ours["p50_ms"], base["p50_ms"]),
        ),
        Row(
            f"{metric}, p99 / max",
            f"{ms(ours['p99_ms'])} / {ms(ours['max_ms'])}",
            f"{ms(base['p99_ms'])} / {ms(base['max_ms'])}{p99_note}",
            ratio(ours["p99_ms"], base["p99_ms"]),
            target,
            passed,
        ),
    ]


@dataclass
class Result:
    name: str
    metrics: dict[str, object] = field(default_factory=dict)
    target: str = ""
    passed: bool | None = None
    rows: list[Row] = field(default_factory=list)

    def save(self) -> None:
        RESULTS_DIR.mkdir(exist_ok=True)
        (RESULTS_DIR / f"{self.name}.json").write_text(json.dumps(asdict(self), indent=2))
        verdict = "" if self.passed is None else (" PASS" if self.passed else " FAIL")
        print(f"{self.name}: {json.dumps(self.metrics)}  target: {self.target}{verdict}")

    @classmethod
    def load(cls, name: str) -> Result:
        raw = json.loads((RESULTS_DIR / f"{name}.json").read_text())
        rows = [Row(**r) for r in raw.pop("rows", [])]
        return cls(**raw, rows=rows)


def verdict(passed: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "-"}[passed]


def markdown_table(rows: list[Row]) -> str:
    lines = ["| metric | value | baseline | ratio | target | pass |", "|---|---|---|---|---|---|"]
    for r in rows:
        shown = "" if r.ratio is None else f"{r.ratio:.2f}x"
        lines.append(
            f"| {r.metric} | {r.value} | {r.baseline} | {shown} | {r.target} | {verdict(r.passed)} |"
        )
    return "\n".join(lines)


def ms(value: float) -> str:
    return f"{value:.1f} ms" if value >= 10 else f"{value:.2f} ms"


def cpu_count() -> int:
    return len(os.sched_getaffinity(0))


def spawn_ready(argv: list[str]) -> tuple[subprocess.Popen[str], str]:
    """Start a child that prints one line when it is ready (e.g. its socket path); returns it and the line."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    ready = proc.stdout.readline().strip()
    if not ready:
        stop_process(proc)
        raise RuntimeError(f"benchmark server exited before it was ready (code {proc.returncode})")
    return proc, ready


def stop_process(proc: subprocess.Popen[bytes] | subprocess.Popen[str] | None, timeout: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after `timeout`; always reaps. Safe on a process that already exited."""
    if proc is None:
        return
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()


def interruptible() -> None:
    """Let SIGINT cancel the run so `finally` blocks still stop children and remove temp dirs.

    A process started in the background by a non-interactive shell inherits SIGINT ignored, and then
    neither Python nor `asyncio.run` would act on it; `run_all` stops a benchmark that overruns with SIGINT.
    """
    signal.signal(signal.SIGINT, signal.default_int_handler)

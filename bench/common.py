"""Shared helpers for benchmarks: percentiles, result records, short socket dirs."""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary_ms(samples: list[float]) -> dict[str, float]:
    return {
        "n": len(samples),
        "p50_ms": round(percentile(samples, 0.5) * 1e3, 3),
        "p99_ms": round(percentile(samples, 0.99) * 1e3, 3),
        "mean_ms": round(statistics.fmean(samples) * 1e3, 3) if samples else float("nan"),
    }


def short_tmpdir(prefix: str) -> Path:
    """Unix socket paths must stay under 108 bytes, so keep benchmark dirs short."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


@dataclass
class Result:
    name: str
    metrics: dict[str, object] = field(default_factory=dict)
    target: str = ""
    passed: bool | None = None

    def save(self) -> None:
        RESULTS_DIR.mkdir(exist_ok=True)
        (RESULTS_DIR / f"{self.name}.json").write_text(json.dumps(asdict(self), indent=2))
        verdict = "" if self.passed is None else (" PASS" if self.passed else " FAIL")
        print(f"{self.name}: {json.dumps(self.metrics)}  target: {self.target}{verdict}")


def cpu_count() -> int:
    return len(os.sched_getaffinity(0))

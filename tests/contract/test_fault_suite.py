"""The short version of bench/fault_suite.py: every scenario, a few times each, in its own process.

Its own process because the suite runs several asyncio loops one after another, and grpc.aio should see
one loop per process (the test session already has one).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_fault_suite_recovers_from_everything(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.fault_suite", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((ROOT / "bench" / "results" / "fault_suite.json").read_text())
    failed = [r for r in result["rows"] if not r["passed"]]
    assert not failed, "\n".join(f"{r['metric']}: {r['value']}" for r in failed)
    assert len(result["rows"]) == 6

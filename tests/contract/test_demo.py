"""`kubegpu demo` end to end, as a newcomer runs it."""

from __future__ import annotations

import json
import subprocess
import sys


def test_demo_runs_and_reports_what_it_shows() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kubegpu", "demo", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    results = json.loads(out.stdout)
    assert results["gpus"] == 8
    assert len(results["allocated"]) == 2
    assert results["visible_devices"].split(",") == results["allocated"]
    assert results["allocatable_after_xid"] == 7
    assert results["allocatable_after_restart"] == 7  # the XID'd GPU stays out across a kubelet restart
    assert results["allocatable_after_recovery"] == 8  # and comes back once recovery probes pass
    assert results["exit_code"] == 0 and results["sockets_left"] == []


def test_demo_human_output_narrates_every_step() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kubegpu", "demo"], capture_output=True, text=True, timeout=60, check=True
    )
    for step in (
        "Start the kubelet",
        "A pod asks for 2 GPUs",
        "XID 79",
        "kubelet restarts",
        "recovers by itself",
        "Clean exit",
    ):
        assert step in out.stdout
    assert "NVIDIA_VISIBLE_DEVICES=" in out.stdout
    assert "Got goaway" not in out.stderr

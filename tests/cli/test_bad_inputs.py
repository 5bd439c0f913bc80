# ruff: noqa: E501  (a table of command lines: one per line reads best)
"""Every command, given bad input, answers with one line and a non-zero exit: never a traceback.

Bad inputs: a missing file, an empty one, binary bytes, Latin-1 text, YAML that is not a mapping, wrong
types, a directory, a busy --http-port, an unresolvable --http-address, an unknown profile, a bad env
value. Each command runs as a process, as a user runs it (a few at a time, to keep the test short).
Exit codes (issue 12): 0 ok, 1 findings or errors found (and the daemons' start failures, as NVIDIA's),
2 bad usage or input.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

FILES = {
    "missing": None,
    "empty": b"",
    "binary": bytes(range(256)) * 4,
    "latin1": b"version: v1\n# caf\xe9\n",
    "list": b"- a\n- b\n",
    "wrong-types": b'flags:\n  failOnInitError: "maybe"\n',
    "directory": None,
}
LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3} [A-Z]+ ")


@dataclass(frozen=True)
class Run:
    name: str
    args: tuple[str, ...]
    code: int  # the exit status expected
    env: tuple[tuple[str, str], ...] = ()
    logs: bool = False  # a long-running command: its error is one log record among others
    report: bool = False  # a report on stdout (config check's findings): its error lines are one line each


def file_path(tmp: Path, kind: str) -> str:
    path = tmp / f"{kind}.yaml"
    if kind == "directory":
        path.mkdir(exist_ok=True)
    elif FILES[kind] is not None:
        path.write_bytes(FILES[kind])  # type: ignore[arg-type]
    return str(path)


def runs(tmp: Path, busy_port: int) -> list[Run]:
    fake = (("KUBEGPU_FAKE_NVML", "dgx-a100"),)
    out: list[Run] = []
    manifest = file_path(tmp, "empty")
    for kind in FILES:
        f = file_path(tmp, kind)
        unusable = kind in ("missing", "directory")
        if kind != "empty":
            out += [
                Run(f"plugin --config-file {kind}", ("plugin", "--config-file", f, "--kubelet-socket", ""), 1, fake, True),
                Run(f"labels --config-file {kind}", ("labels", "--oneshot", "true", "-o", "-", "--config-file", f), 1, fake, True),
                Run(f"mps-daemon run --config-file {kind}", ("mps-daemon", "run", "--config-file", f, "--root", str(tmp / "mps")), 1, fake, True),
                Run(f"config check {kind}", ("config", "check", f, "--profile", "dgx-a100"), 2 if unusable else 1, report=not unusable),
                Run(f"lint --plugin-config {kind}", ("lint", manifest, "--plugin-config", f), 2),
            ]  # fmt: skip
        if kind in ("missing", "binary", "latin1", "directory"):
            out.append(Run(f"lint {kind}", ("lint", f), 2))
            out.append(
                Run(f"dra --kubeconfig {kind}", ("dra", "--node-name", "n", "--kubeconfig", f), 1, fake, True)
            )
            out.append(Run(f"config-manager --kubeconfig {kind}", ("config-manager", "--oneshot", "true", "--kubeconfig", f, "--node-name", "n", "--config-file-srcdir", str(tmp), "--config-file-dst", str(tmp / "dst.yaml")), 1, (), True))  # fmt: skip
        out.append(Run(f"explain --snapshot {kind}", ("explain", "default/p", "--snapshot", f), 2))
        out.append(Run(f"doctor --cluster --snapshot {kind}", ("doctor", "--cluster", "--snapshot", f), 2))
        if kind in ("binary", "latin1", "missing"):
            # NVIDIA's MPS init container falls back to 65536k when meminfo cannot be read: one ERROR, exit 0.
            out.append(Run(f"mps-daemon mount-shm --meminfo {kind}", ("mps-daemon", "mount-shm", "--dry-run", "--meminfo", f, "--root", str(tmp / "mps")), 0, (), True))  # fmt: skip
    http = ("plugin", "--kubelet-socket", "", "--http-address", "127.0.0.1", "--http-port", str(busy_port))
    out += [
        Run("plugin --http-port in use", http, 1, fake, True),
        Run("plugin --http-address unresolvable", ("plugin", "--kubelet-socket", "", "--http-port", "18081", "--http-address", "no-such-host.invalid"), 1, fake, True),
        Run("plugin unknown profile", ("plugin", "--kubelet-socket", ""), 1, (("KUBEGPU_FAKE_NVML", "no-such-profile"),), True),
        Run("plugin bad env value", ("plugin", "--kubelet-socket", ""), 1, (*fake, ("KUBEGPU_HEALTH_PROBE_SECONDS", "abc")), True),
        Run("dra without a node name", ("dra",), 1, fake, True),
        Run("dra bad --gpus", ("dra", "--node-name", "n", "--gpus", "0,MIG-1"), 1, fake, True),
        Run("dra bad --http-endpoint", ("dra", "--node-name", "n", "--http-endpoint", "8080"), 1, fake, True),
        Run("dra bad METRICS_PATH", ("dra", "--node-name", "n"), 1, (*fake, ("METRICS_PATH", "metrics")), True),
        Run("plugin bad flag value", ("plugin", "--kubelet-socket", "", "--mig-strategy", "weird"), 1, fake, True),
        Run("config check unknown profile", ("config", "check", manifest, "--profile", "no-such-profile"), 2),
        Run("demo unknown profile", ("demo", "--profile", "no-such-profile"), 2),
        Run("kubelet-sim --dir a file", ("kubelet-sim", "--dir", manifest), 2),
        Run("fake-nvml inject without state", ("fake-nvml", "inject", "--gpu", "0", "--xid", "79"), 2),
        Run("fake-nvml inject missing state dir", ("fake-nvml", "inject", "--gpu", "0", "--xid", "79", "--state-dir", str(tmp / "nope")), 2),
        Run("unknown command", ("no-such-command",), 2),
        Run("unknown option", ("lint", "--no-such-option"), 2),
    ]  # fmt: skip
    return out


def execute(run: Run) -> tuple[Run, subprocess.CompletedProcess[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBEGPU_", "CONFIG_FILE", "KUBECONFIG"))}
    proc = subprocess.run(
        [sys.executable, "-m", "kubegpu", *run.args],
        capture_output=True,
        text=True,
        env={**env, **dict(run.env)},
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    return run, proc


@pytest.fixture
def busy_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_every_command_answers_bad_input_with_one_line(tmp_path: Path, busy_port: int) -> None:
    plan = runs(tmp_path, busy_port)
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(execute, plan))
    failures = []
    for run, proc in results:
        output = proc.stdout + proc.stderr
        problems = []
        if "Traceback" in output:
            problems.append("a traceback")
        if proc.returncode != run.code:
            problems.append(f"exit {proc.returncode}, expected {run.code}")
        if run.report:
            errors = [line for line in proc.stdout.splitlines() if line.startswith("error: ")]
            if not errors or proc.stderr:
                problems.append("no one-line error in the report")
        elif run.logs:
            lines = proc.stderr.splitlines()
            errors = [i for i, line in enumerate(lines) if " ERROR " in line]
            if len(errors) != 1:
                problems.append(f"{len(errors)} ERROR records")
            elif errors[0] + 1 < len(lines) and not LOG_RECORD.match(lines[errors[0] + 1]):
                problems.append("the ERROR record spans lines")
        else:
            lines = proc.stderr.splitlines()
            if len(lines) != 1 or not lines[0].lower().startswith("error"):
                problems.append(f"stderr is {len(lines)} lines")
        if problems:
            failures.append(f"{run.name}: {', '.join(problems)}\n{output[-1500:]}")
    assert not failures, "\n\n".join(failures)
    assert len(results) >= 60

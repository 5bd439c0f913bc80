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
    stdin: str = os.devnull  # what standard input reads


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
    with open(run.stdin, "rb") as stdin:
        proc = subprocess.run(
            [sys.executable, "-m", "kubegpu", *run.args],
            capture_output=True,
            text=True,
            env={**env, **dict(run.env)},
            timeout=60,
            stdin=stdin,
        )
    return run, proc


@pytest.fixture
def busy_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def problems_of(run: Run, proc: subprocess.CompletedProcess[str]) -> list[str]:
    output = proc.stdout + proc.stderr
    problems = []
    if "Traceback" in output:
        problems.append("a traceback")
    if "internal error" in output:
        problems.append("an internal error")
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
    return problems


def check_all(plan: list[Run]) -> list[tuple[Run, subprocess.CompletedProcess[str]]]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(execute, plan))
    failures = []
    for run, proc in results:
        problems = problems_of(run, proc)
        if problems:
            failures.append(f"{run.name}: {', '.join(problems)}\n{(proc.stdout + proc.stderr)[-1500:]}")
    assert not failures, "\n\n".join(failures)
    return results


def test_every_command_answers_bad_input_with_one_line(tmp_path: Path, busy_port: int) -> None:
    results = check_all(runs(tmp_path, busy_port))
    assert len(results) >= 60


# The inputs an independent campaign found answered with `internal error (...)`, a broken line or in full.
KUBECONFIGS = {
    "utf16": "apiVersion: v1\nkind: Config\n".encode("utf-16"),
    "two-documents": b"apiVersion: v1\nclusters: []\n---\nkind: Config\n",
    "json-list": b'[{"name": "a"}]',
    "scalar": b"just some text\n",
    "wrong-types": b"clusters: 5\ncontexts: x\nusers: {}\ncurrent-context: 3\n",
    "entry-types": b"clusters:\n- 7\ncontexts:\n- name: [1]\n",
}
LONG = "x" * 5000
SNAPSHOT = str(Path(__file__).resolve().parents[1] / "fixtures" / "toolkit" / "cluster.json")


def campaign_runs(tmp: Path) -> list[Run]:
    fake = (("KUBEGPU_FAKE_NVML", "dgx-a100"),)
    out: list[Run] = []
    for kind, data in KUBECONFIGS.items():
        path = tmp / f"kubeconfig-{kind}"
        path.write_bytes(data)
        k = str(path)
        out += [
            Run(f"explain --kubeconfig {kind}", ("explain", "default/p", "--kubeconfig", k), 2),
            Run(f"doctor --cluster --kubeconfig {kind}", ("doctor", "--cluster", "--kubeconfig", k), 2),
            Run(f"config-manager --kubeconfig {kind}", ("config-manager", "--oneshot", "true", "--kubeconfig", k, "--node-name", "n", "--config-file-srcdir", str(tmp), "--config-file-dst", str(tmp / "dst.yaml")), 1, (), True),
            Run(f"labels --kubeconfig {kind}", ("labels", "--oneshot", "true", "--use-node-feature-api", "true", "--node-name", "n", "--namespace", "ns", "--kubeconfig", k), 1, fake, True),
        ]  # fmt: skip
    state = tmp / "state"
    state.mkdir()
    (state / "faults.json").write_bytes(b'{"gpus": {"0": {"lost": tr\xff')
    (state / "meta.json").write_bytes(b"[1, 2")
    long_host = "a" * 70
    out += [
        Run("fake-nvml inject torn state", ("fake-nvml", "inject", "--gpu", "0", "--lost", "--state-dir", str(state)), 2),
        Run("plugin KUBEGPU_HTTP_ADDRESS 70 characters", ("plugin", "--kubelet-socket", "", "--http-port", "18082"), 1, (*fake, ("KUBEGPU_HTTP_ADDRESS", long_host)), True),
        Run("config check KUBEGPU_HTTP_ADDRESS 70 characters", ("config", "check", "/dev/null", "--profile", "dgx-a100"), 1, (("KUBEGPU_HTTP_ADDRESS", long_host),), report=True),
        Run("plugin IMEX_CHANNEL_IDS with a newline", ("plugin", "--kubelet-socket", ""), 1, (*fake, ("IMEX_CHANNEL_IDS", "0\n2026-01-01T00:00:00.000 ERROR forged")), True),
        Run("plugin KUBEGPU_XID_ACTIONS with a newline", ("plugin", "--kubelet-socket", ""), 1, (*fake, ("KUBEGPU_XID_ACTIONS", "/nonexistent\n2026-01-01T00:00:00.000 ERROR forged")), True),
        Run("plugin KUBEGPU_XID_ACTIONS of 5,000 characters", ("plugin", "--kubelet-socket", ""), 1, (*fake, ("KUBEGPU_XID_ACTIONS", "/" + LONG)), True),
        Run("plugin KUBEGPU_HEALTH_PROBE_SECONDS of 5,000 characters", ("plugin", "--kubelet-socket", ""), 1, (*fake, ("KUBEGPU_HEALTH_PROBE_SECONDS", LONG)), True),
        # A unix socket path over the kernel's 107 bytes: the plugin retried binding it forever, silently.
        Run("plugin --kubelet-socket of 5,000 characters", ("plugin", "--kubelet-socket", "/" + LONG), 1, fake, True),
        Run("config check --kubelet-socket of 5,000 characters", ("config", "check", "/dev/null", "--profile", "dgx-a100", "--kubelet-socket", "/" + LONG), 1, report=True),
        Run("dra --kubelet-plugins-directory-path of 5,000 characters", ("dra", "--node-name", "n", "--kubelet-plugins-directory-path", "/" + LONG), 1, fake, True),
        Run("dra --kubelet-registrar-directory-path of 5,000 characters", ("dra", "--node-name", "n", "--kubelet-registrar-directory-path", "/" + LONG), 1, fake, True),
        Run("kubelet-sim --grace-period nan", ("kubelet-sim", "--grace-period", "nan", "--dir", str(tmp / "ks")), 2),
        Run("kubelet-sim --grace-period 1e309", ("kubelet-sim", "--grace-period", "1e309", "--dir", str(tmp / "ks")), 2),
        # Every file or stream is size-checked before it is read: a device is refused at once, not read to the
        # limit (`--preflight /dev/zero` grew to 13 GB; `--snapshot /dev/zero` peaked at 2.1 GB).
        Run("doctor --cluster --preflight /dev/zero", ("doctor", "--cluster", "--preflight", "/dev/zero", "--snapshot", SNAPSHOT), 2),
        Run("doctor --cluster --preflight - < /dev/zero", ("doctor", "--cluster", "--preflight", "-", "--snapshot", SNAPSHOT), 2, stdin="/dev/zero"),
        Run("doctor --cluster --snapshot /dev/zero", ("doctor", "--cluster", "--snapshot", "/dev/zero"), 2),
        Run("explain --snapshot /dev/zero", ("explain", "default/p", "--snapshot", "/dev/zero"), 2),
        Run("lint /dev/zero", ("lint", "/dev/zero"), 2),
        Run("lint - < /dev/zero", ("lint", "-"), 2, stdin="/dev/zero"),
        Run("lint --plugin-config /dev/zero", ("lint", "-", "--plugin-config", "/dev/zero"), 2),
        Run("config check /dev/zero", ("config", "check", "/dev/zero", "--profile", "dgx-a100"), 2),
        Run("mps-daemon run --timeout nan", ("mps-daemon", "run", "--timeout", "nan", "--root", str(tmp / "mps")), 2, fake),
    ]  # fmt: skip
    return out


@pytest.mark.timeout(600)  # a few dozen processes: slow on a loaded machine
def test_every_command_answers_the_campaigns_inputs_with_one_short_line(tmp_path: Path) -> None:
    results = check_all(campaign_runs(tmp_path))
    for run, proc in results:
        errors = [line for line in (proc.stdout + proc.stderr).splitlines() if "error" in line.lower()]
        assert errors and max(len(line) for line in errors) < 1500, f"{run.name}: an error line echoes it all"
        assert "forged" not in "".join(
            line for line in proc.stderr.splitlines() if line.startswith("2026-01-01")
        )

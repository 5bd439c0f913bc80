"""The CLI convention (README, "Output and exit codes"), checked on the commands as a user runs them:
through a pipe, and on a terminal (a pty of 80 and 120 columns).

- piped: no tables, no colour, no wrapping: each record one whole line;
- on a terminal: tables at full width that never cut a word, a path or an ID;
- exit 0 ok, 1 findings, 2 bad usage or input; errors one line on stderr;
- a reader that goes away (`| head -1`) ends the command quietly: nothing on stderr, exit 141 (SIGPIPE's).
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
BOX = set("│┃┏┓┗┛━─┡┩╇┼┬┴")
GPU_REQUEST = """apiVersion: v1
kind: Pod
metadata:
  name: trainer-{i}
spec:
  containers:
  - name: main
    image: cuda:12
    resources:
      limits:
        nvidia.com/gpu: -1
"""
TIME_SLICED = """version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""


def env() -> dict[str, str]:
    out = {
        k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES") and not k.startswith("KUBEGPU_")
    }
    return {**out, "TERM": "xterm-256color"}


def kubegpu(*args: str) -> list[str]:
    return [sys.executable, "-m", "kubegpu", *args]


def piped(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(kubegpu(*args), capture_output=True, text=True, env=env(), timeout=120)


def on_terminal(columns: int, *args: str) -> tuple[int, str, str]:
    """Run with stdout on a pty of `columns` columns; (exit code, stdout without colour codes, stderr)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    proc = subprocess.Popen(
        kubegpu(*args), stdin=subprocess.DEVNULL, stdout=follower, stderr=subprocess.PIPE, env=env()
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    code = proc.wait(timeout=120)
    text = ANSI.sub("", b"".join(chunks).decode()).replace("\r\n", "\n")
    return code, text, stderr


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    """Pods with a negative GPU request, in a file whose path is longer than a narrow table column."""
    path = tmp_path / "a-directory-with-a-rather-long-name" / "gpu-workloads-for-the-training-team.yaml"
    path.parent.mkdir()
    path.write_text("---\n".join(GPU_REQUEST.format(i=i) for i in range(3)))
    return path


def test_piped_lint_is_one_whole_line_per_finding(manifest: Path) -> None:
    out = piped("lint", str(manifest))
    assert (out.returncode, out.stderr) == (1, "")
    lines = out.stdout.splitlines()
    findings = [line for line in lines if line.startswith(f"{manifest}:")]
    assert len(findings) == 3 and all(" error " in line for line in findings)
    assert not BOX & set(out.stdout) and "\x1b[" not in out.stdout
    assert lines[-1] == "3 object(s) checked: 3 error(s), 0 warning(s)."


@pytest.mark.parametrize("columns", [80, 120])
def test_lint_on_a_terminal_never_cuts_a_path(manifest: Path, columns: int) -> None:
    code, text, stderr = on_terminal(columns, "lint", str(manifest))
    assert (code, stderr) == (1, "")
    lines = text.splitlines()
    # wider than the terminal only where one word is (the path: the terminal wraps it, nothing cuts it)
    assert all(len(line) <= columns or len(line.split()) == 1 for line in lines), text
    # a table, or (too narrow for the longest word) plain lines: either way the path is whole on its line
    assert any(str(manifest) in line for line in lines), text
    for word in ("trainer-0", "trainer-2"):  # object names whole on one line, never cut by a wrap
        assert any(word in line for line in lines), text
    assert not any(line.rstrip("│ ").endswith(str(manifest)[:-5]) for line in lines)


@pytest.mark.parametrize("columns", [80, 120])
def test_config_check_on_a_terminal_shows_whole_device_ids(tmp_path: Path, columns: int) -> None:
    config = tmp_path / "ts.yaml"
    config.write_text(TIME_SLICED)
    code, text, stderr = on_terminal(columns, "config", "check", str(config), "--profile", "t4-pcie")
    assert (code, stderr) == (0, "")
    lines = text.splitlines()
    assert all(len(line) <= columns or len(line.split()) == 1 for line in lines), text
    ids = re.findall(r"GPU-[0-9a-f-]+::\d", text)
    # the first GPU's four replicas, each whole (an ID cut in two would not match the full pattern)
    assert len({i[-1] for i in ids}) == 4 and all(len(i) == len("GPU-") + 36 + 3 for i in ids), ids
    # a table where one fits with whole IDs (120 columns); at 80 the same records as wrapped lines
    assert bool(BOX & set(text)) == (columns == 120)


def test_config_check_piped_is_plain_lines(tmp_path: Path) -> None:
    config = tmp_path / "ts.yaml"
    config.write_text(TIME_SLICED)
    out = piped("config", "check", str(config), "--profile", "t4-pcie")
    assert (out.returncode, out.stderr) == (0, "")
    assert not BOX & set(out.stdout)
    resource = next(line for line in out.stdout.splitlines() if line.startswith("nvidia.com/gpu: "))
    assert resource.startswith(
        "nvidia.com/gpu: 16 devices, sharing time-slicing: GPU-"
    ) and resource.endswith(", ... (12 more)")


def test_a_broken_pipe_is_quiet(tmp_path: Path) -> None:
    """`kubegpu lint FILE | head -1`: more output than a pipe holds, the reader stops after one line."""
    big = tmp_path / "many.yaml"
    big.write_text("---\n".join(GPU_REQUEST.format(i=i) for i in range(1500)))
    proc = subprocess.Popen(
        kubegpu("lint", str(big)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(), text=True
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()
    stderr = proc.stderr.read()
    assert proc.wait(timeout=120) == 141 and stderr == ""
    assert first.startswith(f"{big}:")


def test_bad_usage_and_bad_input_are_one_line_on_stderr_with_exit_2(tmp_path: Path) -> None:
    for args in (
        ("lint", str(tmp_path / "missing.yaml")),
        ("doctor", "--host-root", str(tmp_path / "nonexistent")),
        ("config", "check", str(tmp_path / "missing.yaml")),
        ("explain", "default/p", "--snapshot", str(tmp_path / "missing.json")),
        ("lint", "--no-such-option"),
    ):
        out = piped(*args)
        assert (out.returncode, out.stdout) == (2, ""), args
        assert len(out.stderr.splitlines()) == 1 and out.stderr.lower().startswith("error: "), (
            args,
            out.stderr,
        )


def test_help_imports_no_subcommand() -> None:
    """`kubegpu --help` lists every command from cli/main.py's table: none of them is imported."""
    code = (
        "import sys\n"
        "from kubegpu.cli.main import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "wanted = ('kubegpu', 'rich', 'grpc', 'pynvml')\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith(wanted))), file=sys.stderr)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env(), timeout=60)
    assert out.stderr.split() == [
        "kubegpu",
        "kubegpu.cli",
        "kubegpu.cli.main",
        "kubegpu.common",
        "kubegpu.common.output",
    ]
    for name in ("config", "config-manager", "demo", "doctor", "explain", "lint", "plugin"):
        assert re.search(rf"^  {name} +\S", out.stdout, re.M), name


def test_the_help_table_says_what_each_command_says() -> None:
    import click

    from kubegpu.cli.main import main

    ctx = click.Context(main)
    assert set(main.lazy_help) == set(main.lazy_commands)
    for name, short in main.lazy_help.items():
        command = main.get_command(ctx, name)
        assert command is not None and command.get_short_help_str(500) == short, name


def test_kubelet_sim_event_lines_are_never_wrapped_when_piped(tmp_path: Path) -> None:
    plugins = tmp_path / "device-plugins"
    proc = subprocess.Popen(
        kubegpu("kubelet-sim", "--dir", str(plugins)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env(),
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline().decode() for _ in range(2)]
    finally:
        proc.send_signal(2)  # SIGINT: the simulator stops and removes its sockets
        rest, stderr = proc.communicate(timeout=60)
    started, hint = lines
    assert re.fullmatch(rf"\+ +0\.000s kubelet-started +kubelet serving {plugins}/kubelet\.sock\n", started)
    assert hint.startswith(
        f"Point the plugin at --kubelet-socket {plugins}/kubelet.sock. PodResources API on "
    )
    assert hint.endswith("SIGHUP restarts the kubelet, Ctrl-C or SIGTERM stops it.\n")  # one line, > 80 chars
    assert len(hint) > 80 and proc.returncode == 0 and stderr == b""
    assert "kubelet-stopped" in rest.decode()

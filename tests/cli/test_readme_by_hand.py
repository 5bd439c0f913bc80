"""The README's "Trying things by hand" section works as written, from any directory.

Its shell block is extracted and run by bash (`-e`: any failing command fails the test) in a temp
directory, with `kubegpu` on PATH as the README says, after two substitutions that let it run next to other
tests: the work directory (/tmp/kubegpu) and the HTTP port (8080). The block must stop everything it
started: the run is bounded, and whatever is left in its process group afterwards fails the test (and is
killed).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
BIN = Path(sys.executable).parent


def by_hand_block() -> str:
    text = README.read_text()
    section = text[text.index("### Trying things by hand") :]
    match = re.search(r"```sh\n(.*?)\n```", section, re.S)
    assert match, "no shell block in the by-hand section"
    return match.group(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_block_uses_only_what_a_user_has() -> None:
    block = by_hand_block()
    assert ".venv/" not in block  # works from any directory, not only the repository's root
    assert "--pod-resources-socket /tmp/kubegpu/pod-resources/kubelet.sock" in block  # the simulator's
    assert (
        "cat > configs.yaml" in block and "kubegpu config check configs.yaml" in block
    )  # a file that exists
    assert re.search(r"^kill \$PLUGIN.*kill \$KUBELET", block, re.M)  # says how to stop everything
    assert (
        "[docs/architecture.md](docs/architecture.md)"
        in README.read_text().split("### Trying things by hand")[1]
    )


@pytest.mark.skipif(shutil.which("curl") is None, reason="the README's block uses curl")
@pytest.mark.timeout(240)
def test_the_by_hand_section_runs_as_written(tmp_path: Path) -> None:
    work = tmp_path / "kg"
    log = tmp_path / "plugin.log"
    script = (
        by_hand_block()
        .replace("/tmp/kubegpu", str(work))
        .replace("8080", str(free_port()))
        .replace("2> plugin.log", f"2> {log}")  # kept after the block removes its directory
    )
    elsewhere = tmp_path / "elsewhere"  # not the repository: the block must not depend on where it starts
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBEGPU_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.Popen(
        ["bash", "-e", "-c", script],
        cwd=elsewhere,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        leftover = _kill_group(proc.pid)
    assert proc.returncode == 0, (out, err)
    assert leftover == [], f"processes left running: {leftover}"
    assert not work.exists()  # cleaned up as the block says
    lines = out.splitlines()
    assert 'kubegpu_devices{health="unhealthy",resource="nvidia.com/gpu"} 1.0' in lines  # the injected XID
    assert sum("registered nvidia.com/gpu" in line for line in lines) == 2  # again after the restart
    assert "OK: the plugin would start with each of the 1 configs" in lines
    assert any(line.startswith("+") and "kubelet-stopped" in line for line in lines)
    plugin_log = log.read_text()
    # warnings for what the block does (the XID on GPU 3, the kubelet restart), none for PodResources
    warnings = [line for line in plugin_log.splitlines() if " WARNING " in line or " ERROR " in line]
    assert any(" GPU 3 (GPU-" in line for line in warnings), warnings
    assert not [line for line in warnings if "podresources" in line.lower().replace("-", "")], warnings
    assert "sockets removed" in plugin_log


def _kill_group(pgid: int) -> list[str]:
    """Whatever is still running in the block's process group: named, then killed."""
    left = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.getpgid(int(pid)) == pgid:
                left.append(Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ").strip())
        except (OSError, ProcessLookupError):
            continue
    if left:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    return [c for c in left if c]

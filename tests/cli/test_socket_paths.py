"""A unix socket path over the kernel's limit (sun_path: 108 bytes with the NUL) is refused at start.

The plugin given such a --kubelet-socket retried binding its own sockets beside it forever, logging only
gRPC's warning; the DRA driver's directories build its sockets the same way. Both now refuse the setting in
one line naming it, its length and the fix, and `config check` refuses exactly what the plugin refuses.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

LIMIT = 107  # bytes a unix socket's path may hold, the terminating NUL aside


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBEGPU_", "KUBELET_", "CONFIG_FILE"))}
    return subprocess.run(
        [sys.executable, "-m", "kubegpu", *args],
        capture_output=True,
        text=True,
        env={**env, "KUBEGPU_FAKE_NVML": "dgx-a100"},
        timeout=60,
    )


def directory_of(tmp: Path, total: int, file: str) -> Path:
    """A directory under `tmp` whose path joined with `/file` is `total` bytes long."""
    short = Path("/tmp") / f"kg-sock-{os.getpid()}-{tmp.name[-8:]}"
    padding = total - len(str(short)) - 1 - len(file) - 1
    assert padding > 0
    return short / ("d" * padding)


def check(socket: str) -> subprocess.CompletedProcess[str]:
    return run("config", "check", "/dev/null", "--profile", "dgx-a100", "--kubelet-socket", socket)


@pytest.mark.parametrize(
    ("kubelet_bytes", "problem"),
    [
        (LIMIT - 3, None),  # nvidia-gpu.sock beside it: exactly 107 bytes
        (LIMIT - 2, "the plugin's socket beside it '{dir}/nvidia-gpu.sock' would be 108 bytes"),
        (LIMIT + 1, "it is 108 bytes"),
    ],
)
def test_config_check_refuses_a_kubelet_socket_with_no_room_for_the_plugins(
    tmp_path: Path, kubelet_bytes: int, problem: str | None
) -> None:
    directory = directory_of(tmp_path, kubelet_bytes, "kubelet.sock")
    socket = f"{directory}/kubelet.sock"
    assert len(socket) == kubelet_bytes
    proc = check(socket)
    errors = [line for line in proc.stdout.splitlines() if line.startswith("error: ")]
    if problem is None:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert errors == []
        return
    assert proc.returncode == 1
    expected = (
        f"error: invalid --kubelet-socket (KUBELET_SOCKET) '{socket}': {problem.format(dir=directory)}, "
        "over the 107 a unix socket's path may hold; give a shorter path"
    )
    assert errors == [expected]


def test_the_plugin_refuses_a_5000_character_kubelet_socket_in_one_line() -> None:
    proc = run("plugin", "--kubelet-socket", "/" + "x" * 5000)
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert proc.returncode == 1
    assert len(errors) == 1
    assert errors[0].endswith(
        "... (5001 characters): it is 5001 bytes, over the 107 a unix socket's path may hold; "
        "give a shorter path"
    )
    assert "invalid --kubelet-socket (KUBELET_SOCKET) '/xxx" in errors[0]
    assert len(errors[0]) < 500  # the value cut at 256 characters


def test_the_dra_driver_refuses_directories_its_sockets_do_not_fit_in(tmp_path: Path) -> None:
    plugins = directory_of(tmp_path, LIMIT + 1, "gpu.nvidia.com/dra.sock")
    registrar = directory_of(tmp_path, LIMIT, "gpu.nvidia.com-reg.sock")  # fits exactly
    proc = run(
        "dra",
        "--node-name",
        "n",
        "--kubelet-plugins-directory-path",
        str(plugins),
        "--kubelet-registrar-directory-path",
        str(registrar),
    )
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert proc.returncode == 1
    assert len(errors) == 1
    assert errors[0].endswith(
        f"invalid --kubelet-plugins-directory-path (KUBELET_PLUGINS_DIRECTORY_PATH) '{plugins}': "
        f"the driver's socket in it '{plugins}/gpu.nvidia.com/dra.sock' would be 108 bytes, over the 107 a "
        "unix socket's path may hold; give a shorter path"
    )

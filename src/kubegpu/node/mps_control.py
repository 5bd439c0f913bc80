"""Talking to the driver's tools: `nvidia-smi` for compute modes, `nvidia-cuda-mps-control` for daemons.

Executables are looked up on PATH at each call (as NVIDIA's exec.Command does), so the image decides
which tools run and tests put stand-ins first on PATH. Unlike NVIDIA's, every call has a timeout: a
wedged driver must not hang the manager's shutdown or the plugin's start.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from kubegpu.node.mps_paths import MpsRoot

NVIDIA_SMI = "nvidia-smi"
MPS_CONTROL = "nvidia-cuda-mps-control"
EXCLUSIVE_PROCESS = "EXCLUSIVE_PROCESS"
DEFAULT = "DEFAULT"
HEALTH_COMMAND = "get_default_active_thread_percentage"
DEFAULT_TIMEOUT_S = 30.0
# Passed through to the control daemon besides its two MPS variables: what it needs to find
# nvidia-cuda-mps-server and the driver libraries. Everything else (CUDA_VISIBLE_DEVICES, our own
# CUDA_MPS_* ...) stays out: the daemon must serve every GPU of its resource with the defaults we set.
_PASSED_THROUGH = ("PATH", "LD_LIBRARY_PATH")


class MpsCommandError(RuntimeError):
    """A driver tool failed, timed out or is missing; the message names the command and its output."""


def executable(name: str) -> str:
    """The absolute path of a tool on PATH. Raises MpsCommandError naming PATH when it is missing."""
    found = shutil.which(name)
    if found is None:
        raise MpsCommandError(
            f"{name} not found on PATH ({os.environ.get('PATH', '')}): run the MPS daemon with the NVIDIA "
            "container runtime so the driver's tools are mounted into the container"
        )
    return found


def _output(text: str | bytes | None) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return (text or "").strip()


def run_tool(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> str:
    """Run a tool to completion and return its stdout. Raises MpsCommandError with what it printed."""
    command = " ".join(argv)
    try:
        done = subprocess.run(
            [executable(argv[0]), *argv[1:]],
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=None if env is None else dict(env),
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as err:
        raise MpsCommandError(f"`{command}` did not finish within {timeout_s:g}s") from err
    except OSError as err:
        raise MpsCommandError(f"cannot run `{command}`: {err}") from err
    if done.returncode != 0:
        output = _output(done.stdout + "\n" + done.stderr)
        raise MpsCommandError(f"`{command}` exited with {done.returncode}: {output or '(no output)'}")
    return done.stdout


def set_compute_mode(uuid: str, mode: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """`nvidia-smi -i <uuid> -c <mode>` (EXCLUSIVE_PROCESS so only the MPS server opens the GPU)."""
    try:
        run_tool([NVIDIA_SMI, "-i", uuid, "-c", mode], timeout_s=timeout_s)
    except MpsCommandError as err:
        raise MpsCommandError(f"error setting compute mode {mode} on {uuid}: {err}") from err


def control_env(root: MpsRoot, resource: str) -> dict[str, str]:
    env = {k: os.environ[k] for k in _PASSED_THROUGH if k in os.environ}
    env.update(root.control_env(resource))
    return env


def start_control_daemon(root: MpsRoot, resource: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """`nvidia-cuda-mps-control -d`: it forks the daemon and returns.

    Its output goes to a file, not a pipe: the forked daemon inherits our descriptors, and waiting for
    EOF on a pipe it holds open would wait for the daemon to exit.
    """
    argv = [executable(MPS_CONTROL), "-d"]
    with tempfile.TemporaryFile(mode="w+") as out:
        try:
            done = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=control_env(root, resource),
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as err:
            raise MpsCommandError(f"`{MPS_CONTROL} -d` did not return within {timeout_s:g}s") from err
        except OSError as err:
            raise MpsCommandError(f"cannot run `{MPS_CONTROL} -d`: {err}") from err
        if done.returncode != 0:
            out.seek(0)
            output = _output(out.read())
            raise MpsCommandError(
                f"`{MPS_CONTROL} -d` for {resource} exited with {done.returncode}: {output or '(no output)'}"
            )


def send_command(root: MpsRoot, resource: str, command: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
    """Pipe one command into `nvidia-cuda-mps-control` for this resource's daemon; returns its answer.

    The command is written without a trailing newline, exactly as NVIDIA's manager writes it.
    """
    return run_tool([MPS_CONTROL], env=control_env(root, resource), stdin=command, timeout_s=timeout_s)


def mps_daemon_alive(mps_root: Path, resource_name: str, timeout_s: float) -> tuple[bool, str]:
    """Whether the MPS control daemon of `resource_name` answers, as NVIDIA's plugin checks before serving.

    `mps_root` is where the host's MPS root is mounted in the caller's container (/mps in NVIDIA's
    DaemonSets). Sends `get_default_active_thread_percentage` through `nvidia-cuda-mps-control` with the
    resource's pipe directory. Returns (True, "") when it answers, else (False, why). Blocks up to
    `timeout_s`; call it from a thread in async code.
    """
    root = MpsRoot(Path(mps_root))
    pipe = root.pipe_dir(resource_name)
    if not pipe.is_dir():
        return False, (
            f"MPS control daemon for {resource_name} is not running: {pipe} does not exist "
            f"(is `kubegpu mps-daemon run` running on this node with the MPS root mounted at {mps_root}?)"
        )
    try:
        send_command(root, resource_name, HEALTH_COMMAND, timeout_s)
    except MpsCommandError as err:
        return False, f"MPS control daemon for {resource_name} does not answer (pipe {pipe}): {err}"
    return True, ""

"""One MPS control daemon per shared resource: start it with its limits, stop it and clean up.

Start (NVIDIA's order): compute mode EXCLUSIVE_PROCESS on each GPU, pipe dir (0755, SELinux-labelled for
containers when SELinux is on) and log dir, `nvidia-cuda-mps-control -d`, one control call per default
limit, `.started`, then follow `log/control.log` on our stdout so `kubectl logs` shows the daemon.

Stop: `quit`, compute mode DEFAULT, remove `.started`, stop following the log, remove the log dir. Unlike
NVIDIA, a failed step does not skip the rest: a GPU left in EXCLUSIVE_PROCESS would refuse every
non-MPS workload after the daemon is gone, so the compute mode is reset even when `quit` fails.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kubegpu.mps.plan import DaemonPlan
from kubegpu.node import mps_control as control
from kubegpu.node.mps_paths import MpsRoot

log = logging.getLogger(__name__)

SELINUX_FS = Path("/sys/fs/selinux")
CONTAINER_FILE_LABEL = "system_u:object_r:container_file_t:s0"

Labeler = Callable[[Path, str], None]


def set_selinux_label(path: Path, label: str) -> None:
    """Label a directory and what is already in it (as `chcon -R` would), so containers may use the pipes."""
    targets = [path, *(Path(d) / n for d, dirs, files in os.walk(path) for n in (*dirs, *files))]
    for target in targets:
        os.setxattr(target, "security.selinux", label.encode(), follow_symlinks=False)


@dataclass(frozen=True, slots=True)
class DaemonOptions:
    root: MpsRoot = field(default_factory=MpsRoot)
    selinux_fs: Path = SELINUX_FS  # SELinux is on when this exists
    timeout_s: float = control.DEFAULT_TIMEOUT_S  # per driver-tool call
    follow_logs: bool = True


class ControlDaemon:
    """The MPS control daemon of one resource. Remembers what it changed so `stop` undoes exactly that."""

    def __init__(
        self, plan: DaemonPlan, options: DaemonOptions, labeler: Labeler = set_selinux_label
    ) -> None:
        self.plan = plan
        self.options = options
        self._labeler = labeler
        self._exclusive: list[str] = []  # GPUs we put in EXCLUSIVE_PROCESS
        self._daemon_started = False
        self._tail: subprocess.Popen[bytes] | None = None

    @property
    def resource(self) -> str:
        return self.plan.resource

    @property
    def root(self) -> MpsRoot:
        return self.options.root

    def start(self) -> None:
        """Raises MpsCommandError or OSError; call `stop` afterwards either way to undo what was done."""
        timeout = self.options.timeout_s
        for uuid in self.plan.uuids:
            control.set_compute_mode(uuid, control.EXCLUSIVE_PROCESS, timeout)
            self._exclusive.append(uuid)
        log.info("Starting MPS daemon for %s on %s", self.resource, ", ".join(self.plan.uuids))
        pipe_dir, log_dir = self.root.pipe_dir(self.resource), self.root.log_dir(self.resource)
        pipe_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        if self.options.selinux_fs.exists():
            self._labeler(pipe_dir, CONTAINER_FILE_LABEL)
        log_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        control.start_control_daemon(self.root, self.resource, timeout)
        self._daemon_started = True
        for command in self.plan.control_commands():
            try:
                control.send_command(self.root, self.resource, command, timeout)
            except control.MpsCommandError as err:
                message = f"error sending `{command}` for {self.resource}: {err}"
                raise control.MpsCommandError(message) from err
        self.root.started_file(self.resource).touch()
        if self.options.follow_logs:
            self._follow(log_dir / "control.log")

    def _follow(self, path: Path) -> None:
        # NVIDIA runs `tail -n +1 -f`; without tail the daemon still works, we only lose its log lines.
        try:
            self._tail = subprocess.Popen(
                [control.executable("tail"), "-n", "+1", "-f", str(path)], stdin=subprocess.DEVNULL
            )
        except (control.MpsCommandError, OSError) as err:
            log.warning("not following %s: %s", path, err)

    def stop(self) -> list[str]:
        """Undo `start`, as far as it got. Returns the errors (each step is tried regardless)."""
        errors: list[str] = []
        timeout = self.options.timeout_s
        if self._daemon_started:
            try:
                output = control.send_command(self.root, self.resource, "quit", timeout).strip()
                log.info("Shut down MPS for %s%s", self.resource, f": {output}" if output else "")
            except control.MpsCommandError as err:
                errors.append(f"error sending quit message for {self.resource}: {err}")
            self._daemon_started = False
        for uuid in self._exclusive:
            try:
                control.set_compute_mode(uuid, control.DEFAULT, timeout)
            except control.MpsCommandError as err:
                errors.append(str(err))
        self._exclusive = []
        with contextlib.suppress(FileNotFoundError):
            self.root.started_file(self.resource).unlink()
        self._stop_following()
        try:
            shutil.rmtree(self.root.log_dir(self.resource))
        except FileNotFoundError:
            pass
        except OSError as err:
            errors.append(f"failed to remove {self.root.log_dir(self.resource)}: {err}")
        return errors

    def _stop_following(self) -> None:
        if self._tail is None:
            return
        self._tail.terminate()
        try:
            self._tail.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._tail.kill()
            self._tail.wait()
        self._tail = None

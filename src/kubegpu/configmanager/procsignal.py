"""Finding the process to signal by its argv[0] under /proc, and signalling it.

With `shareProcessNamespace: true` the config-manager sidecar sees the plugin container's processes in its
own /proc, which is how NVIDIA's config-manager finds `nvidia-device-plugin` to send it SIGHUP.

Matching is NVIDIA's (v0.20.1): argv[0] equals the target, or their base names are equal
(`/usr/bin/kubegpu` matches `kubegpu` and the other way round; `kubegpu-x` does not match `kubegpu`).
Beyond NVIDIA, for a Python program:

- a console script started through its shebang shows the interpreter as argv[0]
  (`/usr/bin/python3 /usr/local/bin/kubegpu plugin`), and `python -m kubegpu` shows the module after
  `-m`; for an interpreter, the script or module is matched too;
- the config-manager never picks itself. That matters for us only: `kubegpu config-manager` and
  `kubegpu plugin` are the same program, whereas NVIDIA's config-manager is a binary of its own.
"""

from __future__ import annotations

import logging
import os
import re
import signal
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path

from kubegpu.configmanager.errors import ConfigManagerError, go_errno, go_os_error

log = logging.getLogger("kubegpu.configmanager")

_PYTHON = re.compile(r"python[0-9.]*")
# Interpreter options that take a separate value (`-W error`), so that value is not taken for the script.
_OPTIONS_WITH_VALUE = frozenset({"-W", "-X", "--check-hash-based-pycs"})


def matches(argv0: str, target: str) -> bool:
    """NVIDIA's rule: the same string, or the same base name."""
    return argv0 == target or os.path.basename(argv0) == os.path.basename(target)


def program_names(argv: Sequence[str]) -> list[str]:
    """The names a process can be matched by: argv[0], and for a Python interpreter its script or module."""
    if not argv:
        return []
    names = [argv[0]]
    if _PYTHON.fullmatch(os.path.basename(argv[0])):
        script = _python_program(argv[1:])
        if script:
            names.append(script)
    return names


def _python_program(args: Sequence[str]) -> str | None:
    it = iter(args)
    for arg in it:
        if arg == "-m":
            return next(it, None)
        if arg == "-c" or arg == "-":  # code from the command line or stdin: no program name to match
            return None
        if arg in _OPTIONS_WITH_VALUE:
            next(it, None)
        elif not arg.startswith("-"):
            return arg
    return None


def read_cmdline(proc_root: Path, pid: int) -> list[str] | None:
    """The argv of `pid` from `<proc_root>/<pid>/cmdline`; None when it has none or is gone."""
    try:
        raw = (proc_root / str(pid) / "cmdline").read_bytes()
    except OSError:
        # Exited between listing and reading, or not ours to read. NVIDIA gives up on the whole search
        # here; one short-lived process elsewhere in the pod must not stop the signal reaching the plugin.
        return None
    if not raw:  # kernel threads and zombies have an empty cmdline
        return None
    return [os.fsdecode(part) for part in raw.rstrip(b"\0").split(b"\0")]


def _pids(proc_root: Path) -> Iterator[int]:
    try:
        names = os.listdir(proc_root)
    except OSError as err:
        raise ConfigManagerError(f"error getting list of all procs: {go_os_error('open', err)}") from err
    # Lowest PID first, the order NVIDIA sees /proc in: the longest-running match wins.
    yield from sorted(int(name) for name in names if name.isdigit())


def find_pid(target: str, *, proc_root: str | Path = "/proc", exclude: Collection[int] = ()) -> int:
    """The first process (lowest PID) whose program matches `target`; raises ConfigManagerError."""
    root = Path(proc_root)
    for pid in _pids(root):
        if pid in exclude:
            continue
        argv = read_cmdline(root, pid)
        if argv and any(matches(name, target) for name in program_names(argv)):
            return pid
    raise ConfigManagerError("no process found")


def signal_process(
    target: str, signum: int, *, proc_root: str | Path = "/proc", exclude: Collection[int] | None = None
) -> int:
    """Send `signum` to the process matching `target`; the PID signalled. Raises ConfigManagerError."""
    if exclude is None:
        exclude = (os.getpid(),)
    try:
        pid = find_pid(target, proc_root=proc_root, exclude=exclude)
    except ConfigManagerError as err:
        raise ConfigManagerError(f"error finding pid: {err}") from err
    log.debug("Signalling PID %d", pid)
    try:
        os.kill(pid, signum)
    except (OSError, ValueError, OverflowError) as err:
        reason = go_errno(err) if isinstance(err, OSError) else "invalid argument"
        raise ConfigManagerError(f"error sending signal: {reason}") from err
    return pid


def signal_name(signum: int) -> str:
    """The signal as Go's syscall.Signal prints it in NVIDIA's log line (`hangup`, `terminated`)."""
    try:
        text = signal.strsignal(signum)
    except ValueError:
        text = None
    if not text or text.startswith(("Unknown signal", "Real-time signal")):
        return f"signal {signum}"
    return text.lower()

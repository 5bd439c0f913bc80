"""Running an image the way a node does, for `make image-test` (smoke_test.py): a private buildah storage
the OCI archive is loaded into (Storage), the image's root filesystem run as a container on a read-only
root (Container), and long-running processes whose output is watched and which are stopped for sure
(Daemon)."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


class Storage:
    """A buildah storage of its own in a temporary directory, as a freshly imported node's would be, so
    the test runs what the archive holds and nothing else, and leaves nothing behind."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.base = ["buildah", "--root", str(tmp / "storage"), "--runroot", str(tmp / "run")]
        self.env = {**os.environ, "BUILDAH_ISOLATION": "chroot"}
        self.containers: list[str] = []

    def __call__(self, *args: str) -> str:
        proc = subprocess.run([*self.base, *args], capture_output=True, text=True, env=self.env)
        if proc.returncode != 0:
            raise AssertionError(f"buildah {' '.join(args)}: exit {proc.returncode}\n{proc.stderr}")
        return proc.stdout.strip()

    def container(self, image: str) -> Container:
        name = f"kubegpu-image-test-{os.getpid()}-{len(self.containers)}"
        self("from", "--quiet", "--pull-never", "--name", name, image)
        self.containers.append(name)
        return Container(self, name)

    def close(self) -> None:
        for name in self.containers:
            with contextlib.suppress(AssertionError):
                self("rm", name)
        with contextlib.suppress(AssertionError):
            self("rmi", "--all", "--force")
        # An overlay storage may keep a mount or two; nothing under tmp may stay mounted before it goes.
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        for mount in sorted((m for m in mounts if m.startswith(str(self.tmp))), reverse=True):
            subprocess.run(["umount", "-l", mount], check=False)


class Container:
    """The image's root filesystem (a buildah container, mounted), run the way the kubelet's runtime runs
    a pod's container with readOnlyRootFilesystem: in a mount namespace of its own, the root bind-mounted
    read-only, /proc and /dev mounted, the volumes bound, the image's environment only, as the image's
    user unless told, chrooted. (buildah run has no read-only root, and in 1.28 it fails after any command
    run on one; this is the same chroot isolation it uses, minus that.) The process is the command itself,
    so its exit status and the signals it gets are the command's own."""

    def __init__(self, storage: Storage, name: str) -> None:
        self.mountpoint = Path(storage("mount", name))
        config = json.loads(storage("inspect", "--type", "container", name))["OCIv1"]["config"]
        self.user: str = config.get("User") or "0:0"
        self.env = dict(item.partition("=")[::2] for item in config.get("Env") or [])

    def argv(
        self,
        command: Sequence[str],
        *,
        user: str | None = None,
        env: dict[str, str] | None = None,
        volumes: Sequence[tuple[Path, str]] = (),
    ) -> list[str]:
        # The mount targets are made in the container's own layer first, as a runtime does.
        for target in ("proc", "dev", *(target.lstrip("/") for _, target in volumes)):
            (self.mountpoint / target).mkdir(parents=True, exist_ok=True)
        script = [
            'root="$0"',
            'mount --bind "$root" "$root"',
            'mount -o remount,bind,ro "$root"',
            'mount -t proc proc "$root/proc"',
            'mount --rbind /dev "$root/dev"',
            *(f'mount --bind {shlex.quote(str(src))} "$root"{shlex.quote(dst)}' for src, dst in volumes),
            'exec "$@"',
        ]
        environment = [f"{key}={value}" for key, value in {**self.env, **(env or {})}.items()]
        return [
            *("unshare", "--mount", "--propagation", "private", "sh", "-ec", "; ".join(script)),
            str(self.mountpoint),
            *("env", "-i", *environment),
            *("chroot", f"--userspec={user or self.user}", str(self.mountpoint), *command),
        ]

    def run(self, command: Sequence[str], **options: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(command, **options), capture_output=True, text=True, timeout=120)


class Daemon:
    """A long-running process in its own process group (a container's command, or a simulator), its
    output collected line by line; stop() ends the whole group, so nothing of it survives."""

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            self.lines.put(line)

    def wait_for(
        self, predicate: Callable[[str], bool], what: str, peer: Daemon | None = None, timeout: float = 60.0
    ) -> str:
        """The first line of output that satisfies predicate; fails when this process or its peer (the
        one expected to cause that line) exits first, or at the timeout, with both their outputs."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
            except queue.Empty:
                gone = [d for d in (self, peer) if d is not None and d.proc.poll() is not None]
                if gone or time.monotonic() > deadline:
                    outputs = "\n".join(
                        f"--- {d.name}: exit {d.proc.poll()}\n{d.tail()}" for d in (self, peer) if d
                    )
                    raise AssertionError(f"no {what}:\n{outputs}") from None
                continue
            if predicate(line):
                return line

    def tail(self, lines: int = 40) -> str:
        return "".join(self.output[-lines:])

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, as the kubelet's runtime sends it to a container, then SIGKILL to the whole group."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # anything the group left behind
        return self.proc.returncode

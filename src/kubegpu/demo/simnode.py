"""A GPU node without a GPU: the kubelet simulator in this process, `kubegpu plugin` as a child process.

The plugin runs exactly as on a node (its own process, real unix sockets, the real discovery code) on the
fake NVML, and faults are injected from yet another process through the fake's state directory. The demo,
the contract tests and the benchmarks all build on this, so they exercise the same path.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

from kubegpu.kubeletsim import KubeletSimulator, SimEvent
from kubegpu.settings.table import FAKE_NVML_ENV, FAKE_NVML_STATE_ENV

GPU_RESOURCE = "nvidia.com/gpu"


class SimulatedNode:
    def __init__(
        self,
        profile: str = "dgx-a100",
        *,
        plugin_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        on_event: Callable[[SimEvent], None] | None = None,
    ) -> None:
        # Unix socket paths are limited to 107 bytes: keep the root short.
        self.root = Path(tempfile.mkdtemp(prefix="kubegpu-", dir="/tmp"))
        self.plugin_dir = self.root / "device-plugins"
        self.state_dir = self.root / "nvml"
        self.kubelet_socket = self.plugin_dir / "kubelet.sock"
        self.log_path = self.root / "plugin.log"
        self.profile = profile
        self.plugin_args = list(plugin_args)
        self.extra_env = dict(env or {})
        self.sim = KubeletSimulator(self.plugin_dir, on_event=on_event)
        self.plugin: subprocess.Popen[bytes] | None = None
        self.plugin_started_at: float | None = None

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            FAKE_NVML_ENV: self.profile,
            FAKE_NVML_STATE_ENV: str(self.state_dir),
            "PYTHONUNBUFFERED": "1",
            **self.extra_env,
        }

    async def __aenter__(self) -> SimulatedNode:
        await self.start_kubelet()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def start_kubelet(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        await self.sim.start()

    def start_plugin(self, *extra_args: str) -> subprocess.Popen[bytes]:
        """Start `kubegpu plugin` against the simulator, logging to `log_path`."""
        args = [
            sys.executable,
            "-m",
            "kubegpu",
            "plugin",
            "--kubelet-socket",
            str(self.kubelet_socket),
            *self.plugin_args,
            *extra_args,
        ]
        with open(self.log_path, "ab") as log:
            self.plugin = subprocess.Popen(args, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.plugin_started_at = time.monotonic()
        return self.plugin

    async def wait_allocatable(self, count: int, resource: str = GPU_RESOURCE, timeout: float = 20.0) -> None:
        """Wait until the kubelet reports `count` allocatable devices (and the plugin is registered)."""
        try:
            await self.sim.wait_for(
                lambda: self.sim.registered(resource) and self.sim.allocatable().get(resource) == count,
                timeout=timeout,
            )
        except TimeoutError as err:
            raise TimeoutError(f"{err}\n--- plugin log ---\n{self.plugin_log()}") from None

    def inject(self, *args: str) -> None:
        """Run `kubegpu fake-nvml inject ARGS` as a separate process, as an operator would."""
        subprocess.run(
            [sys.executable, "-m", "kubegpu", "fake-nvml", "inject", *args],
            env=self.env,
            check=True,
            capture_output=True,
        )

    def signal_plugin(self, sig: signal.Signals) -> None:
        assert self.plugin is not None
        self.plugin.send_signal(sig)

    async def stop_plugin(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 10.0) -> int:
        """Stop the plugin with `sig` and return its exit code."""
        plugin, self.plugin = self.plugin, None
        if plugin is None:
            return 0
        if plugin.poll() is None:
            plugin.send_signal(sig)
        try:
            return await asyncio.wait_for(asyncio.to_thread(plugin.wait), timeout)
        except TimeoutError:
            plugin.kill()
            await asyncio.to_thread(plugin.wait)
            raise

    async def wait_plugin_exit(self, timeout: float = 20.0) -> int:
        assert self.plugin is not None
        return await asyncio.wait_for(asyncio.to_thread(self.plugin.wait), timeout)

    async def wait_log(self, text: str, timeout: float = 20.0) -> None:
        """Wait until the plugin's log holds `text` (a line it writes once, e.g. at start-up)."""
        deadline = time.monotonic() + timeout
        while text not in self.plugin_log():
            if time.monotonic() > deadline:
                log = self.plugin_log()
                raise TimeoutError(f"the plugin did not log {text!r} within {timeout} s:\n{log}")
            await asyncio.sleep(0.05)

    def plugin_log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def plugin_sockets(self) -> list[str]:
        return sorted(p.name for p in self.plugin_dir.glob("nvidia-*.sock"))

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.stop_plugin(signal.SIGTERM, timeout=5.0)
        with contextlib.suppress(Exception):
            await self.sim.stop()
        shutil.rmtree(self.root, ignore_errors=True)

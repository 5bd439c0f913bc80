"""Step 1 and 2 of every change of what is served (daemon.py): the `Candidate` built before anything is
touched (`Preparer`: discovery, the GPUs it lost carried over, the options, resources and CDI specs), the
settings parsed again for a reload (`SettingsLoader`), and writing the CDI specs all or nothing.

A failure here is a `ReloadError`: the old config keeps serving, and its `reason` labels the metric.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from kubegpu.allocation.allocate import AllocateOptions
from kubegpu.allocation.cdi import Spec, specs_for
from kubegpu.allocation.from_settings import allocate_options, resource_options
from kubegpu.allocation.resources import Resource, ResourceError, ResourceOptions, build_resources
from kubegpu.node.discovery import discover, explain_nvml_error
from kubegpu.node.driverfiles import ImexChannelError
from kubegpu.node.inventory import Gpu, Inventory
from kubegpu.node.mps_control import mps_daemon_alive
from kubegpu.node.nvml.backend import NvmlBackend
from kubegpu.plugin.cdi_files import CdiSpecWriter
from kubegpu.plugin.coexist import leave_to_dra
from kubegpu.plugin.reconcile import carry_missing
from kubegpu.settings.nvidia_config import ConfigError
from kubegpu.settings.plugin import PluginSettings
from kubegpu.settings.table import CDI_ROOT_ENV

log = logging.getLogger("kubegpu.plugin.daemon")  # the daemon's lines, wherever the code lives

# A 1 MiB ConfigMap parses in well under a second; a file that takes longer cannot be one we should serve,
# and the parse must not hold the old config's Allocate answers or health updates up meanwhile.
CONFIG_LOAD_BUDGET_S = 10.0
MISSING = "not found by discovery"

T = TypeVar("T")


class StartupError(RuntimeError):
    """The daemon cannot start; the message names the cause and the fix. Exit code 1."""


class ReloadError(RuntimeError):
    """A new config (or a rediscovery) cannot be served; nothing was changed. `reason` labels the metric."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Candidate:
    """Everything a change of config or devices needs, built before anything is touched."""

    settings: PluginSettings
    base: Inventory  # what discovery found, plus the GPUs it lost since (no faults applied)
    missing: Mapping[str, Gpu]  # the GPUs carried over: UUID -> the GPU as last seen
    missing_reasons: Mapping[str, str]
    rediscovered: bool
    resource_options: ResourceOptions
    allocate_options: AllocateOptions
    withheld: frozenset[str]  # MPS resources whose control daemon does not answer yet
    specs: Mapping[str, Spec]
    to_dra: tuple[Gpu, ...] = ()  # discovered GPUs left to `kubegpu dra` (--dra-gpus)


def in_daemon_thread(call: Callable[[], T], name: str) -> asyncio.Future[T]:
    """Run `call` in a daemon thread; unlike the default executor's threads, one that overruns its time
    budget neither holds up the exit nor blocks the next call."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def target() -> None:
        result: Any = None
        error: BaseException | None = None
        try:
            result = call()
        except BaseException as err:  # handed to the awaiting coroutine
            error = err
        with contextlib.suppress(RuntimeError):  # the loop closed while we ran: nobody is waiting
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=target, name=name, daemon=True).start()
    future.add_done_callback(lambda f: f.cancelled() or f.exception())  # no "never retrieved" warning
    return future


def why_missing(nvml: Any, uuids: Sequence[str]) -> dict[str, str]:
    """What NVML says about GPUs discovery no longer lists (runs in a thread)."""
    out = {}
    for uuid in uuids:
        try:
            nvml.nvmlDeviceGetHandleByUUID(uuid)
            out[uuid] = MISSING
        except nvml.NVMLError as err:
            out[uuid] = f"{MISSING}: {err}"
    return out


async def mps_not_ready(resources: Sequence[Resource], settings: PluginSettings) -> frozenset[str]:
    """MPS resources whose control daemon does not answer yet: left out, and retried later.

    NVIDIA checks the same thing before serving an MPS resource; a plugin serving replicas without a
    daemon would hand out pipes nobody listens on.
    """
    out = set()
    for resource in resources:
        if resource.sharing != "mps":
            continue
        root = settings.env.mps_container_root
        alive, reason = await asyncio.to_thread(mps_daemon_alive, root, resource.name, 10.0)
        if not alive:
            log.warning("not serving %s yet: the MPS control daemon is not ready (%s)", resource.name, reason)
            out.add(resource.name)
    return frozenset(out)


async def write_cdi(cdi: CdiSpecWriter, specs: Mapping[str, Spec]) -> None:
    """Write the CDI specs (or remove ours when no CDI strategy is selected), all or nothing.

    Runs before the servers change: the runtime must find a spec for every name Allocate hands out.
    """
    try:
        await asyncio.to_thread(cdi.refresh, specs)
    except OSError as err:
        raise ReloadError(
            "cdi",
            f"unable to write CDI specs to {cdi.root}: {err}; the cdi-* device-list strategies "
            f"need a writable CDI directory (mount the host's /var/run/cdi, or set {CDI_ROOT_ENV})",
        ) from err


class SettingsLoader:
    """The config file parsed again for a reload, in a daemon thread within a time budget (the parse must not
    hold the old config's Allocate answers or health updates up meanwhile)."""

    def __init__(self, read: Callable[[], PluginSettings], budget_s: float = CONFIG_LOAD_BUDGET_S) -> None:
        self._read = read
        self.budget_s = budget_s
        self.parsing: asyncio.Future[PluginSettings] | None = None  # the last parse, maybe still running

    async def load(self) -> PluginSettings:
        """The new settings, or ReloadError (a parse over its budget is left to finish on its own)."""
        budget = self.budget_s
        if self.parsing is not None and not self.parsing.done():
            raise ReloadError(
                "timeout",
                f"the config file's previous parse is still running, over its {budget:g} s budget; fix the "
                "file (a ConfigMap holds at most 1 MiB) and reload again",
            )
        self.parsing = in_daemon_thread(self._read, "config-parse")
        try:
            return await asyncio.wait_for(asyncio.shield(self.parsing), budget)
        except TimeoutError:
            raise ReloadError(
                "timeout",
                f"parsing the config file took longer than its {budget:g} s budget; fix the file "
                "(a ConfigMap holds at most 1 MiB)",
            ) from None
        except ConfigError as err:
            raise ReloadError("invalid_config", str(err)) from err
        except Exception as err:  # anything else the parser raised is still a config we cannot use
            raise ReloadError("invalid_config", f"{type(err).__name__}: {err}") from err


@dataclass(frozen=True, slots=True)
class Current:
    """What is served now, as a new candidate starts from it."""

    base: Inventory
    missing: Mapping[str, Gpu]
    to_dra: tuple[Gpu, ...]


class Preparer:
    """Builds a `Candidate` from settings and (re)discovery, NVML initialised on first use. Changes nothing
    that is served."""

    def __init__(self, backend: NvmlBackend) -> None:
        self._backend = backend
        self.nvml_up = False

    async def prepare(self, settings: PluginSettings, current: Current, *, rediscover: bool) -> Candidate:
        """Everything the change needs, or ReloadError naming what cannot be served."""
        if rediscover:
            found = leave_to_dra(await self._discover(settings, current.base), settings.dra_gpus)
            # A GPU given to DRA since the last pass is not lost: it must not be carried over as missing.
            previous = leave_to_dra(current.base, settings.dra_gpus).inventory
            carried = carry_missing(previous, found.inventory)
            base, missing, to_dra = carried.inventory, carried.missing, found.gpus
            nvml = self._backend.nvml
            reasons = await asyncio.to_thread(why_missing, nvml, list(missing)) if missing else {}
        else:
            base, missing, reasons, to_dra = current.base, current.missing, {}, current.to_dra
        resource_opts = await asyncio.to_thread(resource_options, settings)
        try:
            allocate_opts = await asyncio.to_thread(allocate_options, settings)
        except ImexChannelError as err:
            raise ReloadError("resources", str(err)) from err
        # Health plays no part here: what is served takes its health from the fault book when the daemon
        # applies the candidate (serving.py), where the lost GPUs' faults are recorded first.
        try:
            resources = build_resources(base, resource_opts)
        except ResourceError as err:
            raise ReloadError("resources", str(err)) from err
        withheld = await mps_not_ready(resources, settings)
        specs = specs_for(base, settings, allocate_opts.imex_channels, resource_opts.mig_minors)
        return Candidate(
            settings=settings,
            base=base,
            missing=dict(missing),
            missing_reasons=reasons,
            rediscovered=rediscover,
            resource_options=resource_opts,
            allocate_options=allocate_opts,
            withheld=withheld,
            specs=specs,
            to_dra=to_dra,
        )

    async def _discover(self, settings: PluginSettings, served: Inventory) -> Inventory:
        nvml = self._backend.nvml
        try:
            if not self.nvml_up:
                await asyncio.to_thread(nvml.nvmlInit)
                self.nvml_up = True
            return await asyncio.to_thread(discover, nvml, self._backend.sysfs_root)
        except nvml.NVMLError as err:
            message = f"nvml init failed: {err}. {explain_nvml_error(err)}"
            if served.gpus or settings.flags.failOnInitError is not False:
                raise ReloadError("discovery", message) from err
            log.warning("%s (failOnInitError=false: staying up)", message)
            return Inventory()

    async def shutdown(self) -> None:
        if self.nvml_up:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self._backend.nvml.nvmlShutdown)
            self.nvml_up = False

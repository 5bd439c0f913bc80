"""Step 1 and 2 of every change of what is served (daemon.py): the `Candidate` built before anything is
touched, the pieces of it that need no daemon state, and writing its CDI specs all or nothing.

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
from kubegpu.allocation.cdi import Spec
from kubegpu.allocation.resources import Resource, ResourceOptions
from kubegpu.node.faults import Fault, FaultBook
from kubegpu.node.inventory import Gpu, Health, Inventory
from kubegpu.node.mps_control import mps_daemon_alive
from kubegpu.node.xids import XidAction
from kubegpu.plugin.cdi_files import CdiSpecWriter
from kubegpu.settings.plugin import PluginSettings
from kubegpu.settings.table import CDI_ROOT_ENV

log = logging.getLogger("kubegpu.plugin.daemon")  # the daemon's lines, wherever the code lives

# A 1 MiB ConfigMap parses in well under a second; a file that takes longer cannot be one we should serve,
# and the parse must not hold the old config's Allocate answers or health updates up meanwhile.
CONFIG_LOAD_BUDGET_S = 10.0
MISSING = "not found by discovery"

T = TypeVar("T")


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


def missing_health(faults: FaultBook, reasons: Mapping[str, str], uuid: str) -> Health:
    """How a GPU discovery lost will be served: its fault, or the one the daemon's apply will record."""
    fault = faults.get(uuid) or Fault(XidAction.RESET_GPU, reasons.get(uuid, MISSING), None, 0.0)
    return fault.health


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

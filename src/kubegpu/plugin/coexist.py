"""Coexistence with DRA: the GPUs `--dra-gpus` gives to `kubegpu dra` are left out of the device plugin.

A physical GPU advertised both as `nvidia.com/gpu` and in a ResourceSlice could be handed to two pods at
once. The plugin therefore drops the selected GPUs from each discovered snapshot before anything is built
from it, so their replicas, MIG devices, CDI specs and health monitoring all go with them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from kubegpu.node.inventory import Gpu, Inventory
from kubegpu.settings.dra_selection import GpuSelection

log = logging.getLogger("kubegpu.plugin.daemon")  # the daemon's lines, wherever the code lives


@dataclass(frozen=True, slots=True)
class LeftToDra:
    inventory: Inventory  # what the device plugin serves
    gpus: tuple[Gpu, ...]  # what it leaves to DRA


def leave_to_dra(inventory: Inventory, selection: GpuSelection) -> LeftToDra:
    """`inventory` without the GPUs `selection` names, and those GPUs. Links to a dropped GPU go too."""
    if selection.empty:
        return LeftToDra(inventory, ())
    kept = tuple(g for g in inventory.gpus if not selection.includes(g))
    gone = tuple(g for g in inventory.gpus if selection.includes(g))
    if not gone:
        return LeftToDra(inventory, ())
    indices = {g.index for g in kept}
    links = tuple(link for link in inventory.links if link.a in indices and link.b in indices)
    return LeftToDra(replace(inventory, gpus=kept, links=links), gone)


def describe(gpus: tuple[Gpu, ...], selection: GpuSelection) -> str:
    """The log line naming what the plugin leaves to DRA."""
    if not gpus:
        return f"no GPU matches KUBEGPU_DRA_GPUS={selection}: the device plugin serves every GPU"
    named = ", ".join(f"GPU {g.index} ({g.uuid})" for g in gpus)
    return (
        f"leaving {len(gpus)} GPU(s) to DRA (KUBEGPU_DRA_GPUS={selection}): {named}; the device plugin does "
        f"not serve them, their MIG devices or replicas"
    )


class DraAnnouncer:
    """Says which GPUs DRA gets, at start and whenever that changes; warns about items naming no GPU."""

    def __init__(self) -> None:
        self._said: tuple[tuple[str, ...], GpuSelection] | None = None  # what was logged last

    def rediscovered(self, to_dra: tuple[Gpu, ...], served: tuple[Gpu, ...], selection: GpuSelection) -> None:
        """After a discovery: `to_dra` left to DRA, `served` kept. Silent without a selection (it is read at
        start only, so then nothing is ever left to DRA)."""
        said = (tuple(g.uuid for g in to_dra), selection)
        if said == self._said or selection.empty:
            return
        self._said = said
        log.info("%s", describe(to_dra, selection))
        unmatched = selection.unmatched([*served, *to_dra])
        if unmatched:
            log.warning("KUBEGPU_DRA_GPUS names no GPU of this node: %s", ", ".join(unmatched))

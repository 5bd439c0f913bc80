"""Coexistence with DRA: the GPUs `--dra-gpus` gives to `kubegpu dra` are left out of the device plugin.

A physical GPU advertised both as `nvidia.com/gpu` and in a ResourceSlice could be handed to two pods at
once. The plugin therefore drops the selected GPUs from each discovered snapshot before anything is built
from it, so their replicas, MIG devices, CDI specs and health monitoring all go with them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kubegpu.node.inventory import Gpu, Inventory
from kubegpu.settings.dra_selection import GpuSelection


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

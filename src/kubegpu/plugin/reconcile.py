"""What a reload, a rediscovery or a health change must do to the servers: a pure diff of full snapshots.

Like the device-plugin framework Intel's plugins build on, the daemon never patches its state step by
step: it builds the complete new picture (the snapshot, the resources built from it, the Allocate options)
and `plan()` compares it with what each server serves now. The daemon then applies the plan. Nothing here
touches a socket, a thread or NVML, so every reload case is a unit test.

Two rules keep the kubelet's view true across reloads:
- `carry_missing()`: a GPU the previous snapshot had and this discovery does not find (it fell off the
  bus, NVML cannot read it) stays listed, Unhealthy, under the same IDs; dropping it would make the
  kubelet forget it, and it would not come back when the GPU recovers.
- faults are applied on top of every snapshot (`with_faults()`), so a reload cannot make a GPU healthy.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kubegpu.allocation.allocate import AllocateOptions
from kubegpu.allocation.resources import Resource
from kubegpu.node.inventory import Gpu, Health, Inventory


class Step(enum.StrEnum):
    ADD = "add"  # a new resource: start a server on its socket and register it
    UPDATE = "update"  # the same server serves new devices and/or Allocate options, in place
    KEEP = "keep"  # nothing changed
    REMOVE = "remove"  # no longer served: stop the server and remove its socket


@dataclass(frozen=True, slots=True)
class Served:
    """What one running server serves: the identity a plan compares against."""

    resource: Resource
    options: AllocateOptions

    @property
    def name(self) -> str:
        return self.resource.name


@dataclass(frozen=True, slots=True)
class Change:
    name: str
    step: Step
    resource: Resource | None  # what to serve from now on; None for REMOVE
    listed_changed: bool = False  # the kubelet will see a different device list (IDs, health, NUMA)
    options_changed: bool = False  # Allocate answers differently from now on


class MonitorStep(enum.StrEnum):
    KEEP = "keep"  # the running health monitor watches exactly these GPUs
    WATCH = "watch"  # start a monitor for `Plan.gpus` (then stop the old one, if any)
    STOP = "stop"  # no GPUs left to watch


@dataclass(frozen=True, slots=True)
class Plan:
    changes: tuple[Change, ...]  # one per resource served before or after, sorted by name
    monitor: MonitorStep
    gpus: frozenset[str]  # the physical GPUs (UUIDs) to watch after the plan

    def of(self, *steps: Step) -> tuple[Change, ...]:
        return tuple(c for c in self.changes if c.step in steps)

    @property
    def registrations(self) -> tuple[str, ...]:
        """The resources that register with the kubelet: new servers only (an update never re-registers:
        the socket, the only thing a registration names besides the resource, follows from the name)."""
        return tuple(c.name for c in self.of(Step.ADD))

    @property
    def serving(self) -> tuple[Resource, ...]:
        """Every resource served after the plan, sorted by name."""
        return tuple(c.resource for c in self.changes if c.resource is not None)

    @property
    def changes_nothing(self) -> bool:
        return self.monitor is MonitorStep.KEEP and all(c.step is Step.KEEP for c in self.changes)

    def summary(self) -> str:
        """One line for the log, e.g. `nvidia.com/gpu: update (options); nvidia.com/mig-1g.5gb: add`."""
        parts = []
        for c in self.changes:
            if c.step is Step.KEEP:
                continue
            what = [w for w, on in (("devices", c.listed_changed), ("options", c.options_changed)) if on]
            parts.append(f"{c.name}: {c.step.value}" + (f" ({', '.join(what)})" if what else ""))
        if self.monitor is not MonitorStep.KEEP:
            parts.append(f"health monitor: {self.monitor.value} ({len(self.gpus)} GPUs)")
        return "; ".join(parts) or "nothing to change"


def listed(resource: Resource) -> tuple[tuple[str, bool, int | None], ...]:
    """What the kubelet sees of a resource's devices in ListAndWatch: ID, health and NUMA node."""
    return tuple((d.id, d.health.healthy, d.numa_node) for d in resource.devices)


def plan(
    served: Iterable[Served],
    resources: Sequence[Resource],
    options: AllocateOptions,
    *,
    watched: frozenset[str] | None,
    gpus: Iterable[str],
) -> Plan:
    """From what is served now to `resources` with `options`.

    `watched`: the GPUs the running health monitor watches (None when none runs); `gpus`: the physical
    GPUs of the new snapshot. Resource names are unique on both sides.
    """
    before = {s.name: s for s in served}
    after = {r.name: r for r in resources}
    changes = []
    for name in sorted(before.keys() | after.keys()):
        old, new = before.get(name), after.get(name)
        if new is None:
            changes.append(Change(name, Step.REMOVE, None))
        elif old is None:
            changes.append(Change(name, Step.ADD, new, listed_changed=True, options_changed=True))
        else:
            changes.append(_compare(old, new, options))
    wanted = frozenset(gpus)
    if not wanted:
        monitor = MonitorStep.KEEP if watched is None else MonitorStep.STOP
    else:
        monitor = MonitorStep.KEEP if watched == wanted else MonitorStep.WATCH
    return Plan(tuple(changes), monitor, wanted)


def _compare(old: Served, new: Resource, options: AllocateOptions) -> Change:
    listed_changed = listed(old.resource) != listed(new)
    options_changed = old.options != options
    if old.resource == new and not options_changed:
        return Change(new.name, Step.KEEP, new)
    # Also when only what Allocate reads changed (paths, memory): the server must answer with the new one.
    return Change(new.name, Step.UPDATE, new, listed_changed, options_changed)


# --- snapshots ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Carried:
    """The snapshot to serve: what discovery found, plus the GPUs it lost since the previous one."""

    inventory: Inventory
    missing: Mapping[str, Gpu]  # UUID -> the GPU as the previous snapshot had it


def carry_missing(previous: Inventory, discovered: Inventory) -> Carried:
    """Keep every GPU of `previous` that `discovered` lacks, as it was, unless its index is taken.

    A GPU whose index now belongs to another UUID was replaced, not lost: it is dropped. Links of a kept
    GPU to GPUs still present are kept too, so preferred allocation scores it as before.
    """
    found = {g.uuid for g in discovered.gpus}
    taken = {g.index for g in discovered.gpus}
    missing = {g.uuid: g for g in previous.gpus if g.uuid not in found and g.index not in taken}
    if not missing:
        return Carried(discovered, {})
    gpus = tuple(sorted((*discovered.gpus, *missing.values()), key=lambda g: g.index))
    present = {g.index for g in gpus}
    lost = {g.index for g in missing.values()}
    known = {(link.a, link.b) for link in discovered.links}
    links = tuple(
        sorted(
            (
                *discovered.links,
                *(
                    link
                    for link in previous.links
                    if (link.a in lost or link.b in lost)
                    and link.a in present
                    and link.b in present
                    and (link.a, link.b) not in known
                ),
            ),
            key=lambda link: (link.a, link.b),
        )
    )
    return Carried(
        Inventory(
            gpus=gpus,
            links=links,
            driver_version=discovered.driver_version,
            cuda_driver_version=discovered.cuda_driver_version,
        ),
        missing,
    )


def with_faults(inventory: Inventory, faults: Mapping[str, Health]) -> Inventory:
    """The snapshot as served: each GPU with a fault carries the fault's health (MIG devices follow)."""
    return inventory.with_gpu_health({u: h for u, h in faults.items() if inventory.gpu_by_uuid(u)})

"""What the plugin serves now, and step 3 of every change of it (daemon.py): plan against the running
servers (reconcile.py) and apply the plan to them.

The state here is replaced whole by each apply, and an apply and a health update never interleave: both
hold `lock`. The snapshot served is always the discovered one with the fault book's faults on top.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from kubegpu.allocation.allocate import AllocateOptions
from kubegpu.allocation.resources import Resource, ResourceOptions, build_resources
from kubegpu.node.faults import FaultBook
from kubegpu.node.inventory import Gpu, GpuLink, Inventory
from kubegpu.plugin.events import DaemonEvents
from kubegpu.plugin.prepare import Candidate
from kubegpu.plugin.reconcile import Plan, Served, Step, plan, with_faults
from kubegpu.plugin.registrar import Registrar
from kubegpu.plugin.server import ResourceServer

log = logging.getLogger("kubegpu.plugin.daemon")  # the daemon's lines, wherever the code lives


class Serving:
    def __init__(
        self, faults: FaultBook, registrar: Registrar, metrics: DaemonEvents, plugin_dir: Path
    ) -> None:
        self._faults = faults  # outlives every monitor, reload and server
        self._registrar = registrar
        self._metrics = metrics
        self._plugin_dir = plugin_dir
        self.lock = asyncio.Lock()  # an apply and a health update never interleave
        self.base = Inventory()  # discovered + carried GPUs, without faults
        self.inventory = Inventory()  # as served: base with the faults on top
        self.missing: dict[str, Gpu] = {}
        self.to_dra: tuple[Gpu, ...] = ()
        self.resource_options = ResourceOptions()
        self.allocate_options = AllocateOptions()
        self.withheld: frozenset[str] = frozenset()

    def take(self, candidate: Candidate) -> None:
        """The candidate's picture becomes the current one (the caller holds `lock`)."""
        self.to_dra = candidate.to_dra
        self.base = candidate.base
        self.missing = dict(candidate.missing)
        self.resource_options = candidate.resource_options
        self.allocate_options = candidate.allocate_options
        self.withheld = candidate.withheld

    def faults_changed(self) -> bool:
        """Whether the fault book holds what the served snapshot does not show yet."""
        return with_faults(self.base, self._faults.health()) != self.inventory

    def build_served(self) -> list[Resource]:
        """The resources to serve now: the current snapshot with today's faults, minus withheld ones."""
        self.inventory = with_faults(self.base, self._faults.health())
        resources = build_resources(self.inventory, self.resource_options)
        return [r for r in resources if r.name not in self.withheld]

    def plan(self, resources: Sequence[Resource], watched: frozenset[str] | None) -> Plan:
        served = [Served(s.resource, s.options) for s in self._registrar.servers]
        gpus = [g.uuid for g in self.base.gpus]
        return plan(served, resources, self.allocate_options, watched=watched, gpus=gpus)

    def _links(self) -> Mapping[tuple[int, int], GpuLink]:
        return self.inventory.link_map()

    async def apply_servers(self, applied: Plan, *, updates_only: bool = False) -> None:
        current = {s.name: s for s in self._registrar.servers}
        servers = []
        for change in applied.changes:
            server = current.get(change.name)
            if change.step is Step.REMOVE:
                continue
            assert change.resource is not None
            if change.step is Step.ADD or server is None:
                if updates_only:
                    continue  # the health path never changes which servers run
                options = self.allocate_options
                server = ResourceServer(
                    change.resource, self._plugin_dir, options, self._links, self._metrics
                )
            elif change.step is Step.UPDATE:
                server.options = self.allocate_options
                if await server.update(change.resource) and updates_only:
                    r = change.resource
                    log.info("%s: %d of %d devices healthy", r.name, r.healthy_count, len(r.devices))
            servers.append(server)
        self._metrics.update_resources(s.resource for s in servers)
        if not updates_only and any(c.step in (Step.ADD, Step.REMOVE) for c in applied.changes):
            await self._registrar.set_servers(servers)

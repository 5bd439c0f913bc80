"""Readable output for the simulator's events: one line per event, and the node's resources as a table."""

from __future__ import annotations

from collections.abc import Mapping

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .events import EventKind, SimEvent

_STYLES: dict[EventKind, str] = {
    EventKind.KUBELET_STARTED: "bold green",
    EventKind.KUBELET_STOPPED: "bold yellow",
    EventKind.REGISTRATION_REJECTED: "red",
    EventKind.REGISTERED: "green",
    EventKind.DEVICES_UPDATED: "cyan",
    EventKind.STREAM_ENDED: "bold red",
    EventKind.DISCONNECTED: "yellow",
    EventKind.RESOURCE_REMOVED: "red",
    EventKind.NODE_STATUS: "blue",
    EventKind.POD_ADMITTED: "green",
    EventKind.POD_REJECTED: "red",
    EventKind.CONTAINER_STARTED: "green",
    EventKind.CONTAINER_START_FAILED: "red",
    EventKind.POD_REMOVED: "dim",
    EventKind.DRA_PLUGIN_REGISTERED: "green",
    EventKind.DRA_PLUGIN_REJECTED: "red",
    EventKind.DRA_PLUGIN_DEREGISTERED: "yellow",
    EventKind.DRA_SLICES_WIPED: "yellow",
    EventKind.CLAIMS_PREPARED: "green",
    EventKind.PREPARE_FAILED: "red",
    EventKind.CLAIMS_UNPREPARED: "dim",
    EventKind.UNPREPARE_FAILED: "red",
}
_KIND_WIDTH = max(len(k) for k in EventKind)


def node_status_table(capacity: Mapping[str, int], allocatable: Mapping[str, int]) -> Table:
    table = Table("resource", "capacity", "allocatable", title="node status", title_justify="left")
    for resource in sorted(capacity):
        cap, alloc = capacity[resource], allocatable.get(resource, 0)
        table.add_row(resource, str(cap), Text(str(alloc), style="red" if alloc < cap else ""))
    return table


class Narrator:
    """An event listener that prints `+seconds kind description` lines (times relative to the first event).

    Pass it as `on_event`. With `node_tables`, a node-status change also prints the whole table.
    """

    def __init__(self, console: Console | None = None, *, node_tables: bool = False) -> None:
        self.console = console or Console(highlight=False)
        self.node_tables = node_tables
        self._start: float | None = None

    def __call__(self, event: SimEvent) -> None:
        if self._start is None:
            self._start = event.time
        # Text, not markup: messages contain brackets (device lists) that rich would eat.
        line = Text.assemble(
            (f"+{event.time - self._start:8.3f}s ", "dim"),
            (f"{event.kind:<{_KIND_WIDTH}} ", _STYLES.get(event.kind, "")),
            event.message,
        )
        self.console.print(line)
        if self.node_tables and event.kind == EventKind.NODE_STATUS:
            self.console.print(node_status_table(event.data["capacity"], event.data["allocatable"]))

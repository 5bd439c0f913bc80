"""Readable output for the simulator's events: one line per event, and the node's resources as a table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rich.text import Text

from kubegpu.common import output

from .events import EventKind, SimEvent

if TYPE_CHECKING:
    from rich.console import Console

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


def print_node_status(console: Console, capacity: Mapping[str, int], allocatable: Mapping[str, int]) -> None:
    """The node's extended resources: a table on a terminal, `node status: RESOURCE capacity N ...` piped."""
    rows: list[list[Any]] = []
    for resource in sorted(capacity):
        cap, alloc = capacity[resource], allocatable.get(resource, 0)
        rows.append([resource, str(cap), Text(str(alloc), style="red" if alloc < cap else "")])
    output.print_table(
        console,
        ["resource", "capacity", "allocatable"],
        rows,
        title="node status",
        plain=lambda r: f"node status: {r[0]} capacity {r[1]} allocatable {r[2]}",
    )


class Narrator:
    """An event listener that prints `+seconds kind description` lines (times relative to the first event).

    Pass it as `on_event`. With `node_tables`, a node-status change also prints the whole table.
    """

    def __init__(self, console: Console | None = None, *, node_tables: bool = False) -> None:
        self.console = console or output.console()
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
        self.console.print(line, soft_wrap=True)  # one event, one line: grep sees it whole
        if self.node_tables and event.kind == EventKind.NODE_STATUS:
            print_node_status(self.console, event.data["capacity"], event.data["allocatable"])

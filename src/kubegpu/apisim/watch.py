"""WATCH on a resource, as the real server streams it: from a resourceVersion, synthetic ADDED events
without one, BOOKMARKs, 410 Gone on compacted history, DELETED/ADDED when an object leaves/enters the
selector."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping
from typing import Any

from .calls import flag
from .convert import from_hub
from .errors import bad_request, gone
from .routes import ResourceRoute
from .store import Event, Obj, Store
from .verbs import route_matcher


def stream_watch(
    store: Store,
    route: ResourceRoute,
    query: Mapping[str, str],
    send: Callable[[dict[str, Any]], None],
    default_timeout: float,
) -> None:
    """Send the events after the query's resourceVersion as they happen, until the timeout (then a
    BOOKMARK if asked for, as the real server does) or `close_streams()` (no goodbye: a lost server)."""
    kind = route.kind
    wanted = route_matcher(route, query)
    deadline = time.monotonic() + float(query.get("timeoutSeconds") or default_timeout)
    requested = query.get("resourceVersion") or ""
    with store.cond:
        epoch = store.epoch
        if requested in ("", "0"):
            # "Start at most recent": synthetic ADDED events for the current state first.
            current, cursor = store.list(kind, route.namespace, wanted)
        else:
            current, cursor = [], int(requested) if requested.isdigit() else -1
        compacted = store.compacted
    if cursor < 0:
        send({"type": "ERROR", "object": bad_request(f"invalid resource version: {requested}").status()})
        return
    if requested not in ("", "0") and cursor < compacted:
        send(
            {
                "type": "ERROR",
                "object": gone(f"too old resource version: {cursor} ({compacted})").status(),
            }
        )
        return
    for obj in current:
        send({"type": "ADDED", "object": from_hub(kind, route.version, obj)})
    while True:
        with store.cond:
            while True:
                fresh = [e for e in store.history if e.resource_version > cursor and e.kind is kind]
                remaining = deadline - time.monotonic()
                if fresh or store.epoch != epoch or remaining <= 0:
                    break
                store.cond.wait(min(remaining, 0.5))
            closed = store.epoch != epoch
            latest = store.resource_version
        if fresh:
            for event in fresh:
                shown = _watch_event(event, route, wanted)
                if shown is not None:
                    send(shown)
            cursor = fresh[-1].resource_version
            continue
        if not closed and flag(query, "allowWatchBookmarks"):
            bookmark = {
                "kind": kind.kind,
                "apiVersion": kind.api_version(route.version),
                "metadata": {"resourceVersion": str(latest)},
            }
            send({"type": "BOOKMARK", "object": bookmark})
        return


def _watch_event(event: Event, route: ResourceRoute, wanted: Callable[[Obj], bool]) -> dict[str, Any] | None:
    """The event as this watch sees it (the watch cache's rule): entering the selector is ADDED,
    leaving it is DELETED (with the previous state at the new resourceVersion)."""
    obj, previous = event.object, event.previous
    if (
        route.namespace is not None
        and route.kind.namespaced
        and obj["metadata"].get("namespace") != route.namespace
    ):
        return None
    now = wanted(obj) and event.type != "DELETED"
    before = previous is not None and wanted(previous) and event.type != "ADDED"
    if event.type == "DELETED":
        now, before = False, wanted(obj)
    if now and before:
        kind, shown = "MODIFIED", obj
    elif now:
        kind, shown = "ADDED", obj
    elif before:
        kind = "DELETED"
        shown = copy.deepcopy(obj if event.type == "DELETED" or previous is None else previous)
        shown["metadata"]["resourceVersion"] = str(event.resource_version)
    else:
        return None
    return {"type": kind, "object": from_hub(route.kind, route.version, shown)}

"""The publisher's list and watch of its own ResourceSlices, in a thread of its own.

As client-go's reflector: list, then watch from the list's resourceVersion for a random 5-10 minutes (so a
fleet's reconnects spread out), resume from the last event; 410 Gone (history compacted) lists again at
once; a 404 (the version is no longer served) asks the publisher to find the version again. Everything it
sees goes to the publisher's loop through `call_in_loop`.

During an outage every failed attempt waits a capped back-off (`outage_backoff`: at most a second, so the
pool is listed, and a slice deleted meanwhile written again, within about a second of the server answering;
a 429's Retry-After is honoured up to RETRY_AFTER_CAP) and is logged in one line, at most once per
FAILURE_LOG_INTERVAL_S for each kind of failure (refused, timed out, 500, 429...) with a count of the rest;
the first success after failures says so.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import threading
from collections.abc import Callable
from typing import Any

from kubegpu.common.backoff import Backoff
from kubegpu.common.log_throttle import LogThrottle
from kubegpu.dra.api_errors import ApiError, ApiStatusError, status_error
from kubegpu.dra.kubeapi import WatchStream
from kubegpu.dra.slice_api import HTTP_GONE, HTTP_NOT_FOUND, PublishError, SliceApi, describe

log = logging.getLogger("kubegpu.dra.publisher")

WATCH_SECONDS = (300, 600)  # client-go's reflector: a random 5-10 minute watch, spreading reconnects
RETRY_AFTER_CAP = 10.0  # the most a 429's Retry-After holds a retry back
FAILURE_LOG_INTERVAL_S = 30.0
# Errors a retry may fix: the API server's answers, connections that fail, bodies that are not what we expect.
RETRIED = (ApiError, PublishError, ValueError, KeyError, TypeError, AttributeError)


def outage_backoff() -> Backoff:
    """Half a second doubling to 1 s, up to 25% longer (capped): a slice deleted while the API server was
    unreachable is back within about a second of it answering. (client-go's reflector goes up to 30 s,
    which is how long a wiped node then went without its devices.)"""
    return Backoff(initial=0.5, maximum=1.0, jitter=(1.0, 1.25), reset_after=120.0)


def retry_delay(backoff: Backoff, err: BaseException) -> float:
    """The back-off's next delay, or longer when the server asked for it (429/5xx Retry-After), capped."""
    delay = backoff.next_delay()
    retry_after = err.retry_after if isinstance(err, ApiStatusError) else None
    if retry_after is not None:
        delay = max(delay, min(retry_after, RETRY_AFTER_CAP))
    return delay


class SliceWatch:
    def __init__(
        self,
        api: SliceApi,
        *,
        version: Callable[[], str],
        backoff: Callable[[], Backoff],
        call_in_loop: Callable[..., None],
        on_list: Callable[[list[dict[str, Any]], int], None],
        on_event: Callable[[str, dict[str, Any]], None],
        on_version_gone: Callable[[], None],
    ) -> None:
        self.api = api
        self._version = version
        self._backoff = backoff
        self._call_in_loop = call_in_loop
        self._on_list, self._on_event, self._on_version_gone = on_list, on_event, on_version_gone
        self._stopping = threading.Event()
        self._relist = threading.Event()  # list again (the publisher moved to another version)
        self._stream: WatchStream | None = None
        self._thread: threading.Thread | None = None
        self._log = LogThrottle(log, interval_s=FAILURE_LOG_INTERVAL_S)
        self._failures = 0

    # ---- control (the publisher's loop) --------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"resourceslice-watch-{self.api.node_name}", daemon=True
        )
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def relist(self) -> None:
        """List again (in the version the publisher now uses) and watch from there."""
        self._relist.set()
        self._end_request()

    def stop(self) -> None:
        self._stopping.set()
        self._end_request()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _end_request(self) -> None:
        stream = self._stream
        if stream is not None:
            stream.end()

    # ---- the thread ----------------------------------------------------------------------------------

    def _run(self) -> None:
        backoff = self._backoff()
        while not self._stopping.is_set():
            try:
                self._relist.clear()
                resource_version = self._list()
                while not self._stopping.is_set() and not self._relist.is_set():
                    resource_version = self._watch(resource_version)
                    backoff.reset()
            except RETRIED as err:
                if self._stopping.is_set():
                    return
                if self._relist.is_set():
                    continue  # we ended the request ourselves: list in the new version
                if isinstance(err, ApiStatusError) and err.status == HTTP_GONE:
                    continue  # history compacted: list again
                if isinstance(err, ApiStatusError) and err.status == HTTP_NOT_FOUND:
                    self._call_in_loop(self._on_version_gone)  # the version went away: ask which one now
                self._failed(backoff, err)

    def _failed(self, backoff: Backoff, err: BaseException) -> None:
        self._failures += 1
        delay = retry_delay(backoff, err)
        self._log.warning(
            f"watch-{getattr(err, 'kind', type(err).__name__)}",  # one line per kind of failure
            "cannot watch the ResourceSlices of pool %s: %s; retrying in %.1fs",
            self.api.node_name,
            describe(err),
            delay,
        )
        self._stopping.wait(delay)

    def _list(self) -> str:
        items, resource_version = self.api.list(self._version())
        if self._failures:
            log.info(
                "listing the ResourceSlices of pool %s again after %d failed attempt(s)",
                self.api.node_name,
                self._failures,
            )
            self._failures = 0
        self._call_in_loop(self._on_list, items, int(resource_version) if resource_version.isdigit() else -1)
        return resource_version

    def _watch(self, resource_version: str) -> str:
        """One watch request, until the server ends it; the resourceVersion to resume from."""
        stream = self.api.watch(self._version(), resource_version, random.randint(*WATCH_SECONDS))
        self._stream = stream
        try:
            if self._relist.is_set() or self._stopping.is_set():
                return resource_version  # ended before the stream was there to end
            for line in stream.lines():
                if self._stopping.is_set() or self._relist.is_set():
                    break
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    code = obj.get("code")
                    code = code if isinstance(code, int) else 500
                    raise status_error(code, str(obj.get("reason") or ""), json.dumps(obj).encode(), None)
                resource_version = str((obj.get("metadata") or {}).get("resourceVersion") or resource_version)
                if kind in ("ADDED", "MODIFIED", "DELETED") and self.api.ours(obj):
                    self._call_in_loop(self._on_event, str(kind), obj)
        finally:
            self._stream = None
            with contextlib.suppress(OSError):
                stream.close()
        return resource_version

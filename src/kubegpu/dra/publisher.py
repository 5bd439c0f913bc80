"""Publishes the node's DRA devices as ResourceSlices and keeps them published, as the kubelet helper does.

What `k8s.io/dynamic-resource-allocation/resourceslice`'s controller does for a node driver, with the
official `kubernetes` client:
- the resource.k8s.io version is discovered (v1, else v1beta2, else v1beta1) and the v1 device dicts are
  converted to its shape;
- one pool per node, named after the node; slices named by the server from `generateName:
  <node>-<driver>-`, owned by the Node (its UID read once, again after our slices were deleted), so the
  garbage collector removes them with the Node;
- every change of the devices bumps the pool generation in all of its slices; a pool is split to the API's
  devices-per-slice limit; slices no longer needed are deleted;
- our slices (field selector `spec.nodeName`, `spec.driver`) are listed and watched: a slice deleted (the
  kubelet wipes a node's slices when it starts) is written again at once, one changed by someone else too,
  but not more often than every 5 s (two writers that disagree must not take turns at full speed);
- the pool is compared by content: a restarted driver that finds it as it wants it writes nothing;
- a 404 makes it ask again which version the server serves (a downgrade removes v1);
- device taints are published when the server keeps them (checked once with a dry-run create before the
  first tainted device goes out); a server without DRADeviceTaints would drop the taint and show a broken
  GPU as healthy, so there a tainted device is left out of the slice instead;
- every failure is logged in one line and retried with capped, jittered back-off.

Requests go through `CustomObjectsApi` with plain dicts: one code path for the three versions, and no
client model in between (the client's models carry fields of newer releases, which an older server drops).
The client is synchronous: requests run in threads, the watch in its own daemon thread.

Not done, as upstream does not either: slices are left in place when the driver stops (the kubelet removes
them when the plugin is gone; a restarted driver takes them over).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

from kubegpu.common.backoff import Backoff
from kubegpu.dra import slices
from kubegpu.dra.slices import GROUP, PLURAL, Device

log = logging.getLogger(__name__)

HTTP_NOT_FOUND, HTTP_CONFLICT, HTTP_GONE = 404, 409, 410
REQUEST_TIMEOUT = (10.0, 30.0)  # connect, read
FOREIGN_EDIT_DELAY = 5.0  # seconds between two rewrites of slices someone else keeps changing
WATCH_SECONDS = (300, 600)  # client-go's reflector: a random 5-10 minute watch, spreading reconnects
# Errors a retry may fix: the API server's answers, and connections that fail or return garbage.
RETRIED = (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError, KeyError, TypeError)


class PublishError(RuntimeError):
    """A failure with its one-line cause and fix (retried like any other)."""


def default_backoff() -> Backoff:
    """client-go's: 800 ms doubling to 30 s, up to 25% longer, starting over after 2 quiet minutes."""
    return Backoff(initial=0.8, maximum=30.0, jitter=(1.0, 1.25), reset_after=120.0)


class SlicePublisher:
    """Keeps the node's pool of ResourceSlices equal to the latest `update()`, until `stop()`."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        driver_name: str,
        node_name: str,
        max_devices_per_slice: int = slices.MAX_DEVICES_PER_SLICE,
        backoff: Callable[[], Backoff] = default_backoff,
        foreign_edit_delay: float = FOREIGN_EDIT_DELAY,
    ) -> None:
        if max_devices_per_slice < 1:
            raise ValueError(f"max_devices_per_slice must be at least 1, got {max_devices_per_slice}")
        self.driver_name = driver_name
        self.node_name = node_name
        self.max_devices_per_slice = max_devices_per_slice
        # Any: called with _preload_content=False, they answer urllib3 responses, not what they declare.
        self._custom: Any = client.CustomObjectsApi(api_client)
        self._core: Any = client.CoreV1Api(api_client)
        self._group: Any = client.ResourceApi(api_client)
        self._backoff = backoff
        # update() may come from any thread.
        self._lock = threading.Lock()
        self._devices: list[Device] | None = None  # None: nothing to publish yet
        self._requested_at = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._stopped: asyncio.Event | None = None
        self._stopping = threading.Event()
        # State of the loop thread.
        self.version: str | None = None  # the resource.k8s.io version in use
        self._rediscover = False
        self.taints_served: bool | None = None  # None: not known yet
        self._node_uid: str | None = None
        self._cache: dict[str, dict[str, Any]] = {}  # our slices by name, as last listed or watched
        self._listed = False
        self._written: set[str] = set()  # the slices we created or replaced (by name)
        self._last_chunks: list[list[Device]] | None = None  # what the last write published
        self._foreign_edit_delay = foreign_edit_delay
        self._last_fix = -foreign_edit_delay  # when someone else's change was last undone
        self._fix_timer: asyncio.TimerHandle | None = None  # the pass that undoes it, when it must wait
        self._generation = 0
        self._left_out: tuple[str, ...] = ()
        self._watch_thread: threading.Thread | None = None
        self._relist = threading.Event()  # the watch thread lists again (a new version)
        self._watch_response: Any = None
        # For metrics and tests.
        self.last_publish_seconds: float | None = None  # update() to the last write of its pool
        self.publish_errors = 0

    # ---- the interface -------------------------------------------------------------------------------

    @property
    def published_generation(self) -> int:
        """The pool generation of the last complete publication (0: none yet)."""
        return self._generation

    @property
    def field_selector(self) -> str:
        return f"spec.nodeName={self.node_name},spec.driver={self.driver_name}"

    def update(self, devices: Sequence[Mapping[str, Any]]) -> None:
        """The devices to publish (v1 `Device` dicts); the latest call wins. Safe from any thread."""
        copied = [dict(d) for d in devices]
        with self._lock:
            self._devices = copied
            self._requested_at = time.monotonic()
        self._poke()

    async def run(self) -> None:
        """Publish, and keep publishing, until `stop()`. Failures are logged and retried, never raised."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._stopped = asyncio.Event()
        self._wake.set()
        backoff = self._backoff()
        try:
            while not self._stopping.is_set():
                await self._wake.wait()
                self._wake.clear()
                if self._stopping.is_set():
                    break
                try:
                    await self._pass()
                    backoff.reset()
                except (PublishError, *RETRIED) as err:
                    self.publish_errors += 1
                    # A version the server stopped serving (a downgrade) answers 404 too: ask again.
                    self._rediscover = isinstance(err, ApiException) and err.status == HTTP_NOT_FOUND
                    delay = backoff.next_delay()
                    log.warning(
                        "cannot publish ResourceSlices of pool %s (driver %s): %s; retrying in %.1fs",
                        self.node_name,
                        self.driver_name,
                        _describe(err),
                        delay,
                    )
                    await self._sleep(delay)
                    self._wake.set()
        finally:
            self._stop_watch()

    async def stop(self) -> None:
        """End `run()` and the watch; the slices stay (the kubelet removes them when the driver is gone)."""
        self._stopping.set()
        self._poke()
        self._stop_watch()
        thread = self._watch_thread
        if thread is not None:
            await asyncio.to_thread(thread.join, 5.0)

    # ---- one pass ------------------------------------------------------------------------------------

    async def _pass(self) -> None:
        if self.version is None or self._rediscover:
            self._rediscover = False
            version = await asyncio.to_thread(self._discover)
            if version != self.version:
                log.info("publishing ResourceSlices through %s/%s", GROUP, version)
                self.version = version
                if self._listed:
                    self._listed = False  # the watch thread lists again in the new version, then wakes us
                    self._relist.set()
                    self._end_watch_request()
        if self._watch_thread is None or not self._watch_thread.is_alive():
            self._start_watch()
        if not self._listed:
            return  # the watch thread wakes us once it has listed our slices
        with self._lock:
            devices, requested_at = self._devices, self._requested_at
        if devices is None:
            return
        wanted = await self._publishable(devices)
        chunks = slices.split(wanted, self.max_devices_per_slice)
        if self._in_sync(chunks):
            return
        if self._edited_by_others(chunks):
            # Put it back, but not more often than every FOREIGN_EDIT_DELAY: two writers that disagree (the
            # two pods of a rolling update) must not take turns as fast as the API server answers.
            wait = self._last_fix + self._foreign_edit_delay - time.monotonic()
            if wait > 0:
                assert self._loop is not None
                if self._fix_timer is not None:  # one pending wake-up, however many passes see the edit
                    self._fix_timer.cancel()
                self._fix_timer = self._loop.call_later(wait, self._poke_now)
                return
            self._last_fix = time.monotonic()
            log.info(
                "the ResourceSlices of pool %s were changed by someone else; writing them again",
                self.node_name,
            )
        await self._write(chunks)
        self._last_chunks = chunks
        self._written &= set(self._cache)
        self.last_publish_seconds = time.monotonic() - requested_at

    def _discover(self) -> str:
        try:
            response = self._group.get_api_group(_preload_content=False, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as err:
            if err.status == HTTP_NOT_FOUND:
                raise PublishError(_NO_DRA) from err
            raise
        served = [str(v.get("version")) for v in json.loads(response.data).get("versions") or []]
        version = slices.pick_version(served)
        if version is None:
            raise PublishError(f"{_NO_DRA} (it serves {', '.join(served) or 'no version'})")
        return version

    async def _publishable(self, devices: list[Device]) -> list[Device]:
        """The devices this server can take: tainted ones only when it keeps taints."""
        if any(d.get("taints") for d in devices) and self.taints_served is None:
            if await asyncio.to_thread(self._probe_taints, devices):
                self.taints_served = True
            else:
                self._taints_dropped()
        if self.taints_served is not False:
            return devices
        kept, left_out = slices.without_taints(devices)
        if tuple(left_out) != self._left_out:
            self._left_out = tuple(left_out)
            if left_out:
                log.info("left out of the ResourceSlices while tainted: %s", ", ".join(left_out))
        return kept

    def _probe_taints(self, devices: list[Device]) -> bool:
        """A dry-run create with one tainted device: does the server keep its taints?"""
        tainted = next(d for d in devices if d.get("taints"))
        body = self._new_body([tainted], generation=1, count=1, node_uid=self._node_uid or _PROBE_UID)
        got = self._custom.create_cluster_custom_object(
            GROUP,
            self._v,
            PLURAL,
            body,
            dry_run="All",
            _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT,
        )
        return not slices.dropped_taints([tainted], slices.devices_of(json.loads(got.data), self._v))

    def _in_sync(self, chunks: list[list[Device]]) -> bool:
        """Whether our slices hold exactly these chunks, as one complete pool at one generation.

        Compared by content, not by who wrote it: a restarted driver (or the other pod of a rolling update)
        that finds the pool as it wants it writes nothing.
        """
        mine = self._mine()
        if len(mine) != len(chunks) or len({slices.generation_of(o) for o in mine}) != 1:
            return False
        for obj in mine:
            if slices.pool_of(obj) != self.node_name or slices.slice_count_of(obj) != len(chunks):
                return False
        # Which slice holds which chunk does not matter (slice names are random): compare as multisets.
        got = sorted(slices.content_key(slices.devices_of(o, self._v)) for o in mine)
        if got != sorted(slices.content_key(c) for c in chunks):
            return False
        self._generation = slices.generation_of(mine[0])
        return True

    def _edited_by_others(self, chunks: list[list[Device]]) -> bool:
        """Our last write already wanted these chunks and no slice went or came: someone changed one."""
        return chunks == self._last_chunks and set(self._cache) == self._written

    def _mine(self) -> list[dict[str, Any]]:
        return [self._cache[name] for name in sorted(self._cache)]

    async def _write(self, chunks: list[list[Device]]) -> None:
        """Bump the generation and write the pool: update our slices, create the missing, delete the rest."""
        current = self._mine()
        generation = max([self._generation, *(slices.generation_of(o) for o in current)]) + 1
        if len(chunks) > len(current) and self._node_uid is None:
            self._node_uid = await asyncio.to_thread(self._read_node_uid)
        for i, devices in enumerate(chunks):
            if i < len(current):
                await asyncio.to_thread(self._replace, current[i], devices, generation, len(chunks))
            else:
                await asyncio.to_thread(self._create, devices, generation, len(chunks))
        for stale in current[len(chunks) :]:
            await asyncio.to_thread(self._delete, stale)
        self._generation = generation
        log.info(
            "published pool %s generation %d: %d device(s) in %d ResourceSlice(s)",
            self.node_name,
            generation,
            sum(len(c) for c in chunks),
            len(chunks),
        )

    def _read_node_uid(self) -> str:
        try:
            node = self._core.read_node(
                self.node_name, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as err:
            if err.status == HTTP_NOT_FOUND:
                raise PublishError(
                    f"node {self.node_name!r} not found: the slices are owned by their Node; check "
                    "--node-name (NODE_NAME, usually from the pod's spec.nodeName)"
                ) from err
            raise
        uid = (json.loads(node.data).get("metadata") or {}).get("uid")
        if not uid:
            raise PublishError(f"node {self.node_name!r} has no UID")
        return str(uid)

    def _known_devices(self) -> list[Device]:
        return [d for obj in list(self._cache.values()) for d in slices.devices_of(obj, self._v)]

    def _new_body(
        self, devices: list[Device], *, generation: int, count: int, node_uid: str
    ) -> dict[str, Any]:
        spec = slices.spec(
            driver=self.driver_name,
            node_name=self.node_name,
            generation=generation,
            count=count,
            devices=devices,
            version=self._v,
        )
        return slices.new_slice(
            driver=self.driver_name,
            node_name=self.node_name,
            node_uid=node_uid,
            version=self._v,
            slice_spec=spec,
        )

    def _create(self, devices: list[Device], generation: int, count: int) -> None:
        assert self._node_uid is not None
        sent = slices.carry_taint_times(devices, self._known_devices())
        body = self._new_body(sent, generation=generation, count=count, node_uid=self._node_uid)
        got = self._custom.create_cluster_custom_object(
            GROUP, self._v, PLURAL, body, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
        )
        self._wrote(json.loads(got.data), devices)

    def _replace(self, current: dict[str, Any], devices: list[Device], generation: int, count: int) -> None:
        body = {**current, "apiVersion": f"{GROUP}/{self._v}", "kind": slices.KIND}
        body["spec"] = slices.spec(
            driver=self.driver_name,
            node_name=self.node_name,
            generation=generation,
            count=count,
            devices=slices.carry_taint_times(devices, self._known_devices()),
            version=self._v,
        )
        name = slices.name_of(current)
        try:
            got = self._custom.replace_cluster_custom_object(
                GROUP, self._v, PLURAL, name, body, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as err:
            if err.status in (HTTP_NOT_FOUND, HTTP_CONFLICT):
                # Gone or changed meanwhile: the watch brings the current state, the retry builds on it.
                self._forget(name)
            raise
        self._wrote(json.loads(got.data), devices)

    def _delete(self, obj: dict[str, Any]) -> None:
        name = slices.name_of(obj)
        try:
            self._custom.delete_cluster_custom_object(
                GROUP, self._v, PLURAL, name, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as err:
            if err.status != HTTP_NOT_FOUND:
                raise
        self._call_in_loop(self._gone, name)

    def _wrote(self, obj: dict[str, Any], devices: list[Device]) -> None:
        if self.taints_served is not False and slices.dropped_taints(
            devices, slices.devices_of(obj, self._v)
        ):
            # The server stopped keeping taints (a downgrade, the gate turned off): the next pass sees the
            # slice differ from what it wants and writes it again without the tainted devices.
            self._taints_dropped()
        self._call_in_loop(self._remember, obj)

    def _taints_dropped(self) -> None:
        self.taints_served = False
        log.warning(
            "the API server drops device taints (feature gate DRADeviceTaints is off): unhealthy devices are "
            "left out of the ResourceSlices instead of being tainted; enable the gate on the API server and "
            "scheduler to keep them listed with their taint"
        )

    # ---- the cache (loop thread) ---------------------------------------------------------------------

    def _remember(self, obj: dict[str, Any]) -> None:
        self._written.add(slices.name_of(obj))
        self._seen(obj)

    def _forget(self, name: str) -> None:
        self._call_in_loop(self._written.discard, name)

    def _gone(self, name: str) -> None:
        self._cache.pop(name, None)
        self._written.discard(name)

    def _seen(self, obj: dict[str, Any]) -> None:
        """A newer state of one of our slices (an older one, arriving late from the watch, is ignored)."""
        name = slices.name_of(obj)
        known = self._cache.get(name)
        if known is None or slices.resource_version_of(obj) >= slices.resource_version_of(known):
            self._cache[name] = obj

    def _on_list(self, items: list[dict[str, Any]], resource_version: int) -> None:
        # What we wrote after the list was taken is newer than the list: it stays (its event follows).
        newer = {n: o for n, o in self._cache.items() if slices.resource_version_of(o) > resource_version}
        self._cache = {**{slices.name_of(o): o for o in items}, **newer}
        self._listed = True
        self._poke_now()

    def _on_event(self, kind: str, obj: dict[str, Any]) -> None:
        name = slices.name_of(obj)
        if kind == "DELETED":
            if name in self._written:
                log.info("ResourceSlice %s was deleted; publishing pool %s again", name, self.node_name)
                self._node_uid = None  # a deleted Node takes its slices: read the (new) UID again
            # Kept in _written until the next write: a deletion is put right at once, not held off as an edit.
            self._cache.pop(name, None)
        else:
            self._seen(obj)
        self._poke_now()

    # ---- the watch (its own thread) ------------------------------------------------------------------

    def _start_watch(self) -> None:
        self._listed = False
        self._watch_thread = threading.Thread(
            target=self._watch_forever, name=f"resourceslice-watch-{self.node_name}", daemon=True
        )
        self._watch_thread.start()

    def _stop_watch(self) -> None:
        self._stopping.set()
        self._end_watch_request()

    def _end_watch_request(self) -> None:
        response = self._watch_response
        if response is not None:
            with contextlib.suppress(Exception):  # best effort: the read timeout ends it otherwise
                response.shutdown()  # unblocks the thread's read

    def _watch_forever(self) -> None:
        backoff = self._backoff()
        while not self._stopping.is_set():
            try:
                self._relist.clear()
                version = self._list()
                while not self._stopping.is_set() and not self._relist.is_set():
                    version = self._watch(version)
                    backoff.reset()
            except ApiException as err:
                if err.status == HTTP_GONE:
                    continue  # history compacted: list again
                if err.status == HTTP_NOT_FOUND:  # the version went away: the loop asks which one now
                    self._call_in_loop(self._rediscover_now)
                self._watch_failed(backoff, f"the API server answered {err.status} {err.reason}")
            except (PublishError, *RETRIED) as err:
                if self._stopping.is_set():
                    return
                if self._relist.is_set():
                    continue  # we ended the request ourselves: list in the new version
                self._watch_failed(backoff, _describe(err))

    def _watch_failed(self, backoff: Backoff, why: str) -> None:
        delay = backoff.next_delay()
        log.warning(
            "cannot watch the ResourceSlices of pool %s: %s; retrying in %.1fs", self.node_name, why, delay
        )
        self._stopping.wait(delay)

    def _list(self) -> str:
        response = self._custom.list_cluster_custom_object(
            GROUP,
            self._v,
            PLURAL,
            field_selector=self.field_selector,
            _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT,
        )
        body = json.loads(response.data)
        items = [o for o in body.get("items") or [] if self._ours(o)]
        version = str((body.get("metadata") or {}).get("resourceVersion", ""))
        self._call_in_loop(self._on_list, items, int(version) if version.isdigit() else -1)
        return version

    def _watch(self, resource_version: str) -> str:
        """One watch request, until the server ends it; the resourceVersion to resume from."""
        seconds = random.randint(*WATCH_SECONDS)
        response = self._custom.list_cluster_custom_object(
            GROUP,
            self._v,
            PLURAL,
            field_selector=self.field_selector,
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=resource_version,
            timeout_seconds=seconds,
            _preload_content=False,
            _request_timeout=(REQUEST_TIMEOUT[0], seconds + 30),
        )
        self._watch_response = response
        try:
            for line in iter_resp_lines(response):  # the client's: one line per event as it arrives
                if self._stopping.is_set():
                    break
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    raise ApiException(status=obj.get("code", 500), reason=obj.get("message", "watch error"))
                resource_version = str((obj.get("metadata") or {}).get("resourceVersion") or resource_version)
                if kind in ("ADDED", "MODIFIED", "DELETED") and self._ours(obj):
                    self._call_in_loop(self._on_event, str(kind), obj)
        finally:
            self._watch_response = None
            response.release_conn()
        return resource_version

    def _ours(self, obj: Mapping[str, Any]) -> bool:
        spec = obj.get("spec") or {}
        return spec.get("driver") == self.driver_name and spec.get("nodeName") == self.node_name

    # ---- plumbing ------------------------------------------------------------------------------------

    @property
    def _v(self) -> str:
        assert self.version is not None
        return self.version

    def _poke(self) -> None:
        """Wake the loop from any thread."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._poke_now)

    def _poke_now(self) -> None:
        if self._wake is not None:
            self._wake.set()
        if self._stopped is not None and self._stopping.is_set():
            self._stopped.set()

    def _rediscover_now(self) -> None:
        self._rediscover = True
        self._poke_now()

    def _call_in_loop(self, fn: Callable[..., Any], *args: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            fn(*args)
        else:
            loop.call_soon_threadsafe(fn, *args)

    async def _sleep(self, seconds: float) -> None:
        """Sleep, ending early on stop() (not on update(): a failing server is not hammered)."""
        assert self._stopped is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopped.wait(), seconds)


_NO_DRA = (
    "the API server does not serve resource.k8s.io v1, v1beta2 or v1beta1: DRA needs Kubernetes 1.32 or "
    "later with the resource.k8s.io API enabled (GA and on by default from 1.34)"
)
_PROBE_UID = "00000000-0000-0000-0000-000000000000"  # a dry run stores nothing: no real owner needed


def _describe(err: BaseException) -> str:
    if isinstance(err, ApiException):
        message = ""
        with contextlib.suppress(ValueError, AttributeError):
            message = str(json.loads(err.body).get("message", "")) if err.body else ""
        return f"the API server answered {err.status} {err.reason}" + (f": {message}" if message else "")
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text}" if not isinstance(err, PublishError) else text

"""Publishes the node's DRA devices as ResourceSlices and keeps them published, as the kubelet helper does.

What `k8s.io/dynamic-resource-allocation/resourceslice`'s controller does for a node driver:
- the resource.k8s.io version is discovered (v1, else v1beta2, else v1beta1) and the v1 device dicts are
  converted to its shape;
- one pool per node, named after the node; slices named by the server from `generateName:
  <node>-<driver>-`, owned by the Node (its UID read once, again after our slices were deleted), so the
  garbage collector removes them with the Node;
- every change of the devices bumps the pool generation in all of its slices; a pool is split to the API's
  devices-per-slice limit; slices no longer needed are deleted;
- our slices (field selector `spec.nodeName`, `spec.driver`) are listed and watched (`slice_watch`): a slice
  deleted (the kubelet wipes a node's slices when it starts) is written again at once, one changed by
  someone else too, but not more often than every 5 s (two writers that disagree must not take turns at
  full speed);
- the pool is compared by content: a restarted driver that finds it as it wants it writes nothing;
- a 404 makes it ask again which version the server serves (a downgrade removes v1);
- device taints are published when the server keeps them (checked once with a dry-run create before the
  first tainted device goes out); elsewhere a tainted device is left out of the slice (`slice_taints`);
- ConsumableShares' fields are left out once a write comes back without them (`slice_sharing`);
- every failure is logged in one line (at most one every 30 s, with a count of the rest) and retried after
  a back-off capped at a second (a 429's Retry-After is honoured up to 10 s), so a pool deleted during an
  outage is back within about a second of the API server answering again.

Requests go through `slice_api` (the light client, plain dicts): one code path for the three versions, and
no client model in between (models carry fields of newer releases, which an older server drops). The calls
block: requests run in threads, the watch in its own daemon thread.

Not done, as upstream does not either: slices are left in place when the driver stops (the kubelet removes
them when the plugin is gone; a restarted driver takes them over).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubegpu.common.backoff import Backoff
from kubegpu.common.log_throttle import LogThrottle
from kubegpu.dra import slices
from kubegpu.dra.api_errors import ApiStatusError
from kubegpu.dra.kubeapi import KubeClient
from kubegpu.dra.slice_api import HTTP_CONFLICT, HTTP_NOT_FOUND, SliceApi, describe
from kubegpu.dra.slice_cache import SliceCache
from kubegpu.dra.slice_sharing import SharingSupport
from kubegpu.dra.slice_taints import TaintSupport
from kubegpu.dra.slice_watch import FAILURE_LOG_INTERVAL_S, RETRIED, SliceWatch, outage_backoff, retry_delay
from kubegpu.dra.slices import Device

log = logging.getLogger(__name__)

FOREIGN_EDIT_DELAY = 5.0  # seconds between two rewrites of slices someone else keeps changing
_PROBE_UID = "00000000-0000-0000-0000-000000000000"  # a dry run stores nothing: no real owner needed


class SlicePublisher:
    """Keeps the node's pool of ResourceSlices equal to the latest `update()`, until `stop()`."""

    def __init__(
        self,
        api: KubeClient,
        *,
        driver_name: str,
        node_name: str,
        max_devices_per_slice: int = slices.MAX_DEVICES_PER_SLICE,
        backoff: Callable[[], Backoff] = outage_backoff,
        foreign_edit_delay: float = FOREIGN_EDIT_DELAY,
    ) -> None:
        if max_devices_per_slice < 1:
            raise ValueError(f"max_devices_per_slice must be at least 1, got {max_devices_per_slice}")
        self.driver_name = driver_name
        self.node_name = node_name
        self.max_devices_per_slice = max_devices_per_slice
        self.api = SliceApi(api, driver_name=driver_name, node_name=node_name)
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
        self._taints = TaintSupport()
        self._sharing = SharingSupport()
        self._node_uid: str | None = None
        self._slices = SliceCache()
        self._last_chunks: list[list[Device]] | None = None  # what the last write published
        self._foreign_edit_delay = foreign_edit_delay
        self._last_fix = -foreign_edit_delay  # when someone else's change was last undone
        self._fix_timer: asyncio.TimerHandle | None = None  # the pass that undoes it, when it must wait
        self._generation = 0
        self._watch: SliceWatch | None = None
        self._log = LogThrottle(log, interval_s=FAILURE_LOG_INTERVAL_S)
        self._failures = 0  # failed passes since the last good one
        # For metrics and tests.
        self.last_publish_seconds: float | None = None  # update() to the last write of its pool
        self.publish_errors = 0

    # ---- the interface -------------------------------------------------------------------------------

    @property
    def published_generation(self) -> int:
        """The pool generation of the last complete publication (0: none yet)."""
        return self._generation

    @property
    def taints_served(self) -> bool | None:
        """Whether the API server keeps device taints (None: not known yet)."""
        return self._taints.served

    @property
    def field_selector(self) -> str:
        return self.api.field_selector

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
                    if self._failures:
                        log.info(
                            "ResourceSlices of pool %s in sync again after %d failed attempt(s)",
                            self.node_name,
                            self._failures,
                        )
                        self._failures = 0
                except RETRIED as err:
                    self.publish_errors += 1
                    self._failures += 1
                    # A version the server stopped serving (a downgrade) answers 404 too: ask again.
                    self._rediscover = isinstance(err, ApiStatusError) and err.status == HTTP_NOT_FOUND
                    delay = retry_delay(backoff, err)
                    self._log.warning(
                        f"publish-{getattr(err, 'kind', type(err).__name__)}",
                        "cannot publish ResourceSlices of pool %s (driver %s): %s; retrying in %.1fs",
                        self.node_name,
                        self.driver_name,
                        describe(err),
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
        watch = self._watch
        if watch is not None:
            await asyncio.to_thread(watch.join, 5.0)

    # ---- one pass ------------------------------------------------------------------------------------

    async def _pass(self) -> None:
        if self.version is None or self._rediscover:
            self._rediscover = False
            version = await asyncio.to_thread(self.api.discover)
            if version != self.version:
                log.info("publishing ResourceSlices through %s/%s", slices.GROUP, version)
                self.version = version
                if self._slices.listed and self._watch is not None:
                    self._slices.listed = (
                        False  # the watch thread lists again in the new version, then wakes us
                    )
                    self._watch.relist()
        if self._watch is None or not self._watch.alive:
            self._start_watch()
        if not self._slices.listed:
            return  # the watch thread wakes us once it has listed our slices
        with self._lock:
            devices, requested_at = self._devices, self._requested_at
        if devices is None:
            return
        wanted = await self._publishable(devices)
        chunks = slices.split(wanted, self.max_devices_per_slice)
        generation = self._slices.in_sync(chunks, self.node_name, self._v)
        if generation is not None:
            self._generation = generation
            return
        if self._slices.edited_by_others(chunks, self._last_chunks):
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
        self._slices.after_write()
        self.last_publish_seconds = time.monotonic() - requested_at

    async def _publishable(self, devices: list[Device]) -> list[Device]:
        """The devices this server can take: tainted ones only when it keeps taints."""
        if self._taints.must_probe(devices):
            if await asyncio.to_thread(self._probe_taints, devices):
                self._taints.served = True
            else:
                self._taints.dropped()
        return self._sharing.publishable(self._taints.publishable(devices))

    def _probe_taints(self, devices: list[Device]) -> bool:
        """A dry-run create with one tainted device: does the server keep its taints?"""
        tainted = next(d for d in devices if d.get("taints"))
        body = self._new_body([tainted], generation=1, count=1, node_uid=self._node_uid or _PROBE_UID)
        got = self.api.create(self._v, body, dry_run=True)
        return not slices.dropped_taints([tainted], slices.devices_of(got, self._v))

    async def _write(self, chunks: list[list[Device]]) -> None:
        """Bump the generation and write the pool: update our slices, create the missing, delete the rest."""
        current = self._slices.mine()
        generation = max([self._generation, *(slices.generation_of(o) for o in current)]) + 1
        if len(chunks) > len(current) and self._node_uid is None:
            self._node_uid = await asyncio.to_thread(self.api.read_node_uid)
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

    def _spec(self, devices: list[Device], generation: int, count: int) -> dict[str, Any]:
        return slices.spec(
            driver=self.driver_name,
            node_name=self.node_name,
            generation=generation,
            count=count,
            devices=devices,
            version=self._v,
        )

    def _new_body(
        self, devices: list[Device], *, generation: int, count: int, node_uid: str
    ) -> dict[str, Any]:
        spec = self._spec(devices, generation, count)
        return slices.new_slice(
            driver=self.driver_name,
            node_name=self.node_name,
            node_uid=node_uid,
            version=self._v,
            slice_spec=spec,
        )

    def _create(self, devices: list[Device], generation: int, count: int) -> None:
        assert self._node_uid is not None
        sent = slices.carry_taint_times(devices, self._slices.known_devices(self._v))
        body = self._new_body(sent, generation=generation, count=count, node_uid=self._node_uid)
        self._wrote(self.api.create(self._v, body), devices)

    def _replace(self, current: dict[str, Any], devices: list[Device], generation: int, count: int) -> None:
        body = {**current, "apiVersion": f"{slices.GROUP}/{self._v}", "kind": slices.KIND}
        sent = slices.carry_taint_times(devices, self._slices.known_devices(self._v))
        body["spec"] = self._spec(sent, generation, count)
        name = slices.name_of(current)
        try:
            got = self.api.replace(self._v, name, body)
        except ApiStatusError as err:
            if err.status in (HTTP_NOT_FOUND, HTTP_CONFLICT):
                # Gone or changed meanwhile: the watch brings the current state, the retry builds on it.
                self._call_in_loop(self._slices.written.discard, name)
            raise
        self._wrote(got, devices)

    def _delete(self, obj: dict[str, Any]) -> None:
        name = slices.name_of(obj)
        self.api.delete(self._v, name)
        self._call_in_loop(self._slices.gone, name)

    def _wrote(self, obj: dict[str, Any], devices: list[Device]) -> None:
        self._taints.written(devices, slices.devices_of(obj, self._v))
        self._sharing.written(devices, slices.devices_of(obj, self._v))
        self._call_in_loop(self._slices.wrote, obj)

    # ---- what the watch reports (loop thread) ---------------------------------------------------------

    def _on_list(self, items: list[dict[str, Any]], resource_version: int) -> None:
        self._slices.on_list(items, resource_version)
        self._poke_now()

    def _on_event(self, kind: str, obj: dict[str, Any]) -> None:
        name = slices.name_of(obj)
        if kind == "DELETED":
            if self._slices.deleted(name):
                log.info("ResourceSlice %s was deleted; publishing pool %s again", name, self.node_name)
                self._node_uid = None  # a deleted Node takes its slices: read the (new) UID again
        else:
            self._slices.seen(obj)
        self._poke_now()

    # ---- the watch (its own thread) ------------------------------------------------------------------

    def _start_watch(self) -> None:
        self._slices.listed = False
        self._watch = SliceWatch(
            self.api,
            version=lambda: self._v,
            backoff=self._backoff,
            call_in_loop=self._call_in_loop,
            on_list=self._on_list,
            on_event=self._on_event,
            on_version_gone=self._rediscover_now,
        )
        self._watch.start()

    def _stop_watch(self) -> None:
        self._stopping.set()
        if self._watch is not None:
            self._watch.stop()

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

"""What the publisher knows of its own ResourceSlices: the objects as last listed, watched or written, and
which of them it wrote itself. Used from the publisher's loop thread only."""

from __future__ import annotations

from typing import Any

from kubegpu.dra import slices
from kubegpu.dra.slices import Device


class SliceCache:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}  # our slices by name
        self.written: set[str] = set()  # the slices we created or replaced (by name)
        self.listed = False  # a list has filled the cache since the watch (re)started

    def mine(self) -> list[dict[str, Any]]:
        return [self.objects[name] for name in sorted(self.objects)]

    def known_devices(self, version: str) -> list[Device]:
        return [d for obj in list(self.objects.values()) for d in slices.devices_of(obj, version)]

    # ---- changes -------------------------------------------------------------------------------------

    def seen(self, obj: dict[str, Any]) -> None:
        """A newer state of one of our slices (an older one, arriving late from the watch, is ignored)."""
        name = slices.name_of(obj)
        known = self.objects.get(name)
        if known is None or slices.resource_version_of(obj) >= slices.resource_version_of(known):
            self.objects[name] = obj

    def wrote(self, obj: dict[str, Any]) -> None:
        self.written.add(slices.name_of(obj))
        self.seen(obj)

    def gone(self, name: str) -> None:
        """We deleted it."""
        self.objects.pop(name, None)
        self.written.discard(name)

    def deleted(self, name: str) -> bool:
        """Someone deleted it (a watch event); whether we had written it.

        It stays in `written` until the next write: a deletion is put right at once, not held off as an
        edit by someone else."""
        self.objects.pop(name, None)
        return name in self.written

    def on_list(self, items: list[dict[str, Any]], resource_version: int) -> None:
        # What we wrote after the list was taken is newer than the list: it stays (its event follows).
        newer = {n: o for n, o in self.objects.items() if slices.resource_version_of(o) > resource_version}
        self.objects = {**{slices.name_of(o): o for o in items}, **newer}
        self.listed = True

    def after_write(self) -> None:
        self.written &= set(self.objects)

    # ---- comparisons ---------------------------------------------------------------------------------

    def in_sync(self, chunks: list[list[Device]], pool: str, version: str) -> int | None:
        """The generation of our slices when they hold exactly these chunks as one complete pool at one
        generation; None otherwise.

        Compared by content, not by who wrote it: a restarted driver (or the other pod of a rolling update)
        that finds the pool as it wants it writes nothing.
        """
        mine = self.mine()
        if len(mine) != len(chunks) or len({slices.generation_of(o) for o in mine}) != 1:
            return None
        for obj in mine:
            if slices.pool_of(obj) != pool or slices.slice_count_of(obj) != len(chunks):
                return None
        # Which slice holds which chunk does not matter (slice names are random): compare as multisets.
        got = sorted(slices.content_key(slices.devices_of(o, version)) for o in mine)
        if got != sorted(slices.content_key(c) for c in chunks):
            return None
        return slices.generation_of(mine[0])

    def edited_by_others(self, chunks: list[list[Device]], last_chunks: list[list[Device]] | None) -> bool:
        """Our last write already wanted these chunks and no slice went or came: someone changed one."""
        return chunks == last_chunks and set(self.objects) == self.written

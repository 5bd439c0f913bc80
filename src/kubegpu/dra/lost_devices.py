"""Devices a prepared claim holds that discovery no longer finds: published again as lost, not dropped.

The device plugin keeps a lost GPU listed Unhealthy under its ID; the driver does the same across a
restart. It keeps the device entries it last published (`published.json` in its plugin directory, written
atomically and only when they change). At start, a device that a checkpointed claim holds but discovery
did not find is published again from its saved entry with NVIDIA's `<driver>/gpu-lost` taint, and the
health stream reports it Unhealthy ("GPU is lost"). Once no claim holds it, it is published no more.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from kubegpu.common.files import FileProblem, read_bytes, write_atomic

log = logging.getLogger(__name__)

PUBLISHED_FILE = "published.json"
MAX_BYTES = 16 << 20  # far above any node's devices; a bigger file is not ours


def lost_entries(
    saved: Mapping[str, Mapping[str, Any]],
    found: Collection[str],
    held: Collection[str],
    taint: Mapping[str, str],
) -> list[dict[str, Any]]:
    """The saved entries of the devices a claim holds that discovery did not find, each with `taint` as its
    only taint, in name order. A held device with no saved entry cannot be described and is left out."""
    return [
        {**saved[name], "taints": [dict(taint)]}
        for name in sorted(held)
        if name not in found and name in saved
    ]


class PublishedStore:
    """The device entries last published, kept in the plugin directory across restarts."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / PUBLISHED_FILE
        self._written: bytes | None = None
        self.saved: dict[str, dict[str, Any]] = self._load()

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            data = read_bytes(self.path, limit=MAX_BYTES, what="published devices file")
            entries = json.loads(data)
            if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
                raise ValueError("not a list of devices")
        except FileProblem as err:
            if not isinstance(err.__cause__, FileNotFoundError):
                log.warning("%s: a lost GPU a claim holds is not published again until it is back", err)
            return {}
        except ValueError as err:
            log.warning(
                "cannot read %s (%s): a lost GPU a claim holds is not published again until it is back",
                self.path,
                err,
            )
            return {}
        self._written = data
        return _by_name(entries)

    def save(self, entries: Sequence[Mapping[str, Any]]) -> None:
        """Keep `entries` (once they differ from what the file holds); a failed write is logged, not raised:
        publishing goes on, only a later restart's view of lost devices is older."""
        data = json.dumps(list(entries), sort_keys=True, separators=(",", ":")).encode()
        if data == self._written:
            return
        try:
            write_atomic(self.path, data, mode=0o600)
        except OSError as err:
            log.warning("cannot write %s: %s", self.path, err.strerror or err)
            return
        self._written = data
        self.saved = _by_name(entries)


def _by_name(entries: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The devices among the entries (DynamicMIG's counter-set entries have no name), by name."""
    return {e["name"]: dict(e) for e in entries if isinstance(e.get("name"), str)}

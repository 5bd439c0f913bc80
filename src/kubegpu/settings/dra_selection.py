"""Which of the node's GPUs go to DRA: `all`, `none` (or empty), or a comma list of indices and UUIDs.

One text, two readers: the DRA driver (`kubegpu dra --gpus`) publishes the selected GPUs, and the device
plugin (`kubegpu plugin --dra-gpus`) leaves the same GPUs out, so a physical GPU is never advertised by
both. A GPU's MIG devices follow their parent GPU: a MIG UUID is not a selection item.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from kubegpu.common.quoting import quote_id

ALL = "all"
NONE = "none"
ACCEPTED = "use all, none, GPU indices (0,2) or GPU UUIDs (GPU-<uuid>), comma-separated"

# NVML's GPU UUID: "GPU-" and a canonical UUID. Hex compared without case (NVML prints it in lower case).
_UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)
_INDEX = re.compile(r"[0-9]{1,4}")  # NVML enumerates at most a few dozen GPUs; 4 digits is generous


class GpuSelectionError(ValueError):
    """A bad selection text. `fix` is the reason and the accepted forms, without the text itself."""

    def __init__(self, text: str, fix: str) -> None:
        super().__init__(f"invalid GPU selection {quote_id(text)}: {fix}")
        self.fix = fix


class GpuLike(Protocol):
    @property
    def index(self) -> int: ...

    @property
    def uuid(self) -> str: ...


def _norm_uuid(uuid: str) -> str:
    return "GPU-" + uuid[4:].lower() if uuid[:4].upper() == "GPU-" else uuid


@dataclass(frozen=True, slots=True)
class GpuSelection:
    everything: bool = False
    uuids: frozenset[str] = frozenset()  # normalized: "GPU-" + lower-case hex
    indices: frozenset[int] = frozenset()

    def includes(self, gpu: GpuLike) -> bool:
        return self.everything or gpu.index in self.indices or _norm_uuid(gpu.uuid) in self.uuids

    @property
    def empty(self) -> bool:
        return not self.everything and not self.uuids and not self.indices

    def unmatched(self, gpus: Iterable[GpuLike]) -> list[str]:
        """The items that name no GPU of `gpus` (a typo, or a GPU this node does not have), sorted."""
        gpus = list(gpus)
        indices = {g.index for g in gpus}
        uuids = {_norm_uuid(g.uuid) for g in gpus}
        missing = [str(i) for i in sorted(self.indices - indices)]
        return missing + sorted(self.uuids - uuids)

    def __str__(self) -> str:
        """The selection as `parse_gpu_selection` reads it back (canonical order)."""
        if self.everything:
            return ALL
        if self.empty:
            return NONE
        return ",".join([str(i) for i in sorted(self.indices)] + sorted(self.uuids))


NO_GPUS = GpuSelection()
ALL_GPUS = GpuSelection(everything=True)


def parse_gpu_selection(text: str) -> GpuSelection:
    """Parse `all` | `none` | `` (none) | `0,2` | `GPU-<uuid>,...` (indices and UUIDs may mix).

    Raises GpuSelectionError (a ValueError) with one line naming the bad item and the accepted forms.
    """
    stripped = text.strip()
    if stripped.lower() in ("", NONE):
        return NO_GPUS
    if stripped.lower() == ALL:
        return ALL_GPUS
    uuids: set[str] = set()
    indices: set[int] = set()
    for raw in stripped.split(","):
        item = raw.strip()
        if _INDEX.fullmatch(item):
            indices.add(int(item))
        elif _UUID.fullmatch(item):
            uuids.add(_norm_uuid(item))
        else:
            raise GpuSelectionError(stripped, f"{_why(item)}; {ACCEPTED}")
    return GpuSelection(everything=False, uuids=frozenset(uuids), indices=frozenset(indices))


def _why(item: str) -> str:
    if not item:
        return "an empty item"
    if item.lower() in (ALL, NONE):
        return f"{item!r} cannot be mixed with other items"
    if item[:4].upper() == "MIG-":
        return f"{quote_id(item)} is a MIG device; MIG devices follow their parent GPU, name the GPU"
    return f"{quote_id(item)} is neither a GPU index nor a GPU UUID"

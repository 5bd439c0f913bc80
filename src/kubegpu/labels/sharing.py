"""The part of the config's `sharing` section that GFD's labels depend on.

What GFD sees of sharing, after NVIDIA's config post-processing (`kubegpu.config.apply_nvidia_restrictions`):
- names carry the `nvidia.com/` prefix;
- a resource is "renamed" when it keeps a `rename`: with NVIDIA's rules exactly when its block has
  `renameByDefault: true` (kubegpu's --allow-resource-customization also honours an explicit `rename`);
- the active strategy is MPS if `sharing.mps` has any resource with replicas > 1, else time-slicing if
  `sharing.timeSlicing` has one, else none;
- per-resource replicas are looked up in the `mps` block when it is present at all, else in `timeSlicing`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kubegpu.settings.nvidia_config import Config

SharingStrategy = Literal["none", "time-slicing", "mps"]


@dataclass(frozen=True, slots=True)
class ReplicatedResource:
    name: str  # fully qualified, e.g. "nvidia.com/gpu"
    replicas: int
    renamed: bool  # served under another name: GFD then leaves "-SHARED" off the product label


@dataclass(frozen=True, slots=True)
class SharingSettings:
    strategy: SharingStrategy = "none"
    # of the block GFD consults: mps when present, else timeSlicing
    resources: tuple[ReplicatedResource, ...] = ()

    def replication(self, resource_name: str) -> ReplicatedResource | None:
        return next((r for r in self.resources if r.name == resource_name), None)


def sharing_from_config(config: Config) -> SharingSettings:
    """The sharing GFD's labels reflect, from a parsed config after NVIDIA's restrictions were applied."""
    sharing = config.sharing
    if sharing is None:
        return SharingSettings()
    kind, _ = sharing.strategy()
    strategy: SharingStrategy = (
        "mps" if kind == "mps" else "time-slicing" if kind == "time-slicing" else "none"
    )
    block = sharing.mps if sharing.mps is not None else sharing.timeSlicing
    entries = (block.resources or []) if block is not None else []
    # name and replicas are checked when the file is parsed (NVIDIA's "no resource name specified", ...)
    resources = tuple(ReplicatedResource(r.name or "", r.replicas or 0, bool(r.rename)) for r in entries)
    return SharingSettings(strategy, resources)

"""The Node object's capacity/allocatable for device-plugin resources, as the kubelet's status sync sets them.

The Node outlives kubelet restarts, so values stick until the device manager reports new ones: a resource
the device manager dropped (endpoint stopped past the grace period) is set to 0, never deleted.
"""

from __future__ import annotations

from collections.abc import Mapping


class NodeStatus:
    def __init__(self) -> None:
        self.capacity: dict[str, int] = {}
        self.allocatable: dict[str, int] = {}

    def apply(
        self, capacity: Mapping[str, int], allocatable: Mapping[str, int], removed: set[str]
    ) -> set[str]:
        """Merge one GetCapacity result; return the resources whose capacity or allocatable changed."""
        new_capacity = {**self.capacity, **capacity, **dict.fromkeys(removed, 0)}
        # Allocatable starts as a copy of capacity (no reservations for extended resources) and the device
        # manager's allocatable overrides it.
        new_allocatable = {**new_capacity, **allocatable}
        changed = {
            r
            for r in new_capacity
            if new_capacity[r] != self.capacity.get(r) or new_allocatable[r] != self.allocatable.get(r)
        }
        self.capacity, self.allocatable = new_capacity, new_allocatable
        return changed

    def reset(self) -> set[str]:
        """No checkpoint at kubelet start means a new node: extended resources drop to 0 until reported."""
        changed = {r for r in self.capacity if self.capacity[r] or self.allocatable.get(r)}
        self.capacity = dict.fromkeys(self.capacity, 0)
        self.allocatable = dict.fromkeys(self.capacity, 0)
        return changed

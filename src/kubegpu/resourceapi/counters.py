"""Shared counters (KEP-4815, DRAPartitionableDevices) as the scheduler's structured allocator counts them.

A pool's counter sets (`sharedCounters`) hold amounts; a device that consumes counters
(`consumesCounters`) takes its amounts from them while it is allocated. Per pool, what is available is
each counter's value minus what every allocated device of the pool consumes (devices in slices that do
not reach the node included; a device allowing multiple allocations counts once, however many claims
share it). A device can be allocated only if, with what this search has already picked, no counter of
any set in its pool goes below zero (the scheduler checks every counter of the pool, so a pool already
over-consumed admits no further consuming device). The scheduler treats a device whose shared
allocation already exists as having paid: a second share consumes no counters again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .model import Device, DeviceID
from .pools import Pool


@dataclass(frozen=True, slots=True)
class Deficit:
    """The first counter that would go below zero: what is available of it and what would be consumed."""

    counter_set: str
    counter: str
    available: int
    wanted: int


class CounterLedger:
    """The counters one allocation search has consumed, per pool, on top of what allocated claims hold."""

    def __init__(self, is_allocated: Callable[[DeviceID], bool]) -> None:
        self._is_allocated = is_allocated
        self._available: dict[str, dict[str, dict[str, int]]] = {}
        self._consuming: dict[str, dict[str, dict[str, int]]] = {}

    def available(self, pool: Pool) -> dict[str, dict[str, int]]:
        """Per counter set and counter: the set's amount minus what allocated devices consume."""
        if pool.id not in self._available:
            left = {c.name: dict(c.counters) for c in pool.counter_sets}
            for device_id, device in pool.all_devices():
                if not self._is_allocated(device_id):
                    continue
                for consumption in device.consumes_counters:
                    counters = left.get(consumption.counter_set)
                    if counters is None:
                        continue  # an invalid pool: nobody allocates from it
                    for name, amount in consumption.counters.items():
                        if name in counters:
                            counters[name] -= amount
            self._available[pool.id] = left
        return self._available[pool.id]

    def take(self, pool: Pool, device: Device) -> Deficit | None:
        """Consume `device`'s counters, or return the counter that does not have enough (nothing taken)."""
        consuming = self._consuming.setdefault(pool.id, {})
        for consumption in device.consumes_counters:
            counters = consuming.setdefault(consumption.counter_set, {})
            for name, amount in consumption.counters.items():
                counters[name] = counters.get(name, 0) + amount
        for set_name, counters in self.available(pool).items():
            taken = consuming.get(set_name, {})
            for name, amount in counters.items():
                if amount < taken.get(name, 0):
                    deficit = Deficit(set_name, name, amount, taken.get(name, 0))
                    self.give_back(pool, device)
                    return deficit
        return None

    def give_back(self, pool: Pool, device: Device) -> None:
        consuming = self._consuming[pool.id]
        for consumption in device.consumes_counters:
            counters = consuming[consumption.counter_set]
            for name, amount in consumption.counters.items():
                counters[name] -= amount


def consumers(
    pool: Pool, counter_set: str, counter: str, is_allocated: Callable[[DeviceID], bool]
) -> list[DeviceID]:
    """The allocated devices of `pool` that consume `counter` of `counter_set`."""
    return [
        device_id
        for device_id, device in pool.all_devices()
        if is_allocated(device_id)
        and any(c.counter_set == counter_set and counter in c.counters for c in device.consumes_counters)
    ]

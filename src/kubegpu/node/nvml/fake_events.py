"""The fake NVML's event calls: event sets that deliver the events injected into the state directory.

An event set delivers only events appended to the events log after it was created and its device
registered, for the registered types, as a real event set only delivers events raised after that.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pynvml

from kubegpu.node.nvml.fake_handles import (
    DeviceTable,
    Gpu,
    device_handle,
    event_set_handle,
    event_set_serial,
    fail,
)
from kubegpu.node.nvml.fake_profile import EVENT_TYPES
from kubegpu.node.nvml.fake_state import EventRecord, StateDir

_POLL_S = 0.002  # event wait polls the events log this often: injected -> delivered in a few ms


@dataclass
class EventSet:
    cursor: int  # events-log offset read so far
    registered: dict[int, tuple[int, int]] = field(default_factory=dict)  # gpu -> (event types, since offset)
    pending: collections.deque[EventRecord] = field(default_factory=collections.deque)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def wants(self, offset: int, record: EventRecord) -> bool:
        if record.kind == "wait_error":
            return True
        types_, since = self.registered.get(record.gpu if record.gpu is not None else -1, (0, 0))
        return bool(types_ & record.event_type) and offset >= since


class EventCalls(DeviceTable):
    """nvmlEventSet* and the event registration calls of `FakeNvml`."""

    def __init__(self, gpus: tuple[Gpu, ...], state: StateDir) -> None:
        super().__init__(gpus, state)
        self._event_sets: dict[int, EventSet] = {}
        self._next_event_set = 1

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        gpu = self._gpu(handle)
        mask = 0
        for name in gpu.model.events:
            mask |= EVENT_TYPES[name]
        return mask

    def nvmlEventSetCreate(self) -> Any:
        self._require_init()
        with self._lock:
            serial = self._next_event_set
            self._next_event_set += 1
            self._event_sets[serial] = EventSet(cursor=self.state.events_end())
        return event_set_handle(serial)

    def _event_set(self, eventSet: Any) -> EventSet:
        self._require_init()
        found = self._event_sets.get(event_set_serial(eventSet))
        if found is None:
            fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return found

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        gpu = self._gpu(handle)
        event_set = self._event_set(eventSet)
        if eventTypes & ~self.nvmlDeviceGetSupportedEventTypes(handle):
            fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        with event_set.lock:
            old_types, since = event_set.registered.get(gpu.index, (0, self.state.events_end()))
            event_set.registered[gpu.index] = (old_types | eventTypes, since)

    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int) -> Any:
        event_set = self._event_set(eventSet)
        deadline = time.monotonic() + timeoutms / 1000
        while True:
            record = self._next_event(event_set)
            if record is not None:
                return self._event_data(record)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                fail(pynvml.NVML_ERROR_TIMEOUT)
            time.sleep(min(_POLL_S, remaining))

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> Any:
        return self.nvmlEventSetWait_v2(eventSet, timeoutms)

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        self._event_set(eventSet)
        with self._lock:
            del self._event_sets[event_set_serial(eventSet)]

    def _next_event(self, event_set: EventSet) -> EventRecord | None:
        with event_set.lock:
            if not event_set.pending:
                records, event_set.cursor = self.state.read_events(event_set.cursor)
                event_set.pending.extend(r for offset, r in records if event_set.wants(offset, r))
            return event_set.pending.popleft() if event_set.pending else None

    def _event_data(self, record: EventRecord) -> Any:
        if record.kind == "wait_error":
            fail(pynvml.NVML_ERROR_UNKNOWN)
        data = pynvml.c_nvmlEventData_t()
        data.device = device_handle(record.gpu or 0)
        data.eventType, data.eventData = record.event_type, record.data
        data.gpuInstanceId, data.computeInstanceId = record.gi, record.ci
        return data

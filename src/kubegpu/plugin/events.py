"""What the daemon reports as it runs (`DaemonEvents`), and the sink for it when nothing serves /metrics.

`PluginMetrics` (metrics.py) counts these events for Prometheus. It is built, and prometheus-client
imported, only when the HTTP endpoint is on (`--http-port`): without an endpoint no one can read the
counters, and the library with its exposition stack is about 3 MB of the daemon's resident memory.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from kubegpu.allocation.resources import Resource


class DaemonEvents(Protocol):
    """The daemon's, the servers', the supervisor's and the health monitor's reports."""

    def update_resources(self, resources: Iterable[Resource]) -> None: ...
    def allocated(self, resource: str, devices: int) -> None: ...
    def allocation_failed(self, resource: str, rpc: str = "Allocate") -> None: ...
    def rpc_refused(self, resource: str, rpc: str, reason: str) -> None: ...
    def registered(self, resource: str, latency_s: float) -> None: ...
    def xid(self, code: int, gpu_uuid: str | None) -> None: ...
    def xid_ignored(self, code: int) -> None: ...
    def ecc_event(self, kind: str) -> None: ...
    def config_reload(self, failure: str | None = None) -> None: ...
    def task_restarted(self, name: str) -> None: ...


class NoMetrics:
    """DaemonEvents when no endpoint serves /metrics: every report is dropped."""

    def update_resources(self, resources: Iterable[Resource]) -> None:
        pass

    def allocated(self, resource: str, devices: int) -> None:
        pass

    def allocation_failed(self, resource: str, rpc: str = "Allocate") -> None:
        pass

    def rpc_refused(self, resource: str, rpc: str, reason: str) -> None:
        pass

    def registered(self, resource: str, latency_s: float) -> None:
        pass

    def xid(self, code: int, gpu_uuid: str | None) -> None:
        pass

    def xid_ignored(self, code: int) -> None:
        pass

    def ecc_event(self, kind: str) -> None:
        pass

    def config_reload(self, failure: str | None = None) -> None:
        pass

    def task_restarted(self, name: str) -> None:
        pass

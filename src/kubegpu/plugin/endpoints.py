"""The plugin's HTTP side, wired only when --http-port is set: the Prometheus metrics the daemon reports to,
the GPU telemetry sampler, and the server of /healthz, /readyz and /metrics.

prometheus-client, the PodResources client and the HTTP server load only then (events.py says why); without
a port the daemon reports to `NoMetrics` and nothing here starts.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubegpu.node.inventory import Inventory
from kubegpu.plugin.events import DaemonEvents, NoMetrics
from kubegpu.plugin.prepare import StartupError
from kubegpu.plugin.supervise import Supervisor
from kubegpu.settings.plugin import PluginSettings

if TYPE_CHECKING:
    from kubegpu.plugin.http_endpoint import HttpServer, StatusSource
    from kubegpu.plugin.metrics import PluginMetrics
    from kubegpu.plugin.telemetry import Telemetry

log = logging.getLogger("kubegpu.plugin.daemon")  # the daemon's lines, wherever the code lives

TELEMETRY_TASK = "gpu-telemetry"


class Endpoints:
    def __init__(
        self,
        settings: PluginSettings,
        status: StatusSource,
        tasks: Callable[[], Mapping[str, bool]],
        nvml: Callable[[], Any],
        inventory: Callable[[], Inventory],
        plugin_dir: Path,
    ) -> None:
        """The metrics and the telemetry sampler; the HTTP server comes with `serve` (it needs the
        supervisor, which reports to these metrics)."""
        self._settings = settings
        self._status = status
        self.metrics: DaemonEvents = NoMetrics()
        self.telemetry: Telemetry | None = None  # GPU telemetry for /metrics (telemetry.py)
        self.http: HttpServer | None = None
        self._served: PluginMetrics | None = None
        if not settings.http_port:
            return
        from kubegpu.plugin.metrics import PluginMetrics
        from kubegpu.plugin.podresources_client import PodResourcesClient
        from kubegpu.plugin.telemetry_metrics import install_telemetry

        pod_resources = settings.pod_resources_socket
        self.metrics = self._served = PluginMetrics(
            status=status,
            pod_resources=PodResourcesClient(pod_resources) if pod_resources else None,
            tasks=tasks,
        )
        self.telemetry = install_telemetry(self._served, settings, nvml, inventory, plugin_dir)

    def serve(self, supervisor: Supervisor) -> None:
        """Build the HTTP server (when a port is set): its health checks read the supervisor's tasks."""
        if self._served is None:
            return
        from kubegpu.plugin.http_endpoint import HttpServer

        settings = self._settings
        self.http = HttpServer(
            self._status,
            self._served,
            port=settings.http_port,
            host=settings.http_address or None,
            grace_s=settings.health_grace_s,
            tasks_down=supervisor.down,
            spawn=supervisor.spawn,
        )

    async def start(self) -> None:
        """Listen; StartupError naming the settings to change when the port or address cannot be used."""
        if self.http is None:
            return
        try:
            await self.http.start()
        except OSError as err:  # the port is taken, the address does not resolve or is not ours
            where = f"{self._settings.http_address or '*'}:{self._settings.http_port}"
            if isinstance(err, socket.gaierror) or not err.errno:
                cause = err.strerror or str(err)
            else:  # asyncio words bind errors its own way; the errno's text is the one users search for
                cause = os.strerror(err.errno)
            raise StartupError(
                f"cannot serve the HTTP endpoint on {where}: {cause}; choose a free "
                "--http-port (KUBEGPU_HTTP_PORT) and an address of this node for --http-address "
                "(KUBEGPU_HTTP_ADDRESS)"
            ) from err
        log.info("serving /healthz, /readyz and /metrics on port %d", self.http.port)

    def start_telemetry(self, supervisor: Supervisor) -> None:
        if self.telemetry is not None:
            supervisor.start(TELEMETRY_TASK, self.telemetry.run)

    async def close(self) -> None:
        if self.http is not None:
            await self.http.close()

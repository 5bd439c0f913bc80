"""The DRA driver's metrics endpoint: NVIDIA's `--http-endpoint` (a Go listen address, `:8080`,
`127.0.0.1:8080`, `[::1]:8080`) and `--metrics-path` (`/metrics`), served by the standard library's HTTP
server in a daemon thread (a scrape never waits on the event loop, and prometheus-client reads its
registry thread-safely). GET or HEAD on the path answers the exposition; any other path is 404, any other
method 405.

prometheus-client is imported only when the endpoint is on (`serve_metrics`), not by `parse_endpoint`.
"""

from __future__ import annotations

import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)


def parse_endpoint(text: str) -> tuple[str, int]:
    """(host, port) of a Go listen address; an empty host is every interface. ValueError names the fix."""
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(
            f"invalid --http-endpoint (HTTP_ENDPOINT) {text!r}: "
            "want [host]:port, e.g. :8080 or 127.0.0.1:8080"
        )
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port_text)


def check_path(path: str) -> str:
    if not path.startswith("/"):
        raise ValueError(
            f"invalid --metrics-path (METRICS_PATH) {path!r}: it must start with /, e.g. /metrics"
        )
    return path


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)


class MetricsServer:
    def __init__(self, registry: Any, endpoint: str, path: str) -> None:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        host, port = parse_endpoint(endpoint)
        metrics_path = check_path(path)

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # scrapes are not log lines
                pass

            def do_GET(self) -> None:
                self._answer(with_body=True)

            def do_HEAD(self) -> None:
                self._answer(with_body=False)

            def _answer(self, *, with_body: bool) -> None:
                if self.path.split("?", 1)[0] != metrics_path:
                    body, status, kind = b"404 page not found\n", 404, "text/plain; charset=utf-8"
                else:
                    body, status, kind = generate_latest(registry), 200, CONTENT_TYPE_LATEST
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if with_body:
                    self.wfile.write(body)

        for method in ("POST", "PUT", "PATCH", "DELETE"):
            setattr(Handler, f"do_{method}", lambda self: self.send_error(405))
        self._httpd = _Server((host, port), Handler)
        self.port = self._httpd.server_address[1]
        self.host = host
        self.path = metrics_path
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()
        shown = f"[{self.host}]" if ":" in self.host else self.host
        log.info("serving metrics on http://%s:%d%s", shown, self.port, self.path)

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)

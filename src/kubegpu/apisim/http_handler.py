"""The HTTP side of the simulated API server: one handler class per server, reading each request (JSON
body, query with the last value of each key), recording it, applying the server's Fault, then routing it to
pods/proxy, discovery, a watch stream (watch.py) or a verb (verbs.py); errors as `Status` bodies.

Every response closes its connection, so a stopped server is really unreachable (no kept-alive socket
keeps serving); a watch is a chunked stream of JSON lines until it ends.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

from .calls import ApiCall, Fault, flag
from .errors import ApiError, bad_request, injected, method_not_allowed
from .kinds import ResourceKind
from .pod_proxy import is_proxy_path, proxy_get
from .routes import DiscoveryRoute, ResourceRoute, parse_path
from .store import Store
from .verbs import handle, route_matcher
from .watch import stream_watch


class Served(Protocol):
    """What the handler needs of the server (ApiServerSim), named here so this module need not import it."""

    store: Store
    kinds: tuple[ResourceKind, ...]
    served: dict[str, tuple[str, ...]]
    watch_timeout: float
    requests: list[tuple[str, dict[str, str]]]
    calls: list[ApiCall]
    fault: Fault | None

    def discovery_body(self, route: DiscoveryRoute) -> dict[str, Any]: ...


def handler_class(server: Served) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # chunked streaming needs 1.1

        def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
            pass

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_PUT(self) -> None:
            self._serve("PUT")

        def do_PATCH(self) -> None:
            self._serve("PATCH")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

        def _serve(self, method: str) -> None:
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
            try:
                body = self._read_body()
            except ValueError as err:
                server.requests.append((url.path, query))
                self._json(400, bad_request(f"the body of the request is not valid JSON: {err}").status())
                return
            server.requests.append((url.path, query))
            server.calls.append(ApiCall(method, url.path, query, body))
            fault = server.fault
            if fault is not None and fault.applies(url.path):
                time.sleep(fault.hang_s)
                if fault.status:
                    with contextlib.suppress(OSError):  # the client gave up waiting
                        self._json(fault.status, injected(fault.status).status())
                    return
            try:
                if method == "GET" and is_proxy_path(url.path):  # pods/proxy: pod_proxy.py
                    self._raw(*proxy_get(server.store, url.path, query))
                    return
                route = parse_path(url.path, server.kinds, server.served)
                if isinstance(route, DiscoveryRoute):
                    if method != "GET":
                        raise method_not_allowed()
                    self._json(200, server.discovery_body(route))
                elif method == "GET" and not route.name and flag(query, "watch"):
                    route_matcher(route, query)  # a bad selector is a 400 before the stream starts
                    self._watch(route, query)
                else:
                    code, response = handle(
                        server.store, method, route, query, body, self.headers.get("Content-Type", "")
                    )
                    self._json(code, response)
            except ApiError as err:
                self._json(err.code, err.status())

        def _read_body(self) -> Any:
            length = int(self.headers.get("Content-Length") or 0)
            if not length:
                return None
            raw = self.rfile.read(length)
            return json.loads(raw) if raw.strip() else None

        def _json(self, code: int, body: Any) -> None:
            self._raw(code, "application/json", json.dumps(body).encode())

        def _raw(self, code: int, content_type: str, data: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
            self.close_connection = True

        def _watch(self, route: ResourceRoute, query: Mapping[str, str]) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True

            def send(event: dict[str, Any]) -> None:
                line = json.dumps(event).encode() + b"\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))

            try:
                stream_watch(server.store, route, query, send, server.watch_timeout)
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass

    return Handler

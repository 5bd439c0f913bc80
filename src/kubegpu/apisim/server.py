"""A fake Kubernetes API server for Nodes: list and watch over HTTP on 127.0.0.1, as the real one speaks.

Enough of the protocol for the official client's `list_node` and `watch.Watch().stream`:

- `GET /api/v1/nodes[?fieldSelector=metadata.name%3D<name>]` → a NodeList with `metadata.resourceVersion`;
- the same with `watch=true&resourceVersion=R[&timeoutSeconds=T]` → a chunked stream of newline-delimited
  JSON events (ADDED / MODIFIED / DELETED) after R, a BOOKMARK when the timeout ends the watch, and an
  ERROR event carrying a 410 Status when R is older than the compacted history.

Every response closes its connection, so a stopped server is really unreachable (no kept-alive socket
keeps serving). Requests are recorded for assertions.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass
class Event:
    resource_version: int
    type: str
    node: dict[str, Any]


class FakeApiServer:
    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.resource_version = 100
        self.history: list[Event] = []
        self.compacted = 0  # watches from a resourceVersion below this get 410 Gone
        self.requests: list[tuple[str, dict[str, str]]] = []
        self._cond = threading.Condition()
        self._epoch = 0  # bumped to end every open watch stream
        self._httpd: ThreadingHTTPServer | None = None
        self.port = 0

    # ---- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> None:
        """Listen (again, on the same port after a stop) and serve in a background thread."""
        httpd = ThreadingHTTPServer(("127.0.0.1", self.port), _handler(self))
        httpd.daemon_threads = True
        self.port = httpd.server_address[1]
        self._httpd = httpd
        threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self) -> None:
        """Stop listening and end the open watches: the client sees the connection go away."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        self.close_streams()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def write_kubeconfig(self, path: Path) -> Path:
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "fake", "user": {"token": "fake-token"}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
                    "current-context": "fake",
                }
            )
        )
        return path

    # ---- state changes -------------------------------------------------------------------------------

    def add_node(self, name: str, labels: dict[str, str] | None = None) -> None:
        node = {"metadata": {"name": name, "labels": dict(labels or {})}}
        self._change(name, "ADDED", node)

    def set_label(self, name: str, key: str, value: str | None, *, record: bool = True) -> None:
        """Set (or with None remove) one label. `record=False` leaves no watch event, as if the event
        had been compacted away before the watcher saw it."""
        node = copy.deepcopy(self.nodes[name])
        if value is None:
            node["metadata"]["labels"].pop(key, None)
        else:
            node["metadata"]["labels"][key] = value
        self._change(name, "MODIFIED", node, record=record)

    def delete_node(self, name: str) -> None:
        self._change(name, "DELETED", self.nodes[name])

    def compact(self) -> None:
        """Drop the event history: watches from any earlier resourceVersion now get 410 Gone."""
        with self._cond:
            self.history.clear()
            self.compacted = self.resource_version

    def close_streams(self) -> None:
        with self._cond:
            self._epoch += 1
            self._cond.notify_all()

    def _change(self, name: str, kind: str, node: dict[str, Any], *, record: bool = True) -> None:
        with self._cond:
            self.resource_version += 1
            node = copy.deepcopy(node)
            node["metadata"]["resourceVersion"] = str(self.resource_version)
            if kind == "DELETED":
                self.nodes.pop(name, None)
            else:
                self.nodes[name] = node
            if record:
                self.history.append(Event(self.resource_version, kind, node))
            self._cond.notify_all()

    # ---- request log ---------------------------------------------------------------------------------

    def lists(self) -> list[dict[str, str]]:
        return [q for path, q in self.requests if path == "/api/v1/nodes" and not _is_watch(q)]

    def watches(self) -> list[dict[str, str]]:
        return [q for path, q in self.requests if path == "/api/v1/nodes" and _is_watch(q)]

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; requests so far: {self.requests}")
            time.sleep(0.01)

    # ---- serving -------------------------------------------------------------------------------------

    def _select(self, query: dict[str, str]) -> Callable[[dict[str, Any]], bool]:
        selector = query.get("fieldSelector", "")
        if not selector:
            return lambda node: True
        key, _, value = selector.partition("=")
        if key != "metadata.name":
            raise ValueError(f"unsupported field selector {selector!r}")
        return lambda node: node["metadata"]["name"] == value

    def list_body(self, query: dict[str, str]) -> dict[str, Any]:
        wanted = self._select(query)
        with self._cond:
            return {
                "kind": "NodeList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self.resource_version)},
                "items": [copy.deepcopy(n) for n in self.nodes.values() if wanted(n)],
            }

    def stream_watch(self, query: dict[str, str], send: Callable[[dict[str, Any]], None]) -> None:
        """Send the events after the query's resourceVersion as they happen, until the timeout (then a
        BOOKMARK if asked for, as the real server does) or `close_streams()` (no goodbye: a lost server)."""
        wanted = self._select(query)
        deadline = time.monotonic() + float(query.get("timeoutSeconds", "30"))
        with self._cond:
            epoch = self._epoch
            cursor = int(query.get("resourceVersion") or self.resource_version)
            compacted = self.compacted
        if cursor < compacted:
            gone = _status(410, "Expired", f"too old resource version: {cursor} ({compacted})")
            send({"type": "ERROR", "object": gone})
            return
        while True:
            with self._cond:
                while True:
                    fresh = [e for e in self.history if e.resource_version > cursor and wanted(e.node)]
                    remaining = deadline - time.monotonic()
                    if fresh or self._epoch != epoch or remaining <= 0:
                        break
                    self._cond.wait(min(remaining, 0.5))
                closed = self._epoch != epoch
                current = self.resource_version
            if fresh:
                for event in fresh:
                    send({"type": event.type, "object": event.node})
                cursor = fresh[-1].resource_version
                continue
            if not closed and _flag(query, "allowWatchBookmarks"):
                bookmark = {"kind": "Node", "apiVersion": "v1", "metadata": {"resourceVersion": str(current)}}
                send({"type": "BOOKMARK", "object": bookmark})
            return


def _flag(query: dict[str, str], name: str) -> bool:
    return query.get(name, "").lower() in ("true", "1")  # the Python client sends `True`


def _is_watch(query: dict[str, str]) -> bool:
    return _flag(query, "watch")


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _handler(server: FakeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # chunked streaming needs 1.1

        def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
            pass

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            server.requests.append((url.path, query))
            if url.path != "/api/v1/nodes":
                self._json(404, _status(404, "NotFound", f"the server could not find {url.path}"))
                return
            try:
                if _is_watch(query):
                    self._watch(query)
                else:
                    self._json(200, server.list_body(query))
            except ValueError as err:
                self._json(400, _status(400, "BadRequest", str(err)))

        def _json(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
            self.close_connection = True

        def _watch(self, query: dict[str, str]) -> None:
            server._select(query)  # a bad selector is a 400 before the stream starts
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
                server.stream_watch(query, send)
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass

    return Handler

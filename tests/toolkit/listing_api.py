"""A read-only Kubernetes API server for the cluster tools' live mode: the lists `kubectl get
nodes,pods,daemonsets,runtimeclasses -A` reads, served over HTTP on 127.0.0.1 from a snapshot file.

The official client talks to it as to a real API server: `GET /api/v1/nodes?limit=N[&continue=T]` and the
same for pods, `/apis/apps/v1/daemonsets` and `/apis/node.k8s.io/v1/runtimeclasses`, typed lists paged with
`metadata.continue`. A request without the expected bearer token is refused with 401, so a test can tell
which kubeconfig user (and so which context) the client used. Requests are recorded.

(kubegpu.apisim, the simulated API server, serves Nodes and the DRA kinds but no Pods, DaemonSets or
RuntimeClasses, and takes any token; once it serves these lists, the kubectl-plugin tests can move to it.)
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

LISTS = {
    "/api/v1/nodes": ("Node", "NodeList", "v1"),
    "/api/v1/pods": ("Pod", "PodList", "v1"),
    "/apis/apps/v1/daemonsets": ("DaemonSet", "DaemonSetList", "apps/v1"),
    "/apis/node.k8s.io/v1/runtimeclasses": ("RuntimeClass", "RuntimeClassList", "node.k8s.io/v1"),
}


class ListingApiServer:
    def __init__(self, snapshot: Path, token: str) -> None:
        items = json.loads(snapshot.read_text())["items"]
        self.objects: dict[str, list[dict[str, Any]]] = {
            path: [{k: v for k, v in i.items() if k != "kind"} for i in items if i.get("kind") == kind]
            for path, (kind, _, _) in LISTS.items()
        }
        self.token = token
        self.requests: list[tuple[str, dict[str, list[str]]]] = []
        self._httpd: ThreadingHTTPServer | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        httpd.daemon_threads = True
        self.port = httpd.server_address[1]
        self._httpd = httpd
        threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def answer(self, path: str, query: dict[str, list[str]], auth: str | None) -> tuple[int, dict[str, Any]]:
        self.requests.append((path, query))
        if auth != f"Bearer {self.token}":
            return 401, _status(401, "Unauthorized", "Unauthorized")
        if path not in LISTS:
            return 404, _status(404, "NotFound", f"the server could not find the requested resource ({path})")
        _, list_kind, api_version = LISTS[path]
        objects = self.objects[path]
        start = int(query.get("continue", ["0"])[0] or 0)
        limit = int(query.get("limit", ["0"])[0] or 0) or len(objects)
        page = objects[start : start + limit]
        following = start + limit if start + limit < len(objects) else None
        meta: dict[str, Any] = {"resourceVersion": "1"}
        if following is not None:
            meta["continue"] = str(following)
        return 200, {"kind": list_kind, "apiVersion": api_version, "metadata": meta, "items": page}


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _handler(server: ListingApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlsplit(self.path)
            code, body = server.answer(url.path, parse_qs(url.query), self.headers.get("Authorization"))
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


def kubeconfig(path: Path, contexts: dict[str, tuple[ListingApiServer, str | None]], current: str) -> Path:
    """A kubeconfig with one cluster, user (the server's token) and context per name; `namespace` per
    context as given."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": current,
        "clusters": [{"name": name, "cluster": {"server": srv.url}} for name, (srv, _) in contexts.items()],
        "users": [{"name": name, "user": {"token": srv.token}} for name, (srv, _) in contexts.items()],
        "contexts": [
            {
                "name": name,
                "context": {"cluster": name, "user": name, **({"namespace": ns} if ns else {})},
            }
            for name, (_, ns) in contexts.items()
        ],
    }
    path.write_text(json.dumps(config))
    return path

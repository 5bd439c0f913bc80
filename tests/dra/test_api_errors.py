"""Failed API server calls by kind, as the light client reports them to the driver's metrics: real refused
connections, a server that never answers, one that answers 500, 429 and 404, and one whose answer is not
JSON; the kinds written out as the metrics name them."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kubegpu.dra.api_errors import (
    ApiBadResponse,
    ApiServerError,
    ApiStatusError,
    ApiThrottled,
    ApiTimeout,
    ApiUnreachable,
)
from kubegpu.dra.kubeapi import KubeClient
from kubegpu.settings.kubeaccess import ApiAccess


class _Answers(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    codes = [500, 429, 404, 200, 201]

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        code = self.codes.pop(0)
        body = b'{"kind":"Status","apiVersion":"v1","status":"Failure","code":%d}' % code
        if code == 200:
            body = b'{"kind":"ResourceClaim","metadata":{"name":"c"},"spec":{}}'
        if code == 201:
            code, body = 200, b"<html>a proxy's login page</html>"
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def answering() -> Iterator[str]:
    _Answers.codes = [500, 429, 404, 200, 201]
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def counting(url: str) -> tuple[KubeClient, list[str]]:
    kinds: list[str] = []
    return KubeClient(ApiAccess(server=url), on_error=kinds.append), kinds


def test_5xx_429_and_bodies_not_json_are_counted_and_other_answers_are_not(answering: str) -> None:
    api, kinds = counting(answering)
    for error in (ApiServerError, ApiThrottled, ApiStatusError):
        with pytest.raises(error):
            api.request("GET", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/c")
    assert api.request("GET", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/c")["kind"] == (
        "ResourceClaim"
    )
    with pytest.raises(ApiBadResponse):
        api.request("GET", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/c")
    assert kinds == ["server_error", "too_many_requests", "other"]  # the 404 is an answer, not a failure


def test_a_refused_connection_is_a_connection_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nobody listens there
    api, kinds = counting(f"http://127.0.0.1:{port}")
    with pytest.raises(ApiUnreachable):
        api.request("GET", "/api")
    with pytest.raises(ApiUnreachable):
        api.stream("/apis/resource.k8s.io/v1/resourceslices", {"watch": "true"}, (1.0, 1.0))
    assert kinds == ["connection", "connection"]


def test_a_server_that_does_not_answer_is_a_timeout() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()  # accepts (the kernel's backlog) and never answers
        api, kinds = counting(f"http://127.0.0.1:{listening.getsockname()[1]}")
        with pytest.raises(ApiTimeout):
            api.request("GET", "/api", timeout=(1.0, 0.2))
    assert kinds == ["timeout"]

"""Failed API server calls by kind, through the official client's REST layer: real urllib3 failures against
a port nobody listens on and a server that answers 500 and 429, counted as the driver's metrics count them."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import urllib3
from kubernetes import client

from kubegpu.dra.api_errors import count_api_errors, error_kind, status_kind


class Recorder:
    def __init__(self) -> None:
        self.kinds: list[str] = []

    def api_error(self, kind: str) -> None:
        self.kinds.append(kind)


class _Answers(BaseHTTPRequestHandler):
    codes = [500, 429, 404, 200]

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        code = self.codes.pop(0)
        body = b'{"kind":"Status","apiVersion":"v1","status":"Failure","code":%d}' % code
        if code == 200:
            body = b'{"kind":"ResourceClaim","metadata":{"name":"c"},"spec":{}}'
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def answering() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def api(host: str) -> client.ResourceV1Api:
    configuration = client.Configuration(host=host)
    configuration.retries = 0
    return client.ResourceV1Api(client.ApiClient(configuration))


def test_5xx_and_429_are_counted_and_other_answers_are_not(answering: str) -> None:
    recorder = Recorder()
    resource = api(answering)
    count_api_errors(resource.api_client, recorder)
    for _ in range(3):
        with pytest.raises(client.ApiException):
            resource.read_namespaced_resource_claim("c", "default")
    resource.read_namespaced_resource_claim("c", "default")
    assert recorder.kinds == ["server_error", "too_many_requests"]  # the 404 is an answer, not a failure


def test_a_refused_connection_is_a_connection_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nobody listens there
    recorder = Recorder()
    resource = api(f"http://127.0.0.1:{port}")
    count_api_errors(resource.api_client, recorder)
    with pytest.raises(urllib3.exceptions.MaxRetryError):
        resource.read_namespaced_resource_claim("c", "default")
    assert recorder.kinds == ["connection"]


def test_kinds_of_urllib3_failures() -> None:
    pool = urllib3.HTTPConnectionPool("127.0.0.1", 1)
    assert error_kind(urllib3.exceptions.ReadTimeoutError(pool, "/", "read timed out")) == "timeout"
    assert (
        error_kind(urllib3.exceptions.MaxRetryError(pool, "/", urllib3.exceptions.ConnectTimeoutError()))
        == "timeout"
    )
    assert error_kind(urllib3.exceptions.ProtocolError("Connection aborted.")) == "connection"
    assert error_kind(ValueError("not JSON")) == "other"
    assert [status_kind(c) for c in (200, 404, 409, 429, 500, 503)] == [
        None,
        None,
        None,
        "too_many_requests",
        "server_error",
        "server_error",
    ]

"""The DRA driver's light API client against a scripted server on a real socket: kept-alive connections,
each failure as its typed error with its text, Retry-After within the caller's budget, bearer tokens and
basic auth, TLS with the cluster's CA, client certificates and tls-server-name, and watch streams; any
bytes a broken server sends end as an answer or an ApiError, nothing else."""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubegpu.dra.api_errors import (
    ApiBadResponse,
    ApiError,
    ApiServerError,
    ApiStatusError,
    ApiThrottled,
    ApiTimeout,
    ApiUnreachable,
)
from kubegpu.dra.kubeapi import KubeClient
from kubegpu.settings.kubeaccess import ApiAccess
from kubegpu.settings.kubeconfig import KubeconfigError

TLS = Path(__file__).parent.parent / "fixtures" / "tls"
Action = Callable[[socket.socket], bool]  # writes an answer; False: close the connection afterwards


def answer(
    status: int, body: Any = None, *, headers: dict[str, str] | None = None, close: bool = False
) -> Action:
    data = json.dumps(body).encode() if body is not None and not isinstance(body, bytes) else body or b""
    reason = {200: "OK", 404: "Not Found", 429: "Too Many Requests", 500: "Internal Server Error"}[status]

    def act(conn: socket.socket) -> bool:
        head = [
            f"HTTP/1.1 {status} {reason}",
            "Content-Type: application/json",
            f"Content-Length: {len(data)}",
        ]
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        conn.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + data)
        return not close

    return act


def chunked(*chunks: bytes, then_hang: float = 0.0, close: bool = False) -> Action:
    def act(conn: socket.socket) -> bool:
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
            + (b"Connection: close\r\n" if close else b"")
            + b"\r\n"
        )
        for chunk in chunks:
            conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        time.sleep(then_hang)
        conn.sendall(b"0\r\n\r\n")
        return False

    return act


def raw(data: bytes) -> Action:
    """Whatever bytes, then the connection closes."""

    def act(conn: socket.socket) -> bool:
        conn.sendall(data)
        return False

    return act


def hang(seconds: float) -> Action:
    def act(conn: socket.socket) -> bool:
        time.sleep(seconds)
        return False

    return act


def hang_up(conn: socket.socket) -> bool:
    return False


class Scripted:
    """Answers each request with the next action; records requests and connections."""

    def __init__(self, *actions: Action, tls: ssl.SSLContext | None = None) -> None:
        self.actions = list(actions)
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.connections = 0
        scripted = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                conn: socket.socket = self.request
                if tls is not None:
                    try:
                        conn = tls.wrap_socket(conn, server_side=True)
                    except (ssl.SSLError, OSError):
                        return
                scripted.connections += 1
                reader = conn.makefile("rb")
                while True:
                    line = reader.readline()
                    if not line:
                        return
                    headers: dict[str, str] = {}
                    while (h := reader.readline()) not in (b"\r\n", b""):
                        k, _, v = h.decode().partition(":")
                        headers[k.strip().lower()] = v.strip()
                    body = reader.read(int(headers.get("content-length", "0")))
                    scripted.requests.append((line.decode().strip(), headers, body))
                    if not scripted.actions or not scripted.actions.pop(0)(conn):
                        conn.close()
                        return

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def script() -> Iterator[Callable[..., Scripted]]:
    servers: list[Scripted] = []

    def make(*actions: Action, tls: ssl.SSLContext | None = None) -> Scripted:
        servers.append(Scripted(*actions, tls=tls))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def client_for(server: Scripted, **access: Any) -> KubeClient:
    return KubeClient(ApiAccess(server=f"http://127.0.0.1:{server.port}", **access))


def test_answers_are_json_over_one_kept_alive_connection(script: Callable[..., Scripted]) -> None:
    server = script(answer(200, {"kind": "APIGroup"}), answer(200, {"items": []}))
    api = client_for(server)
    assert api.request("GET", "/apis/resource.k8s.io") == {"kind": "APIGroup"}
    got = api.request(
        "GET", "/apis/resource.k8s.io/v1/resourceslices", query={"fieldSelector": "spec.nodeName=a"}
    )
    assert got == {"items": []}
    assert [r[0] for r in server.requests] == [
        "GET /apis/resource.k8s.io HTTP/1.1",
        "GET /apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3Da HTTP/1.1",
    ]
    assert server.connections == 1


def test_a_body_goes_out_as_json_with_its_length(script: Callable[..., Scripted]) -> None:
    server = script(answer(200, {"metadata": {"name": "s-1"}}))
    got = client_for(server).request(
        "POST", "/apis/x/v1/things", body={"spec": {"a": 1}}, query={"dryRun": "All"}
    )
    assert got == {"metadata": {"name": "s-1"}}
    line, headers, body = server.requests[0]
    assert line == "POST /apis/x/v1/things?dryRun=All HTTP/1.1"
    assert (headers["content-type"], json.loads(body)) == ("application/json", {"spec": {"a": 1}})


def test_an_idle_connection_the_server_closed_is_not_reused(script: Callable[..., Scripted]) -> None:
    # The first answer keeps the connection alive by its headers, but the server closes it afterwards (an
    # idle timeout): the next call must not be sent into the dead connection.
    server = script(answer(200, {"n": 1}, close=True), answer(200, {"n": 2}))
    api = client_for(server)
    assert api.request("GET", "/a") == {"n": 1}
    time.sleep(0.1)
    assert api.request("GET", "/b") == {"n": 2}
    assert server.connections == 2


def test_a_refused_connection_is_unreachable(script: Callable[..., Scripted]) -> None:
    server = script()
    port = server.port
    server.close()
    with pytest.raises(ApiUnreachable) as err:
        KubeClient(ApiAccess(server=f"http://127.0.0.1:{port}")).request("GET", "/api")
    assert str(err.value) == "the API server refused the connection (is it down?)"
    assert err.value.kind == "connection"


def test_a_server_that_does_not_answer_times_out(script: Callable[..., Scripted]) -> None:
    server = script(hang(2.0))
    started = time.monotonic()
    with pytest.raises(ApiTimeout) as err:
        client_for(server).request("GET", "/api", timeout=(1.0, 0.3))
    assert time.monotonic() - started < 1.5
    assert str(err.value) == "the API server did not answer within 0.3 s"


def test_a_connection_closed_without_an_answer_is_unreachable(script: Callable[..., Scripted]) -> None:
    server = script(hang_up)
    with pytest.raises(ApiUnreachable) as err:
        client_for(server).request("GET", "/api")
    assert str(err.value) == "the API server closed the connection without answering"


def test_a_500_is_a_server_error_with_the_status_message(script: Callable[..., Scripted]) -> None:
    status = {"kind": "Status", "status": "Failure", "message": "etcdserver: request timed out", "code": 500}
    server = script(answer(500, status))
    with pytest.raises(ApiServerError) as err:
        client_for(server).request("GET", "/api")
    assert (err.value.status, err.value.kind) == (500, "server_error")
    assert (
        str(err.value) == "the API server answered 500 Internal Server Error: etcdserver: request timed out"
    )


def test_a_429_is_waited_out_within_the_budget(script: Callable[..., Scripted]) -> None:
    server = script(
        answer(429, {"message": "too many requests"}, headers={"Retry-After": "1"}), answer(200, {})
    )
    slept: list[float] = []
    api = KubeClient(ApiAccess(server=f"http://127.0.0.1:{server.port}"), sleep=slept.append)
    assert api.request("GET", "/api", throttle_budget=5.0) == {}
    assert slept == [1.0]


def test_a_429_beyond_the_budget_is_raised_with_its_retry_after(script: Callable[..., Scripted]) -> None:
    server = script(answer(429, {"message": "too many requests"}, headers={"Retry-After": "30"}))
    slept: list[float] = []
    api = KubeClient(ApiAccess(server=f"http://127.0.0.1:{server.port}"), sleep=slept.append)
    with pytest.raises(ApiThrottled) as err:
        api.request("GET", "/api", throttle_budget=5.0)
    assert (slept, err.value.retry_after, err.value.kind) == ([], 30.0, "too_many_requests")
    assert (
        str(err.value)
        == "the API server answered 429 Too Many Requests: too many requests (retry after 30 s)"
    )


def test_a_404_says_whether_it_names_the_object(script: Callable[..., Scripted]) -> None:
    named = {"message": 'resourceclaims "c1" not found', "details": {"name": "c1", "kind": "resourceclaims"}}
    server = script(
        answer(404, named), answer(404, {"message": "the server could not find the requested resource"})
    )
    api = client_for(server)
    with pytest.raises(ApiStatusError) as err:
        api.request("GET", "/c1")
    assert err.value.names("resourceclaims", "c1") and not err.value.names("resourceclaims", "c2")
    with pytest.raises(ApiStatusError) as err:
        api.request("GET", "/c1")
    assert not err.value.names("resourceclaims", "c1")


def test_a_2xx_that_is_not_json_is_a_bad_response(script: Callable[..., Scripted]) -> None:
    server = script(answer(200, b"<html>proxy login</html>"))
    with pytest.raises(ApiBadResponse) as err:
        client_for(server).request("GET", "/apis")
    assert str(err.value) == "the API server's answer to GET /apis is not JSON"


def test_a_chunked_answer_is_read_whole(script: Callable[..., Scripted]) -> None:
    server = script(chunked(b'{"items": [', b'{"a": 1}', b"]}"))
    assert client_for(server).request("GET", "/list") == {"items": [{"a": 1}]}


def test_bearer_token_and_a_token_file_read_again_every_minute(
    script: Callable[..., Scripted], tmp_path: Path
) -> None:
    server = script(answer(200, {}), answer(200, {}), answer(200, {}), answer(200, {}))
    assert client_for(server, token="abc").request("GET", "/") == {}
    token_file = tmp_path / "token"
    token_file.write_text("first\n")
    now = [0.0]
    api = KubeClient(
        ApiAccess(server=f"http://127.0.0.1:{server.port}", token_file=str(token_file)), clock=lambda: now[0]
    )
    api.request("GET", "/")
    token_file.write_text("rotated\n")
    now[0] = 30.0
    api.request("GET", "/")
    now[0] = 61.0
    api.request("GET", "/")
    assert [r[1]["authorization"] for r in server.requests] == [
        "Bearer abc", "Bearer first", "Bearer first", "Bearer rotated",
    ]  # fmt: skip


def test_basic_auth(script: Callable[..., Scripted]) -> None:
    server = script(answer(200, {}))
    client_for(server, username="admin", password="s3cret").request("GET", "/")
    assert server.requests[0][1]["authorization"] == "Basic " + base64.b64encode(b"admin:s3cret").decode()


@pytest.mark.parametrize("close", [False, True], ids=["kept-alive", "connection-close"])
def test_a_watch_streams_lines_as_they_come_and_can_be_ended(
    script: Callable[..., Scripted], close: bool
) -> None:
    # With "Connection: close" http.client lets go of the socket as soon as the head is read: ending the
    # stream must still reach it (the publisher ends its watch to list again in another version).
    event = b'{"type": "ADDED", "object": {"metadata": {"name": "s"}}}\n'
    server = script(chunked(event[:10], event[10:] + event, then_hang=30.0, close=close))
    kinds: list[str] = []
    api = KubeClient(ApiAccess(server=f"http://127.0.0.1:{server.port}"), on_error=kinds.append)
    stream = api.stream("/watch", {"watch": "true"}, (1.0, 60.0))
    lines = stream.lines()
    assert [next(lines), next(lines)] == [event, event]
    threading.Timer(0.2, stream.end).start()
    started = time.monotonic()
    with pytest.raises(StopIteration):  # an end asked for is the stream's end, not a failed call
        next(lines)
    assert time.monotonic() - started < 5.0
    assert kinds == []
    stream.close()


def tls_server_context(*, require_client_cert: bool = False) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(TLS / "server.crt", TLS / "server.key")
    if require_client_cert:
        context.load_verify_locations(TLS / "ca.crt")
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def test_tls_with_the_clusters_ca_and_a_client_certificate(script: Callable[..., Scripted]) -> None:
    server = script(answer(200, {"ok": True}), tls=tls_server_context(require_client_cert=True))
    access = ApiAccess(
        server=f"https://127.0.0.1:{server.port}",
        ca_data=(TLS / "ca.crt").read_bytes(),
        cert_data=(TLS / "client.crt").read_bytes(),
        key_data=(TLS / "client.key").read_bytes(),
    )
    assert KubeClient(access).request("GET", "/api") == {"ok": True}
    files = ApiAccess(
        server=f"https://127.0.0.1:{server.port}",
        ca_file=str(TLS / "ca.crt"),
        cert_file=str(TLS / "client.crt"),
        key_file=str(TLS / "client.key"),
    )
    server.actions.append(answer(200, {"ok": 2}))
    assert KubeClient(files).request("GET", "/api") == {"ok": 2}


def test_tls_without_the_ca_is_refused_and_insecure_skips_the_check(script: Callable[..., Scripted]) -> None:
    server = script(answer(200, {}), tls=tls_server_context())
    with pytest.raises(ApiUnreachable) as err:
        KubeClient(ApiAccess(server=f"https://127.0.0.1:{server.port}")).request("GET", "/api")
    assert "TLS: unable to get local issuer certificate" in str(err.value)
    assert (
        KubeClient(ApiAccess(server=f"https://127.0.0.1:{server.port}", insecure=True)).request("GET", "/")
        == {}
    )


def test_tls_server_name_names_the_certificate_to_expect(script: Callable[..., Scripted]) -> None:
    # The certificate is for apiserver.test and 127.0.0.1, not "localhost".
    server = script(answer(200, {}), tls=tls_server_context())
    ca = str(TLS / "ca.crt")
    with pytest.raises(ApiUnreachable) as err:
        KubeClient(ApiAccess(server=f"https://localhost:{server.port}", ca_file=ca)).request("GET", "/")
    assert "TLS: Hostname mismatch" in str(err.value)
    access = ApiAccess(
        server=f"https://localhost:{server.port}", ca_file=ca, tls_server_name="apiserver.test"
    )
    assert KubeClient(access).request("GET", "/") == {}


def test_unusable_tls_files_fail_at_start_with_the_source() -> None:
    with pytest.raises(KubeconfigError) as err:
        KubeClient(
            ApiAccess(server="https://10.0.0.1:6443", ca_data=b"not a certificate", source="in-cluster")
        )
    assert str(err.value).startswith("in-cluster: cannot use its TLS certificates or key: ")
    with pytest.raises(KubeconfigError) as err:
        KubeClient(ApiAccess(server="ftp://10.0.0.1", source="kubeconfig k, context 'c'"))
    assert str(err.value) == "kubeconfig k, context 'c': server 'ftp://10.0.0.1' is not an http(s) URL"


def test_a_204_has_no_body_and_keeps_the_connection(script: Callable[..., Scripted]) -> None:
    def no_content(conn: socket.socket) -> bool:
        conn.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")
        return True

    server = script(no_content, answer(200, {"n": 2}))
    api = client_for(server)
    assert api.request("DELETE", "/a") is None
    assert api.request("GET", "/b") == {"n": 2}
    assert server.connections == 1


def test_connection_close_and_http_1_0_are_not_kept_alive(script: Callable[..., Scripted]) -> None:
    server = script(
        answer(200, {"n": 1}, headers={"Connection": "close"}),
        raw(b'HTTP/1.0 200 OK\r\n\r\n{"n": 2}'),  # no length: the body ends with the connection
        answer(200, {"n": 3}),
    )
    api = client_for(server)
    assert [api.request("GET", "/") for _ in range(3)] == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert server.connections == 3


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"", "the API server closed the connection without answering"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n{}", "the connection to the API server was lost"),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            "the connection to the API server was lost",
        ),
        (
            b"SSH-2.0-OpenSSH\r\n",
            "cannot reach the API server at {url}: its answer is not HTTP/1.1 "
            "(BadStatusLine: SSH-2.0-OpenSSH)",
        ),
        (
            b"HTTP/1.1 \xb2\xb2\xb2 OK\r\n\r\n",
            "cannot reach the API server at {url}: its answer is not HTTP/1.1 "
            "(BadStatusLine: HTTP/1.1 \xb2\xb2\xb2 OK)",
        ),
        (
            b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000 + b"\r\n\r\n",
            "cannot reach the API server at {url}: its answer is not HTTP/1.1 (LineTooLong: got more than "
            "65536 bytes when reading header line)",
        ),
    ],
)
def test_broken_answers_name_what_is_wrong(script: Callable[..., Scripted], data: bytes, error: str) -> None:
    server = script(raw(data))
    api = client_for(server)
    with pytest.raises(ApiUnreachable) as err:
        api.request("GET", "/")
    assert str(err.value) == error.format(url=api.server)


def test_an_answer_over_the_size_limit_is_refused(
    script: Callable[..., Scripted], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("kubegpu.dra.kubeapi.MAX_BODY", 100)
    server = script(answer(200, {"a": "x" * 200}))
    api = client_for(server)
    with pytest.raises(ApiUnreachable) as err:
        api.request("GET", "/")
    assert (
        str(err.value) == f"cannot reach the API server at {api.server}: the answer is larger than 100 bytes"
    )


@pytest.fixture(scope="module")
def one_server() -> Iterator[Scripted]:
    server = Scripted()
    yield server
    server.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=st.lists(st.binary(max_size=60).map(lambda b: b.replace(b"\n", b"") + b"\n"), max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=800), max_size=10),
)
def test_watch_lines_come_out_whole_however_the_chunks_cut_them(
    one_server: Scripted, lines: list[bytes], cuts: list[int]
) -> None:
    body = b"".join(lines)
    points = sorted({c % (len(body) + 1) for c in cuts} | {0, len(body)})
    one_server.actions[:] = [chunked(*(body[a:b] for a, b in itertools.pairwise(points) if b > a))]
    stream = client_for(one_server).stream("/watch", {"watch": "true"}, (1.0, 5.0))
    try:
        assert list(stream.lines()) == lines
    finally:
        stream.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.binary(max_size=300)
    | st.builds(lambda tail: b"HTTP/1.1 200 OK\r\n" + tail, st.binary(max_size=300))
)
def test_any_bytes_from_the_server_are_an_answer_or_an_api_error(one_server: Scripted, data: bytes) -> None:
    one_server.actions[:] = [raw(data)]
    api = client_for(one_server)
    with contextlib.suppress(ApiError):
        api.request("GET", "/", timeout=(1.0, 2.0))
    one_server.actions[:] = [raw(data)]
    try:
        stream = api.stream("/watch", None, (1.0, 2.0))
    except ApiError:
        return
    try:
        list(stream.lines())
    except ApiError:
        pass
    finally:
        stream.close()

"""The light client's HTTP/1.1 reader on a socket pair: bodies by length, chunked and to the end, watch
lines however the chunks cut them, and any bytes a broken server sends end as HttpError, nothing else."""

from __future__ import annotations

import itertools
import socket
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.dra.http11 import Connection, HttpError, request_bytes


def served(data: bytes) -> Connection:
    ours, theirs = socket.socketpair()
    ours.settimeout(5.0)

    def send() -> None:
        theirs.sendall(data)
        theirs.close()

    threading.Thread(target=send, daemon=True).start()
    return Connection(ours)


def chunk_encoded(parts: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts if p) + b"0\r\n\r\n"


def test_a_response_by_content_length_and_its_headers() -> None:
    conn = served(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: 1\r\nx-a: 2\r\n\r\n{}")
    head = conn.read_head()
    assert (head.status, head.reason, head.headers, head.keeps_alive) == (
        200, "OK", {"content-length": "2", "x-a": "1, 2"}, True,
    )  # fmt: skip
    assert conn.read_body(head, 100) == b"{}"


def test_an_interim_100_is_skipped_and_a_body_without_length_ends_with_the_connection() -> None:
    conn = served(b'HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 404 Not Found\r\n\r\n{"a": 1}')
    head = conn.read_head()
    assert (head.status, head.keeps_alive) == (404, False)
    assert conn.read_body(head, 100) == b'{"a": 1}'


def test_a_204_has_no_body_and_keeps_the_connection() -> None:
    conn = served(b"HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
    head = conn.read_head()
    assert (head.status, head.keeps_alive, conn.read_body(head, 100)) == (204, True, b"")
    assert conn.read_body(conn.read_head(), 100) == b"{}"


def test_connection_close_is_not_kept_alive() -> None:
    head = served(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").read_head()
    assert not head.keeps_alive


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"", "the server closed the connection without answering"),
        (b"SSH-2.0-OpenSSH\r\n", "not an HTTP/1.1 status line: b'SSH-2.0-OpenSSH\\r\\n'"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n{}",
            "the connection was closed before the answer was complete",
        ),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "invalid Content-Length '-1'"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\n", "invalid Content-Length '\xb2'"),
        (
            b"HTTP/1.1 \xb2\xb2\xb2 OK\r\n\r\n",
            "not an HTTP/1.1 status line: b'HTTP/1.1 \\xb2\\xb2\\xb2 OK\\r\\n'",
        ),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "invalid chunk size b'zz'"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 200\r\n\r\n", "the response body is larger than 100 bytes"),
        (b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n", "malformed header line b'bad header\\r\\n'"),
    ],
)
def test_broken_answers_name_what_is_wrong(data: bytes, error: str) -> None:
    conn = served(data)
    with pytest.raises(HttpError) as err:
        conn.read_body(conn.read_head(), 100)
    assert str(err.value) == error


def test_a_request_carries_host_headers_and_length() -> None:
    assert request_bytes("PUT", "/a?b=c", "10.0.0.1:6443", {"Accept": "application/json"}, b"{}") == (
        b"PUT /a?b=c HTTP/1.1\r\nHost: 10.0.0.1:6443\r\nAccept: application/json\r\n"
        b"Content-Length: 2\r\n\r\n{}"
    )
    assert request_bytes("GET", "/", "h", {}, None) == b"GET / HTTP/1.1\r\nHost: h\r\n\r\n"


@settings(max_examples=150, deadline=None)
@given(
    lines=st.lists(st.binary(max_size=60).map(lambda b: b.replace(b"\n", b"") + b"\n"), max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=800), max_size=10),
)
def test_watch_lines_come_out_whole_however_the_chunks_cut_them(lines: list[bytes], cuts: list[int]) -> None:
    body = b"".join(lines)
    points = sorted({c % (len(body) + 1) for c in cuts} | {0, len(body)})
    parts = [body[a:b] for a, b in itertools.pairwise(points)]
    conn = served(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk_encoded(parts))
    head = conn.read_head()
    assert list(conn.lines(head, 1000)) == lines


@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(max_size=300)
    | st.builds(lambda tail: b"HTTP/1.1 200 OK\r\n" + tail, st.binary(max_size=300))
)
def test_any_bytes_from_the_server_are_an_answer_or_an_http_error(data: bytes) -> None:
    conn = served(data)
    try:
        head = conn.read_head()
        conn.read_body(head, 1000)
        list(conn.lines(head, 1000))
    except HttpError:
        pass
    finally:
        conn.close()

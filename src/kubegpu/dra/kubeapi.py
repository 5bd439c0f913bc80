"""The few Kubernetes API calls the DRA driver makes, over HTTP(S) with the standard library's `http.client`.

The official `kubernetes` client's models and API classes cost the driver about 25 MB of resident memory (it
was 2.66x a bare grpc.aio server) for calls that need none of them: the driver reads and writes plain JSON
in whichever resource.k8s.io version the server serves. This client does what those calls need and no more:

- keep-alive connections, reused one call at a time; an idle one the server closed is dropped before use,
  never retried after its request went out (a create must not be sent twice);
- a connect and a read timeout per call, and answers read up to a size limit;
- typed errors whose text says what failed (`api_errors`), each failed call reported to `on_error` by
  kind (the driver's metrics);
- 429, and 5xx with a Retry-After (client-go's rule), are tried again after the server's Retry-After when
  the caller gives a budget for it, and otherwise raised with `retry_after` for the caller's back-off;
- bearer tokens (a token file read again every minute: projected tokens rotate), client certificates,
  basic auth, the cluster's CA or insecure-skip-tls-verify, tls-server-name; see `settings.kubeaccess`.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import select
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode, urlsplit

from kubegpu.common.quoting import plain_id
from kubegpu.dra.api_errors import (
    ApiBadResponse,
    ApiError,
    ApiServerError,
    ApiThrottled,
    ApiTimeout,
    ApiUnreachable,
    failure_kind,
    status_error,
)
from kubegpu.settings.kubeaccess import ApiAccess
from kubegpu.settings.kubeconfig import KubeconfigError

Timeout = tuple[float, float]  # connect, read (seconds)
DEFAULT_TIMEOUT: Timeout = (10.0, 30.0)
TOKEN_REREAD_S = 60.0  # client-go's cachingTokenSource
MAX_BODY = 64 * 1024 * 1024  # one answer (a list of a node's slices is far smaller)
MAX_EVENT = 16 * 1024 * 1024  # one watch event; the API server stores objects up to 1.5 MiB
MAX_ERROR_BODY = 64 * 1024  # an error status's body: its Status message is all that is read from it
MAX_IDLE = 4
E = TypeVar("E", bound=BaseException)


class TooLarge(http.client.HTTPException):
    """An answer (or a watch event) over its size limit."""


class _Connection(http.client.HTTPConnection):
    """One connection to the API server: TCP, then TLS when the server is https, within the connect
    timeout; every read after that within the call's read timeout."""

    def __init__(
        self, host: str, port: int, timeout: Timeout, tls: ssl.SSLContext | None, tls_name: str
    ) -> None:
        super().__init__(host, port, timeout=timeout[0])
        self._read_timeout = timeout[1]
        self._tls, self._tls_name = tls, tls_name

    def connect(self) -> None:
        # The host as bytes: resolving a str would load the idna codec (and unicodedata) for nothing.
        host: Any = self.host.encode() if self.host.isascii() else self.host
        sock = socket.create_connection((host, self.port), self.timeout)
        try:
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=self._tls_name)
            sock.settimeout(self._read_timeout)
        except BaseException:
            sock.close()
            raise
        self.sock = sock

    def read_timeout(self, seconds: float) -> None:
        self._read_timeout = seconds
        if self.sock is not None:
            self.sock.settimeout(seconds)


class KubeClient:
    """Calls to one API server as one identity. Thread-safe; blocking (callers use threads)."""

    def __init__(
        self,
        access: ApiAccess,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        url = urlsplit(access.server)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise KubeconfigError(f"{access.source}: server {access.server!r} is not an http(s) URL")
        self.access = access
        self.server = access.server
        self._host = url.hostname
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._host_header = url.netloc.rpartition("@")[2]
        self._prefix = url.path.rstrip("/")
        self._tls = _tls_context(access) if url.scheme == "https" else None
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._idle: list[_Connection] = []
        self._token = access.token
        self._token_read_at: float | None = None
        # Each failed call by kind (`api_errors.failure_kind`); the daemon points it at its metrics.
        self.on_error: Callable[[str], None] = on_error or (lambda kind: None)

    # ---- calls ---------------------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        timeout: Timeout = DEFAULT_TIMEOUT,
        throttle_budget: float = 0.0,
    ) -> Any:
        """The decoded JSON answer; ApiError otherwise. A 429 (or a 5xx with Retry-After) is tried again
        after the server's Retry-After as long as the waits add up to at most `throttle_budget` seconds."""
        payload = json.dumps(body).encode() if body is not None else None
        waited = 0.0
        while True:
            try:
                status, reason, retry_after, data = self._exchange(
                    method, self._target(path, query), payload, timeout
                )
            except ApiError as failed:
                raise self.counted(failed) from None
            if status < 400:
                try:
                    return json.loads(data) if data else None
                except ValueError:
                    raise self.counted(
                        ApiBadResponse(f"the API server's answer to {method} {path} is not JSON")
                    ) from None
            answered = self.counted(status_error(status, reason, data, retry_after))
            retry = isinstance(answered, ApiThrottled | ApiServerError) and retry_after is not None
            if retry and retry_after is not None and waited + retry_after <= throttle_budget:
                self._sleep(retry_after)
                waited += retry_after
                continue
            raise answered

    def stream(self, path: str, query: Mapping[str, str] | None, timeout: Timeout) -> WatchStream:
        """A watch: the response's lines as they come, on a connection of its own."""
        conn = self._new_connection(timeout)
        try:
            self._connect(conn, timeout)
            sock = conn.sock  # http.client lets go of it once an answer says the connection will close
            response = self._send(conn, "GET", self._target(path, query), None, timeout)
            if response.status >= 400:
                data = _read_limited(response, MAX_ERROR_BODY)
                raise status_error(response.status, response.reason, data, _retry_after(response))
        except BaseException as err:
            conn.close()
            raise self.counted(self.api_error(err, timeout)) from None
        return WatchStream(conn, sock, response, self, timeout)

    def counted(self, err: E) -> E:
        """`err`, reported to `on_error` when it is a failed call (not the API's verdict, such as a 404)."""
        kind = failure_kind(err) if isinstance(err, ApiError) else None
        if kind is not None:
            self.on_error(kind)
        return err

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    # ---- plumbing ------------------------------------------------------------------------------------

    def _target(self, path: str, query: Mapping[str, str] | None) -> str:
        return self._prefix + path + ("?" + urlencode(query) if query else "")

    def _headers(self, payload: bytes | None) -> dict[str, str]:
        headers = {"Host": self._host_header, "Accept": "application/json", "User-Agent": "kubegpu-dra"}
        token = self._current_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        elif self.access.username:
            pair = f"{self.access.username}:{self.access.password}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
        if payload is not None:
            headers["Content-Type"] = "application/json"
        return headers

    def _send(
        self, conn: _Connection, method: str, target: str, payload: bytes | None, timeout: Timeout
    ) -> http.client.HTTPResponse:
        conn.request(method, target, body=payload, headers=self._headers(payload))
        return conn.getresponse()

    def _exchange(
        self, method: str, target: str, payload: bytes | None, timeout: Timeout
    ) -> tuple[int, str, float | None, bytes]:
        """One request on a kept-alive connection (or a new one): status, reason, Retry-After, body."""
        conn = self._take(timeout)
        try:
            response = self._send(conn, method, target, payload, timeout)
            limit = MAX_BODY if response.status < 400 else MAX_ERROR_BODY
            data = _read_limited(response, limit)
        except BaseException as err:
            conn.close()
            raise self.api_error(err, timeout) from None
        if response.will_close or not response.isclosed():
            conn.close()  # the server closes it, or an error body was left unread
        else:
            self._give_back(conn)
        return response.status, response.reason, _retry_after(response), data

    def _current_token(self) -> str:
        if self.access.token or not self.access.token_file:
            return self.access.token
        now = self._clock()
        if self._token_read_at is None or now - self._token_read_at >= TOKEN_REREAD_S:
            try:
                token = Path(self.access.token_file).read_text().strip()
            except OSError as err:
                if not self._token:  # a token read before is used until the file is back
                    raise ApiUnreachable(
                        f"cannot read the token file {self.access.token_file}: {err.strerror or err}"
                    ) from None
            else:
                self._token, self._token_read_at = token, now
        return self._token

    def _take(self, timeout: Timeout) -> _Connection:
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                conn = self._new_connection(timeout)
                self._connect(conn, timeout)
                return conn
            if conn.sock is not None and not _closed_by_peer(conn.sock):
                conn.read_timeout(timeout[1])
                return conn
            conn.close()

    def _give_back(self, conn: _Connection) -> None:
        with self._lock:
            if len(self._idle) < MAX_IDLE:
                self._idle.append(conn)
                return
        conn.close()

    def _new_connection(self, timeout: Timeout) -> _Connection:
        return _Connection(
            self._host, self._port, timeout, self._tls, self.access.tls_server_name or self._host
        )

    def _connect(self, conn: _Connection, timeout: Timeout) -> None:
        try:
            conn.connect()
        except BaseException as err:
            conn.close()
            raise self.api_error(err, timeout, connecting=True) from None

    def api_error(self, err: BaseException, timeout: Timeout, *, connecting: bool = False) -> BaseException:
        """The ApiError for what a call raised (anything else, such as KeyboardInterrupt, as it is)."""
        if isinstance(err, ApiError):
            return err
        if isinstance(err, TimeoutError):  # socket.timeout
            if connecting:
                return ApiTimeout(f"the API server did not accept a connection within {timeout[0]:g} s")
            return ApiTimeout(f"the API server did not answer within {timeout[1]:g} s")
        if isinstance(err, ConnectionRefusedError):
            return ApiUnreachable("the API server refused the connection (is it down?)")
        if isinstance(err, http.client.RemoteDisconnected):
            return ApiUnreachable("the API server closed the connection without answering")
        if isinstance(err, ConnectionResetError | BrokenPipeError | http.client.IncompleteRead):
            return ApiUnreachable("the connection to the API server was lost")
        if isinstance(err, OSError | http.client.HTTPException):
            return ApiUnreachable(f"cannot reach the API server at {self.server}: {_reason(err)}")
        return err


class WatchStream:
    """One watch response, read by one thread: `lines()`, then `close()`; `end()` from any thread stops it."""

    def __init__(
        self,
        conn: _Connection,
        sock: socket.socket,
        response: http.client.HTTPResponse,
        client: KubeClient,
        timeout: Timeout,
    ) -> None:
        self._conn, self._sock, self._response = conn, sock, response
        self._client, self._timeout = client, timeout
        self._ended = False

    def lines(self) -> Iterator[bytes]:
        """The body's lines as they arrive (each with its newline; the last one may lack it). An end asked
        for by `end()` is the stream's end, not an error."""
        while True:
            try:
                line = self._response.readline(MAX_EVENT + 1)
                if len(line) > MAX_EVENT:
                    raise TooLarge(f"a watch event is larger than {MAX_EVENT} bytes")
            except BaseException as err:
                if self._ended:
                    return
                raise self._client.counted(self._client.api_error(err, self._timeout)) from None
            if not line:
                return
            yield line

    def end(self) -> None:
        self._ended = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # the reading thread's blocked read returns at once

    def close(self) -> None:
        self._response.close()
        self._conn.close()
        self._sock.close()


def _read_limited(response: http.client.HTTPResponse, limit: int) -> bytes:
    """The body, or TooLarge past `limit` bytes; IncompleteRead when the connection ends before a body of
    announced length does. A body longer than the limit is left unread (its connection is not reused)."""
    if response.length is not None:
        if response.length > limit:
            raise TooLarge(f"the answer is larger than {limit} bytes")
        return response.read()
    data = response.read(limit + 1)  # chunked, or to the end of the connection
    if len(data) > limit:
        raise TooLarge(f"the answer is larger than {limit} bytes")
    return data


def _tls_context(access: ApiAccess) -> ssl.SSLContext:
    """The TLS settings of `access`; KubeconfigError when its files cannot be used (at start, not later)."""
    try:
        context = ssl.create_default_context(
            cafile=access.ca_file or None, cadata=access.ca_data.decode() if access.ca_data else None
        )
        if access.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if access.cert_file or access.cert_data:
            _load_client_certificate(context, access)
    except (OSError, ssl.SSLError, ValueError) as err:
        raise KubeconfigError(
            f"{access.source}: cannot use its TLS certificates or key: {_reason(err)}"
        ) from None
    return context


def _load_client_certificate(context: ssl.SSLContext, access: ApiAccess) -> None:
    if access.cert_file and not access.cert_data and not access.key_data:
        context.load_cert_chain(access.cert_file, access.key_file or None)
        return
    # ssl reads certificates from files only: embedded data goes through a private temporary directory.
    with tempfile.TemporaryDirectory(prefix="kubegpu-tls-") as tmp:
        cert = access.cert_file or _private_file(Path(tmp) / "cert.pem", access.cert_data)
        key = access.key_file or (
            _private_file(Path(tmp) / "key.pem", access.key_data) if access.key_data else ""
        )
        context.load_cert_chain(cert, key or None)


def _private_file(path: Path, data: bytes) -> str:
    path.touch(mode=0o600)
    path.write_bytes(data)
    return str(path)


def _closed_by_peer(sock: socket.socket) -> bool:
    """An idle keep-alive connection with something to read has been closed (or spoiled) by the server."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _retry_after(response: http.client.HTTPResponse) -> float | None:
    value = response.getheader("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None  # an HTTP date: the API server sends seconds
    return seconds if 0 <= seconds < 86400 else None


def _reason(err: BaseException) -> str:
    if isinstance(err, TooLarge):
        return str(err)
    if isinstance(err, http.client.HTTPException):
        return f"its answer is not HTTP/1.1 ({type(err).__name__}: {plain_id(str(err).strip(), 80)})"
    if isinstance(err, ssl.SSLCertVerificationError):
        return f"TLS: {err.verify_message or err}"
    if isinstance(err, ConnectionRefusedError):
        return "connection refused"
    if isinstance(err, socket.gaierror):
        return f"cannot resolve the host ({err.strerror or err})"
    if isinstance(err, ConnectionResetError | BrokenPipeError):
        return "the connection was reset"
    if isinstance(err, OSError) and err.strerror:
        return err.strerror[0].lower() + err.strerror[1:]
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text}" if text else type(err).__name__

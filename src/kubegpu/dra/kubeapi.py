"""The few Kubernetes API calls the DRA driver makes, over HTTP(S) with the standard library.

The official `kubernetes` client's models and API classes cost the driver about 25 MB of resident memory (it
was 2.66x a bare grpc.aio server) for calls that need none of them: the driver reads and writes plain JSON
in whichever resource.k8s.io version the server serves. This client does what those calls need and no more:

- keep-alive connections, reused one call at a time; an idle one the server closed is dropped before use,
  never retried after its request went out (a create must not be sent twice);
- a connect and a read timeout per call;
- typed errors whose text says what failed (`api_errors`), each failed call reported to `on_error` by
  kind (the driver's metrics);
- 429, and 5xx with a Retry-After (client-go's rule), are tried again after the server's Retry-After when
  the caller gives a budget for it, and otherwise raised with `retry_after` for the caller's back-off;
- bearer tokens (a token file read again every minute: projected tokens rotate), client certificates,
  basic auth, the cluster's CA or insecure-skip-tls-verify, tls-server-name; see `settings.kubeaccess`.
"""

from __future__ import annotations

import base64
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
from kubegpu.dra.http11 import Connection, Head, HttpError, request_bytes
from kubegpu.settings.kubeaccess import ApiAccess
from kubegpu.settings.kubeconfig import KubeconfigError

Timeout = tuple[float, float]  # connect, read (seconds)
DEFAULT_TIMEOUT: Timeout = (10.0, 30.0)
TOKEN_REREAD_S = 60.0  # client-go's cachingTokenSource
MAX_BODY = 64 * 1024 * 1024  # one answer (a list of a node's slices is far smaller)
MAX_EVENT = 16 * 1024 * 1024  # one watch event; the API server stores objects up to 1.5 MiB
MAX_IDLE = 4
E = TypeVar("E", bound=BaseException)


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
        self._idle: list[Connection] = []
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
                head, data = self._exchange(method, self._target(path, query), payload, timeout)
            except ApiError as err:
                raise self.counted(err) from None
            if head.status < 400:
                try:
                    return json.loads(data) if data else None
                except ValueError:
                    raise self.counted(
                        ApiBadResponse(f"the API server's answer to {method} {path} is not JSON")
                    ) from None
            retry_after = _retry_after(head)
            err = self.counted(status_error(head.status, head.reason, data, retry_after))
            retry = isinstance(err, ApiThrottled | ApiServerError) and retry_after is not None
            if retry and retry_after is not None and waited + retry_after <= throttle_budget:
                self._sleep(retry_after)
                waited += retry_after
                continue
            raise err

    def stream(self, path: str, query: Mapping[str, str] | None, timeout: Timeout) -> WatchStream:
        """A watch: the response's lines as they come, on a connection of its own."""
        conn = self._connect(timeout)
        try:
            conn.send(self._request_bytes("GET", self._target(path, query), None))
            head = conn.read_head()
            if head.status >= 400:
                data = conn.read_body(head, 64 * 1024)
                raise status_error(head.status, head.reason, data, _retry_after(head))
        except BaseException as err:
            conn.close()
            raise self.counted(self.api_error(err, timeout)) from None
        return WatchStream(conn, head, self, timeout)

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

    def _request_bytes(self, method: str, target: str, payload: bytes | None) -> bytes:
        headers = {"Accept": "application/json", "User-Agent": "kubegpu-dra"}
        token = self._current_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        elif self.access.username:
            pair = f"{self.access.username}:{self.access.password}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
        if payload is not None:
            headers["Content-Type"] = "application/json"
        return request_bytes(method, target, self._host_header, headers, payload)

    def _exchange(
        self, method: str, target: str, payload: bytes | None, timeout: Timeout
    ) -> tuple[Head, bytes]:
        conn = self._take(timeout)
        try:
            conn.send(self._request_bytes(method, target, payload))
            head = conn.read_head()
            data = conn.read_body(head, MAX_BODY)
        except BaseException as err:
            conn.close()
            raise self.api_error(err, timeout) from None
        if head.keeps_alive:
            self._give_back(conn)
        else:
            conn.close()
        return head, data

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

    def _take(self, timeout: Timeout) -> Connection:
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return self._connect(timeout)
            if not _closed_by_peer(conn.sock):
                conn.sock.settimeout(timeout[1])
                return conn
            conn.close()

    def _give_back(self, conn: Connection) -> None:
        with self._lock:
            if len(self._idle) < MAX_IDLE:
                self._idle.append(conn)
                return
        conn.close()

    def _connect(self, timeout: Timeout) -> Connection:
        # The host as bytes: resolving a str would load the idna codec (and unicodedata) for nothing.
        host: Any = self._host.encode() if self._host.isascii() else self._host
        try:
            sock = socket.create_connection((host, self._port), timeout[0])
        except BaseException as err:
            raise self.api_error(err, timeout, connecting=True) from None
        try:
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=self.access.tls_server_name or self._host)
            sock.settimeout(timeout[1])
        except BaseException as err:
            sock.close()
            raise self.api_error(err, timeout, connecting=True) from None
        return Connection(sock)

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
        if isinstance(err, ConnectionResetError | BrokenPipeError):
            return ApiUnreachable("the connection to the API server was lost")
        if isinstance(err, OSError | HttpError):
            return ApiUnreachable(f"cannot reach the API server at {self.server}: {_reason(err)}")
        return err


class WatchStream:
    """One watch response, read by one thread: `lines()`, then `close()`; `end()` from any thread stops it."""

    def __init__(self, conn: Connection, head: Head, client: KubeClient, timeout: Timeout) -> None:
        self._conn, self._head, self._client, self._timeout = conn, head, client, timeout

    def lines(self) -> Iterator[bytes]:
        lines = self._conn.lines(self._head, MAX_EVENT)
        while True:
            try:
                line = next(lines)
            except StopIteration:
                return
            except BaseException as err:
                raise self._client.counted(self._client.api_error(err, self._timeout)) from None
            yield line

    def end(self) -> None:
        self._conn.shutdown()  # the reading thread's next read returns at once

    def close(self) -> None:
        self._conn.close()


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


def _retry_after(head: Head) -> float | None:
    value = head.header("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None  # an HTTP date: the API server sends seconds
    return seconds if 0 <= seconds < 86400 else None


def _reason(err: BaseException) -> str:
    if isinstance(err, HttpError):
        return str(err)
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

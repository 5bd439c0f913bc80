"""The API server connection of `kubegpu labels`: GFD's Kubernetes client flags on the official client.

`connect` builds an ApiClient from `--kubeconfig` (a path), or from the pod's service account when it is
empty, as GFD does (`kubegpu.settings.kubeconfig`); `RateLimiter` is client-go's token bucket behind
`--kube-api-qps` / `--kube-api-burst`; `describe_failure` turns what the client raises into one line: the
cause, without urllib3's nesting.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kubernetes import client
from kubernetes.client.rest import ApiException

from kubegpu.settings.choices import DEFAULT_KUBE_API_BURST, DEFAULT_KUBE_API_QPS
from kubegpu.settings.kubeconfig import KubeconfigError, load_configuration

# A connection that hangs (a dead node on the path, a black-holed route) must not stall the labeller for
# the kernel's TCP timeout: (connect, read) seconds for every request.
REQUEST_TIMEOUT = (10.0, 30.0)


class ConnectError(Exception):
    """No client configuration could be built. The message is the cause; the caller adds the fix."""


def connect(kubeconfig: str) -> client.ApiClient:
    """An ApiClient for the kubeconfig at this path, or for the in-cluster config when it is empty."""
    try:
        return client.ApiClient(load_configuration(kubeconfig))
    except KubeconfigError as err:
        kind = "out-of-cluster" if kubeconfig else "in-cluster"  # GFD's words
        raise ConnectError(f"create {kind} client configuration: {err}") from err


def host_of(api_client: client.ApiClient) -> str:
    return str(api_client.configuration.host)


@dataclass
class RateLimiter:
    """client-go's token bucket: `burst` requests at once, then `qps` per second.

    As client-go: a QPS of 0 means 5 and a burst of 0 means 10; a negative QPS turns the limit off.
    """

    qps: float = DEFAULT_KUBE_API_QPS
    burst: int = DEFAULT_KUBE_API_BURST
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    _tokens: float = field(default=0.0, init=False)
    _last: float = field(default=0.0, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def __post_init__(self) -> None:
        self.qps = self.qps or DEFAULT_KUBE_API_QPS
        self.burst = self.burst or DEFAULT_KUBE_API_BURST
        self._tokens = float(self.burst)
        self._last = self.clock()

    def acquire(self) -> None:
        """Wait until one more request is allowed."""
        if self.qps < 0:
            return
        with self._lock:
            now = self.clock()
            self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
            self._last = now
            if self._tokens >= 1:
                self._tokens -= 1
                return
            wait = (1 - self._tokens) / self.qps
            self._tokens = 0.0
            self._last = now + wait  # the token that refills while we sleep is this request's
        self.sleep(wait)


_ERRNO = re.compile(r"\[Errno -?\d+\] [^'\")]+")


def describe_failure(err: BaseException) -> str:
    """One line saying why a request failed: the API server's status and message, or the network error
    (`[Errno 111] Connection refused`) without urllib3's wrapping of it."""
    if isinstance(err, ApiException):
        message = status_message(err)
        text = f"{err.status} {err.reason}".strip()
        return f"{text}: {message}" if message else text
    text = str(err)
    found = _ERRNO.search(text)
    if found:
        return found.group(0).strip()
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def status_message(err: ApiException) -> str:
    """The `message` of the Status body the API server sent, if it sent one."""
    try:
        body = json.loads(err.body or "")
    except (TypeError, ValueError):
        return ""
    return str(body.get("message", "")) if isinstance(body, dict) else ""


def status_details(err: ApiException) -> dict[str, object]:
    """The `details` of the Status body (name, group, kind of the object concerned), or {}."""
    try:
        body = json.loads(err.body or "")
    except (TypeError, ValueError):
        return {}
    details = body.get("details") if isinstance(body, dict) else None
    return details if isinstance(details, dict) else {}

"""Failed API server calls, by kind, from the official `kubernetes` client the claim reader and the slice
publisher use today: its REST layer is wrapped once, so every call either of them makes is seen, with no
change to them. A client that replaces this one reports through `DriverEvents.api_error` itself.

Kinds (`events.API_ERROR_KINDS`): "connection" (refused, reset, unreachable), "timeout", "server_error"
(5xx), "too_many_requests" (429), "other" (anything else that failed below HTTP). 4xx answers other than
429 are the API's verdicts (a claim not found, a conflict), not failures of the API server, and are left to
the callers.
"""

from __future__ import annotations

from typing import Any

import urllib3

from kubegpu.dra.events import DriverEvents


def status_kind(status: int) -> str | None:
    if status == 429:
        return "too_many_requests"
    if 500 <= status <= 599:
        return "server_error"
    return None


def error_kind(err: BaseException) -> str:
    if isinstance(err, urllib3.exceptions.MaxRetryError) and err.reason is not None:
        err = err.reason
    # NewConnectionError is a ConnectTimeoutError to urllib3 (for compatibility): asked first.
    if isinstance(err, urllib3.exceptions.NewConnectionError | urllib3.exceptions.ProtocolError):
        return "connection"
    if isinstance(err, urllib3.exceptions.TimeoutError | TimeoutError):
        return "timeout"
    if isinstance(err, OSError):
        return "connection"
    return "other"


def count_api_errors(api_client: Any, events: DriverEvents) -> None:
    """Report every failed call `api_client` (a kubernetes.client.ApiClient) makes from now on."""
    rest = api_client.rest_client
    request = rest.request

    def counted(*args: Any, **kwargs: Any) -> Any:
        try:
            response = request(*args, **kwargs)
        except Exception as err:
            events.api_error(error_kind(err))
            raise
        kind = status_kind(response.status)
        if kind is not None:
            events.api_error(kind)
        return response

    rest.request = counted

"""The light API client's errors: each says in one line what failed, and has a `kind` for logs and metrics.

The kinds are the metrics' (`events.API_ERROR_KINDS`), so one name means one thing everywhere:
- `ApiUnreachable` "connection": refused, reset, DNS, TLS;
- `ApiTimeout` "timeout": no connection or no answer in time;
- `ApiServerError` "server_error" (5xx) and `ApiThrottled` "too_many_requests" (429), with the server's
  Status and Retry-After;
- `ApiBadResponse` "other": a 2xx whose body is not JSON.
`ApiStatusError` "status" is any other error status (404, 409, 403...): the API's answer (a claim not found,
a conflict), which the caller judges; it is not a failure of the API server and is not counted as one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


class ApiError(Exception):
    """A failed API call; str() says what failed in one line."""

    kind = "other"  # for logs and metrics, see above


class ApiUnreachable(ApiError):
    kind = "connection"


class ApiTimeout(ApiError):
    kind = "timeout"


class ApiBadResponse(ApiError):
    kind = "other"


class ApiStatusError(ApiError):
    """The server answered with an error status; `message`, `reason` and `details` from its Status body."""

    kind = "status"

    def __init__(
        self, status: int, reason: str, message: str, details: Mapping[str, Any], retry_after: float | None
    ) -> None:
        text = f"the API server answered {status} {reason}" + (f": {message}" if message else "")
        if retry_after is not None:
            text += f" (retry after {retry_after:g} s)"
        super().__init__(text)
        self.status = status
        self.reason = reason
        self.message = message
        self.details = details
        self.retry_after = retry_after

    def names(self, kind: str, name: str) -> bool:
        """Whether the Status is about this object (a 404 for a missing object names it; a 404 for a path
        the server does not serve, such as a version it dropped, does not)."""
        return self.details.get("kind") == kind and self.details.get("name") == name


class ApiThrottled(ApiStatusError):
    kind = "too_many_requests"


class ApiServerError(ApiStatusError):
    kind = "server_error"


def status_error(status: int, reason: str, body: bytes, retry_after: float | None) -> ApiStatusError:
    try:
        parsed = json.loads(body) if body else {}
    except ValueError:
        parsed = {}
    if not isinstance(parsed, dict):
        parsed = {}
    message = str(parsed.get("message") or "")
    if not message and body and not parsed:
        message = body[:200].decode(errors="replace").strip().splitlines()[0] if body.strip() else ""
    details = parsed.get("details") if isinstance(parsed.get("details"), dict) else {}
    cls = ApiThrottled if status == 429 else ApiServerError if status >= 500 else ApiStatusError
    return cls(status, reason or str(parsed.get("reason") or ""), message, details or {}, retry_after)


def failure_kind(err: ApiError) -> str | None:
    """The metrics' kind of a failed call, or None for an answer that is the API's verdict (404, 409...)."""
    return None if type(err) is ApiStatusError else err.kind

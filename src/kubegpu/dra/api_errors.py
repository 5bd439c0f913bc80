"""The light API client's errors: each says in one line what failed, and has a `kind` for logs and metrics.

- `ApiUnreachable`: refused, reset, DNS, TLS; `ApiTimeout`: no connection or no answer in time;
- `ApiBadResponse`: a 2xx whose body is not JSON;
- `ApiStatusError`: an error status with the server's Status (`message`, `reason`, `details`) and its
  Retry-After; `ApiThrottled` for 429, `ApiServerError` for 5xx.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


class ApiError(Exception):
    """A failed API call; str() says what failed in one line."""

    kind = "error"  # for logs and metrics: unreachable, timeout, bad-response, status, throttled, server


class ApiUnreachable(ApiError):
    kind = "unreachable"


class ApiTimeout(ApiError):
    kind = "timeout"


class ApiBadResponse(ApiError):
    kind = "bad-response"


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
    kind = "throttled"


class ApiServerError(ApiStatusError):
    kind = "server"


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

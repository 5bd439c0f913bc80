"""API errors as the kube-apiserver writes them: a `Status` body with code, reason, message and details.

The texts follow apimachinery's `k8s.io/apimachinery/pkg/api/errors` (NewNotFound, NewAlreadyExists,
NewConflict, NewInvalid, ...) and `k8s.io/apimachinery/pkg/util/validation/field` (the per-field error
strings), so a client, and a test, sees the words a real cluster would print.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


def go_quote(value: str) -> str:
    """Go's %q for a string (JSON escaping differs only for a few control characters)."""
    return json.dumps(value, ensure_ascii=False)


def render_value(value: Any) -> str:
    """A field error's value the way `field.Error` prints it: strings quoted, numbers and bools bare,
    anything else as JSON."""
    if isinstance(value, str):
        return go_quote(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


# field.ErrorType -> (the cause's reason, the text after the field path)
_FIELD_ERROR_WORDS = {
    "Required": ("FieldValueRequired", "Required value"),
    "Invalid": ("FieldValueInvalid", "Invalid value"),
    "Duplicate": ("FieldValueDuplicate", "Duplicate value"),
    "NotSupported": ("FieldValueNotSupported", "Unsupported value"),
    "Forbidden": ("FieldValueForbidden", "Forbidden"),
    "TooMany": ("FieldValueTooMany", "Too many"),
    "TooLong": ("FieldValueTooLong", "Too long"),
}


@dataclass(frozen=True, slots=True)
class FieldError:
    """One validation failure on one field (apimachinery's `field.Error`)."""

    type: str  # a key of _FIELD_ERROR_WORDS
    field: str  # e.g. spec.devices[0].name
    detail: str = ""
    value: Any = None
    has_value: bool = False  # Required/Forbidden/TooLong print no value

    @classmethod
    def required(cls, path: str, detail: str = "") -> FieldError:
        return cls("Required", path, detail)

    @classmethod
    def invalid(cls, path: str, value: Any, detail: str) -> FieldError:
        return cls("Invalid", path, detail, value, True)

    @classmethod
    def duplicate(cls, path: str, value: Any) -> FieldError:
        return cls("Duplicate", path, "", value, True)

    @classmethod
    def not_supported(cls, path: str, value: Any, supported: Sequence[str]) -> FieldError:
        return cls(
            "NotSupported", path, "supported values: " + ", ".join(map(go_quote, supported)), value, True
        )

    @classmethod
    def forbidden(cls, path: str, detail: str) -> FieldError:
        return cls("Forbidden", path, detail)

    @classmethod
    def too_many(cls, path: str, actual: int, maximum: int) -> FieldError:
        return cls("TooMany", path, f"must have at most {maximum} items", actual, True)

    @classmethod
    def too_long(cls, path: str, maximum: int) -> FieldError:
        return cls("TooLong", path, f"may not be more than {maximum} bytes")

    def body(self) -> str:
        """The error without its field: what goes into a cause's `message`."""
        words = _FIELD_ERROR_WORDS[self.type][1]
        text = words + (f": {render_value(self.value)}" if self.has_value else "")
        return text + (f": {self.detail}" if self.detail else "")

    def __str__(self) -> str:
        return f"{self.field}: {self.body()}"

    def cause(self) -> dict[str, str]:
        return {"reason": _FIELD_ERROR_WORDS[self.type][0], "message": self.body(), "field": self.field}


@dataclass
class ApiError(Exception):
    """A failed request: `status()` is the body the server sends with HTTP `code`."""

    code: int
    reason: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        }
        if self.details:
            body["details"] = self.details
        body["code"] = self.code
        return body


def _details(qualified: tuple[str, str], name: str, **extra: Any) -> dict[str, Any]:
    group, resource = qualified
    details: dict[str, Any] = {"name": name} if name else {}
    if group:
        details["group"] = group
    details["kind"] = resource
    details.update(extra)
    return details


def _qualified(qualified: tuple[str, str]) -> str:
    group, resource = qualified
    return f"{resource}.{group}" if group else resource


def not_found(qualified: tuple[str, str], name: str) -> ApiError:
    """`qualified` is (group, plural), e.g. ("resource.k8s.io", "resourceslices")."""
    return ApiError(
        404, "NotFound", f"{_qualified(qualified)} {go_quote(name)} not found", _details(qualified, name)
    )


def already_exists(qualified: tuple[str, str], name: str) -> ApiError:
    return ApiError(
        409,
        "AlreadyExists",
        f"{_qualified(qualified)} {go_quote(name)} already exists",
        _details(qualified, name),
    )


def conflict(qualified: tuple[str, str], name: str, why: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f"Operation cannot be fulfilled on {_qualified(qualified)} {go_quote(name)}: {why}",
        _details(qualified, name),
    )


STALE_OBJECT = "the object has been modified; please apply your changes to the latest version and try again"


def invalid(group: str, kind: str, name: str, errors: Sequence[FieldError]) -> ApiError:
    """422 with every field error; the message lists them like apimachinery's NewInvalid."""
    qualified_kind = f"{kind}.{group}" if group else kind
    texts = [str(e) for e in errors]
    listed = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    details: dict[str, Any] = {"name": name}
    if group:
        details["group"] = group
    details["kind"] = kind
    details["causes"] = [e.cause() for e in errors]
    return ApiError(422, "Invalid", f"{qualified_kind} {go_quote(name)} is invalid: {listed}", details)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def path_not_found() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


def method_not_allowed() -> ApiError:
    return ApiError(
        405, "MethodNotAllowed", "the server does not allow this method on the requested resource", {}
    )


def unsupported_media_type(content_type: str, accepted: Sequence[str]) -> ApiError:
    return ApiError(
        415,
        "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media types include: "
        + ", ".join(accepted),
        {},
    )


def gone(message: str) -> ApiError:
    """What a watch from a compacted resourceVersion gets (as an ERROR event, not an HTTP status)."""
    return ApiError(410, "Expired", message)


def injected(code: int) -> ApiError:
    """What a server in trouble answers (a fault a test injects): 500 InternalError, 429 TooManyRequests,
    503 ServiceUnavailable, with the real reasons and texts."""
    known = {
        429: (
            "TooManyRequests",
            "the server has received too many requests and has asked us to try again later",
        ),
        500: (
            "InternalError",
            'an error on the server ("injected") has prevented the request from succeeding',
        ),
        503: ("ServiceUnavailable", "the server is currently unable to handle the request"),
    }
    reason, message = known.get(code, ("InternalError", f"injected HTTP {code}"))
    return ApiError(code, reason, message, {"retryAfterSeconds": 1} if code == 429 else {})

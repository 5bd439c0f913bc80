"""Errors with the kubelet's texts, so tests can compare what a user would see on a real node."""

from __future__ import annotations

import json

import grpc

# grpc-go's codes.Code.String(), which is what appears in "rpc error: code = ... desc = ...".
_GO_CODE_NAMES = {
    grpc.StatusCode.OK: "OK",
    grpc.StatusCode.CANCELLED: "Canceled",
    grpc.StatusCode.UNKNOWN: "Unknown",
    grpc.StatusCode.INVALID_ARGUMENT: "InvalidArgument",
    grpc.StatusCode.DEADLINE_EXCEEDED: "DeadlineExceeded",
    grpc.StatusCode.NOT_FOUND: "NotFound",
    grpc.StatusCode.ALREADY_EXISTS: "AlreadyExists",
    grpc.StatusCode.PERMISSION_DENIED: "PermissionDenied",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "ResourceExhausted",
    grpc.StatusCode.FAILED_PRECONDITION: "FailedPrecondition",
    grpc.StatusCode.ABORTED: "Aborted",
    grpc.StatusCode.OUT_OF_RANGE: "OutOfRange",
    grpc.StatusCode.UNIMPLEMENTED: "Unimplemented",
    grpc.StatusCode.INTERNAL: "Internal",
    grpc.StatusCode.UNAVAILABLE: "Unavailable",
    grpc.StatusCode.DATA_LOSS: "DataLoss",
    grpc.StatusCode.UNAUTHENTICATED: "Unauthenticated",
}


def go_rpc_error(err: grpc.aio.AioRpcError) -> str:
    """Render a failed call the way grpc-go's status error prints it."""
    code = err.code()
    # A Go client whose context expires reports the context's error, not grpc-core's "Deadline Exceeded".
    desc = "context deadline exceeded" if code == grpc.StatusCode.DEADLINE_EXCEEDED else err.details() or ""
    return f"rpc error: code = {_GO_CODE_NAMES.get(code, code.name)} desc = {desc}"


def go_quote(value: str) -> str:
    """Go's %q for a string (close enough: JSON escaping differs only for control characters)."""
    return json.dumps(value, ensure_ascii=False)


class DeviceManagerError(Exception):
    """An error the kubelet's device manager returns internally; str() is its Go error text."""


class PodError(Exception):
    """A pod-level failure as the kubelet reports it: `reason` (e.g. UnexpectedAdmissionError) + message."""

    def __init__(self, reason: str, message: str, cause: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.cause = cause  # the device manager's own error text, without the kubelet's wrapping


class AdmissionError(PodError):
    """The pod was rejected at admission; every device it got so far was released."""

    @classmethod
    def unexpected(cls, cause: DeviceManagerError) -> AdmissionError:
        # lifecycle admission.GetPodAdmitResult wraps device manager errors like this.
        return cls(
            "UnexpectedAdmissionError", f"Allocate failed due to {cause}, which is unexpected", str(cause)
        )


class ContainerStartError(PodError):
    """The container could not start (e.g. PreStartContainer failed). The pod keeps its devices, as on a
    real node, where the kubelet retries the start with back-off."""


class PrepareError(PodError):
    """The pod's claims could not be prepared (FailedPrepareDynamicResources). The pod stays admitted and
    its containers unstarted; the kubelet tries again on its next sync."""

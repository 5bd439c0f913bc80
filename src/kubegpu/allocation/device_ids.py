"""Device IDs as the kubelet sees them: a GPU/MIG UUID, or `<uuid>::<replica>` for a shared replica.

The one home of the replica-ID format, with the semantics of NVIDIA's `AnnotatedID` (k8s-device-plugin
internal/rm/devices.go): built as `<id>::<replica>`; split at the first `::`; an ID without `::` is the
device itself (replica 0); a replica part that is not a decimal integer reads as 0, as Go's ignored
`strconv.ParseInt` error gives, and one out of int64 range reads as the nearest bound, as ParseInt returns.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

SEPARATOR = "::"

_GO_DECIMAL = re.compile(r"[+-]?[0-9]+")  # what strconv.ParseInt(s, 10, 0) accepts
_INT64_MAX = 2**63 - 1
_INT64_MIN = -(2**63)


def _go_parse_int(text: str) -> int:
    if _GO_DECIMAL.fullmatch(text) is None:
        return 0
    return max(_INT64_MIN, min(_INT64_MAX, int(text)))


class AnnotatedId(str):
    """A device ID that may carry a replica number (NVIDIA's `AnnotatedID`); it is the kubelet's string."""

    __slots__ = ()

    @classmethod
    def of(cls, device_id: str, replica: int) -> AnnotatedId:
        """The ID of replica `replica` of device `device_id` (NVIDIA's `NewAnnotatedID`)."""
        return cls(replica_id(device_id, replica))

    @property
    def has_annotations(self) -> bool:
        """Whether this is a replica ID (it contains `::`)."""
        return SEPARATOR in self

    def parts(self) -> tuple[str, int]:
        """The backing device ID and the replica number (NVIDIA's `Split`: replica 0 when there is none)."""
        device_id, sep, replica = self.partition(SEPARATOR)
        return str(device_id), _go_parse_int(replica) if sep else 0

    @property
    def backing_id(self) -> str:
        """The GPU or MIG UUID behind this ID: the replica suffix stripped (NVIDIA's `GetID`)."""
        return backing_id(self)


# Plain-string forms of the same rules, for hot paths (one call per replica or candidate) that need no object.


def replica_id(device_id: str, replica: int) -> str:
    """`AnnotatedId.of` as a plain string."""
    return f"{device_id}{SEPARATOR}{replica}"


def backing_id(device_id: str) -> str:
    """The GPU or MIG UUID behind a kubelet device ID (see `AnnotatedId.backing_id`), a plain string."""
    return str(device_id.partition(SEPARATOR)[0])  # without `::`, partition hands back its argument


def any_annotated(device_ids: Iterable[str]) -> bool:
    """Whether any of the IDs is a replica ID (NVIDIA's `AnnotatedIDs.AnyHasAnnotations`)."""
    return any(SEPARATOR in d for d in device_ids)

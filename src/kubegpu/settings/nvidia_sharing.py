"""The `resources`, `sharing` and `imex` blocks of NVIDIA's v1 config file, with NVIDIA's validation texts.

Kept apart from `config.py` (flags and precedence) because these blocks are data about resources, and the
resource layer is what consumes them. Every error text a user can hit is NVIDIA's (spec §1.2).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from kubegpu.settings.nvidia_decode import go_json
from kubegpu.settings.schema import checked, nested

RESOURCE_PREFIX = "nvidia.com"
MAX_RESOURCE_NAME = 63
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"^{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*$")
_DNS1123_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)


def resource_name(raw: str) -> str:
    """NVIDIA's ResourceName rules: `gpu` means `nvidia.com/gpu`; length and DNS-1123 checks."""
    name = raw if raw.startswith(f"{RESOURCE_PREFIX}/") else f"{RESOURCE_PREFIX}/{raw}"
    if len(name) > MAX_RESOURCE_NAME:
        raise ValueError(
            f"fully-qualified resource name must be {MAX_RESOURCE_NAME} characters or less: {name}"
        )
    short = name.split("/", 1)[1]
    problems = []
    if len(short) > 253:
        problems.append("must be no more than 253 characters")
    if not _DNS1123_SUBDOMAIN.match(short):
        problems.append(_DNS1123_MESSAGE)
    if problems:
        raise ValueError(f"incorrect format for resource name '{name}': [{' '.join(problems)}]")
    return name


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return len(text) == 36


def valid_device_reference(text: str) -> bool:
    """A GPU index ("0"), MIG index ("0:1"), GPU UUID, MIG UUID or legacy MIG-GPU-<uuid>/<gi>/<ci>."""
    if re.fullmatch(r"\d+", text) or re.fullmatch(r"\d+:\d+", text):
        return True
    if text.startswith("GPU-"):
        return _is_uuid(text[4:])
    if text.startswith("MIG-GPU-"):
        parts = text[8:].split("/")
        return len(parts) == 3 and _is_uuid(parts[0]) and parts[1].isdigit() and parts[2].isdigit()
    if text.startswith("MIG-"):
        return _is_uuid(text[4:])
    return False


@dataclass(frozen=True)
class ReplicatedDevices:
    """`devices:` of a shared resource: "all", a count, or a list of indices/UUIDs."""

    all: bool = False
    count: int | None = None
    ids: tuple[str, ...] = ()

    @classmethod
    def parse(cls, raw: Any) -> ReplicatedDevices:
        """NVIDIA's ReplicatedDevices.UnmarshalJSON on the JSON value: "all", a count, or device references.

        Tried in NVIDIA's order: a string (JSON null reads as ""), an integer, a list whose items are
        integers >= 0 (null reads as 0) or strings naming a device.
        """
        if isinstance(raw, ReplicatedDevices):
            return raw
        if raw is None or isinstance(raw, str):
            text = raw or ""
            if text != "all":
                raise ValueError(f"devices set as '{text}' but the only valid string input is 'all'")
            return cls(all=True)
        if isinstance(raw, int) and not isinstance(raw, bool) and -(1 << 63) <= raw < (1 << 63):
            if raw <= 0:
                raise ValueError(f"devices set as '{raw}' but a count of devices must be > 0")
            return cls(count=raw)
        if isinstance(raw, list):
            return cls(ids=tuple(_device_reference(item) for item in raw))
        raise ValueError(f"unrecognized type for devices spec: {go_json(raw)}")

    def describe(self) -> Any:
        return "all" if self.all else self.count if self.count is not None else list(self.ids)


def _device_reference(item: Any) -> str:
    if item is None or (isinstance(item, int) and not isinstance(item, bool) and 0 <= item < (1 << 64)):
        index = item or 0
        return str(index - (1 << 64) if index >= (1 << 63) else index)  # NVIDIA's strconv.Itoa(int(uint))
    text = item if isinstance(item, str) else ""  # NVIDIA prints the string it failed to read: empty
    if text and valid_device_reference(text):
        return text
    raise ValueError(f"unsupported type for device in devices list: {text}, string")


@dataclass
class ReplicatedResource:
    name: str | None = None
    rename: str | None = None
    devices: ReplicatedDevices = field(
        default=ReplicatedDevices(all=True), metadata=checked(ReplicatedDevices.parse)
    )
    replicas: int | None = None

    def __post_init__(self) -> None:
        # NVIDIA reads a present key even when empty or null: `name: ""` is a bad name, not a missing one.
        if self.name is None:
            raise ValueError("no resource name specified")
        self.name = resource_name(self.name)
        if self.rename is not None:
            self.rename = resource_name(self.rename)
        if self.replicas is None:
            raise ValueError("no replicas specified")
        if self.replicas < 2:
            raise ValueError("number of replicas must be >= 2")


@dataclass
class SharingStrategy:
    """`sharing.timeSlicing` or `sharing.mps`."""

    renameByDefault: bool = False
    failRequestsGreaterThanOne: bool | None = None
    resources: list[ReplicatedResource] | None = field(
        default=None, metadata=nested(ReplicatedResource, many=True)
    )

    def __post_init__(self) -> None:
        if not self.resources:
            raise ValueError("no resources specified")
        if self.renameByDefault:
            for r in self.resources:
                if not r.rename:
                    r.rename = f"{r.name}.shared"

    @property
    def active(self) -> bool:
        return any((r.replicas or 0) > 1 for r in self.resources or ())


@dataclass
class Sharing:
    timeSlicing: SharingStrategy | None = field(default=None, metadata=nested(SharingStrategy))
    mps: SharingStrategy | None = field(default=None, metadata=nested(SharingStrategy))

    def strategy(self) -> tuple[str, SharingStrategy | None]:
        """NVIDIA's resolution: MPS if it has replicas, else time-slicing if it has, else none."""
        if self.mps is not None and self.mps.active:
            return "mps", self.mps
        if self.timeSlicing is not None and self.timeSlicing.active:
            return "time-slicing", self.timeSlicing
        return "none", None


@dataclass
class ResourcePattern:
    pattern: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if self.pattern is None:
            raise ValueError("resources must have a 'pattern' field set")
        if self.name is None:
            raise ValueError("resources must have a 'name' field set")
        self.name = resource_name(self.name)


@dataclass
class Resources:
    gpus: list[ResourcePattern] = field(default_factory=list, metadata=nested(ResourcePattern, many=True))
    mig: list[ResourcePattern] = field(default_factory=list, metadata=nested(ResourcePattern, many=True))


def _imex_channel_ids(ids: list[int] | None) -> list[int] | None:
    # Checked here so a bad file fails at parse time; the startup text is NVIDIA's.
    if ids not in (None, [], [0]):
        raise ValueError(
            "invalid IMEX channel IDs: invalid IMEX config: channelIDs must be [] or [0]; "
            f"found [{' '.join(str(i) for i in ids or [])}]"
        )
    return ids


@dataclass
class Imex:
    channelIDs: list[int] | None = field(default=None, metadata=checked(_imex_channel_ids))
    required: bool | None = None

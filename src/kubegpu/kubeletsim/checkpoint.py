"""The device manager's checkpoint file, `<plugin dir>/kubelet_internal_checkpoint` (spec §9).

The JSON shape is the kubelet's. The checksum is not: the kubelet's is FNV-1a over a Go-specific deep
print (`hashutil.DeepHashObject`) of the data that Python cannot reproduce faithfully, so we write 0 and
never verify it when reading. A real kubelet would reject our file as corrupt; only the simulator reads it.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubegpu.common.files import MIB, FileProblem, read_text_file, write_atomic

CHECKPOINT_LIMIT = 64 * MIB  # the kubelet's checkpoint is KBs; a larger file is not one

CHECKPOINT_FILE = "kubelet_internal_checkpoint"
NO_NUMA_NODE = -1  # NUMA key under which devices without topology are recorded


@dataclass(frozen=True, slots=True)
class PodDeviceEntry:
    pod_uid: str
    container_name: str
    resource_name: str
    device_ids: Mapping[int, tuple[str, ...]]  # NUMA node -> device ids
    alloc_resp: bytes  # serialized ContainerAllocateResponse


@dataclass(frozen=True, slots=True)
class Checkpoint:
    pod_device_entries: tuple[PodDeviceEntry, ...] = ()
    registered_devices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # healthy ids


def to_json(checkpoint: Checkpoint) -> str:
    entries = [
        {
            "PodUID": e.pod_uid,
            "ContainerName": e.container_name,
            "ResourceName": e.resource_name,
            "DeviceIDs": {str(numa): list(ids) for numa, ids in sorted(e.device_ids.items())},
            "AllocResp": base64.b64encode(e.alloc_resp).decode(),
        }
        for e in checkpoint.pod_device_entries
    ]
    data = {
        # Go marshals the kubelet's nil slice of entries as null.
        "Data": {
            "PodDeviceEntries": entries or None,
            "RegisteredDevices": {r: list(ids) for r, ids in sorted(checkpoint.registered_devices.items())},
        },
        "Checksum": 0,
    }
    return json.dumps(data, separators=(",", ":"))


def from_json(text: str) -> Checkpoint:
    try:
        data: dict[str, Any] = json.loads(text)["Data"]
        entries = tuple(
            PodDeviceEntry(
                pod_uid=e["PodUID"],
                container_name=e["ContainerName"],
                resource_name=e["ResourceName"],
                device_ids={int(numa): tuple(ids) for numa, ids in (e["DeviceIDs"] or {}).items()},
                alloc_resp=base64.b64decode(e["AllocResp"] or ""),
            )
            for e in data.get("PodDeviceEntries") or ()
        )
        registered = {r: tuple(ids or ()) for r, ids in (data.get("RegisteredDevices") or {}).items()}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"corrupt device manager checkpoint: {exc}") from exc
    return Checkpoint(entries, registered)


def write_checkpoint(directory: Path, checkpoint: Checkpoint) -> None:
    """Write atomically (temp file + rename), as the kubelet's checkpoint manager does.

    Synchronous on purpose: the file is a few KiB and writing it in order with the state change it records
    matters more than the microseconds it holds the loop.
    """
    write_atomic(directory / CHECKPOINT_FILE, to_json(checkpoint).encode(), mode=0o600, durable=False)


def read_checkpoint(directory: Path) -> Checkpoint | None:
    """The checkpoint in `directory`, None when there is none. ValueError when it cannot be parsed."""
    path = directory / CHECKPOINT_FILE
    if not path.exists():
        return None
    try:
        text = read_text_file(path, limit=CHECKPOINT_LIMIT, what="checkpoint")
    except FileProblem as err:
        raise ValueError(str(err)) from err
    return from_json(text)

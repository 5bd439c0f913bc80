"""Which pod (by UID) holds which device, from the kubelet's device-manager checkpoint.

PodResources names each holder by namespace, pod and container but not by pod UID, while a process's
cgroup names only the pod UID (`node/proc_cgroup.py`). The kubelet's `kubelet_internal_checkpoint` in the
device-plugin directory (which the plugin mounts anyway) records both a pod's UID and its devices, so the
device IDs join the two. Only the fields read here are relied on; their shape has been stable since the
device manager's v1 checkpoint (Kubernetes 1.20). An unreadable or odd file gives no mapping, never an
error: attribution then falls back to what PodResources alone can say.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from kubegpu.common.files import MIB, FileProblem, read_text_file

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "kubelet_internal_checkpoint"
CHECKPOINT_LIMIT = 64 * MIB


class PodContainer(NamedTuple):
    pod_uid: str
    container: str


def read_device_pods(plugin_dir: Path) -> Mapping[tuple[str, str], PodContainer]:
    """(resource, device ID) -> the pod UID and container name holding it; empty when unknown."""
    path = plugin_dir / CHECKPOINT_FILE
    try:
        data = json.loads(read_text_file(path, limit=CHECKPOINT_LIMIT, what="kubelet checkpoint"))
        entries = data["Data"]["PodDeviceEntries"] or ()
        out: dict[tuple[str, str], PodContainer] = {}
        for entry in entries:
            holder = PodContainer(str(entry["PodUID"]), str(entry["ContainerName"]))
            ids = entry["DeviceIDs"] or {}
            # v1 checkpoints key the IDs by NUMA node; the pre-1.20 format was a plain list.
            for group in ids.values() if isinstance(ids, dict) else (ids,):
                for device_id in group or ():
                    out[(str(entry["ResourceName"]), str(device_id))] = holder
        return out
    except (FileProblem, ValueError, KeyError, TypeError, AttributeError) as err:
        log.debug("cannot read pod UIDs from %s: %s", path, err)
        return {}

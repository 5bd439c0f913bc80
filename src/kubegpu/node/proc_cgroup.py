"""Which pod and container a process runs in, from its /proc/<pid>/cgroup.

The kubelet puts each container in a cgroup whose path names the pod UID and the container ID, in one of
these layouts (cgroup v1 or v2, cgroupfs or systemd driver; containerd, CRI-O or Docker):

    /kubepods/burstable/pod<uid>/<container id>
    /kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid_>.slice/cri-containerd-<id>.scope
    /kubepods.slice/kubepods-pod<uid with _>.slice/crio-<id>.scope

Reading another container's cgroup file needs the host's PID namespace or the host's /proc mounted into
the plugin (`KUBEGPU_PROC_ROOT`); when the file cannot be read the process is unattributed, not guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from kubegpu.common.files import FileProblem, read_text_file

CGROUP_LIMIT = 64 * 1024  # a process's cgroup file is a few lines
_POD = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice)?$"
)
_CONTAINER = re.compile(r"^(?:[a-z-]+-)?([0-9a-f]{64})(?:\.scope)?$")


@dataclass(frozen=True, slots=True)
class ContainerRef:
    pod_uid: str  # with dashes, as the API server writes it
    container_id: str  # the runtime's 64-hex-digit ID; "" when the path names only the pod


def parse_cgroup(text: str) -> ContainerRef | None:
    """The pod and container a /proc/<pid>/cgroup file names; None for a process outside any pod."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        parts = [p for p in path.split("/") if p]
        for i, part in enumerate(parts):
            pod = _POD.search(part)
            if pod is None:
                continue
            container = ""
            if i + 1 < len(parts) and (match := _CONTAINER.match(parts[i + 1])):
                container = match[1]
            return ContainerRef(pod[1].replace("_", "-"), container)
    return None


def read_container(proc_root: Path, pid: int) -> ContainerRef | None:
    """The pod and container of process `pid` as `proc_root` shows it; None when unknown or unreadable."""
    try:
        text = read_text_file(proc_root / str(pid) / "cgroup", limit=CGROUP_LIMIT, what="cgroup file")
    except FileProblem:
        return None
    return parse_cgroup(text)

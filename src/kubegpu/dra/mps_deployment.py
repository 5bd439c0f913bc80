"""An MPS control daemon as NVIDIA's DRA driver runs it (MPSSupport): its ID, host directories, Deployment.

Pure data, no I/O (`mps_daemon` acts on it). NVIDIA's names and shapes (`sharing.go`,
`templates/mps-control-daemon.tmpl.yaml`):

- ID `<claim UID>-<first 5 hex digits of sha256(comma-joined sorted device UUIDs)>`, one per claim and
  config (the devices of a claim that share one MPS config);
- beyond NVIDIA, with ConsumableShares (claims sharing a device by memory): one daemon per device, shared by
  every claim that holds a share of it, ID `<gpu|mig>-<first 12 hex digits of sha256(device UUID)>`
  (`shared_daemon_id`): a GPU in EXCLUSIVE_PROCESS serves one MPS server, so per-claim daemons cannot
  share it. The ID names the device, not a claim, so it is stable and any sharer finds it;
- host directories `<plugin dir>/mps/<id>/{pipe,shm,log}`;
- Deployment `mps-control-daemon-<id>` in `--namespace`, label `app=<name>`, 1 replica, pinned to the node,
  hostPID, privileged, image `--image-name`; its container starts `nvidia-cuda-mps-control -d` (`-M` for
  multiUser), sets `set_default_active_thread_percentage` and one `set_default_device_pinned_mem_limit` per
  device, writes `startup.log` (its startup probe) and follows the control log. Env: `CUDA_VISIBLE_DEVICES`
  and `FEATURE_GATES`. Mounts: pipe dir at `/driver-root/tmp/nvidia-mps`, log dir at
  `/driver-root/var/log/nvidia-mps`, shm at `/driver-root/dev/shm`, the driver root at `/driver-root`. When
  the driver root has no shell the container cannot chroot into it: shm goes to `/dev/shm` and the script
  runs in the image with the driver root's tools first on PATH.
- What a workload container gets (CDI edits): `CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps`, the pipe dir on
  `/tmp/nvidia-mps`, the shm dir on `/dev/shm` (`rw,nosuid,nodev,bind`), and nothing else; `extra_env` is
  for per-client limits (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`, `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`) a caller
  may add, which NVIDIA never sets.
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubegpu.dra.gpuconfig import MIB, Sharing

NAME_PREFIX = "mps-control-daemon-"
CONTAINER = "mps-control-daemon"
DRIVER_ROOT_MOUNT = "/driver-root"
CLIENT_PIPE_DIR = "/tmp/nvidia-mps"  # also the daemon's default, inside the driver root
DAEMON_LOG_DIR = "/var/log/nvidia-mps"
STARTUP_LOG = "startup.log"
BIND_OPTIONS = ("rw", "nosuid", "nodev", "bind")


def daemon_id(claim_uid: str, uuids: Sequence[str]) -> str:
    digest = hashlib.sha256(",".join(sorted(uuids)).encode()).hexdigest()
    return f"{claim_uid}-{digest[:5]}"


def shared_daemon_id(kind: str, uuid: str) -> str:
    """The ID of the daemon every claim holding a share of the device `uuid` uses (`kind`: gpu or mig)."""
    return f"{kind}-{hashlib.sha256(uuid.encode()).hexdigest()[:12]}"


def deployment_name(daemon: str) -> str:
    return NAME_PREFIX + daemon


@dataclass(frozen=True, slots=True)
class DaemonDirs:
    """`<plugin dir>/mps/<id>` and its three directories, as the host (and the driver) sees them."""

    root: Path

    @classmethod
    def of(cls, plugin_dir: Path, daemon: str) -> DaemonDirs:
        return cls(plugin_dir / "mps" / daemon)

    @property
    def pipe(self) -> Path:
        return self.root / "pipe"

    @property
    def shm(self) -> Path:
        return self.root / "shm"

    @property
    def log(self) -> Path:
        return self.root / "log"


@dataclass(frozen=True, slots=True)
class DaemonSpec:
    """One control daemon: the claim's devices that share one MPS config."""

    claim_uid: str
    devices: tuple[str, ...]  # the published device names of the group
    uuids: tuple[str, ...]  # every device of the group (GPU or MIG UUIDs)
    full_gpus: tuple[str, ...]  # the full GPUs among them: their compute mode goes EXCLUSIVE_PROCESS
    config: Sharing
    # The daemon's ID when not NVIDIA's per-claim one: a device's daemon shared by the claims holding a share
    # of it (`shared_daemon_id`); empty: `daemon_id(claim_uid, uuids)`.
    name: str = ""

    @property
    def id(self) -> str:
        return self.name or daemon_id(self.claim_uid, self.uuids)

    def pinned_limits(self) -> dict[str, str]:
        """`<uuid>: <N>M` per device with a limit (a per-device index is into the sorted UUIDs)."""
        return {u: f"{b // MIB}M" for u, b in self.config.pinned_limits(sorted(self.uuids)).items()}


@dataclass(frozen=True, slots=True)
class DeploymentOptions:
    """NVIDIA's flags that shape the Deployment, and where it runs."""

    namespace: str
    image: str
    node_name: str
    driver_root: str  # the host's driver root (`--nvidia-driver-root`): the daemon's hostPath
    feature_gates: str  # FEATURE_GATES as the driver runs with it
    pull_secrets: tuple[str, ...] = ()
    pull_policy: str = ""
    service_account: str = ""
    chroot: bool = True  # the driver root has a shell: the script runs inside it


def daemon_script(spec: DaemonSpec, chroot: bool) -> str:
    """The container's shell script: start the daemon, set its defaults, mark started, follow its log."""
    root = "" if chroot else DRIVER_ROOT_MOUNT
    pipe, log = f"{root}{CLIENT_PIPE_DIR}", f"{root}{DAEMON_LOG_DIR}"
    lines = ["set -e"]
    if not chroot:
        lines.append(f"export PATH={DRIVER_ROOT_MOUNT}/usr/bin:{DRIVER_ROOT_MOUNT}/bin:$PATH")
    lines += [
        f"export CUDA_MPS_PIPE_DIRECTORY={pipe}",
        f"export CUDA_MPS_LOG_DIRECTORY={log}",
        "nvidia-cuda-mps-control -d" + (" -M" if spec.config.multi_user else ""),
    ]
    if spec.config.thread_percentage is not None:
        lines.append(
            f"echo set_default_active_thread_percentage {spec.config.thread_percentage} "
            "| nvidia-cuda-mps-control"
        )
    for uuid, limit in spec.pinned_limits().items():
        lines.append(f"echo set_default_device_pinned_mem_limit {uuid} {limit} | nvidia-cuda-mps-control")
    lines += [
        f'echo "startup complete" > {log}/{STARTUP_LOG}',
        f"exec tail -n +1 -f {log}/control.log",
    ]
    script = "\n".join(lines)
    if chroot:
        return f"exec chroot {DRIVER_ROOT_MOUNT} /bin/sh -c {shlex.quote(script)}"
    return script


def deployment(spec: DaemonSpec, dirs: DaemonDirs, options: DeploymentOptions) -> dict[str, Any]:
    name = deployment_name(spec.id)
    inside = DRIVER_ROOT_MOUNT if options.chroot else ""
    pod: dict[str, Any] = {
        "nodeName": options.node_name,
        "hostPID": True,
        "containers": [
            {
                "name": CONTAINER,
                "image": options.image,
                "command": ["sh", "-c", daemon_script(spec, options.chroot)],
                "env": [
                    {"name": "CUDA_VISIBLE_DEVICES", "value": ",".join(spec.uuids)},
                    {"name": "FEATURE_GATES", "value": options.feature_gates},
                ],
                "securityContext": {"privileged": True},
                "startupProbe": {
                    "exec": {"command": ["cat", f"{DRIVER_ROOT_MOUNT}{DAEMON_LOG_DIR}/{STARTUP_LOG}"]},
                    "initialDelaySeconds": 1,
                    "periodSeconds": 1,
                    "failureThreshold": 60,
                },
                "volumeMounts": [
                    {"name": "driver-root", "mountPath": DRIVER_ROOT_MOUNT},
                    {"name": "mps-pipe-dir", "mountPath": f"{DRIVER_ROOT_MOUNT}{CLIENT_PIPE_DIR}"},
                    {"name": "mps-log-dir", "mountPath": f"{DRIVER_ROOT_MOUNT}{DAEMON_LOG_DIR}"},
                    {"name": "mps-shm", "mountPath": f"{inside}/dev/shm"},
                ],
            }
        ],
        "volumes": [
            {"name": "driver-root", "hostPath": {"path": options.driver_root, "type": "Directory"}},
            {"name": "mps-pipe-dir", "hostPath": {"path": str(dirs.pipe), "type": "DirectoryOrCreate"}},
            {"name": "mps-log-dir", "hostPath": {"path": str(dirs.log), "type": "DirectoryOrCreate"}},
            {"name": "mps-shm", "hostPath": {"path": str(dirs.shm), "type": "DirectoryOrCreate"}},
        ],
    }
    container = pod["containers"][0]
    if options.pull_policy:
        container["imagePullPolicy"] = options.pull_policy
    if options.pull_secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in options.pull_secrets]
    if options.service_account:
        pod["serviceAccountName"] = options.service_account
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": options.namespace, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


def cdi_edits(dirs: DaemonDirs, extra_env: Sequence[str] = ()) -> dict[str, Any]:
    """The container edits every device of the daemon's group adds for the workload (NVIDIA's), plus
    `extra_env` (`NAME=value`, per-client limits; NVIDIA sets none)."""
    options = list(BIND_OPTIONS)
    return {
        "env": [f"CUDA_MPS_PIPE_DIRECTORY={CLIENT_PIPE_DIR}", *extra_env],
        "mounts": [
            {"hostPath": str(dirs.shm), "containerPath": "/dev/shm", "options": options},
            {"hostPath": str(dirs.pipe), "containerPath": CLIENT_PIPE_DIR, "options": options},
        ],
    }


def node_of(obj: Mapping[str, Any]) -> str:
    """The node a Deployment's pods are pinned to ("" when none)."""
    return str(((obj.get("spec") or {}).get("template") or {}).get("spec", {}).get("nodeName") or "")

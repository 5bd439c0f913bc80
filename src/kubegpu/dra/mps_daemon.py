"""MPSSupport: a claim's MPS control daemons started, checked, kept and stopped, as NVIDIA's driver runs them.

`start(spec)`: the host directories `<plugin dir>/mps/<id>/{pipe,shm,log}`, shm mounted as a tmpfs sized as
NVIDIA sizes it (half of MemTotal), each full GPU set to EXCLUSIVE_PROCESS with the `nvidia-smi` under the
container driver root, then the Deployment created (one already there is kept: a retried Prepare, a
rebuilt claim). What `stop` needs later is written to `<dir>/daemon.json` before anything else, so a
driver that crashed half-way, or restarted, can still stop or re-create the daemon.
`wait_ready(id)`: NVIDIA's readiness check (1 ready replica, 1 pod, its container ready) with NVIDIA's
back-off (1 s doubling with jitter, 4 tries, at most 10 s a wait); otherwise `MPS control daemon is not
yet ready: ...` and the kubelet retries the claim.
`stop(id)`: as NVIDIA's, only when the daemon's directory exists: the Deployment deleted (foreground), the
compute modes back to DEFAULT, shm unmounted, the directory removed.
`ensure(id)` re-creates a held daemon's Deployment from its record when it is gone (`mps_supervise`).

On a simulated node (the fake NVML) shm stays a plain directory and the log says so: mounting a tmpfs there
would need root and would outlive a test. With ConsumableShares a device's daemon is shared by the claims
holding a share of it (`daemon_specs(shared=...)`): `start` by a later sharer keeps its shm mounted and its
Deployment as they are, `cdi_edits` adds each client's limits; who still holds it is the checkpoint's to say
(`held_daemons`), so `dra.prepare` stops it only with its last holder.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubegpu.common.backoff import Backoff
from kubegpu.common.files import write_atomic
from kubegpu.dra.api_errors import ApiError, ApiStatusError
from kubegpu.dra.claims import RETRY, ClaimError
from kubegpu.dra.devices import DraDevice
from kubegpu.dra.gpuconfig import MPS, ConfigError, Sharing
from kubegpu.dra.kubeapi import KubeClient
from kubegpu.dra.mps_deployment import (
    NAME_PREFIX,
    DaemonDirs,
    DaemonSpec,
    DeploymentOptions,
    cdi_edits,
    deployment,
    deployment_name,
    node_of,
    shared_daemon_id,
)
from kubegpu.dra.nvidia_smi import NvidiaSmi, NvidiaSmiError
from kubegpu.node import mps_shm
from kubegpu.node.mps_control import DEFAULT, EXCLUSIVE_PROCESS, MpsCommandError, run_tool

log = logging.getLogger(__name__)

RECORD = "daemon.json"
SUMMARY_KEY = "mpsControlDaemon"  # in a prepared claim's sharing summary (the checkpoint): the daemon's ID
READY_STEPS = 4  # NVIDIA's wait.Backoff{Duration: 1s, Factor: 2, Jitter: 1, Steps: 4, Cap: 10s}
NOT_READY = "MPS control daemon is not yet ready"
COMING_ONLINE = "waiting for MPS control daemon to come online"


class MpsError(ClaimError):
    """A daemon could not be started, found ready or stopped; the claim (or its Unprepare) fails with it."""

    kind = "mps"


@dataclass(frozen=True, slots=True)
class Record:
    """What `<dir>/daemon.json` keeps: the Deployment and the GPUs whose compute mode was set."""

    deployment: dict[str, Any]
    full_gpus: tuple[str, ...]


MULTI_USER_CAPABILITY = (7, 0)


def daemon_specs(
    claim_uid: str,
    devices: Sequence[DraDevice],
    sharing: Mapping[str, Sharing | None],
    shared: Sequence[str] = (),
) -> list[DaemonSpec]:
    """One daemon per MPS config of the claim, over the devices it applies to (NVIDIA's grouping); a device
    in `shared` (held as a share, ConsumableShares) gets the daemon of that device instead, which every
    claim sharing it uses (`shared_daemon_id`). ConfigError (NVIDIA's text) when multiUser is asked of a GPU
    below compute capability 7.0."""
    groups: dict[tuple[Sharing, str], list[DraDevice]] = {}
    for device in devices:
        config = sharing.get(device.name)
        if config is not None and config.strategy == MPS:
            name = shared_daemon_id(device.kind, device.uuid) if device.name in shared else ""
            groups.setdefault((config, name), []).append(device)
    out = []
    for (config, name), members in groups.items():
        full = [d.gpu for d in members if d.mig is None]
        if config.multi_user:
            for gpu in full:
                if gpu.compute_capability < MULTI_USER_CAPABILITY:
                    major, minor = gpu.compute_capability
                    raise ConfigError(
                        f"multiuser mode was requested but is not supported: GPU {gpu.uuid} has insufficient "
                        f'cudaComputeCapability "{major}.{minor}", wanted >= "7.0"'
                    )
        out.append(
            DaemonSpec(
                claim_uid,
                tuple(d.name for d in members),
                tuple(d.uuid for d in members),
                tuple(g.uuid for g in full),
                config,
                name,
            )
        )
    return out


def config_of(summary: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A checkpointed sharing summary without the daemon's ID: the config as a claim asked for it, which is
    what decides whether two claims may share a device."""
    if summary is None:
        return None
    return {key: v for key, v in summary.items() if key != SUMMARY_KEY}


def held_daemons(sharing_summaries: Iterable[Mapping[str, Any]]) -> set[str]:
    """The daemon IDs prepared claims hold, from their checkpointed sharing summaries."""
    out = set()
    for summaries in sharing_summaries:
        for summary in summaries.values():
            if isinstance(summary, Mapping) and isinstance(summary.get(SUMMARY_KEY), str):
                out.add(summary[SUMMARY_KEY])
    return out


class MpsDaemons:
    def __init__(
        self,
        api: KubeClient,
        *,
        plugin_dir: Path,
        options: DeploymentOptions,
        smi: NvidiaSmi,
        simulated: bool = False,
        api_timeout: float = 10.0,
        sleep: Callable[[float], None] = time.sleep,
        mount: Callable[[Path], object] = mps_shm.mount_shm,
        unmount: Callable[[Path], object] | None = None,
    ) -> None:
        self.api = api
        self.plugin_dir = plugin_dir
        self.options = options
        self.smi = smi
        self.simulated = simulated
        self._timeout = (min(5.0, api_timeout), api_timeout)  # connect, read
        self.sleep = sleep
        self.mount = mount
        self.unmount = unmount or (lambda path: run_tool(["umount", str(path)]))

    # ---- paths and records ---------------------------------------------------------------------------

    def dirs(self, daemon: str) -> DaemonDirs:
        return DaemonDirs.of(self.plugin_dir, daemon)

    def record(self, daemon: str) -> Record | None:
        try:
            raw = json.loads((self.dirs(daemon).root / RECORD).read_text())
            return Record(dict(raw["deployment"]), tuple(str(u) for u in raw["fullGpus"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def of_claim(self, claim_uid: str) -> set[str]:
        """The daemons whose directory is on disk for `claim_uid` (`<claim UID>-<5 hex>`)."""
        try:
            names = [p.name for p in (self.plugin_dir / "mps").iterdir()]
        except OSError:
            return set()
        prefix = f"{claim_uid}-"
        return {n for n in names if n.startswith(prefix) and len(n) == len(prefix) + 5}

    def cdi_edits(self, daemon: str, extra_env: Iterable[str] = ()) -> dict[str, Any]:
        return cdi_edits(self.dirs(daemon), tuple(extra_env))

    def _path(self, name: str = "") -> str:
        base = f"/apis/apps/v1/namespaces/{self.options.namespace}/deployments"
        return f"{base}/{name}" if name else base

    # ---- start ---------------------------------------------------------------------------------------

    def start(self, spec: DaemonSpec) -> None:
        """Everything but the readiness wait; MpsError naming the step that failed."""
        daemon, dirs = spec.id, self.dirs(spec.id)
        manifest = deployment(spec, dirs, self.options)
        try:
            for path in (dirs.pipe, dirs.shm, dirs.log):
                path.mkdir(mode=0o755, parents=True, exist_ok=True)
            body = {"deployment": manifest, "fullGpus": list(spec.full_gpus)}
            write_atomic(dirs.root / RECORD, (json.dumps(body, indent=2) + "\n").encode())
        except OSError as err:
            raise MpsError(f"error creating the MPS control daemon directories {dirs.root}: {err}") from None
        if spec.name and not self.simulated and mps_shm.is_mount_point(dirs.shm):
            log.info("MPS shm %s is mounted already: kept for the daemon's other clients", dirs.shm)
        else:  # NVIDIA's: a per-claim daemon's shm is mounted afresh (what was there unmounted)
            self._mount_shm(dirs.shm)
        for uuid in spec.full_gpus:
            try:
                self.smi.compute_mode(uuid, EXCLUSIVE_PROCESS)
            except NvidiaSmiError as err:
                raise MpsError(f"error setting compute mode {EXCLUSIVE_PROCESS} on {uuid}: {err}") from None
        self._create(manifest, daemon)
        log.info("MPS control daemon %s started for %s", deployment_name(daemon), ", ".join(spec.uuids))

    def _mount_shm(self, shm: Path) -> None:
        if self.simulated:
            log.info(
                "MPS shm %s is a plain directory, not a tmpfs (size=%s): the node is simulated (fake NVML)",
                shm,
                mps_shm.shm_size(),
            )
            return
        try:
            self.mount(shm)
        except (MpsCommandError, OSError) as err:
            raise MpsError(f"error mounting the MPS shm tmpfs at {shm}: {err}") from None

    def _create(self, manifest: dict[str, Any], daemon: str) -> bool:
        """Create the Deployment; False when it exists already (kept as it is)."""
        try:
            self.api.request("POST", self._path(), body=manifest, timeout=self._timeout)
        except ApiStatusError as err:
            if err.status == 409:  # AlreadyExists: kept as it is
                return False
            raise MpsError(f"error creating MPS control daemon {deployment_name(daemon)}: {err}") from None
        except ApiError as err:
            raise MpsError(f"error creating MPS control daemon {deployment_name(daemon)}: {err}") from None
        return True

    # ---- ready ---------------------------------------------------------------------------------------

    def wait_ready(self, daemon: str) -> None:
        """NVIDIA's readiness wait; MpsError `MPS control daemon is not yet ready: ...` (kubelet retries)."""
        backoff = Backoff(initial=1.0, maximum=10.0, factor=2.0, jitter=(1.0, 2.0))
        reason: str | None = COMING_ONLINE
        for step in range(READY_STEPS):
            reason = self._not_ready(daemon)
            if reason is None:
                log.info("MPS control daemon %s is ready", deployment_name(daemon))
                return
            if step < READY_STEPS - 1:
                self.sleep(backoff.next_delay())
        raise MpsError(f"{NOT_READY}: {reason}; {RETRY}")

    def _not_ready(self, daemon: str) -> str | None:
        name = deployment_name(daemon)
        try:
            obj = self.api.request("GET", self._path(name), timeout=self._timeout)
            if int((obj.get("status") or {}).get("readyReplicas") or 0) != 1:
                return COMING_ONLINE
            pods = self.api.request(
                "GET",
                f"/api/v1/namespaces/{self.options.namespace}/pods",
                query={"labelSelector": f"app={name}"},
                timeout=self._timeout,
            )
        except ApiError as err:
            return f"{COMING_ONLINE} ({err})"
        items = [p for p in pods.get("items") or [] if not (p.get("metadata") or {}).get("deletionTimestamp")]
        if len(items) != 1:
            return f"{COMING_ONLINE} (expected 1 pod of {name}, found {len(items)})"
        statuses = (items[0].get("status") or {}).get("containerStatuses") or []
        if not statuses or not all(s.get("ready") for s in statuses):
            return COMING_ONLINE
        return None

    # ---- kept ----------------------------------------------------------------------------------------

    def listed(self) -> dict[str, str]:
        """This node's MPS control-daemon Deployments in the namespace: name -> UID. ApiError when the API
        server cannot be asked."""
        found = self.api.request("GET", self._path(), timeout=self._timeout)
        out = {}
        for obj in found.get("items") or []:
            meta = obj.get("metadata") or {}
            name = str(meta.get("name") or "")
            if name.startswith(NAME_PREFIX) and node_of(obj) == self.options.node_name:
                out[name] = str(meta.get("uid") or "")
        return out

    def ensure(self, daemon: str) -> bool:
        """Re-create a held daemon's Deployment from its record; True when it was created."""
        record = self.record(daemon)
        if record is None:
            log.error(
                "MPS control daemon %s is gone and cannot be re-created: %s is missing or unreadable",
                deployment_name(daemon),
                self.dirs(daemon).root / RECORD,
            )
            return False
        created = self._create(record.deployment, daemon)
        if created:
            log.warning("MPS control daemon %s was gone: re-created", deployment_name(daemon))
        return created

    def delete_orphan(self, name: str, uid: str) -> None:
        """Delete a Deployment no prepared claim holds (only that object: a precondition on its UID)."""
        query = {"propagationPolicy": "Foreground"}
        body = {"propagationPolicy": "Foreground", "preconditions": {"uid": uid}}
        try:
            self.api.request("DELETE", self._path(name), query=query, body=body, timeout=self._timeout)
        except ApiStatusError as err:
            if err.status in (404, 409):
                return
            raise
        log.warning("deleted MPS control daemon %s: no prepared claim holds it", name)

    # ---- stop ----------------------------------------------------------------------------------------

    def stop(self, daemon: str) -> None:
        """NVIDIA's Stop; nothing when the daemon's directory is gone. MpsError when a step fails (the
        directory stays, so the retried Unprepare does the rest)."""
        dirs = self.dirs(daemon)
        if not dirs.root.exists():
            return
        record = self.record(daemon)
        name = deployment_name(daemon)
        try:
            self.api.request(
                "DELETE",
                self._path(name),
                query={"propagationPolicy": "Foreground"},
                timeout=self._timeout,
            )
        except ApiStatusError as err:
            if err.status != 404:
                raise MpsError(f"error deleting MPS control daemon {name}: {err}") from None
        except ApiError as err:
            raise MpsError(f"error deleting MPS control daemon {name}: {err}") from None
        for uuid in record.full_gpus if record else ():
            try:
                self.smi.compute_mode(uuid, DEFAULT)
            except NvidiaSmiError as err:
                raise MpsError(f"error resetting compute mode on {uuid}: {err}") from None
        if not self.simulated and mps_shm.is_mount_point(dirs.shm):
            try:
                self.unmount(dirs.shm)
            except (MpsCommandError, OSError) as err:
                raise MpsError(f"error unmounting the MPS shm tmpfs at {dirs.shm}: {err}") from None
        shutil.rmtree(dirs.root, ignore_errors=True)
        log.info("MPS control daemon %s stopped", name)

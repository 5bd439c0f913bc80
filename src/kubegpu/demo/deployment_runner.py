"""The simulated node's kubelet and Deployment controller, for the Deployments pinned to it (the DRA driver's
MPS control daemons): nothing else in the simulator runs a Deployment.

For each apps/v1 Deployment on the simulated API server whose pod template is pinned to this node
(`spec.template.spec.nodeName`), the runner does what the controllers and the kubelet would, within what a
test can check:
- the hostPath volumes are created (`DirectoryOrCreate`) or must exist (`Directory`);
- the container's command runs as a process of its own, with the container's env, in a session of its own,
  its volume mount paths rewritten to their host paths (there is no container; the command's text is
  rewritten, longest mount path first, in one pass) and `/bin/sh` as the shell;
- the startup probe's exec command (rewritten the same way) is run every pass (0.05 s) until it succeeds;
  then a Pod (owned by the Deployment: the simulator has no ReplicaSet) is written with a ready container
  and the Deployment's status with `readyReplicas: 1`;
- a Deployment deleted or re-created (a new UID) has its process killed (its Pod goes with the Deployment:
  the API server's garbage collection) and a re-created one is started again.
`hold()` keeps new Deployments from starting (not ready, as a slow image pull would); `release()` lets
them go.
The real MPS daemon is the fake `nvidia-cuda-mps-control` (`node/nvml/fake_mps_control.py`) the test puts
under the driver root.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubegpu.apisim import ApiServerSim

log = logging.getLogger(__name__)
POLL_S = 0.05
# The PATH a container gets from the runtime when its image sets none (containerd's default): the host's
# own environment does not leak into a container.
CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class _Running:
    uid: str
    name: str
    namespace: str
    process: subprocess.Popen[bytes] | None = None
    probe: list[str] = field(default_factory=list)
    ready: bool = False
    failed: str = ""


class DeploymentRunner:
    def __init__(self, api: ApiServerSim, node: str, log_dir: Path) -> None:
        self.api = api
        self.node = node
        self.log_dir = log_dir
        self.running: dict[tuple[str, str], _Running] = {}
        self._held = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="deployment-runner", daemon=True)
        self.started_count = 0  # containers started, re-creations included

    def start(self) -> DeploymentRunner:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for running in list(self.running.values()):
            self._kill(running)
        self.running.clear()

    def hold(self) -> None:
        """New Deployments are not started (their pods stay not ready) until `release`."""
        self._held.set()

    def release(self) -> None:
        self._held.clear()

    # ---- the loop ------------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self._pass()
            except Exception:  # a test's runner must not die silently; say why and go on
                log.exception("deployment runner pass failed")

    def _pass(self) -> None:
        current = {
            (d["metadata"]["namespace"], d["metadata"]["name"]): d
            for d in self.api.list("deployments")
            if (d["spec"].get("template") or {}).get("spec", {}).get("nodeName") == self.node
            and not d["metadata"].get("deletionTimestamp")
        }
        for key, running in list(self.running.items()):
            obj = current.get(key)
            if obj is None or obj["metadata"]["uid"] != running.uid:
                self._kill(running)
                del self.running[key]
        for key, obj in current.items():
            found = self.running.get(key)
            if found is None:
                if self._held.is_set():
                    continue
                found = self.running[key] = self._start(obj)
            if not found.ready and not found.failed:
                self._probe(found, obj)

    # ---- a container ---------------------------------------------------------------------------------

    def _start(self, obj: dict[str, Any]) -> _Running:
        meta = obj["metadata"]
        running = _Running(meta["uid"], meta["name"], meta["namespace"])
        pod = obj["spec"]["template"]["spec"]
        container = pod["containers"][0]
        volumes = {v["name"]: v.get("hostPath") or {} for v in pod.get("volumes") or []}
        mounts: dict[str, str] = {}
        for mount in container.get("volumeMounts") or []:
            host = volumes.get(mount["name"], {})
            path = Path(host.get("path", ""))
            if host.get("type") == "DirectoryOrCreate":
                path.mkdir(parents=True, exist_ok=True)
            elif not path.is_dir():
                running.failed = f"hostPath {path} of volume {mount['name']} is not a directory"
                return running
            mounts[mount["mountPath"]] = str(path)
        rewrite = _rewriter(mounts)
        argv = [rewrite(a) for a in container.get("command", []) + container.get("args", [])]
        if argv[:1] == ["sh"]:
            argv[0] = "/bin/sh"
        env = {"PATH": CONTAINER_PATH}
        env.update({e["name"]: rewrite(str(e.get("value", ""))) for e in container.get("env") or []})
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with (self.log_dir / f"{running.name}.log").open("ab") as out:
            running.process = subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        probe = ((container.get("startupProbe") or {}).get("exec") or {}).get("command") or []
        running.probe = [rewrite(a) for a in probe]
        self.started_count += 1
        log.info("started the container of deployment %s/%s", running.namespace, running.name)
        return running

    def _probe(self, running: _Running, obj: dict[str, Any]) -> None:
        assert running.process is not None
        if running.process.poll() is not None:
            running.failed = f"the container exited with {running.process.returncode}"
            return
        if running.probe:
            done = subprocess.run(running.probe, capture_output=True, timeout=5, check=False)
            if done.returncode != 0:
                return
        running.ready = True
        self._write_ready(obj)

    def _write_ready(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        template = obj["spec"]["template"]
        owner = {"apiVersion": "apps/v1", "kind": "Deployment", "name": meta["name"], "uid": meta["uid"],
                 "controller": True, "blockOwnerDeletion": True}  # fmt: skip
        suffix = uuid.uuid4().hex[:5]
        pod = self.api.create(
            "pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{meta['name'][:50]}-{suffix}",
                    "labels": dict(template["metadata"].get("labels") or {}),
                    "ownerReferences": [owner],
                },
                "spec": template["spec"],
            },
            namespace=meta["namespace"],
        )
        name = template["spec"]["containers"][0]["name"]
        pod["status"] = {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": name, "ready": True, "started": True, "restartCount": 0}],
        }
        self.api.update("pods", pod, status=True)
        status = {
            "observedGeneration": meta.get("generation", 1),
            "replicas": 1,
            "readyReplicas": 1,
            "availableReplicas": 1,
            "updatedReplicas": 1,
        }
        current = self.api.get("deployments", meta["name"], namespace=meta["namespace"])
        if current["metadata"]["uid"] == meta["uid"]:
            current["status"] = status
            self.api.update("deployments", current, status=True)

    def _kill(self, running: _Running) -> None:
        process = running.process
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=5)
        log.info("killed the container of deployment %s/%s", running.namespace, running.name)


def _rewriter(mounts: dict[str, str]) -> Any:
    """A function that rewrites every container path under a mount to its host path, in one pass."""
    if not mounts:
        return lambda text: text
    ordered = sorted(mounts, key=len, reverse=True)
    pattern = re.compile("|".join(re.escape(m) for m in ordered))
    return lambda text: pattern.sub(lambda m: mounts[m.group(0)], text)

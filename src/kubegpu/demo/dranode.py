"""A simulated node for `kubegpu dra` (the demo's DRA act and the contract tests): the API server (apisim),
the kubelet's DRA side (kubeletsim), the fake NVML, and the driver as a separate process on real unix
sockets. The scheduler's part is played by resourceapi's structured allocator: it allocates a claim from
the published slices and reserves it."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kubegpu.apisim import ApiServerSim
from kubegpu.demo.deployment_runner import DeploymentRunner
from kubegpu.kubeletsim import (
    Container,
    ContainerClaim,
    DraSettings,
    ExtendedResourceClaim,
    KubeletSimulator,
    Pod,
    PodResourceClaim,
    RequestMapping,
)
from kubegpu.resourceapi import (
    Allocator,
    Holdings,
    class_mapping,
    extended_claim,
    parse_claim,
    parse_class,
    parse_slice,
    requests_and_mappings,
    reserved_status,
    routes,
)

NODE = "node-a"
DRIVER = "gpu.nvidia.com"
_GPU_SELECTOR = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
_MIG_SELECTOR = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"
# NVIDIA's DeviceClass for whole GPUs (its chart's gpu.nvidia.com class).
GPU_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "gpu.nvidia.com"},
    "spec": {"selectors": [{"cel": {"expression": _GPU_SELECTOR}}]},
}
# NVIDIA's DeviceClass for MIG devices (its chart's mig.nvidia.com class).
MIG_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "mig.nvidia.com"},
    "spec": {"selectors": [{"cel": {"expression": _MIG_SELECTOR}}]},
}


class SimulatedDraNode:
    def __init__(
        self,
        profile: str = "a100-mig",
        env: dict[str, str] | None = None,
        kubelet: str = "1.34",
        **kubelet_options: Any,
    ) -> None:
        """`kubelet_options`: more of the simulated kubelet's `DraSettings` (gates, periods)."""
        self.root = Path(tempfile.mkdtemp(prefix="kgdra-", dir="/tmp"))  # unix socket paths are short
        self.profile = profile
        self.extra_env = dict(env or {})
        self.api = ApiServerSim()
        self.kubelet_version = kubelet
        self.kubelet_options = kubelet_options
        self.cdi = self.root / "cdi"
        self.plugins = self.root / "plugins"
        self.registry = self.root / "plugins_registry"
        self.boot_id = self.root / "boot_id"
        self.boot_id.write_text("2b1d6f0e-0d2a-4c53-9a1b-6f7e2a3c4d5e\n")
        self.log_path = self.root / "dra.log"
        self.driver: subprocess.Popen[bytes] | None = None
        self.sim: KubeletSimulator | None = None
        self.deployments: DeploymentRunner | None = None  # `run_deployments`: MPS control daemons run

    async def __aenter__(self) -> SimulatedDraNode:
        self.api.start()
        self.api.add_node(NODE)
        self.api.create("deviceclasses", GPU_CLASS, namespace="")
        self.kubeconfig = self.api.write_kubeconfig(self.root / "kubeconfig")
        await self.start_kubelet()
        return self

    def run_deployments(self) -> DeploymentRunner:
        """Run the Deployments pinned to this node (the driver's MPS control daemons), as its kubelet
        and the controllers would (`deployment_runner`)."""
        if self.deployments is None:
            self.deployments = DeploymentRunner(self.api, NODE, self.root / "containers").start()
        return self.deployments

    async def __aexit__(self, *exc: object) -> None:
        if self.deployments is not None:
            self.deployments.stop()
        if self.driver is not None and self.driver.poll() is None:
            self.driver.kill()
            self.driver.wait()
        if self.sim is not None:
            await self.sim.stop()
        self.api.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    async def start_kubelet(self) -> None:
        settings = DraSettings(
            node_name=NODE, api_url=self.api.url, kubelet_version=self.kubelet_version, poll_interval=0.02,
            root=self.root, **self.kubelet_options,
        )  # fmt: skip
        self.sim = KubeletSimulator(self.root / "device-plugins", dra=settings)
        await self.sim.start()

    @property
    def env(self) -> dict[str, str]:
        base = {
            k: v for k, v in os.environ.items() if not k.startswith(("KUBEGPU_", "KUBECONFIG", "NODE_NAME"))
        }
        return {
            **base,
            "NODE_NAME": NODE,
            "KUBECONFIG": str(self.kubeconfig),
            "CDI_ROOT": str(self.cdi),
            "KUBELET_REGISTRAR_DIRECTORY_PATH": str(self.registry),
            "KUBELET_PLUGINS_DIRECTORY_PATH": str(self.plugins),
            "KUBEGPU_FAKE_NVML": self.profile,
            "KUBEGPU_FAKE_NVML_STATE": str(self.root / "nvml"),
            "KUBEGPU_DRA_BOOT_ID_FILE": str(self.boot_id),
            "KUBEGPU_HEALTH_PROBE_SECONDS": "0.2",
            "KUBEGPU_RECOVERY_QUIET_SECONDS": "1",
            **self.extra_env,
        }

    def start_driver(self, *args: str) -> subprocess.Popen[bytes]:
        with self.log_path.open("ab") as log:
            self.driver = subprocess.Popen(
                [sys.executable, "-m", "kubegpu", "dra", "-v", *args],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self.driver

    async def stop_driver(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 15.0) -> int:
        assert self.driver is not None
        driver, self.driver = self.driver, None
        driver.send_signal(sig)
        deadline = time.monotonic() + timeout
        while driver.poll() is None:
            if time.monotonic() > deadline:
                driver.kill()
                raise AssertionError(f"the driver did not stop within {timeout} s:\n{self.log()[-3000:]}")
            await asyncio.sleep(0.05)
        return driver.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    async def wait(self, predicate: Any, what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if self.driver is not None and self.driver.poll() is not None:
                raise AssertionError(
                    f"the driver exited {self.driver.returncode} waiting for {what}:\n{self.log()[-3000:]}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}:\n{self.log()[-3000:]}")
            await asyncio.sleep(0.05)

    def slices(self) -> list[dict[str, Any]]:
        return [s for s in self.api.list("resourceslices") if s["spec"]["driver"] == DRIVER]

    def published(self) -> dict[str, dict[str, Any]]:
        return {d["name"]: d for s in self.slices() for d in s["spec"].get("devices", [])}

    async def wait_registered(self) -> None:
        assert self.sim is not None
        await self.sim.wait_for(lambda: bool(self.sim and self.sim.dra_plugins(DRIVER)), 30.0)

    async def wait_published(self, count: int) -> None:
        await self.wait(lambda: len(self.published()) == count, f"{count} published devices")

    def allocate(self, claim: dict[str, Any], pod: Pod) -> dict[str, Any]:
        """Create the claim, allocate it as the scheduler would on this node, reserve it for `pod`."""
        allocated = self.try_allocate(claim, pod)
        if allocated is None:
            raise AssertionError(f"the allocator found no devices for claim {claim['metadata']['name']}")
        return allocated

    def try_allocate(self, claim: dict[str, Any], pod: Pod) -> dict[str, Any] | None:
        """`allocate`, or None (the claim created, left unallocated) when no device fits."""
        created = self.api.create("resourceclaims", claim)
        allocations = self._allocate_on_node(created)
        if allocations is None:
            return None
        created["status"] = reserved_status(allocations[0], pod.name, pod.uid)
        return self.api.update("resourceclaims", created, status=True)

    def _allocate_on_node(self, claim: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The allocator's status.allocation for `claim` on this node, next to what allocated claims hold
        (devices held whole, and the shares of shared ones); None when no device fits."""
        held = [
            parse_claim(c)
            for c in self.api.list("resourceclaims")
            if (c.get("status") or {}).get("allocation")
        ]
        allocator = Allocator(
            [parse_claim(claim)],
            [parse_class(c) for c in self.api.list("deviceclasses")],
            [parse_slice(s) for s in self.slices()],
            Holdings.of_claims(held),
        )
        return allocator.allocate(self.api.get("nodes", NODE, namespace=""))

    def schedule_extended(self, pod: Pod) -> Pod | None:
        """The scheduler's extended-resource bridge (KEP-5004) for `pod` (created with `create_pod`) on this
        node: the resources the node does not advertise but a DeviceClass serves get the special claim,
        allocated, created, reserved for the pod, and recorded in the pod's `extendedResourceClaimStatus`.

        Returns the pod as the kubelet then sees it (its API UID, the claim status read back from the API
        server); the pod unchanged when the node's device plugins serve all of it; None when it stays
        Pending here (a resource neither advertised nor bridged, or no devices fit the claim)."""
        obj = self.api.get("pods", pod.name, namespace=pod.namespace)
        node = self.api.get("nodes", NODE, namespace="")
        mapping = class_mapping(self.api.list("deviceclasses"))
        found = routes(obj, (node.get("status") or {}).get("allocatable") or {}, mapping)
        if any(r.fits_nowhere for r in found):
            return None
        bridged = [r.resource for r in found if r.through_dra]
        if not bridged:
            return pod
        requests, mappings = requests_and_mappings(obj, bridged, mapping)
        claim = extended_claim(obj, requests)
        in_memory = {**claim, "metadata": {**claim["metadata"], "name": "extended-resources"}}
        allocations = self._allocate_on_node(in_memory)  # allocated before it exists, as in Filter/Reserve
        if allocations is None:
            return None
        created = self.api.create("resourceclaims", claim, namespace=pod.namespace)
        uid = obj["metadata"]["uid"]
        created["status"] = reserved_status(allocations[0], pod.name, uid)
        self.api.update("resourceclaims", created, status=True)
        obj["status"] = {
            **(obj.get("status") or {}),
            "extendedResourceClaimStatus": {
                "requestMappings": mappings,
                "resourceClaimName": created["metadata"]["name"],
            },
        }
        stored = self.api.update("pods", obj, status=True)["status"]["extendedResourceClaimStatus"]
        return dataclasses.replace(
            pod,
            uid=uid,
            extended_claim=ExtendedResourceClaim(
                stored["resourceClaimName"],
                tuple(
                    RequestMapping(m["containerName"], m["resourceName"], m["requestName"])
                    for m in stored["requestMappings"]
                ),
            ),
        )

    def create_pod(self, pod: Pod) -> dict[str, Any]:
        """The pod's API object, bound to this node, so the kubelet can write its status."""
        return self.api.create("pods", pod_object(pod), namespace=pod.namespace)


def pod_object(pod: Pod, node: str = NODE) -> dict[str, Any]:
    def container(c: Container) -> dict[str, Any]:
        claims = [{"name": r.name, **({"request": r.request} if r.request else {})} for r in c.claims]
        resources: dict[str, Any] = {"claims": claims} if claims else {}
        if c.limits:
            resources["limits"] = {name: str(amount) for name, amount in c.limits.items()}
        return {"name": c.name, "image": "busybox", **({"resources": resources} if resources else {})}

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod.name, "namespace": pod.namespace},
        "spec": {
            "nodeName": node,
            "containers": [container(c) for c in pod.containers],
            "resourceClaims": [
                {"name": c.name, "resourceClaimName": c.claim_name} for c in pod.resource_claims
            ],
        },
    }


def claim_pod(name: str, *claims: str, request: str = "") -> Pod:
    return Pod(
        name,
        containers=[Container("main", claims=[ContainerClaim(f"pc-{c}", request) for c in claims])],
        resource_claims=[PodResourceClaim(f"pc-{c}", c) for c in claims],
    )

"""MPSSupport with `kubegpu dra` as a process: one MPS control-daemon Deployment per claim as NVIDIA runs it.

The simulated node runs the Deployments pinned to it (`demo/deployment_runner.py`): the daemon container's
script runs against the fake `nvidia-cuda-mps-control` and the fake `nvidia-smi` under the driver root, and
its startup probe decides readiness. Names, paths, script lines and texts are NVIDIA's, written out.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubegpu.demo.dranode import NODE, claim_pod
from kubegpu.demo.dranode import SimulatedDraNode as DraNode
from kubegpu.kubeletsim import PrepareError
from kubegpu.node.nvml import fake_mps_control, fake_smi
from tests.cdi_schema import assert_valid_cdi_spec
from tests.dra_objects import claim, mps_config, request

T4_GPU0 = "GPU-0eaadbe4-c44f-4826-a1a6-b9dd837b9509"
HASH_GPU0 = "815e4"  # sha256("GPU-0eaadbe4-...")[:5]
GATES = (
    "TimeSlicingSettings=false,MPSSupport=true,IMEXDaemonsWithDNSNames=true,PassthroughSupport=false,"
    "DynamicMIG=false,NVMLDeviceHealthCheck=false,ComputeDomainCliques=true,CrashOnNVLinkFabricErrors=true,"
    "DeviceMetadata=false,DRAListTypeAttributes=false,FabricManagerPartitioning=false,"
    "HostManagedIMEXDaemon=false,ConsumableShares=false"
)
BIND = ["rw", "nosuid", "nodev", "bind"]
IMAGE = "registry.example/kubegpu:1.0"
NAMESPACE = "nvidia-dra"


class Node:
    """The simulated node with the fake tools under its driver root and its Deployments run."""

    def __init__(self, node: DraNode) -> None:
        self.node = node
        self.driver_root = node.root / "driver-root"
        self.smi_log = node.root / "nvidia-smi.log"
        self.mps_log = node.root / "mps-control.log"
        fake_smi.install(self.driver_root, self.smi_log)
        fake_mps_control.install(self.driver_root / "usr" / "bin", self.mps_log)
        node.extra_env.update(
            {
                "DRIVER_ROOT_CTR_PATH": str(self.driver_root),
                "NVIDIA_DRIVER_ROOT": str(self.driver_root),
                "IMAGE_NAME": IMAGE,
                "NAMESPACE": NAMESPACE,
                "IMAGE_PULL_SECRETS": "regcred",
                "IMAGE_PULL_POLICY": "IfNotPresent",
                "SERVICE_ACCOUNT_NAME": "kubegpu-dra",
                "FEATURE_GATES": "MPSSupport=true",
            }
        )
        self.runner = node.run_deployments()

    async def start(self) -> None:
        self.node.start_driver()
        await self.node.wait_registered()
        await self.node.wait_published(4)

    async def prepared_mps_claim(self) -> str:
        """Start the driver, prepare claim c1 with NVIDIA's demo MPS config for a pod; its UID."""
        await self.start()
        assert self.node.sim is not None
        pod = claim_pod("mps-pod", "c1")
        c1 = self.node.allocate(claim("c1", [request("gpu")], config=[mps_config()]), pod)
        await self.node.sim.admit(pod)
        return str(c1["metadata"]["uid"])

    def deployments(self) -> dict[str, dict[str, Any]]:
        return {d["metadata"]["name"]: d for d in self.node.api.list("deployments", NAMESPACE)}

    def mps_dir(self, daemon: str) -> Path:
        return self.node.plugins / "gpu.nvidia.com" / "mps" / daemon


def script_lines() -> list[str]:
    return [
        "set -e",
        "export PATH=/driver-root/usr/bin:/driver-root/bin:$PATH",
        "export CUDA_MPS_PIPE_DIRECTORY=/driver-root/tmp/nvidia-mps",
        "export CUDA_MPS_LOG_DIRECTORY=/driver-root/var/log/nvidia-mps",
        "nvidia-cuda-mps-control -d",
        "echo set_default_active_thread_percentage 50 | nvidia-cuda-mps-control",
        f"echo set_default_device_pinned_mem_limit {T4_GPU0} 10240M | nvidia-cuda-mps-control",
        'echo "startup complete" > /driver-root/var/log/nvidia-mps/startup.log',
        "exec tail -n +1 -f /driver-root/var/log/nvidia-mps/control.log",
    ]


async def test_an_mps_claim_runs_nvidias_control_daemon_and_unprepare_stops_it() -> None:
    async with DraNode("t4-pcie") as dra:
        node = Node(dra)
        await node.start()
        assert dra.sim is not None
        pod = claim_pod("mps-pod", "c1")
        c1 = dra.allocate(claim("c1", [request("gpu")], config=[mps_config()]), pod)
        uid = c1["metadata"]["uid"]
        await dra.sim.admit(pod)
        daemon = f"{uid}-{HASH_GPU0}"
        name = f"mps-control-daemon-{daemon}"
        (deployment,) = node.deployments().values()
        host = node.mps_dir(daemon)
        assert deployment["metadata"]["name"] == name
        assert deployment["metadata"]["namespace"] == NAMESPACE
        assert deployment["metadata"]["labels"] == {"app": name}
        spec = deployment["spec"]
        assert (spec["replicas"], spec["selector"]) == (1, {"matchLabels": {"app": name}})
        assert spec["template"]["metadata"]["labels"] == {"app": name}
        pod_spec = spec["template"]["spec"]
        assert (pod_spec["nodeName"], pod_spec["hostPID"]) == (NODE, True)
        assert pod_spec["serviceAccountName"] == "kubegpu-dra"
        assert pod_spec["imagePullSecrets"] == [{"name": "regcred"}]
        (container,) = pod_spec["containers"]
        assert (container["name"], container["image"]) == ("mps-control-daemon", IMAGE)
        assert container["imagePullPolicy"] == "IfNotPresent"
        assert container["securityContext"] == {"privileged": True}
        assert container["env"] == [
            {"name": "CUDA_VISIBLE_DEVICES", "value": T4_GPU0},
            {"name": "FEATURE_GATES", "value": GATES},
        ]
        # the fake driver root has no shell: the script runs in the image, shm on /dev/shm
        assert container["command"][:2] == ["sh", "-c"]
        assert container["command"][2].split("\n") == script_lines()
        assert container["startupProbe"]["exec"]["command"] == [
            "cat",
            "/driver-root/var/log/nvidia-mps/startup.log",
        ]
        assert container["volumeMounts"] == [
            {"name": "driver-root", "mountPath": "/driver-root"},
            {"name": "mps-pipe-dir", "mountPath": "/driver-root/tmp/nvidia-mps"},
            {"name": "mps-log-dir", "mountPath": "/driver-root/var/log/nvidia-mps"},
            {"name": "mps-shm", "mountPath": "/dev/shm"},
        ]
        assert pod_spec["volumes"] == [
            {"name": "driver-root", "hostPath": {"path": str(node.driver_root), "type": "Directory"}},
            {"name": "mps-pipe-dir", "hostPath": {"path": f"{host}/pipe", "type": "DirectoryOrCreate"}},
            {"name": "mps-log-dir", "hostPath": {"path": f"{host}/log", "type": "DirectoryOrCreate"}},
            {"name": "mps-shm", "hostPath": {"path": f"{host}/shm", "type": "DirectoryOrCreate"}},
        ]
        # EXCLUSIVE_PROCESS before the daemon; the daemon started and its defaults set, in NVIDIA's order
        assert fake_smi.calls(node.smi_log) == [f"-i {T4_GPU0} -c EXCLUSIVE_PROCESS"]
        assert [(c.args, c.stdin, c.visible_devices) for c in fake_mps_control.calls(node.mps_log)] == [
            ("-d", "", T4_GPU0),
            ("", "set_default_active_thread_percentage 50", T4_GPU0),
            ("", f"set_default_device_pinned_mem_limit {T4_GPU0} 10240M", T4_GPU0),
        ]
        assert (host / "log" / "startup.log").read_text() == "startup complete\n"
        assert (host / "pipe" / "control").exists()
        assert "the node is simulated (fake NVML)" in dra.log()
        # the workload gets NVIDIA's edits: the pipe directory, and the pipe and shm directories mounted
        spec_file = json.loads((dra.cdi / f"k8s.gpu.nvidia.com-claim_{uid}.json").read_text())
        assert_valid_cdi_spec(spec_file)
        (entry,) = spec_file["devices"]
        edits = entry["containerEdits"]
        assert edits["env"] == ["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"]
        assert edits["mounts"] == [
            {"hostPath": f"{host}/shm", "containerPath": "/dev/shm", "options": BIND},
            {"hostPath": f"{host}/pipe", "containerPath": "/tmp/nvidia-mps", "options": BIND},
        ]
        await dra.sim.terminate_pod("mps-pod")
        assert node.deployments() == {}
        assert [p for p in dra.api.list("pods", NAMESPACE)] == []  # its pod went with it (foreground)
        assert fake_smi.compute_modes(node.smi_log) == {T4_GPU0: "DEFAULT"}
        assert not host.exists()


async def test_a_daemon_not_ready_fails_the_claim_with_nvidias_text_and_the_retry_prepares_it() -> None:
    async with DraNode("t4-pcie") as dra:
        node = Node(dra)
        node.runner.hold()
        await node.start()
        assert dra.sim is not None
        pod = claim_pod("slow", "c1")
        c1 = dra.allocate(claim("c1", [request("gpu")], config=[mps_config()]), pod)
        uid = c1["metadata"]["uid"]
        with pytest.raises(PrepareError) as err:
            await dra.sim.admit(pod)
        assert (
            "claim default/c1: MPS control daemon is not yet ready: waiting for MPS control daemon to come "
            "online; the kubelet will retry"
        ) in str(err.value)
        assert not (dra.cdi / f"k8s.gpu.nvidia.com-claim_{uid}.json").exists()
        assert len(node.deployments()) == 1  # kept for the retry
        node.runner.release()
        await dra.wait(lambda: node.runner.started_count == 1, "the daemon started")
        await dra.sim.prepare_resources("slow")
        assert (dra.cdi / f"k8s.gpu.nvidia.com-claim_{uid}.json").exists()
        assert fake_smi.calls(node.smi_log) == [f"-i {T4_GPU0} -c EXCLUSIVE_PROCESS"] * 2
        assert len(node.deployments()) == 1


async def test_a_deleted_deployment_is_recreated_and_a_restart_keeps_held_and_deletes_orphans() -> None:
    async with DraNode("t4-pcie") as dra:
        node = Node(dra)
        uid = await node.prepared_mps_claim()
        name = f"mps-control-daemon-{uid}-{HASH_GPU0}"
        first = node.deployments()[name]["metadata"]["uid"]
        dra.api.delete("deployments", name, namespace=NAMESPACE)
        await dra.wait(lambda: name in node.deployments(), "the daemon re-created", timeout=20)
        assert node.deployments()[name]["metadata"]["uid"] != first
        await dra.wait(lambda: f"MPS control daemon {name} was gone: re-created" in dra.log(), "the log")
        kept = node.deployments()[name]["metadata"]["uid"]

        # While the driver is down: an orphan on this node (its claim unprepared by a lost process) and
        # another node's daemon appear.
        assert await dra.stop_driver() == 0
        orphan = json.loads(json.dumps(node.deployments()[name]))
        for obj, new, pinned in (
            (orphan, "mps-control-daemon-0c7a2d52-5b0e-4c3b-9f55-0a5d1e7c9b21-abcde", NODE),
            (json.loads(json.dumps(orphan)), "mps-control-daemon-elsewhere-abcde", "node-b"),
        ):
            obj["metadata"] = {"name": new, "labels": {"app": new}}
            obj["spec"]["selector"] = {"matchLabels": {"app": new}}
            obj["spec"]["template"]["metadata"]["labels"] = {"app": new}
            obj["spec"]["template"]["spec"]["nodeName"] = pinned
            obj.pop("status", None)
            dra.api.create("deployments", obj, namespace=NAMESPACE)
        dra.start_driver()
        await dra.wait_registered()
        orphan_name = "mps-control-daemon-0c7a2d52-5b0e-4c3b-9f55-0a5d1e7c9b21-abcde"
        await dra.wait(lambda: orphan_name not in node.deployments(), "the orphan deleted", timeout=20)
        assert set(node.deployments()) == {name, "mps-control-daemon-elsewhere-abcde"}
        assert node.deployments()[name]["metadata"]["uid"] == kept  # held: untouched
        assert f"deleted MPS control daemon {orphan_name}: no prepared claim holds it" in dra.log()


async def test_a_lost_checkpoint_rebuild_gives_the_claim_its_daemon_back() -> None:
    async with DraNode("t4-pcie") as dra:
        node = Node(dra)
        uid = await node.prepared_mps_claim()
        name = f"mps-control-daemon-{uid}-{HASH_GPU0}"
        assert await dra.stop_driver(signal.SIGKILL) != 0
        plugin_dir = dra.plugins / "gpu.nvidia.com"
        for lost in plugin_dir.glob("checkpoint*"):
            lost.unlink()
        shutil.rmtree(plugin_dir / "mps")  # the daemon's record too: only the API server knows the claim
        dra.api.delete("deployments", name, namespace=NAMESPACE)
        dra.start_driver()
        await dra.wait_registered()
        await dra.wait(lambda: name in node.deployments(), "the daemon back", timeout=20)
        await dra.wait(lambda: "rebuilt claim default/c1" in dra.log(), "the rebuild")
        assert (node.mps_dir(f"{uid}-{HASH_GPU0}") / "daemon.json").exists()


def readme_claim() -> dict[str, Any]:
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = text.split("<!-- mps-claim -->", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    loaded = yaml.safe_load(block)
    assert isinstance(loaded, dict)
    return loaded


async def test_the_readme_mps_claim_gets_its_control_daemon() -> None:
    async with DraNode("t4-pcie") as dra:
        node = Node(dra)
        await node.start()
        assert dra.sim is not None
        pod = claim_pod("mps-pod", "mps-gpu", request="")
        allocated = dra.allocate(readme_claim(), pod)
        await dra.sim.admit(pod)
        name = f"mps-control-daemon-{allocated['metadata']['uid']}-{HASH_GPU0}"
        assert list(node.deployments()) == [name]
        assert [c.stdin for c in fake_mps_control.calls(node.mps_log)] == [
            "",
            "set_default_active_thread_percentage 50",
            f"set_default_device_pinned_mem_limit {T4_GPU0} 10240M",
        ]


async def test_a_lost_checkpoint_destroys_no_daemon_its_claims_hold() -> None:
    """Until the API server says which claims this node holds, no daemon is an orphan."""
    async with DraNode("t4-pcie") as dra:
        node = Node(dra)
        uid = await node.prepared_mps_claim()
        name = f"mps-control-daemon-{uid}-{HASH_GPU0}"
        kept = node.deployments()[name]["metadata"]["uid"]
        assert await dra.stop_driver(signal.SIGKILL) != 0
        for lost in (dra.plugins / "gpu.nvidia.com").glob("checkpoint*"):
            lost.unlink()
        dra.start_driver()
        await dra.wait_registered()
        await dra.wait(lambda: "rebuilt claim default/c1" in dra.log(), "the rebuild")
        await asyncio.sleep(6)  # one more pass of the supervisor (every 5 s) after the rebuild
        assert node.deployments()[name]["metadata"]["uid"] == kept
        assert "no prepared claim holds it" not in dra.log()


async def test_the_gate_off_refuses_an_mps_claim_with_nvidias_text_and_runs_nothing() -> None:
    async with DraNode("t4-pcie") as dra:
        node = Node(dra)
        dra.extra_env["FEATURE_GATES"] = ""
        await node.start()
        assert dra.sim is not None
        pod = claim_pod("mps-pod", "c1")
        dra.allocate(claim("c1", [request("gpu")], config=[mps_config()]), pod)
        with pytest.raises(PrepareError) as err:
            await dra.sim.admit(pod)
        assert (
            '"MPS" is selected as the GPU sharing strategy, but the "MPSSupport" feature gate is not '
            "enabled; start the driver with --feature-gates MPSSupport=true"
        ) in str(err.value)
        assert node.deployments() == {}
        assert fake_smi.calls(node.smi_log) == []
        # NAMESPACE, IMAGE_NAME, ... given without the gate change nothing, and say so
        assert "IMAGE_NAME is accepted for NVIDIA compatibility and changes nothing here" in dra.log()

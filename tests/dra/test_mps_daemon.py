"""MPSSupport's pure parts and the daemon manager's edges without a cluster: NVIDIA's daemon ID, grouping,
the container script (chroot or not, `-M`), limits by sorted index, the multiUser refusal, the readiness
back-off, and Stop's rule (nothing when the directory is gone)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from kubegpu.dra.checkpoint import COMPLETED, PreparedClaim
from kubegpu.dra.devices import DraDevice
from kubegpu.dra.gpuconfig import MPS, ConfigError, Sharing, parse
from kubegpu.dra.mps_daemon import MpsDaemons, MpsError, config_of, daemon_specs, held_daemons
from kubegpu.dra.mps_deployment import DaemonDirs, DaemonSpec, DeploymentOptions, daemon_id, daemon_script
from kubegpu.dra.mps_supervise import keep_once
from kubegpu.dra.nvidia_smi import NvidiaSmi
from kubegpu.node.nvml import fake_smi
from tests.builders import gpu_uuid, make_gpus
from tests.dra.test_prepare import make

GIB = 1024**3
UID = "4f1c2a9e-8d3b-4c6f-9a0e-7b5d3c2e1f00"


def test_the_daemon_id_is_nvidias_claim_uid_and_5_hex_of_the_sorted_uuids() -> None:
    # sha256("GPU-00000000-...,GPU-00000001-...") starts with abf3b, whatever order the devices come in
    assert daemon_id(UID, [gpu_uuid(1), gpu_uuid(0)]) == f"{UID}-abf3b"
    assert daemon_id(UID, [gpu_uuid(0), gpu_uuid(1)]) == f"{UID}-abf3b"


def test_one_daemon_per_mps_config_of_a_claim() -> None:
    gpus = make_gpus(3)
    devices = [DraDevice(f"gpu-{g.index}", g) for g in gpus]
    half, quarter = Sharing(MPS, thread_percentage=50), Sharing(MPS, thread_percentage=25)
    specs = daemon_specs(UID, devices, {"gpu-0": half, "gpu-1": quarter, "gpu-2": half})
    assert [(s.devices, s.config.thread_percentage) for s in specs] == [
        (("gpu-0", "gpu-2"), 50),
        (("gpu-1",), 25),
    ]
    assert specs[0].full_gpus == (gpu_uuid(0), gpu_uuid(2))
    assert daemon_specs(UID, devices, {"gpu-0": Sharing("TimeSlicing", interval="Long")}) == []


def test_multi_user_needs_compute_capability_7() -> None:
    (old,) = (dataclasses.replace(g, compute_capability=(6, 1)) for g in make_gpus(1))
    with pytest.raises(ConfigError) as err:
        daemon_specs(UID, [DraDevice("gpu-0", old)], {"gpu-0": Sharing(MPS, multi_user=True)})
    assert str(err.value) == (
        f"multiuser mode was requested but is not supported: GPU {gpu_uuid(0)} has insufficient "
        'cudaComputeCapability "6.1", wanted >= "7.0"'
    )


def test_mps_config_parses_multi_user_and_limits_by_sorted_index() -> None:
    mps_config = {"multiUser": True, "defaultPinnedDeviceMemoryLimit": "2Gi",
                  "defaultPerDevicePinnedMemoryLimit": {"0": "1Gi"}}  # fmt: skip
    config = parse(
        {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
         "sharing": {"strategy": "MPS", "mpsConfig": mps_config}}
    )  # fmt: skip
    assert config.sharing is not None and config.sharing.multi_user
    spec = DaemonSpec(UID, ("gpu-1", "gpu-0"), (gpu_uuid(1), gpu_uuid(0)), (), config.sharing)
    # index 0 is the first of the sorted UUIDs, GPU-00000000-...
    assert spec.pinned_limits() == {gpu_uuid(0): "1024M", gpu_uuid(1): "2048M"}
    script = daemon_script(spec, chroot=True)
    assert script.startswith(
        "exec chroot /driver-root /bin/sh -c 'set -e\nexport CUDA_MPS_PIPE_DIRECTORY=/tmp/"
    )
    assert "\nnvidia-cuda-mps-control -d -M\n" in script
    assert (
        "\necho set_default_device_pinned_mem_limit GPU-00000000-1111-2222-3333-000000000000 1024M |"
        in script
    )
    assert "export PATH" not in script  # inside the driver root its own tools are on PATH
    with pytest.raises(ConfigError, match=r"^multiUser must be a boolean, got a string$"):
        parse({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
               "sharing": {"strategy": "MPS", "mpsConfig": {"multiUser": "yes"}}})  # fmt: skip


def test_held_daemons_come_from_the_checkpointed_sharing() -> None:
    summaries = [
        {"gpu-0": {"strategy": "MPS", "mpsControlDaemon": f"{UID}-abf3b"}},
        {"gpu-1": {"strategy": "TimeSlicing", "interval": "Long"}},
    ]
    assert held_daemons(summaries) == {f"{UID}-abf3b"}


class FakeApi:
    """Answers GET with the objects it holds and records every call."""

    def __init__(self, objects: dict[str, Any]) -> None:
        self.objects = objects
        self.calls: list[tuple[str, str]] = []

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        self.calls.append((method, path))
        return self.objects.get(path)


def daemons(tmp_path: Path, api: FakeApi, sleeps: list[float]) -> MpsDaemons:
    options = DeploymentOptions(namespace="nvidia-dra", image="img", node_name="node-a", driver_root="/",
                                feature_gates="MPSSupport=true")  # fmt: skip
    return MpsDaemons(
        api,  # type: ignore[arg-type]  # the two calls it makes, recorded
        plugin_dir=tmp_path,
        options=options,
        smi=NvidiaSmi(str(tmp_path / "driver-root")),
        simulated=True,
        sleep=sleeps.append,
    )


def test_not_ready_after_nvidias_backoff_is_nvidias_text(tmp_path: Path) -> None:
    name = f"mps-control-daemon-{UID}-abf3b"
    api = FakeApi({f"/apis/apps/v1/namespaces/nvidia-dra/deployments/{name}": {"status": {"replicas": 1}}})
    sleeps: list[float] = []
    with pytest.raises(MpsError) as err:
        daemons(tmp_path, api, sleeps).wait_ready(f"{UID}-abf3b")
    assert str(err.value) == (
        "MPS control daemon is not yet ready: waiting for MPS control daemon to come online; the kubelet "
        "will retry"
    )
    # 4 tries, 3 waits: 1 s, 2 s, 4 s, each times a jitter in [1, 2), at most 10 s
    assert len(sleeps) == 3 and len(api.calls) == 4
    assert 1 <= sleeps[0] <= 2 and 2 <= sleeps[1] <= 4 and 4 <= sleeps[2] <= 8


def test_ready_needs_one_pod_with_a_ready_container(tmp_path: Path) -> None:
    name = f"mps-control-daemon-{UID}-abf3b"
    pod = {"metadata": {"name": "p"}, "status": {"containerStatuses": [{"ready": True}]}}
    api = FakeApi(
        {
            f"/apis/apps/v1/namespaces/nvidia-dra/deployments/{name}": {"status": {"readyReplicas": 1}},
            "/api/v1/namespaces/nvidia-dra/pods": {"items": [pod, pod]},
        }
    )
    sleeps: list[float] = []
    with pytest.raises(MpsError, match=rf"\(expected 1 pod of {name}, found 2\)"):
        daemons(tmp_path, api, sleeps).wait_ready(f"{UID}-abf3b")
    api.objects["/api/v1/namespaces/nvidia-dra/pods"] = {"items": [pod]}
    daemons(tmp_path, api, sleeps).wait_ready(f"{UID}-abf3b")  # no error


def test_stop_does_nothing_when_the_daemon_directory_is_gone_and_resets_what_it_recorded(
    tmp_path: Path,
) -> None:
    api = FakeApi({})
    manager = daemons(tmp_path, api, [])
    manager.stop(f"{UID}-abf3b")
    assert api.calls == []  # NVIDIA's rule: no directory, no Stop
    log = tmp_path / "smi.log"
    fake_smi.install(tmp_path / "driver-root", log)
    dirs = DaemonDirs.of(tmp_path, f"{UID}-abf3b")
    dirs.pipe.mkdir(parents=True)
    (dirs.root / "daemon.json").write_text(json.dumps({"deployment": {}, "fullGpus": [gpu_uuid(0)]}))
    manager.stop(f"{UID}-abf3b")
    assert api.calls == [
        ("DELETE", f"/apis/apps/v1/namespaces/nvidia-dra/deployments/mps-control-daemon-{UID}-abf3b")
    ]
    assert fake_smi.compute_modes(log) == {gpu_uuid(0): "DEFAULT"}
    assert not dirs.root.exists()


# ---- a device's daemon shared by the claims holding a share of it (ConsumableShares, beyond NVIDIA) ------


def test_a_shared_device_gets_the_daemon_named_after_it_and_the_others_nvidias() -> None:
    gpus = make_gpus(3)
    devices = [DraDevice(f"gpu-{g.index}", g) for g in gpus]
    half = Sharing(MPS, thread_percentage=50)
    specs = daemon_specs(UID, devices, {d.name: half for d in devices}, shared=["gpu-0", "gpu-2"])
    # sha256(gpu_uuid(0))[:12], sha256(gpu_uuid(2))[:12]: one daemon per shared GPU, whatever claim asks
    assert [(s.id, s.devices, s.full_gpus) for s in specs] == [
        ("gpu-c3a6e328500d", ("gpu-0",), (gpu_uuid(0),)),
        (f"{UID}-3af14", ("gpu-1",), (gpu_uuid(1),)),  # held whole: NVIDIA's per-claim daemon
        ("gpu-4844d43f7835", ("gpu-2",), (gpu_uuid(2),)),
    ]
    assert daemon_id(UID, [gpu_uuid(1)]) == f"{UID}-3af14"
    other = daemon_specs("another-claim", devices[:1], {"gpu-0": half}, shared=["gpu-0"])
    assert [s.id for s in other] == ["gpu-c3a6e328500d"]


def test_the_daemon_id_is_not_part_of_the_config_two_sharers_compare() -> None:
    recorded = {
        "strategy": "MPS",
        "defaultActiveThreadPercentage": 50,
        "mpsControlDaemon": "gpu-c3a6e328500d",
    }
    assert config_of(recorded) == {"strategy": "MPS", "defaultActiveThreadPercentage": 50}
    assert config_of(None) is None


async def test_the_supervisor_stops_an_unheld_daemon_started_here_and_keeps_a_held_one(
    tmp_path: Path,
) -> None:
    """An unheld daemon whose directory is on this node (a sharer's Prepare rolled back) is stopped as
    Unprepare stops it; one no directory names is deleted by UID; a held one is left alone."""
    preparer, _ = make(tmp_path)
    base = "/apis/apps/v1/namespaces/nvidia-dra/deployments"
    listed = [
        {"metadata": {"name": f"mps-control-daemon-{d}", "uid": f"uid-{d}"},
         "spec": {"template": {"spec": {"nodeName": "node-a"}}}}
        for d in ("gpu-c3a6e328500d", "gpu-4844d43f7835", "gpu-000000000000")
    ]  # fmt: skip
    api = FakeApi({base: {"items": listed}})
    manager = daemons(tmp_path / "plugin", api, [])
    smi_log = tmp_path / "smi.log"
    fake_smi.install(tmp_path / "plugin" / "driver-root", smi_log)
    for daemon, gpu in (("gpu-c3a6e328500d", 0), ("gpu-4844d43f7835", 2)):
        dirs = manager.dirs(daemon)
        dirs.pipe.mkdir(parents=True)
        (dirs.root / "daemon.json").write_text(json.dumps({"deployment": {}, "fullGpus": [gpu_uuid(gpu)]}))
    held = {"gpu-2": {"strategy": "MPS", "mpsControlDaemon": "gpu-4844d43f7835"}}
    preparer.checkpoint.put(PreparedClaim("u1", "default", "c1", COMPLETED, (), held))
    await keep_once(preparer, manager)
    assert [c for c in api.calls if c[0] == "DELETE"] == [
        ("DELETE", f"{base}/mps-control-daemon-gpu-000000000000"),  # by UID: nothing of it here
        ("DELETE", f"{base}/mps-control-daemon-gpu-c3a6e328500d"),  # stopped
    ]
    assert fake_smi.compute_modes(smi_log) == {gpu_uuid(0): "DEFAULT"}
    assert not manager.dirs("gpu-c3a6e328500d").root.exists()
    assert manager.dirs("gpu-4844d43f7835").root.exists()

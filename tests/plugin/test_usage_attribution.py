"""Which container a GPU process belongs to, how long a holder has been idle, and the kubelet checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

from kubegpu.node.inventory import Gpu, MigDevice
from kubegpu.node.proc_cgroup import ContainerRef
from kubegpu.node.usage import DeviceUse, ProcessUse, UsageSample
from kubegpu.plugin.kubelet_checkpoint import PodContainer, read_device_pods
from kubegpu.plugin.telemetry import IdleClock
from kubegpu.plugin.usage_attribution import Holder, Owner, attribute

GPU = Gpu(0, "GPU-aaaa", "NVIDIA A100-SXM4-40GB", 40 << 30, 0, (8, 0), "00000000:07:00.0")
MIG = MigDevice("MIG-bbbb", 0, 3, 0, "3g.20gb", 20 << 30)
UID_A, UID_B, UID_C = "uid-a", "uid-b", "uid-c"
MIB = 1 << 20


def device(
    *processes: ProcessUse, uuid: str = GPU.uuid, mig: MigDevice | None = None, util: float | None = 0
) -> DeviceUse:
    return DeviceUse(uuid, GPU, mig, util, 0, 0, 0, 60, 33, 210, processes)


def holder(pod: str, container: str, device_id: str, uuid: str = GPU.uuid) -> Holder:
    return Holder("ns", pod, container, "nvidia.com/gpu", device_id, uuid)


# Two pods on replicas of one time-sliced GPU, as PodResources and the kubelet checkpoint say.
SHARED = [holder("a", "main", f"{GPU.uuid}::0"), holder("b", "main", f"{GPU.uuid}::1")]
SHARED_PODS = {
    ("nvidia.com/gpu", f"{GPU.uuid}::0"): PodContainer(UID_A, "main"),
    ("nvidia.com/gpu", f"{GPU.uuid}::1"): PodContainer(UID_B, "main"),
}


def test_processes_on_a_shared_gpu_go_to_the_pod_their_cgroup_names() -> None:
    d = device(ProcessUse(1, 300 * MIB, 40), ProcessUse(2, 100 * MIB, 10), ProcessUse(3, 50 * MIB, 5))
    containers = {
        1: ContainerRef(UID_A, "x" * 64),
        2: ContainerRef(UID_B, "y" * 64),
        3: ContainerRef(UID_C, ""),
    }
    (result,) = attribute([d], SHARED, containers, SHARED_PODS)
    assert {o: (u.used_bytes, u.sm_util, u.processes) for o, u in result.owners.items()} == {
        Owner("ns", "a", "main"): (300 * MIB, 40, 1),
        Owner("ns", "b", "main"): (100 * MIB, 10, 1),
    }
    # A pod that does not hold this GPU (or none at all) is counted apart, not dropped.
    assert (result.unattributed.processes, result.unattributed.used_bytes) == (1, 50 * MIB)


def test_without_a_readable_cgroup_only_a_lone_holder_owns_the_process() -> None:
    shared = device(ProcessUse(1, 300 * MIB, 40))
    (result,) = attribute([shared], SHARED, {}, SHARED_PODS)  # no host /proc: two holders, cannot tell
    assert result.owners == {} and result.unattributed.processes == 1
    exclusive = [holder("a", "main", GPU.uuid)]
    (result,) = attribute([shared], exclusive, {}, {})
    assert list(result.owners) == [Owner("ns", "a", "main")]
    # A cgroup that says "not in a pod" is believed even on an exclusive GPU.
    (result,) = attribute(
        [shared], exclusive, {1: None}, {("nvidia.com/gpu", GPU.uuid): PodContainer(UID_A, "main")}
    )
    assert result.owners == {} and result.unattributed.processes == 1


def test_two_containers_of_one_pod_on_one_gpu_count_for_the_pod() -> None:
    holders = [holder("a", "one", f"{GPU.uuid}::0"), holder("a", "two", f"{GPU.uuid}::1")]
    pods = {
        ("nvidia.com/gpu", f"{GPU.uuid}::0"): PodContainer(UID_A, "one"),
        ("nvidia.com/gpu", f"{GPU.uuid}::1"): PodContainer(UID_A, "two"),
    }
    (result,) = attribute([device(ProcessUse(1, MIB, 1))], holders, {1: ContainerRef(UID_A, "z" * 64)}, pods)
    assert list(result.owners) == [Owner("ns", "a", "")]


def test_mig_device_processes_are_their_holders_without_a_utilisation() -> None:
    mig = device(ProcessUse(9, 700 * MIB, None), uuid=MIG.uuid, mig=MIG)
    holders = [holder("m", "c", MIG.uuid, uuid=MIG.uuid), holder("g", "c", GPU.uuid)]
    (result,) = attribute(
        [mig], holders, {9: ContainerRef(UID_A, "")}, {("nvidia.com/gpu", MIG.uuid): PodContainer(UID_A, "c")}
    )
    (use,) = result.owners.values()
    assert (
        list(result.owners) == [Owner("ns", "m", "c")] and use.used_bytes == 700 * MIB and use.sm_util is None
    )


def test_idle_seconds_count_from_the_last_busy_sample_or_from_taking_the_device() -> None:
    now = [100.0]
    clock = IdleClock(5, clock=lambda: now[0])
    key = ("ns", "nb", "c", GPU.uuid)
    assert clock.idle_seconds([key]) == {key: 0.0}  # just seen holding it
    now[0] = 160.0
    clock.observe(UsageSample(150.0, (device(util=5),)))  # at the threshold: not busy
    assert clock.idle_seconds([key]) == {key: 60.0}
    clock.observe(UsageSample(160.0, (device(util=6),)))
    assert clock.idle_seconds([key]) == {key: 0.0}
    now[0] = 400.0
    assert clock.idle_seconds([key]) == {key: 240.0}
    clock.idle_seconds([])  # released
    assert clock.idle_seconds([key]) == {key: 0.0}  # taken again: from now, not from the old holder's time
    mig_busy = UsageSample(500.0, (device(ProcessUse(1, 1, None), uuid=MIG.uuid, mig=MIG, util=None),))
    mig_key = ("ns", "m", "c", MIG.uuid)
    clock.idle_seconds([mig_key])
    now[0] = 500.0
    clock.observe(mig_busy)
    assert clock.idle_seconds([mig_key]) == {mig_key: 0.0}  # a MIG device with a process is in use


def test_the_kubelet_checkpoint_names_the_pod_uid_of_each_device(tmp_path: Path) -> None:
    checkpoint = {
        "Data": {
            "PodDeviceEntries": [
                {
                    "PodUID": UID_A,
                    "ContainerName": "main",
                    "ResourceName": "nvidia.com/gpu",
                    "DeviceIDs": {"0": [f"{GPU.uuid}::0"], "1": [f"{GPU.uuid}::0"]},
                    "AllocResp": "",
                }
            ],
            "RegisteredDevices": {"nvidia.com/gpu": [f"{GPU.uuid}::0"]},
        },
        "Checksum": 1234,
    }
    (tmp_path / "kubelet_internal_checkpoint").write_text(json.dumps(checkpoint))
    assert read_device_pods(tmp_path) == {("nvidia.com/gpu", f"{GPU.uuid}::0"): PodContainer(UID_A, "main")}
    (tmp_path / "kubelet_internal_checkpoint").write_text('{"Data": null}')
    assert read_device_pods(tmp_path) == {}
    assert read_device_pods(tmp_path / "missing") == {}

"""GPU use: the fake NVML's telemetry calls as `inject` sets them, the NVML reader, and cgroup parsing."""

from __future__ import annotations

import string
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubegpu.node.discovery import discover, nvml_session
from kubegpu.node.nvml.fake import FakeNvml
from kubegpu.node.nvml.fake_state import StateDirError
from kubegpu.node.nvml.fake_usage import ProcessUse, UsageFile
from kubegpu.node.proc_cgroup import ContainerRef, parse_cgroup, read_container
from kubegpu.node.usage import UsageReader

POD_UID = "0f3c5a8e-1b2d-4e6f-8a9b-0c1d2e3f4a5b"
CONTAINER_ID = "a1b2c3d4e5f6" + "0" * 52
MIB = 1024 * 1024


@pytest.fixture
def a100_mig(tmp_path: Path) -> FakeNvml:
    fake = FakeNvml.from_profile("a100-mig", state_dir=tmp_path / "nvml")
    fake.nvmlInit()
    return fake


def inject(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kubegpu", "fake-nvml", "inject", "--state-dir", str(state), *args],
        capture_output=True,
        text=True,
    )


def test_inject_sets_use_that_the_fake_reports_through_nvml(a100_mig: FakeNvml) -> None:
    done = inject(
        a100_mig.state.path,
        *("--gpu", "1", "--utilization", "85", "--memory-util", "30", "--memory-used", "100"),
        *("--power", "250.5", "--temperature", "61", "--sm-clock", "1410"),
        *("--process", "4242:2048:60", "--process", "4343:1024"),
    )
    assert done.returncode == 0, done.stderr
    assert "on GPU 1" in done.stdout
    handle = a100_mig.nvmlDeviceGetHandleByIndex(1)
    rates = a100_mig.nvmlDeviceGetUtilizationRates(handle)
    assert (rates.gpu, rates.memory) == (85, 30)
    assert a100_mig.nvmlDeviceGetPowerUsage(handle) == 250500  # mW
    assert a100_mig.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU) == 61
    assert a100_mig.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM) == 1410
    memory = a100_mig.nvmlDeviceGetMemoryInfo(handle)
    assert memory.used == (2048 + 1024 + 100) * MIB and memory.free == memory.total - memory.used
    procs = a100_mig.nvmlDeviceGetComputeRunningProcesses(handle)
    assert [(p.pid, p.usedGpuMemory, p.gpuInstanceId) for p in procs] == [
        (4242, 2048 * MIB, 0xFFFFFFFF),
        (4343, 1024 * MIB, 0xFFFFFFFF),
    ]
    samples = a100_mig.nvmlDeviceGetProcessUtilization(handle, 0)
    assert sorted((s.pid, s.smUtil) for s in samples) == [(4242, 60), (4343, 0)]
    # Another GPU is untouched: idle, no processes, no per-process samples.
    other = a100_mig.nvmlDeviceGetHandleByIndex(2)
    assert a100_mig.nvmlDeviceGetUtilizationRates(other).gpu == 0
    assert a100_mig.nvmlDeviceGetComputeRunningProcesses(other) == []
    with pytest.raises(pynvml.NVMLError_NotFound):
        a100_mig.nvmlDeviceGetProcessUtilization(other, 0)


def test_inject_rejects_bad_use_with_a_clear_message(a100_mig: FakeNvml) -> None:
    state = a100_mig.state.path
    bad = inject(state, "--gpu", "0", "--process", "4242:lots")
    assert bad.returncode == 2 and "is not PID:MIB or PID:MIB:SM" in bad.stderr
    assert "over 100 %" in inject(state, "--gpu", "0", "--process", "1:2:101").stderr
    assert "--mps only goes with --process" in inject(state, "--gpu", "0", "--mps").stderr
    assert "needs --gpu INDEX" in inject(state, "--utilization", "5").stderr
    assert inject(state, "--gpu", "0", "--utilization", "101").returncode == 2


def test_mig_devices_report_their_own_processes_and_memory_but_not_utilisation(a100_mig: FakeNvml) -> None:
    with nvml_session(a100_mig):
        inventory = discover(a100_mig)
    gpu = next(g for g in inventory.gpus if g.mig_devices)
    mig_a, mig_b = gpu.mig_devices[:2]
    usage = UsageFile(a100_mig.state)
    usage.set_gpu(gpu.index, {}, [ProcessUse(7001, 1000)], gi=mig_a.gi)
    usage.set_gpu(gpu.index, {}, [ProcessUse(7002, 300, mps=True)], gi=mig_b.gi)
    handle_a = a100_mig.nvmlDeviceGetHandleByUUID(mig_a.uuid)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        a100_mig.nvmlDeviceGetUtilizationRates(handle_a)
    assert [p.pid for p in a100_mig.nvmlDeviceGetComputeRunningProcesses(handle_a)] == [7001]
    assert a100_mig.nvmlDeviceGetMemoryInfo(handle_a).used == 1000 * MIB

    sample = UsageReader(a100_mig).sample(inventory).by_uuid()
    a, b, whole = sample[mig_a.uuid], sample[mig_b.uuid], sample[gpu.uuid]
    assert a.mig == mig_a and a.utilization is None and a.fb_used_mib == 1000.0
    assert [(p.pid, p.used_bytes, p.sm_util) for p in a.processes] == [(7001, 1000 * MIB, None)]
    assert [p.pid for p in b.processes] == [7002]  # an MPS client, listed by the MPS call
    assert whole.processes == ()  # MIG processes are their MIG device's, not counted twice on the GPU
    assert whole.power_w == 60.0 and a.power_w == 60.0  # the parent's, as dcgm-exporter reports


def test_a_lost_gpu_gives_no_sample_and_the_others_still_do(a100_mig: FakeNvml) -> None:
    with nvml_session(a100_mig):
        inventory = discover(a100_mig)
    a100_mig.state.inject_lost(1)
    sampled = UsageReader(a100_mig).sample(inventory).by_uuid()
    assert inventory.gpus[1].uuid not in sampled and inventory.gpus[2].uuid in sampled


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # cgroup v1, cgroupfs driver
        (f"12:memory:/kubepods/burstable/pod{POD_UID}/{CONTAINER_ID}\n", ContainerRef(POD_UID, CONTAINER_ID)),
        (f"4:cpu:/kubepods/pod{POD_UID}/{CONTAINER_ID}\n", ContainerRef(POD_UID, CONTAINER_ID)),
        # cgroup v2, systemd driver: containerd, CRI-O, Docker
        (
            "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
            f"{POD_UID.replace('-', '_')}.slice/cri-containerd-{CONTAINER_ID}.scope\n",
            ContainerRef(POD_UID, CONTAINER_ID),
        ),
        (
            f"0::/kubepods.slice/kubepods-pod{POD_UID.replace('-', '_')}.slice/crio-{CONTAINER_ID}.scope\n",
            ContainerRef(POD_UID, CONTAINER_ID),
        ),
        (
            f"0::/kubepods.slice/kubepods-pod{POD_UID.replace('-', '_')}.slice/docker-{CONTAINER_ID}.scope\n",
            ContainerRef(POD_UID, CONTAINER_ID),
        ),
        # the pod's own cgroup (a process in the pause sandbox's parent): the pod, no container
        (f"0::/kubepods/burstable/pod{POD_UID}\n", ContainerRef(POD_UID, "")),
        # not in a pod
        ("0::/system.slice/containerd.service\n", None),
        ("0::/\n", None),
        ("", None),
    ],
)
def test_cgroup_paths_name_the_pod_and_container(text: str, expected: ContainerRef | None) -> None:
    assert parse_cgroup(text) == expected


@given(st.text(alphabet=string.printable, max_size=300))
def test_any_cgroup_text_parses_or_says_not_a_pod(text: str) -> None:
    ref = parse_cgroup(text)
    assert ref is None or (len(ref.pod_uid) == 36 and ref.pod_uid.count("-") == 4)


def test_an_unreadable_cgroup_is_unknown_not_an_error(tmp_path: Path) -> None:
    assert read_container(tmp_path, 4242) is None
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_bytes(b"\xff\xfe\x00garbage")
    assert read_container(tmp_path, 4242) is None


NOT_USE = "its gpus are not GPU use by GPU index"
TORN_USAGE = {
    "cut short": (
        b'{"gpus": {"0": {"utilization": 5',
        "is not JSON (Expecting ',' delimiter at line 1, column 33)",
    ),
    "not UTF-8": (b'{"gpus": {"0": {"utilization": 5\xff}}}', "is not UTF-8 text (byte 32)"),
    "a list": (b"[1, 2]", "is not a JSON object"),
    "a GPU's use a list": (b'{"gpus": {"0": [1]}}', f"{NOT_USE} (GPU 0's use is not a JSON object)"),
    "an unknown field": (
        b'{"gpus": {"0": {"processes": [{"pid": 1, "bogus": 1}]}}}',
        f"{NOT_USE} (ProcessUse.__init__() got an unexpected keyword argument 'bogus')",
    ),
}


@pytest.mark.parametrize("kind", list(TORN_USAGE))
def test_a_torn_usage_file_is_a_one_line_error_naming_it_and_the_fix(a100_mig: FakeNvml, kind: str) -> None:
    """As a torn faults.json is: `inject` exits 2 with one line (an internal error before), and the fake's
    telemetry calls raise StateDirError with the same text."""
    body, problem = TORN_USAGE[kind]
    state = a100_mig.state.path
    (state / "usage.json").write_bytes(body)
    expected = (
        f"fake NVML state file {state / 'usage.json'} {problem}; remove it (the fake NVML and the injector "
        "write it again)"
    )
    proc = inject(state, "--gpu", "0", "--utilization", "50")
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"Error: {expected} (see '")
    handle = a100_mig.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(StateDirError) as raised:
        a100_mig.nvmlDeviceGetUtilizationRates(handle)
    assert str(raised.value) == expected

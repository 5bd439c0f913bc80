"""The fake NVML: pynvml's API surface, profiles, fault injection across processes."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager
from importlib import resources
from pathlib import Path

import pynvml
import pytest
from click.testing import CliRunner

from kubegpu.node.nvml.backend import load_nvml
from kubegpu.node.nvml.fake import FakeNvml
from kubegpu.node.nvml.fake_cli import fake_nvml
from kubegpu.node.nvml.fake_profile import ProfileError, load_profile, parse_profile, profile_names
from kubegpu.node.nvml.fake_state import STATE_ENV, StateDir
from kubegpu.node.nvml.pci import device_handle_id
from kubegpu.settings.env import NvmlSelection
from kubegpu.settings.given import read_given
from kubegpu.settings.setting import PLUGIN
from kubegpu.settings.table import for_command

SHORT_MS = 30  # for waits that must time out: nothing is coming


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    path.mkdir()
    return path


def started(profile: str, state_dir: Path | None = None) -> FakeNvml:
    fake = FakeNvml.from_profile(profile, state_dir=state_dir)
    fake.nvmlInit()
    return fake


@pytest.fixture
def a100(state_dir: Path) -> Iterator[FakeNvml]:
    fake = started("a100-mig", state_dir)
    yield fake
    fake.nvmlShutdown()


def raises_nvml(code: int) -> AbstractContextManager[pytest.ExceptionInfo[pynvml.NVMLError]]:
    """Expect exactly pynvml's subclass for `code`, as real NVML raises it."""
    return pytest.raises(pynvml.NVMLError._valClassMapping[code])


def builtin_text(profile: str) -> str:
    return resources.files("kubegpu.node.nvml").joinpath("profiles", f"{profile}.yaml").read_text()


def cli(*args: str, state: Path | None = None) -> tuple[int, str]:
    env = {STATE_ENV: str(state)} if state else {}
    result = CliRunner().invoke(fake_nvml, list(args), env=env)
    return result.exit_code, result.output


# -- library and errors ---------------------------------------------------------------------------


def test_errors_are_pynvmls_own_classes_and_codes() -> None:
    fake = FakeNvml.from_profile("t4-pcie")
    with raises_nvml(pynvml.NVML_ERROR_UNINITIALIZED) as info:
        fake.nvmlDeviceGetCount()
    err = info.value
    assert type(err) is pynvml.NVMLError_Uninitialized
    assert err.value == pynvml.NVML_ERROR_UNINITIALIZED
    assert err == pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
    assert str(err) == str(pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED))


@pytest.mark.parametrize(
    ("profile", "cls", "code"),
    [
        ("no-driver", "NVMLError_DriverNotLoaded", pynvml.NVML_ERROR_DRIVER_NOT_LOADED),
        ("no-library", "NVMLError_LibraryNotFound", pynvml.NVML_ERROR_LIBRARY_NOT_FOUND),
    ],
)
def test_init_faults(profile: str, cls: str, code: int) -> None:
    fake = FakeNvml.from_profile(profile)
    for init in (fake.nvmlInit, lambda: fake.nvmlInitWithFlags(0)):
        with pytest.raises(getattr(pynvml, cls)) as info:
            init()
        assert info.value.value == code
    with raises_nvml(pynvml.NVML_ERROR_UNINITIALIZED):
        fake.nvmlShutdown()  # nothing was initialised
    assert profile in fake.description and "nvmlInit fails" in fake.description


def test_init_is_reference_counted_like_nvml() -> None:
    fake = FakeNvml.from_profile("t4-pcie")
    fake.nvmlInit()
    fake.nvmlInit()
    fake.nvmlShutdown()
    assert fake.nvmlDeviceGetCount() == 4
    fake.nvmlShutdown()
    with raises_nvml(pynvml.NVML_ERROR_UNINITIALIZED):
        fake.nvmlDeviceGetCount()
    with raises_nvml(pynvml.NVML_ERROR_UNINITIALIZED):
        fake.nvmlShutdown()


def test_system_calls() -> None:
    fake = started("dgx-a100")
    assert fake.nvmlSystemGetDriverVersion() == "550.90.07"
    assert fake.nvmlSystemGetCudaDriverVersion() == 12040
    assert fake.nvmlSystemGetCudaDriverVersion_v2() == 12040


def test_pynvml_names_pass_through_and_missing_functions_fail_like_an_old_driver() -> None:
    fake = started("t4-pcie")
    assert fake.NVML_ERROR_NOT_FOUND == pynvml.NVML_ERROR_NOT_FOUND
    assert fake.NVMLError is pynvml.NVMLError
    assert fake.nvmlEventTypeXidCriticalError == pynvml.nvmlEventTypeXidCriticalError
    with raises_nvml(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND):
        fake.nvmlDeviceGetFanSpeed(fake.nvmlDeviceGetHandleByIndex(0))
    with pytest.raises(AttributeError):
        _ = fake.nvmlNoSuchFunction


# -- devices --------------------------------------------------------------------------------------


def test_device_basics_use_pynvml_types() -> None:
    fake = started("t4-pcie")
    handle = fake.nvmlDeviceGetHandleByIndex(2)
    assert isinstance(handle, pynvml.c_nvmlDevice_t)
    assert fake.nvmlDeviceGetUUID(handle) == "GPU-baa5e932-166b-430c-b886-92b700c035ac"
    assert fake.nvmlDeviceGetName(handle) == "Tesla T4"
    assert fake.nvmlDeviceGetIndex(handle) == 2
    assert fake.nvmlDeviceGetMinorNumber(handle) == 2
    assert fake.nvmlDeviceGetCudaComputeCapability(handle) == (7, 5)
    memory = fake.nvmlDeviceGetMemoryInfo(handle)
    assert isinstance(memory, pynvml.c_nvmlMemory_t)
    assert memory.total == 15360 * 1024 * 1024
    pci = fake.nvmlDeviceGetPciInfo(handle)
    assert isinstance(pci, pynvml.nvmlPciInfo_t)
    assert pci.busId == "00000000:AF:00.0"  # a str, as real pynvml's struct decodes it
    assert pci.busIdLegacy == "0000:AF:00.0"
    assert (pci.domain, pci.bus, pci.device) == (0, 0xAF, 0)


def test_handles_behave_like_ctypes_pointers() -> None:
    fake = started("dgx-a100")
    first, again = fake.nvmlDeviceGetHandleByIndex(3), fake.nvmlDeviceGetHandleByIndex(3)
    assert first != again  # real handles do not compare equal either
    assert device_handle_id(first) == device_handle_id(again)
    by_uuid = fake.nvmlDeviceGetHandleByUUID(fake.nvmlDeviceGetUUID(first))
    by_bus = fake.nvmlDeviceGetHandleByPciBusId("0000:4e:00.0")
    assert device_handle_id(by_uuid) == device_handle_id(by_bus) == device_handle_id(first)
    with raises_nvml(pynvml.NVML_ERROR_INVALID_ARGUMENT):
        fake.nvmlDeviceGetHandleByIndex(8)
    with raises_nvml(pynvml.NVML_ERROR_NOT_FOUND):
        fake.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")
    with raises_nvml(pynvml.NVML_ERROR_INVALID_ARGUMENT):
        fake.nvmlDeviceGetUUID(ctypes.c_void_p(1))


def test_topology_and_nvlinks() -> None:
    fake = started("dgx-a100")
    h = [fake.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
    assert fake.nvmlDeviceGetTopologyCommonAncestor(h[0], h[1]) == pynvml.NVML_TOPOLOGY_MULTIPLE
    assert fake.nvmlDeviceGetTopologyCommonAncestor(h[0], h[3]) == pynvml.NVML_TOPOLOGY_NODE
    assert fake.nvmlDeviceGetTopologyCommonAncestor(h[0], h[7]) == pynvml.NVML_TOPOLOGY_SYSTEM
    states = [fake.nvmlDeviceGetNvLinkState(h[0], link) for link in range(12)]
    assert states == [pynvml.NVML_FEATURE_ENABLED] * 12
    types_ = {fake.nvmlDeviceGetNvLinkRemoteDeviceType(h[0], link) for link in range(12)}
    assert types_ == {pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH}
    assert fake.nvmlDeviceGetNvLinkRemotePciInfo(h[0], 0).busId == "00000000:C4:00.0"
    with raises_nvml(pynvml.NVML_ERROR_NOT_SUPPORTED):
        fake.nvmlDeviceGetNvLinkState(h[0], 12)  # past the A100's 12 links
    with raises_nvml(pynvml.NVML_ERROR_INVALID_ARGUMENT):
        fake.nvmlDeviceGetNvLinkState(h[0], pynvml.NVML_NVLINK_MAX_LINKS)

    t4 = started("t4-pcie")
    with raises_nvml(pynvml.NVML_ERROR_NOT_SUPPORTED):
        t4.nvmlDeviceGetNvLinkState(t4.nvmlDeviceGetHandleByIndex(0), 0)


def test_sysfs_numa_tree(tmp_path: Path) -> None:
    fake = started("t4-pcie", tmp_path)
    devices = fake.sysfs_root / "bus" / "pci" / "devices"
    assert (devices / "0000:3b:00.0" / "numa_node").read_text() == "0\n"
    assert (devices / "0000:d8:00.0" / "numa_node").read_text() == "1\n"
    assert fake.sysfs_root.is_relative_to(tmp_path)

    text = builtin_text("t4-pcie")
    no_numa = FakeNvml(parse_profile(text.replace("numa_node: 1", "numa_node: null"), "t4"))
    assert (no_numa.sysfs_root / "bus/pci/devices/0000:af:00.0/numa_node").read_text() == "-1\n"


def test_private_state_dir_is_removed_with_the_fake() -> None:
    fake = FakeNvml.from_profile("t4-pcie")
    path = fake.state.path
    assert (path / "sysfs").is_dir()
    del fake
    assert not path.exists()


# -- MIG ------------------------------------------------------------------------------------------


def test_mig_mode(a100: FakeNvml) -> None:
    enabled, disabled = a100.nvmlDeviceGetHandleByIndex(0), a100.nvmlDeviceGetHandleByIndex(3)
    assert a100.nvmlDeviceGetMigMode(enabled) == [pynvml.NVML_DEVICE_MIG_ENABLE] * 2
    assert a100.nvmlDeviceGetMigMode(disabled) == [pynvml.NVML_DEVICE_MIG_DISABLE] * 2
    assert a100.nvmlDeviceGetMaxMigDeviceCount(enabled) == 7
    t4 = started("t4-pcie")
    with raises_nvml(pynvml.NVML_ERROR_NOT_SUPPORTED):
        t4.nvmlDeviceGetMigMode(t4.nvmlDeviceGetHandleByIndex(0))


def test_mig_devices(a100: FakeNvml) -> None:
    parent = a100.nvmlDeviceGetHandleByIndex(2)
    mig = a100.nvmlDeviceGetMigDeviceHandleByIndex(parent, 1)
    with raises_nvml(pynvml.NVML_ERROR_NOT_FOUND):
        a100.nvmlDeviceGetMigDeviceHandleByIndex(parent, 3)  # an empty slot
    assert bool(a100.nvmlDeviceIsMigDeviceHandle(mig)) is True
    assert bool(a100.nvmlDeviceIsMigDeviceHandle(parent)) is False
    assert device_handle_id(a100.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)) == device_handle_id(
        parent
    )
    assert a100.nvmlDeviceGetUUID(mig) == "MIG-c071dfee-c905-445a-b14c-3df0e65d880d"
    assert a100.nvmlDeviceGetName(mig) == "NVIDIA A100-SXM4-40GB MIG 2g.10gb"
    assert (a100.nvmlDeviceGetGpuInstanceId(mig), a100.nvmlDeviceGetComputeInstanceId(mig)) == (5, 0)
    attrs = a100.nvmlDeviceGetAttributes(mig)
    assert isinstance(attrs, pynvml.c_nvmlDeviceAttributes)
    assert (attrs.gpuInstanceSliceCount, attrs.computeInstanceSliceCount, attrs.memorySizeMB) == (2, 2, 9856)
    assert a100.nvmlDeviceGetMemoryInfo(mig).total == 9856 * 1024 * 1024
    by_uuid = a100.nvmlDeviceGetHandleByUUID("MIG-c071dfee-c905-445a-b14c-3df0e65d880d")
    assert device_handle_id(by_uuid) == device_handle_id(mig)
    with raises_nvml(pynvml.NVML_ERROR_NOT_SUPPORTED):
        a100.nvmlDeviceGetGpuInstanceId(parent)
    with raises_nvml(pynvml.NVML_ERROR_NOT_SUPPORTED):
        a100.nvmlDeviceGetTopologyCommonAncestor(mig, parent)


def test_gpu_instance_profiles(a100: FakeNvml) -> None:
    parent = a100.nvmlDeviceGetHandleByIndex(0)
    info = a100.nvmlGpuInstanceGetInfo(a100.nvmlDeviceGetGpuInstanceById(parent, 7))
    assert (info.id, info.profileId) == (7, 19)
    me = a100.nvmlDeviceGetGpuInstanceProfileInfo(parent, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1)
    assert (me.id, me.name, me.sliceCount) == (20, "MIG 1g.5gb+me", 1)
    v1 = a100.nvmlDeviceGetGpuInstanceProfileInfo(parent, pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE, 1)
    assert isinstance(v1, pynvml.c_nvmlGpuInstanceProfileInfo_t)
    assert v1.memorySizeMB == 40192
    with raises_nvml(pynvml.NVML_ERROR_NOT_SUPPORTED):
        a100.nvmlDeviceGetGpuInstanceProfileInfo(parent, pynvml.NVML_GPU_INSTANCE_PROFILE_8_SLICE)
    with raises_nvml(pynvml.NVML_ERROR_NOT_FOUND):
        a100.nvmlDeviceGetGpuInstanceById(parent, 1)


# -- events ---------------------------------------------------------------------------------------

XID = pynvml.nvmlEventTypeXidCriticalError
ECC = pynvml.nvmlEventTypeSingleBitEccError | pynvml.nvmlEventTypeDoubleBitEccError


def event_set(fake: FakeNvml, gpus: list[int], types_: int = XID | ECC) -> object:
    es = fake.nvmlEventSetCreate()
    for gpu in gpus:
        fake.nvmlDeviceRegisterEvents(fake.nvmlDeviceGetHandleByIndex(gpu), types_, es)
    return es


def assert_no_event(fake: FakeNvml, es: object) -> None:
    with raises_nvml(pynvml.NVML_ERROR_TIMEOUT):
        fake.nvmlEventSetWait_v2(es, SHORT_MS)


def test_supported_events(a100: FakeNvml) -> None:
    mask = a100.nvmlDeviceGetSupportedEventTypes(a100.nvmlDeviceGetHandleByIndex(0))
    assert mask & XID and mask & ECC == ECC
    with raises_nvml(pynvml.NVML_ERROR_NOT_SUPPORTED):
        a100.nvmlDeviceRegisterEvents(a100.nvmlDeviceGetHandleByIndex(0), 1 << 40, a100.nvmlEventSetCreate())


def test_xid_event_reaches_the_wait(a100: FakeNvml) -> None:
    es = event_set(a100, [0, 1, 2, 3])
    a100.state.inject_xid(2, 48)
    data = a100.nvmlEventSetWait_v2(es, 5000)
    assert isinstance(data, pynvml.c_nvmlEventData_t)
    assert (data.eventType, data.eventData) == (XID, 48)
    assert (data.gpuInstanceId, data.computeInstanceId) == (0xFFFFFFFF, 0xFFFFFFFF)  # the whole GPU
    assert device_handle_id(data.device) == device_handle_id(a100.nvmlDeviceGetHandleByIndex(2))
    assert a100.nvmlDeviceGetUUID(data.device) == "GPU-0fc1cef9-414a-4851-9e15-3c8b3f8c10eb"
    assert_no_event(a100, es)  # delivered once
    a100.nvmlEventSetFree(es)
    with raises_nvml(pynvml.NVML_ERROR_INVALID_ARGUMENT):
        a100.nvmlEventSetWait(es, SHORT_MS)


def test_event_set_only_sees_later_events_for_registered_devices_and_types(a100: FakeNvml) -> None:
    a100.state.inject_xid(0, 13)  # before the set exists
    es = a100.nvmlEventSetCreate()
    a100.state.inject_xid(0, 31)  # before GPU 0 is registered
    a100.nvmlDeviceRegisterEvents(a100.nvmlDeviceGetHandleByIndex(0), XID, es)
    a100.state.inject_xid(1, 43)  # GPU 1 is not registered
    a100.state.inject_ecc(0, "single")  # ECC is not registered
    assert_no_event(a100, es)
    a100.state.inject_xid(0, 45)
    assert a100.nvmlEventSetWait_v2(es, 5000).eventData == 45


def test_every_event_set_gets_the_event_and_mig_ids_travel(a100: FakeNvml) -> None:
    sets = [event_set(a100, [0]), event_set(a100, [0])]
    a100.state.inject_xid(0, 94, gi=9, ci=0)
    for es in sets:
        data = a100.nvmlEventSetWait_v2(es, 5000)
        assert (data.eventData, data.gpuInstanceId, data.computeInstanceId) == (94, 9, 0)


def test_waiting_thread_wakes_up_for_an_event(a100: FakeNvml) -> None:
    es = event_set(a100, [1])
    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(a100.nvmlEventSetWait_v2(es, 5000).eventData))
    waiter.start()
    a100.state.inject_xid(1, 63)
    waiter.join(timeout=10)
    assert got == [63]


def test_injection_from_another_process(a100: FakeNvml, state_dir: Path) -> None:
    es = event_set(a100, [3])
    env = {**os.environ, STATE_ENV: str(state_dir)}
    done = subprocess.run(
        [sys.executable, "-m", "kubegpu.node.nvml.fake_cli", "inject", "--gpu", "3", "--xid", "79"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "XID 79 on GPU 3" in done.stdout
    data = a100.nvmlEventSetWait_v2(es, 5000)
    assert (data.eventData, a100.nvmlDeviceGetIndex(data.device)) == (79, 3)


def test_wait_error_fails_the_next_wait_only(a100: FakeNvml, state_dir: Path) -> None:
    es = event_set(a100, [0])
    assert cli("inject", "--wait-error", state=state_dir)[0] == 0
    with raises_nvml(pynvml.NVML_ERROR_UNKNOWN):
        a100.nvmlEventSetWait_v2(es, 5000)
    assert_no_event(a100, es)


def test_lost_gpu_and_recovery(a100: FakeNvml, state_dir: Path) -> None:
    es = event_set(a100, [0, 1])
    parent = a100.nvmlDeviceGetHandleByIndex(0)
    mig = a100.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    code, out = cli("inject", "--gpu", "0", "--lost", state=state_dir)
    assert code == 0, out
    data = a100.nvmlEventSetWait_v2(es, 5000)
    assert (data.eventType, data.eventData) == (XID, 79)
    assert device_handle_id(data.device) == device_handle_id(parent)
    lost_calls = [
        lambda: a100.nvmlDeviceGetUUID(data.device),
        lambda: a100.nvmlDeviceGetHandleByIndex(0),
        lambda: a100.nvmlDeviceGetHandleByUUID("GPU-a533beae-eed7-4075-9b77-c464441d6fff"),
        lambda: a100.nvmlDeviceGetMemoryInfo(parent),
        lambda: a100.nvmlDeviceGetNvLinkState(parent, 0),
        lambda: a100.nvmlDeviceGetUUID(mig),
        lambda: a100.nvmlDeviceGetTopologyCommonAncestor(a100.nvmlDeviceGetHandleByIndex(1), parent),
    ]
    for call in lost_calls:
        with raises_nvml(pynvml.NVML_ERROR_GPU_IS_LOST):
            call()
    assert a100.nvmlDeviceGetUUID(a100.nvmlDeviceGetHandleByIndex(1)).startswith("GPU-")
    assert a100.nvmlDeviceGetCount() == 4

    assert cli("inject", "--gpu", "0", "--recover", state=state_dir)[0] == 0
    assert a100.nvmlDeviceGetUUID(parent) == "GPU-a533beae-eed7-4075-9b77-c464441d6fff"
    assert a100.nvmlDeviceGetUUID(mig).startswith("MIG-")
    assert_no_event(a100, es)  # recovery raises no event


def test_fault_changes_are_all_seen(a100: FakeNvml) -> None:
    # Fault reads are cached on the file's identity; quick successive writes must each be noticed.
    handle = a100.nvmlDeviceGetHandleByIndex(1)
    for _ in range(20):
        a100.state.inject_lost(1)
        with raises_nvml(pynvml.NVML_ERROR_GPU_IS_LOST):
            a100.nvmlDeviceGetUUID(handle)
        a100.state.recover(1)
        assert a100.nvmlDeviceGetUUID(handle).startswith("GPU-")
    # Same size, possibly the same recycled inode, nothing read in between: still seen.
    a100.state.inject_lost(1)
    with raises_nvml(pynvml.NVML_ERROR_GPU_IS_LOST):
        a100.nvmlDeviceGetUUID(handle)
    a100.state.recover(1)
    a100.state.inject_lost(2)
    assert a100.nvmlDeviceGetUUID(handle).startswith("GPU-")


def test_ecc_errors_and_recovery_probes(a100: FakeNvml, state_dir: Path) -> None:
    es = event_set(a100, [1])
    handle = a100.nvmlDeviceGetHandleByIndex(1)
    assert a100.nvmlDeviceGetRemappedRows(handle) == (0, 0, 0, 0)
    assert cli("inject", "--gpu", "1", "--ecc", "double", state=state_dir)[0] == 0
    assert a100.nvmlEventSetWait_v2(es, 5000).eventType == pynvml.nvmlEventTypeDoubleBitEccError
    assert a100.nvmlDeviceGetRemappedRows(handle) == (0, 1, 1, 0)
    uncorrected = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    assert a100.nvmlDeviceGetTotalEccErrors(handle, uncorrected, pynvml.NVML_VOLATILE_ECC) == 1
    with raises_nvml(pynvml.NVML_ERROR_NOT_SUPPORTED):
        a100.nvmlDeviceGetRetiredPagesPendingStatus(handle)  # A100s remap rows instead
    cli("inject", "--gpu", "1", "--recover", state=state_dir)
    assert a100.nvmlDeviceGetRemappedRows(handle) == (0, 1, 0, 0)


def test_page_retirement_on_older_gpus(state_dir: Path) -> None:
    t4 = started("t4-pcie", state_dir)
    handle = t4.nvmlDeviceGetHandleByIndex(0)
    assert t4.nvmlDeviceGetRetiredPagesPendingStatus(handle) == pynvml.NVML_FEATURE_DISABLED
    t4.state.inject_ecc(0, "double")
    assert t4.nvmlDeviceGetRetiredPagesPendingStatus(handle) == pynvml.NVML_FEATURE_ENABLED
    with raises_nvml(pynvml.NVML_ERROR_NOT_SUPPORTED):
        t4.nvmlDeviceGetRemappedRows(handle)


# -- CLI ------------------------------------------------------------------------------------------


def test_cli_profiles() -> None:
    code, out = cli("profiles", "--json")
    assert code == 0
    listed = json.loads(out)
    assert [p["name"] for p in listed] == profile_names()
    assert {"dgx-a100", "dgx1-volta", "hgx-h100", "a100-mig", "t4-pcie", "no-driver", "no-library"} <= set(
        profile_names()
    )
    assert next(p for p in listed if p["name"] == "dgx1-volta")["gpus"] == "8x Tesla V100-SXM2-16GB"
    code, out = cli("profiles")
    assert code == 0 and "hgx-h100" in out


def test_cli_inject_needs_a_state_dir(tmp_path: Path) -> None:
    code, out = cli("inject", "--gpu", "0", "--xid", "48")
    assert code == 2 and f"{STATE_ENV} is not set" in out
    code, out = cli("inject", "--gpu", "0", "--xid", "48", state=tmp_path / "typo")
    assert code == 2 and "does not exist" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpu", "0"], "exactly one of"),
        (["--gpu", "0", "--xid", "48", "--lost"], "exactly one of"),
        (["--xid", "48"], "--xid needs --gpu"),
        (["--gpu", "0", "--wait-error"], "drop --gpu"),
        (["--gpu", "0", "--lost", "--gi", "1"], "--gi only goes with --xid or --process"),
        (["--gpu", "4", "--xid", "48"], "has no GPU 4: use 0..3"),
    ],
)
def test_cli_inject_rejects_bad_arguments(
    a100: FakeNvml, state_dir: Path, args: list[str], message: str
) -> None:
    code, out = cli("inject", *args, state=state_dir)
    assert code == 2 and message in out, out
    assert not (state_dir / "events.jsonl").exists()


# -- profiles and backend selection ---------------------------------------------------------------


def test_load_profile_by_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("description: empty node\n")
    name, profile = load_profile(str(path))
    assert (name, profile.gpus, profile.description) == ("mine", [], "empty node")


T4_GPU = (
    "{model: t4, uuid: GPU-0eaadbe4-c44f-4826-a1a6-b9dd837b9509, pci_bus_id: '00000000:3B:00.0', "
    "minor: 0, pcie: {cpu: 0, host_bridge: rc0}}"
)
T4_MIG_GPU = T4_GPU.replace("minor: 0", "minor: 0, mig: {enabled: true}")
T4_MODEL = "models: {t4: {name: Tesla T4, memory_mib: 15360, compute_capability: '7.5', multiprocessors: 40}}"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("gpus: []\n", "description: a required field is missing"),
        ("description: x\nbogus: 1\n", "bogus: unknown field"),
        (
            f"description: x\n{T4_MODEL}\ngpus: [{T4_GPU.replace('minor: 0', 'minor: -1')}]\n",
            "gpus[0].minor: Expected `int` >= 0",
        ),
        ("description: x\nnvlink: {switches: [zz]}\n", "nvlink: switches: not a PCI bus id: 'zz'"),
        (f"description: x\ngpus: [{T4_GPU}]\n", "gpus[0].model: unknown model 't4'"),
        (f"description: x\n{T4_MODEL}\ngpus: [{T4_GPU.replace('GPU-0e', 'GPU-0E')}]\n", "gpus[0].uuid"),
        (f"description: x\n{T4_MODEL}\ngpus: [{T4_GPU}, {T4_GPU}]\n", "duplicate uuid"),
        (
            f"description: x\n{T4_MODEL}\ngpus: [{T4_MIG_GPU}]\n",
            "gpus[0].mig.enabled: model t4 is not MIG capable",
        ),
        (
            f"description: x\n{T4_MODEL}\ngpus: [{T4_GPU}]\nnvlink: {{switches: ['00000000:C4:00.0'], "
            "switch_links_per_gpu: 2}\n",
            "GPU 0 uses 2 NVLinks but model t4 has 0",
        ),
        ("description: x\ninit_error: DRIVER_GONE\n", "init_error: 'DRIVER_GONE' is not an NVML error name"),
        ("description: [unclosed\n", "not valid YAML"),
        ("- a list\n", "must be a YAML mapping"),
    ],
)
def test_invalid_profiles_name_the_field(body: str, message: str) -> None:
    with pytest.raises(ProfileError) as info:
        parse_profile(body, "test.yaml")
    assert message in str(info.value)
    assert "test.yaml" in str(info.value)


def test_invalid_mig_layouts() -> None:
    text = builtin_text("a100-mig")
    unknown = text.replace("{profile: 3g.20gb, gi: 2,", "{profile: 9g.40gb, gi: 2,")
    with pytest.raises(ProfileError, match=r"gpus\[1\]\.mig\.devices\[1\]\.profile: '9g.40gb' is not"):
        parse_profile(unknown, "x")
    too_big = text.replace("{profile: 1g.5gb, gi: 7,", "{profile: 2g.10gb, gi: 7,")
    with pytest.raises(
        ProfileError, match=r"gpus\[0\]\.mig\.devices: GPU instances take 8 slices, the GPU has 7"
    ):
        parse_profile(too_big, "x")
    shared_gi = text.replace("{profile: 1g.5gb, gi: 8,", "{profile: 1g.5gb, gi: 7,")
    with pytest.raises(ProfileError, match="duplicate MIG gi/ci"):
        parse_profile(shared_gi, "x")


def test_unknown_profile_name_lists_the_known_ones() -> None:
    with pytest.raises(ProfileError, match="unknown fake NVML profile 'dgx-z9': use one of a100-mig, "):
        load_profile("dgx-z9")


def test_load_nvml_real(tmp_path: Path) -> None:
    backend = load_nvml()
    assert backend.nvml is pynvml and not backend.is_fake
    assert backend.sysfs_root == Path("/sys")
    assert "nvidia-ml-py" in backend.description
    selection = NvmlSelection.from_given(
        read_given(for_command(PLUGIN), {}, {"KUBEGPU_SYSFS_ROOT": str(tmp_path)})
    )
    assert load_nvml(selection).sysfs_root == tmp_path


def test_load_nvml_fake(state_dir: Path) -> None:
    env = {"KUBEGPU_FAKE_NVML": "hgx-h100", "KUBEGPU_FAKE_NVML_STATE": str(state_dir)}
    backend = load_nvml(NvmlSelection.from_given(read_given(for_command(PLUGIN), {}, env)))
    assert backend.is_fake and isinstance(backend.nvml, FakeNvml)
    assert backend.sysfs_root == state_dir / "sysfs"
    assert "hgx-h100" in backend.description and "8x NVIDIA H100 80GB HBM3" in backend.description
    assert json.loads((state_dir / "meta.json").read_text())["profile"] == "hgx-h100"
    with pytest.raises(ProfileError):
        load_nvml(NvmlSelection.fake("no-such-profile"))


def test_real_pynvml_without_the_library_raises_library_not_found() -> None:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        pass
    else:
        pytest.skip("libnvidia-ml.so.1 is present on this machine")
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        load_nvml().nvml.nvmlInit()


def test_flaky_gpu_fails_some_calls_until_recovered(state_dir: Path) -> None:
    fake = started("t4-pcie", state_dir)
    state = StateDir(state_dir)
    handle = fake.nvmlDeviceGetHandleByIndex(1)
    state.inject_flaky(1, 0.5)
    outcomes = []
    for _ in range(200):
        try:
            fake.nvmlDeviceGetMemoryInfo(handle)
            outcomes.append(True)
        except pynvml.NVMLError_Unknown:
            outcomes.append(False)
    # About half (100 +- 7): one draw per call. Two draws per call (the handle checked twice) fail 150 of 200,
    # outside this range; so do all and none. Outside it by chance: about once in 30,000 runs.
    assert 70 < outcomes.count(False) < 130
    state.recover(1)
    for _ in range(50):
        fake.nvmlDeviceGetMemoryInfo(handle)
    fake.nvmlDeviceGetMemoryInfo(fake.nvmlDeviceGetHandleByIndex(0))  # other GPUs were never affected
    with pytest.raises(ValueError, match="between 0 and 1"):
        state.inject_flaky(1, 2.0)

"""Discovery on every fake node profile, and its tolerance of what real nodes do wrong."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

import pynvml
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubegpu.node.discovery import discover, explain_nvml_error, numa_node, nvml_session
from kubegpu.node.discovery_mig import mig_memory_gb
from kubegpu.node.inventory import Inventory, LinkLevel
from kubegpu.node.nvml.backend import NvmlBackend, load_nvml
from kubegpu.node.nvml.fake import FakeNvml
from kubegpu.node.nvml.fake_profile import parse_profile
from kubegpu.node.nvml.pci import device_handle_id, sysfs_bus_id
from kubegpu.settings.env import NvmlSelection

GIB = 1024**3
MIB = 1024**2

DGX1_NVLINKS = {
    (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2, (2, 3): 2,
    (2, 6): 1, (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2, (5, 7): 1, (6, 7): 2,
}  # fmt: skip


def discovered(profile: str) -> Inventory:
    backend = load_nvml(NvmlSelection.fake(profile))
    with nvml_session(backend):
        return discover(backend)


def fake_session(fake: FakeNvml) -> Inventory:
    with nvml_session(fake):
        return discover(fake, fake.sysfs_root)


def nvlinks(inventory: Inventory) -> dict[tuple[int, int], int]:
    return {(link.a, link.b): link.nvlinks for link in inventory.links}


def levels(inventory: Inventory) -> dict[tuple[int, int], LinkLevel]:
    return {(link.a, link.b): link.level for link in inventory.links}


ALL_PAIRS_8 = {(a, b) for a in range(8) for b in range(a + 1, 8)}


# -- what every profile discovers to --------------------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "name", "memory_mib", "cc", "numa", "mig_capable"),
    [
        ("dgx-a100", "NVIDIA A100-SXM4-40GB", 40960, (8, 0), [0, 0, 0, 0, 1, 1, 1, 1], True),
        ("dgx1-volta", "Tesla V100-SXM2-16GB", 16160, (7, 0), [0, 0, 0, 0, 1, 1, 1, 1], False),
        ("hgx-h100", "NVIDIA H100 80GB HBM3", 81559, (9, 0), [0, 0, 0, 0, 1, 1, 1, 1], True),
        ("a100-mig", "NVIDIA A100-SXM4-40GB", 40960, (8, 0), [0, 0, 1, 1], True),
        ("t4-pcie", "Tesla T4", 15360, (7, 5), [0, 0, 1, 1], False),
    ],
)
def test_profile_gpus(
    profile: str, name: str, memory_mib: int, cc: tuple[int, int], numa: list[int], mig_capable: bool
) -> None:
    inv = discovered(profile)
    assert [g.index for g in inv.gpus] == list(range(len(numa)))
    assert [g.numa_node for g in inv.gpus] == numa
    assert {g.name for g in inv.gpus} == {name}
    assert {g.memory_bytes for g in inv.gpus} == {memory_mib * MIB}
    assert {g.compute_capability for g in inv.gpus} == {cc}
    assert {g.mig_capable for g in inv.gpus} == {mig_capable}
    assert all(g.uuid.startswith("GPU-") and g.health.healthy for g in inv.gpus)
    assert len({g.uuid for g in inv.gpus}) == len(inv.gpus)
    assert (inv.driver_version, inv.cuda_driver_version) == ("550.90.07", "12.4")
    n = len(numa)
    assert len(inv.links) == n * (n - 1) // 2


def test_dgx1_hybrid_cube_mesh() -> None:
    inv = discovered("dgx1-volta")
    assert nvlinks(inv) == {pair: DGX1_NVLINKS.get(pair, 0) for pair in ALL_PAIRS_8}
    lv = levels(inv)
    assert (lv[(0, 1)], lv[(0, 2)], lv[(0, 4)], lv[(6, 7)]) == (
        LinkLevel.SINGLE,
        LinkLevel.NODE,
        LinkLevel.SYSTEM,
        LinkLevel.SINGLE,
    )


@pytest.mark.parametrize(("profile", "links"), [("dgx-a100", 12), ("hgx-h100", 18)])
def test_nvswitch_systems_link_every_pair(profile: str, links: int) -> None:
    inv = discovered(profile)
    assert nvlinks(inv) == dict.fromkeys(ALL_PAIRS_8, links)
    lv = levels(inv)
    assert all(lv[(a, b)] == LinkLevel.SYSTEM for a, b in ALL_PAIRS_8 if (a < 4) != (b < 4))


def test_dgx_a100_pcie_levels() -> None:
    lv = levels(discovered("dgx-a100"))
    assert (lv[(0, 1)], lv[(0, 2)], lv[(2, 3)], lv[(3, 4)]) == (
        LinkLevel.MULTIPLE,
        LinkLevel.NODE,
        LinkLevel.MULTIPLE,
        LinkLevel.SYSTEM,
    )


def test_h100_minor_numbers_are_not_the_index() -> None:
    inv = discovered("hgx-h100")
    assert [g.minor for g in inv.gpus] == [2, 3, 0, 1, 6, 7, 4, 5]
    assert inv.gpus[0].device_path == "/dev/nvidia2"


def test_t4_pcie_only() -> None:
    inv = discovered("t4-pcie")
    assert nvlinks(inv) == dict.fromkeys([(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)], 0)
    assert levels(inv) == {
        (0, 1): LinkLevel.SINGLE,
        (0, 2): LinkLevel.SYSTEM,
        (0, 3): LinkLevel.SYSTEM,
        (1, 2): LinkLevel.SYSTEM,
        (1, 3): LinkLevel.SYSTEM,
        (2, 3): LinkLevel.NODE,
    }
    assert [g.pci_bus_id for g in inv.gpus][:2] == ["00000000:3B:00.0", "00000000:3C:00.0"]


def test_a100_mig_devices() -> None:
    inv = discovered("a100-mig")
    g0, g1, g2, g3 = inv.gpus
    assert [(g.mig_capable, g.mig_enabled) for g in inv.gpus] == [(True, True)] * 3 + [(True, False)]
    assert [(m.index, m.gi, m.ci, m.profile) for m in g0.mig_devices] == [
        (i, 7 + i, 0, "1g.5gb") for i in range(7)
    ]
    assert {m.memory_bytes for m in g0.mig_devices} == {4864 * MIB}
    assert [m.profile for m in g1.mig_devices] == ["3g.20gb", "3g.20gb"]
    assert [(m.index, m.gi, m.profile) for m in g2.mig_devices] == [
        (0, 1, "3g.20gb"),
        (1, 5, "2g.10gb"),
        (2, 13, "1g.5gb"),
    ]
    assert g2.mig_devices[1].uuid == "MIG-c071dfee-c905-445a-b14c-3df0e65d880d"
    assert g3.mig_devices == ()
    assert nvlinks(inv) == dict.fromkeys([(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)], 4)


H100_MODEL = """
  h100:
    name: NVIDIA H100 80GB HBM3
    memory_mib: 81559
    compute_capability: "9.0"
    multiprocessors: 132
    mig:
      profiles:
        - {name: 1g.10gb, index: 0, id: 19, slices: 1, instances: 7, memory_mib: 9984, multiprocessors: 16}
        - {name: 1g.10gb+me, index: 7, id: 20, slices: 1, instances: 1, memory_mib: 9984, multiprocessors: 16}
        - {name: 1g.10gb-me, index: 13, id: 26, slices: 1, instances: 1, memory_mib: 9984,
           multiprocessors: 16}
        - {name: 1g.10gb+me.all, index: 15, id: 27, slices: 1, instances: 1, memory_mib: 9984,
           multiprocessors: 16}
        - {name: 2g.20gb, index: 1, id: 14, slices: 2, instances: 3, memory_mib: 20096, multiprocessors: 32}
        - {name: 3g.40gb, index: 2, id: 9, slices: 3, instances: 2, memory_mib: 40320, multiprocessors: 60}
        - {name: 7g.80gb, index: 4, id: 0, slices: 7, instances: 1, memory_mib: 80896, multiprocessors: 132}
"""

MIG_ATTRIBUTES_PROFILE = f"""
description: MIG profile names with attributes and compute-instance splits
models:
{H100_MODEL}
gpus:
  - model: h100
    uuid: GPU-11111111-1111-4111-8111-111111111111
    pci_bus_id: "00000000:18:00.0"
    minor: 0
    pcie: {{cpu: 0, host_bridge: rc0}}
    mig:
      enabled: true
      devices:
        - {{profile: 1g.10gb+me, gi: 9, uuid: MIG-11111111-1111-4111-8111-000000000001}}
        - profile: 2g.20gb  # two compute instances of one slice each in one GPU instance
          gi: 3
          compute_slices: 1
          uuid: MIG-11111111-1111-4111-8111-000000000002
        - profile: 2g.20gb
          gi: 3
          ci: 1
          compute_slices: 1
          uuid: MIG-11111111-1111-4111-8111-000000000003
        - {{profile: 1g.10gb-me, gi: 10, uuid: MIG-11111111-1111-4111-8111-000000000004}}
        - {{profile: 1g.10gb+me.all, gi: 11, uuid: MIG-11111111-1111-4111-8111-000000000005}}
        - {{profile: 1g.10gb, gi: 12, uuid: MIG-11111111-1111-4111-8111-000000000006}}
  - model: h100
    uuid: GPU-22222222-2222-4222-8222-222222222222
    pci_bus_id: "00000000:2A:00.0"
    minor: 1
    pcie: {{cpu: 0, host_bridge: rc1}}
    mig:
      enabled: true
      devices:
        - {{profile: 7g.80gb, gi: 0, uuid: MIG-22222222-2222-4222-8222-000000000001}}
"""


@pytest.fixture
def mig_fake() -> FakeNvml:
    return FakeNvml(parse_profile(MIG_ATTRIBUTES_PROFILE, "mig-attributes"))


def test_mig_profile_names_follow_go_nvlib(mig_fake: FakeNvml) -> None:
    g0, g1 = fake_session(mig_fake).gpus
    assert [(m.gi, m.ci, m.profile) for m in g0.mig_devices] == [
        (9, 0, "1g.10gb+me"),
        (3, 0, "1c.2g.20gb"),
        (3, 1, "1c.2g.20gb"),
        (10, 0, "1g.10gb-me"),
        (11, 0, "1g.10gb+me.all"),
        (12, 0, "1g.10gb"),
    ]
    assert [m.profile for m in g1.mig_devices] == ["7g.80gb"]  # 79 GiB: a plain ceil would say 79gb
    assert [g.numa_node for g in (g0, g1)] == [None, None]  # no numa_node in the profile: sysfs says -1


def test_mig_profile_without_permission_loses_only_the_suffix(
    mig_fake: FakeNvml, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def denied(*args: Any) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)

    monkeypatch.setattr(mig_fake, "nvmlDeviceGetGpuInstanceById", denied)
    g0 = fake_session(mig_fake).gpus[0]
    assert [m.profile for m in g0.mig_devices][:2] == ["1g.10gb", "1c.2g.20gb"]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2  # once for each GPU, not for each MIG device
    assert "cannot read the profile of GPU instance 9" in warnings[0].getMessage()


@pytest.mark.parametrize(
    ("mig_mib", "gpu_mib", "gb"),
    [
        (4864, 40960, 5),
        (9856, 40960, 10),
        (19968, 40960, 20),
        (40192, 40960, 40),
        (9984, 81559, 10),
        (20096, 81559, 20),
        (40320, 81559, 40),
        (80896, 81559, 80),
    ],
)
def test_mig_memory_gb(mig_mib: int, gpu_mib: int, gb: int) -> None:
    assert mig_memory_gb(mig_mib, gpu_mib * MIB) == gb


# -- faults and partial failures ------------------------------------------------------------------


def test_gpu_lost_before_discovery_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNvml.from_profile("dgx-a100")
    fake.state.inject_lost(5)
    inv = fake_session(fake)
    assert [g.index for g in inv.gpus] == [0, 1, 2, 3, 4, 6, 7]
    assert all(5 not in (link.a, link.b) for link in inv.links)
    assert len(inv.links) == 21
    assert "skipping GPU index=5" in caplog.text


def test_gpu_lost_while_reading_links(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeNvml.from_profile("dgx1-volta")
    real = fake.nvmlDeviceGetNvLinkState

    def falls_off_the_bus(device: Any, link: int) -> int:
        if fake.nvmlDeviceGetIndex(device) == 3:  # raises once GPU 3 is lost, like the rest
            fake.state.inject_lost(3)
        return real(device, link)

    monkeypatch.setattr(fake, "nvmlDeviceGetNvLinkState", falls_off_the_bus)
    inv = fake_session(fake)
    assert len(inv.gpus) == 8
    gpu3 = inv.gpus[3]
    assert not gpu3.health.healthy and "GPU is lost" in (gpu3.health.reason or "")
    assert all(g.health.healthy for g in inv.gpus if g.index != 3)
    expected = {p: DGX1_NVLINKS.get(p, 0) for p in ALL_PAIRS_8 if 3 not in p}
    assert nvlinks(inv) == expected
    assert "index=3" in caplog.text and "leaving out its links" in caplog.text


def test_unreadable_basic_property_marks_the_gpu_unhealthy(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml.from_profile("t4-pcie")
    real = fake.nvmlDeviceGetMinorNumber

    def flaky(handle: Any) -> int:
        if fake.nvmlDeviceGetIndex(handle) == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return real(handle)

    monkeypatch.setattr(fake, "nvmlDeviceGetMinorNumber", flaky)
    gpus = fake_session(fake).gpus
    assert not gpus[1].health.healthy and "minor number" in (gpus[1].health.reason or "")
    assert gpus[1].uuid == "GPU-5916575e-0280-41c6-9dbf-ffef04648c1d" and gpus[1].numa_node == 0
    assert [g.health.healthy for g in gpus] == [True, False, True, True]


def test_unreadable_mig_device_is_skipped(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeNvml.from_profile("a100-mig")
    real = fake.nvmlDeviceGetAttributes

    def flaky(handle: Any) -> Any:
        if fake.nvmlDeviceGetUUID(handle) == "MIG-c071dfee-c905-445a-b14c-3df0e65d880d":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return real(handle)

    monkeypatch.setattr(fake, "nvmlDeviceGetAttributes", flaky)
    gpu2 = fake_session(fake).gpus[2]
    assert [(m.index, m.profile) for m in gpu2.mig_devices] == [(0, "3g.20gb"), (2, "1g.5gb")]
    assert "skipping MIG device 2:1" in caplog.text


def test_discover_accepts_backend_or_bare_api() -> None:
    fake = FakeNvml.from_profile("t4-pcie")
    backend = NvmlBackend(fake, fake.sysfs_root, is_fake=True, description="t4")
    with nvml_session(backend) as api:
        assert api is fake
        assert discover(backend) == discover(fake, fake.sysfs_root)
        assert [g.numa_node for g in discover(fake, Path("/nonexistent")).gpus] == [None] * 4
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()  # the session shut NVML down


@pytest.mark.parametrize(
    ("profile", "error"),
    [("no-driver", "NVMLError_DriverNotLoaded"), ("no-library", "NVMLError_LibraryNotFound")],
)
def test_init_failure_propagates_from_the_session(profile: str, error: str) -> None:
    backend = load_nvml(NvmlSelection.fake(profile))
    with pytest.raises(getattr(pynvml, error)), nvml_session(backend):
        pytest.fail("the session must not start")


def test_event_device_is_recognisable_after_the_gpu_is_lost() -> None:
    fake = FakeNvml.from_profile("dgx-a100")
    with nvml_session(fake):
        handles = {device_handle_id(fake.nvmlDeviceGetHandleByIndex(i)): i for i in range(8)}
        es = fake.nvmlEventSetCreate()
        for i in range(8):
            fake.nvmlDeviceRegisterEvents(
                fake.nvmlDeviceGetHandleByIndex(i), pynvml.nvmlEventTypeXidCriticalError, es
            )
        fake.state.inject_lost(6)
        event = fake.nvmlEventSetWait_v2(es, 5000)
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            fake.nvmlDeviceGetUUID(event.device)
        assert handles[device_handle_id(event.device)] == 6


# -- errors explained -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, ["kernel driver isn't loaded", "modprobe nvidia"]),
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, ["libnvidia-ml.so.1 not found", "runtimeClassName: nvidia"]),
        (pynvml.NVML_ERROR_NO_PERMISSION, ["privileged"]),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, ["reboot"]),
        (pynvml.NVML_ERROR_GPU_IS_LOST, ["fallen off the bus"]),
        (pynvml.NVML_ERROR_MEMORY, ["nvidia-smi"]),
    ],
)
def test_explain_nvml_error(code: int, words: list[str]) -> None:
    text = explain_nvml_error(pynvml.NVMLError(code))
    for word in words:
        assert word in text
    assert f"NVML error {code}: {pynvml.NVMLError(code)}" in text


# -- sysfs ----------------------------------------------------------------------------------------


@given(
    domain=st.integers(0, 0xFFFF),
    bus=st.integers(0, 0xFF),
    device=st.integers(0, 0x1F),
    function=st.integers(0, 7),
)
def test_sysfs_bus_id_matches_nvidias_rule(domain: int, bus: int, device: int, function: int) -> None:
    nvml_id = f"{domain:08X}:{bus:02X}:{device:02X}.{function}"
    # NVIDIA's plugin: strip the leading "0000" of the 8-digit domain, lower-case.
    assert sysfs_bus_id(nvml_id) == nvml_id.removeprefix("0000").lower()
    assert sysfs_bus_id(sysfs_bus_id(nvml_id)) == sysfs_bus_id(nvml_id)


def test_sysfs_bus_id_examples() -> None:
    assert sysfs_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert sysfs_bus_id("00010000:01:00.1") == "10000:01:00.1"  # VMD-style 32-bit domain
    with pytest.raises(ValueError, match="not a PCI bus id"):
        sysfs_bus_id("3B:00")


@given(node=st.one_of(st.integers(-3, 64).map(str), st.sampled_from(["", "x", " 2\n", "-1\n"])))
def test_numa_node_from_sysfs(node: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        directory = root / "bus/pci/devices/0000:3b:00.0"
        directory.mkdir(parents=True)
        (directory / "numa_node").write_text(node)
        value = numa_node(root, "00000000:3B:00.0")
        try:
            expected: int | None = int(node.strip())
        except ValueError:
            expected = None
        assert value == (expected if expected is not None and expected >= 0 else None)
        assert numa_node(root, "00000000:3C:00.0") is None  # no such device


def test_discovery_logs_nothing_on_a_healthy_node(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kubegpu.node.discovery")
    discovered("a100-mig")
    assert caplog.records == []


def test_unreadable_mig_mode_names_the_gpu(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeNvml.from_profile("t4-pcie")
    real = fake.nvmlDeviceGetMigMode

    def flaky(handle: Any) -> Any:
        if fake.nvmlDeviceGetIndex(handle) == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return real(handle)

    monkeypatch.setattr(fake, "nvmlDeviceGetMigMode", flaky)
    caplog.set_level(logging.WARNING)
    gpus = fake_session(fake).gpus
    assert not gpus[1].mig_capable
    assert [r.getMessage() for r in caplog.records if "MIG mode" in r.getMessage()] == [
        "GPU index=1 uuid=GPU-5916575e-0280-41c6-9dbf-ffef04648c1d: cannot read MIG mode, treating it as not "
        "MIG capable: Unknown Error"
    ]

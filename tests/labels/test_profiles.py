"""GFD's labels for every fake node profile, MIG strategy and sharing mode: exact label sets.

Each case runs a real labelling pass (fake NVML -> discovery -> facts -> labels), so what is checked is
what `kubegpu labels` would write on such a node.
"""

from __future__ import annotations

import dataclasses
from importlib import resources
from pathlib import Path

import pytest

from kubegpu.labels.compute import node_labels
from kubegpu.labels.errors import LabelError
from kubegpu.labels.facts import gather_facts
from kubegpu.labels.node import label_node
from kubegpu.labels.settings import LabelSettings
from kubegpu.labels.sharing import ReplicatedResource, SharingSettings, SharingStrategy
from kubegpu.node.discovery import discover, nvml_session
from kubegpu.node.nvml.backend import NvmlBackend
from kubegpu.node.nvml.fake import FakeNvml
from kubegpu.node.nvml.fake_profile import parse_profile
from kubegpu.node.nvml.pci import sysfs_bus_id

VERSIONS = {
    "nvidia.com/cuda.driver.major": "550",
    "nvidia.com/cuda.driver.minor": "90",
    "nvidia.com/cuda.driver.rev": "07",
    "nvidia.com/cuda.runtime.major": "12",
    "nvidia.com/cuda.runtime.minor": "4",
    "nvidia.com/cuda.driver-version.major": "550",
    "nvidia.com/cuda.driver-version.minor": "90",
    "nvidia.com/cuda.driver-version.revision": "07",
    "nvidia.com/cuda.driver-version.full": "550.90.07",
    "nvidia.com/cuda.runtime-version.major": "12",
    "nvidia.com/cuda.runtime-version.minor": "4",
    "nvidia.com/cuda.runtime-version.full": "12.4",
}
NODE = {
    **VERSIONS,
    "nvidia.com/gpu.machine": "DGX-Test-Server",
    "nvidia.com/gpu.mode": "compute",
    "nvidia.com/mps.capable": "false",
    "nvidia.com/vgpu.present": "false",
}

T4_LABELS = {
    **NODE,
    "nvidia.com/mig.capable": "false",
    "nvidia.com/gpu.product": "Tesla-T4",
    "nvidia.com/gpu.count": "4",
    "nvidia.com/gpu.replicas": "1",
    "nvidia.com/gpu.sharing-strategy": "none",
    "nvidia.com/gpu.memory": "15360",
    "nvidia.com/gpu.family": "turing",
    "nvidia.com/gpu.compute.major": "7",
    "nvidia.com/gpu.compute.minor": "5",
}


def gpu_labels(product: str, count: int, memory: int, family: str, cc: tuple[int, int]) -> dict[str, str]:
    return {
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.count": str(count),
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.memory": str(memory),
        "nvidia.com/gpu.family": family,
        "nvidia.com/gpu.compute.major": str(cc[0]),
        "nvidia.com/gpu.compute.minor": str(cc[1]),
    }


def mig_labels(prefix: str, product: str, count: int, attrs: tuple[int, ...]) -> dict[str, str]:
    """`attrs`: memory, multiprocessors, slices.gi, slices.ci, engines copy/decoder/encoder/jpeg/ofa."""
    names = ["memory", "multiprocessors", "slices.gi", "slices.ci"]
    names += [f"engines.{e}" for e in ("copy", "decoder", "encoder", "jpeg", "ofa")]
    return {
        f"{prefix}.product": product,
        f"{prefix}.count": str(count),
        f"{prefix}.replicas": "1",
        f"{prefix}.sharing-strategy": "none",
        **{f"{prefix}.{n}": str(v) for n, v in zip(names, attrs, strict=True)},
    }


A100_1G5 = (4864, 14, 1, 1, 1, 0, 0, 0, 0)
A100_2G10 = (9856, 28, 2, 2, 2, 1, 0, 0, 0)
A100_3G20 = (19968, 42, 3, 3, 3, 2, 0, 0, 0)
A100_FULL = gpu_labels("NVIDIA-A100-SXM4-40GB", 4, 40960, "ampere", (8, 0))


def backend_for(fake: FakeNvml, pci_class: str | None = "0x030200") -> NvmlBackend:
    """The fake as a backend, with the given PCI class file per GPU (None: no class file at all)."""
    for gpu in fake.profile.gpus:
        device = fake.sysfs_root / "bus" / "pci" / "devices" / sysfs_bus_id(gpu.pci_bus_id)
        if pci_class is None:
            (device / "class").unlink(missing_ok=True)
        else:
            (device / "class").write_text(pci_class + "\n")
    return NvmlBackend(fake, fake.sysfs_root, is_fake=True, description="test")


@pytest.fixture
def machine_file(tmp_path: Path) -> str:
    path = tmp_path / "product_name"
    path.write_text("DGX Test (Server)\n")
    return str(path)


def labels_of(profile: str | FakeNvml, machine_file: str, **settings: object) -> dict[str, str]:
    fake = FakeNvml.from_profile(profile) if isinstance(profile, str) else profile
    options = LabelSettings(no_timestamp=True, machine_type_file=machine_file)
    return label_node(backend_for(fake), dataclasses.replace(options, **settings), timestamp=None)


def profile_variant(name: str, edit: str, replacement: str) -> FakeNvml:
    """A built-in profile with one YAML snippet replaced (e.g. MIG turned on for a GPU)."""
    text = resources.files("kubegpu.node.nvml").joinpath("profiles", f"{name}.yaml").read_text()
    assert edit in text, f"{edit!r} not in {name}.yaml"
    return FakeNvml(parse_profile(text.replace(edit, replacement), f"{name} variant"))


# -- strategy none on every profile ---------------------------------------------------------------


def test_t4_node_labels_exactly(machine_file: str) -> None:
    assert labels_of("t4-pcie", machine_file) == T4_LABELS


@pytest.mark.parametrize(
    ("profile", "gpus", "mig_capable"),
    [
        ("dgx1-volta", gpu_labels("Tesla-V100-SXM2-16GB", 8, 16160, "volta", (7, 0)), "false"),
        ("dgx-a100", gpu_labels("NVIDIA-A100-SXM4-40GB", 8, 40960, "ampere", (8, 0)), "true"),
        ("hgx-h100", gpu_labels("NVIDIA-H100-80GB-HBM3", 8, 81559, "hopper", (9, 0)), "true"),
        # MIG-enabled GPUs count as GPUs of their model; the MIG-disabled one supplies the rest
        ("a100-mig", A100_FULL, "true"),
    ],
)
def test_profiles_with_mig_strategy_none(
    machine_file: str, profile: str, gpus: dict[str, str], mig_capable: str
) -> None:
    assert labels_of(profile, machine_file) == {**NODE, "nvidia.com/mig.capable": mig_capable, **gpus}


def test_mig_enabled_gpus_alone_are_labelled_without_sharing(machine_file: str) -> None:
    # both A100s MIG-enabled (GPU 1 without MIG devices): replicas 0, the time-slicing is not applied
    sharing = SharingSettings("time-slicing", (ReplicatedResource("nvidia.com/gpu", 4, False),))
    labels = labels_of("a100-mig-invalid", machine_file, sharing=sharing)
    assert labels == {
        **NODE,
        "nvidia.com/mig.capable": "true",
        **gpu_labels("NVIDIA-A100-SXM4-40GB", 2, 40960, "ampere", (8, 0)),
        "nvidia.com/gpu.replicas": "0",
    }


# -- MIG strategies -------------------------------------------------------------------------------


def test_a100_mig_mixed(machine_file: str) -> None:
    labels = labels_of("a100-mig", machine_file, mig_strategy="mixed")
    assert labels == {
        **NODE,
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "mixed",
        **A100_FULL,
        **mig_labels("nvidia.com/mig-1g.5gb", "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", 8, A100_1G5),
        **mig_labels("nvidia.com/mig-2g.10gb", "NVIDIA-A100-SXM4-40GB-MIG-2g.10gb", 1, A100_2G10),
        **mig_labels("nvidia.com/mig-3g.20gb", "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb", 3, A100_3G20),
    }


def test_a100_mig_single_with_a_mig_disabled_gpu_is_invalid(machine_file: str) -> None:
    labels = labels_of("a100-mig", machine_file, mig_strategy="single")
    assert labels == {
        **NODE,
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "single",
        **A100_FULL,  # family and compute stay from the GPU labels
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-INVALID",
        "nvidia.com/gpu.count": "0",
        "nvidia.com/gpu.replicas": "0",
        "nvidia.com/gpu.sharing-strategy": "",
        "nvidia.com/gpu.memory": "0",
    }


SINGLE_1G5 = {
    "nvidia.com/mig.strategy": "single",
    "nvidia.com/gpu.family": "ampere",
    "nvidia.com/gpu.compute.major": "8",
    "nvidia.com/gpu.compute.minor": "0",
    **mig_labels("nvidia.com/gpu", "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", 14, A100_1G5),
}


def test_valid_single(machine_file: str) -> None:
    labels = labels_of("a100-mig-single", machine_file, mig_strategy="single")
    assert labels == {**NODE, "nvidia.com/mig.capable": "true", **SINGLE_1G5}


def test_single_time_sliced_shows_shared_product(machine_file: str) -> None:
    sharing = SharingSettings("time-slicing", (ReplicatedResource("nvidia.com/gpu", 3, False),))
    labels = labels_of("a100-mig-single", machine_file, mig_strategy="single", sharing=sharing)
    assert labels == {
        **NODE,
        "nvidia.com/mig.capable": "true",
        **SINGLE_1G5,
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED",
        "nvidia.com/gpu.replicas": "3",
        "nvidia.com/gpu.sharing-strategy": "time-slicing",
    }


def test_single_with_an_empty_mig_gpu_is_invalid(machine_file: str) -> None:
    labels = labels_of("a100-mig-invalid", machine_file, mig_strategy="single")
    assert labels == {
        **NODE,
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "single",
        **gpu_labels("NVIDIA-A100-SXM4-40GB", 2, 40960, "ampere", (8, 0)),
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-INVALID",
        "nvidia.com/gpu.count": "0",
        "nvidia.com/gpu.replicas": "0",
        "nvidia.com/gpu.sharing-strategy": "",
        "nvidia.com/gpu.memory": "0",
    }


def test_mixed_ignores_an_empty_mig_gpu(machine_file: str) -> None:
    labels = labels_of("a100-mig-invalid", machine_file, mig_strategy="mixed")
    assert labels == {
        **NODE,
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "mixed",
        **gpu_labels("NVIDIA-A100-SXM4-40GB", 2, 40960, "ampere", (8, 0)),
        "nvidia.com/gpu.replicas": "0",  # both GPUs MIG-enabled
        **mig_labels("nvidia.com/mig-3g.20gb", "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb", 2, A100_3G20),
    }


def test_single_with_two_profiles_is_invalid(machine_file: str) -> None:
    fake = profile_variant(
        "a100-mig-single", "{profile: 1g.5gb, gi: 7,", "{profile: 1g.5gb+me, gi: 7,"
    )  # one 1g.5gb+me among thirteen 1g.5gb
    labels = labels_of(fake, machine_file, mig_strategy="single")
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-INVALID"
    assert (labels["nvidia.com/gpu.count"], labels["nvidia.com/gpu.replicas"]) == ("0", "0")
    assert "nvidia.com/gpu.multiprocessors" not in labels


def test_single_on_a_node_without_mig_is_like_none(machine_file: str) -> None:
    labels = labels_of("hgx-h100", machine_file, mig_strategy="single")
    expected = gpu_labels("NVIDIA-H100-80GB-HBM3", 8, 81559, "hopper", (9, 0))
    assert labels == {
        **NODE,
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "single",
        **expected,
    }


def test_mixed_names_attribute_profiles_with_dots(machine_file: str) -> None:
    fake = profile_variant(
        "hgx-h100",
        "pcie: {cpu: 0, host_bridge: rc0, switches: [sw0]}}",
        "pcie: {cpu: 0, host_bridge: rc0, switches: [sw0]}, mig: {enabled: true, devices: ["
        "{profile: 1g.10gb+me, gi: 9, uuid: MIG-11111111-2222-3333-4444-555555555555}]}}",
    )
    labels = labels_of(fake, machine_file, mig_strategy="mixed")
    assert labels["nvidia.com/mig-1g.10gb.me.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb.me"
    assert labels["nvidia.com/mig-1g.10gb.me.engines.ofa"] == "1"
    assert labels["nvidia.com/gpu.count"] == "8"


def test_mixed_with_mig_resource_shared_and_renamed(machine_file: str) -> None:
    sharing = SharingSettings("time-slicing", (ReplicatedResource("nvidia.com/mig-1g.5gb", 2, True),))
    labels = labels_of("a100-mig", machine_file, mig_strategy="mixed", sharing=sharing)
    assert labels["nvidia.com/mig-1g.5gb.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"  # renamed
    assert labels["nvidia.com/mig-1g.5gb.replicas"] == "2"
    assert labels["nvidia.com/mig-1g.5gb.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/mig-3g.20gb.replicas"] == "1"
    assert labels["nvidia.com/mig-3g.20gb.sharing-strategy"] == "none"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"


# -- sharing on full GPUs -------------------------------------------------------------------------

TS: SharingStrategy = "time-slicing"


def shared(
    strategy: SharingStrategy, replicas: int, renamed: bool, name: str = "nvidia.com/gpu"
) -> SharingSettings:
    return SharingSettings(strategy, (ReplicatedResource(name, replicas, renamed),))


@pytest.mark.parametrize(
    ("sharing", "product", "replicas", "strategy", "mps_capable"),
    [
        (SharingSettings(), "Tesla-T4", "1", "none", "false"),
        (shared(TS, 4, False), "Tesla-T4-SHARED", "4", TS, "false"),
        (shared(TS, 4, True), "Tesla-T4", "4", TS, "false"),
        (shared("mps", 2, False), "Tesla-T4-SHARED", "2", "mps", "true"),
        (shared("mps", 2, True), "Tesla-T4", "2", "mps", "true"),
        # sharing another resource leaves nvidia.com/gpu alone
        (shared(TS, 4, False, "nvidia.com/other"), "Tesla-T4", "1", "none", "false"),
    ],
    ids=["unshared", "ts", "ts-renamed", "mps", "mps-renamed", "other-resource"],
)
def test_sharing_labels(
    machine_file: str, sharing: SharingSettings, product: str, replicas: str, strategy: str, mps_capable: str
) -> None:
    labels = labels_of("t4-pcie", machine_file, sharing=sharing)
    assert labels == {
        **T4_LABELS,
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.replicas": replicas,
        "nvidia.com/gpu.sharing-strategy": strategy,
        "nvidia.com/mps.capable": mps_capable,
        "nvidia.com/gpu.count": "4",  # physical GPUs, never multiplied by replicas
    }


def test_mps_with_mig_enabled_gpus_fails_like_gfd(machine_file: str) -> None:
    sharing = SharingSettings("mps", (ReplicatedResource("nvidia.com/gpu", 2, False),))
    with pytest.raises(LabelError, match="MPS sharing is not supported for mig devices"):
        labels_of("a100-mig", machine_file, sharing=sharing)


# -- node facts -----------------------------------------------------------------------------------


def test_missing_machine_type_file_is_unknown(tmp_path: Path) -> None:
    labels = labels_of("t4-pcie", str(tmp_path / "absent"))
    assert labels["nvidia.com/gpu.machine"] == "unknown"


@pytest.mark.parametrize(
    ("pci_class", "mode"),
    [("0x030200", "compute"), ("0x030000", "graphics"), ("0x038000", "unknown"), (None, "unknown")],
)
def test_gpu_mode_from_pci_class(machine_file: str, pci_class: str | None, mode: str) -> None:
    fake = FakeNvml.from_profile("t4-pcie")
    settings = LabelSettings(no_timestamp=True, machine_type_file=machine_file)
    labels = label_node(backend_for(fake, pci_class), settings, timestamp=None)
    assert labels["nvidia.com/gpu.mode"] == mode


def test_timestamp_is_the_one_given(machine_file: str) -> None:
    fake = FakeNvml.from_profile("t4-pcie")
    settings = LabelSettings(machine_type_file=machine_file)
    labels = label_node(backend_for(fake), settings, timestamp=1_700_000_000)
    assert labels["nvidia.com/gfd.timestamp"] == "1700000000"


def test_nvml_unavailable(machine_file: str) -> None:
    fake = FakeNvml.from_profile("no-driver")
    tolerant = LabelSettings(machine_type_file=machine_file, fail_on_init_error=False)
    assert label_node(backend_for(fake), tolerant, timestamp=5) == {
        "nvidia.com/gfd.timestamp": "5",
        "nvidia.com/vgpu.present": "false",
    }
    strict = dataclasses.replace(tolerant, fail_on_init_error=True)
    with pytest.raises(LabelError, match="failed to initialize NVML: The NVIDIA kernel driver isn't loaded"):
        label_node(backend_for(fake), strict, timestamp=5)


def test_node_without_gpus_has_no_device_labels(machine_file: str) -> None:
    fake = FakeNvml(parse_profile("description: empty node\n", "empty"))
    assert labels_of(fake, machine_file) == {"nvidia.com/vgpu.present": "false"}


def test_a_gpu_lost_after_discovery_does_not_stop_labelling(machine_file: str) -> None:
    fake = FakeNvml.from_profile("a100-mig")
    backend = backend_for(fake)
    with nvml_session(backend) as api:
        inventory = discover(backend)
        fake.state.inject_lost(0)  # XID 79 between discovery and the attribute reads
        facts = gather_facts(api, backend.sysfs_root, inventory, machine_file, mig_attributes=True)
    assert not any(m.uuid in facts.mig_attributes for m in inventory.gpus[0].mig_devices)
    labels = node_labels(inventory, facts, mig_strategy="mixed", sharing=SharingSettings(), timestamp=None)
    # GPU 0's seven 1g.5gb are still counted; their attributes come from GPU 2's 1g.5gb
    assert labels["nvidia.com/mig-1g.5gb.count"] == "8"
    assert labels["nvidia.com/mig-1g.5gb.multiprocessors"] == "14"

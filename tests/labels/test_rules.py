"""GFD's label rules one by one, on hand-made inventories and facts: names, versions, modes, fabric, vGPU."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kubegpu.labels.compute import (
    clique_labels,
    gpu_mode_labels,
    machine_type_labels,
    node_labels,
    version_labels,
    vgpu_labels,
)
from kubegpu.labels.errors import LabelError
from kubegpu.labels.facts import FabricIds, NodeFacts
from kubegpu.labels.naming import arch_family, product_name, sanitise
from kubegpu.labels.resource_labels import gpu_labels, resource_labels
from kubegpu.labels.sharing import SharingSettings, sharing_from_config
from kubegpu.labels.vgpu import VgpuInfo
from kubegpu.node.inventory import Gpu, Inventory, MigDevice
from kubegpu.settings.nvidia_config import parse_config_text

GIB = 1024**3


def gpu(index: int, name: str = "Tesla T4", cc: tuple[int, int] = (7, 5), memory: int = 15 * GIB) -> Gpu:
    return Gpu(
        index=index,
        uuid=f"GPU-{index:08x}-0000-0000-0000-000000000000",
        name=name,
        memory_bytes=memory,
        minor=index,
        compute_capability=cc,
        pci_bus_id=f"00000000:{index + 1:02X}:00.0",
    )


# -- sanitising and names -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("Tesla T4", "Tesla-T4"),
        ("NVIDIA-TITAN-X-(Pascal)", "NVIDIA-TITAN-X-Pascal"),
        ("some [ / thing / ]else", "some-thing-else"),
        ("  NVIDIA   A100-SXM4-40GB  ", "NVIDIA-A100-SXM4-40GB"),
        ("GeForce RTX\t4090", "GeForce-RTX4090"),  # a tab is not an allowed character: dropped
        ("Quadro RTX 8000 (ü)", "Quadro-RTX-8000"),
        ("a_b.c-d", "a_b.c-d"),
        ("()", ""),
        ("", ""),
    ],
)
def test_sanitise(raw: str, clean: str) -> None:
    assert sanitise(raw) == clean


@pytest.mark.parametrize(
    ("parts", "shared", "product"),
    [
        (["Tesla T4"], False, "Tesla-T4"),
        (["Tesla T4"], True, "Tesla-T4-SHARED"),
        (["NVIDIA A100-SXM4-40GB", "MIG", "1g.5gb"], False, "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"),
        (["", "MIG", "1g.5gb"], False, "MIG-1g.5gb"),  # empty parts are skipped
        (["()", "MIG"], False, "-MIG"),  # a part that sanitises to "" is kept, as GFD does
        ([""], True, ""),  # nothing to name: no "SHARED" either
    ],
)
def test_product_name(parts: list[str], shared: bool, product: str) -> None:
    assert product_name(parts, shared_suffix=shared) == product


@pytest.mark.parametrize(
    ("cc", "family"),
    [
        ((1, 3), "tesla"),
        ((2, 1), "fermi"),
        ((3, 7), "kepler"),
        ((4, 0), "undefined"),
        ((5, 2), "maxwell"),
        ((6, 1), "pascal"),
        ((7, 0), "volta"),
        ((7, 2), "volta"),
        ((7, 4), "volta"),
        ((7, 5), "turing"),
        ((8, 0), "ampere"),
        ((8, 6), "ampere"),
        ((8, 7), "ampere"),
        ((8, 9), "ada-lovelace"),
        ((9, 0), "hopper"),
        ((10, 0), "blackwell"),
        ((11, 0), "undefined"),
        ((12, 0), "blackwell"),
        ((13, 0), "rubin"),
        ((14, 0), "undefined"),
    ],
)
def test_family_map(cc: tuple[int, int], family: str) -> None:
    assert arch_family(*cc) == family


def test_unknown_compute_capability_drops_family_and_compute_labels() -> None:
    labels = gpu_labels([gpu(0, cc=(0, 0))], SharingSettings())
    assert not any(k.startswith(("nvidia.com/gpu.family", "nvidia.com/gpu.compute")) for k in labels)
    assert labels["nvidia.com/gpu.product"] == "Tesla-T4"


def test_zero_memory_drops_the_memory_label() -> None:
    labels = gpu_labels([gpu(0, memory=0)], SharingSettings())
    assert "nvidia.com/gpu.memory" not in labels


def test_memory_is_whole_mib() -> None:
    labels = gpu_labels([gpu(0, memory=15 * GIB + 1024 * 1024 - 1)], SharingSettings())
    assert labels["nvidia.com/gpu.memory"] == "15360"


def test_mixed_models_count_per_model_and_the_last_model_wins() -> None:
    gpus = [gpu(0), gpu(1, "Tesla V100-SXM2-16GB", (7, 0)), gpu(2)]
    labels = gpu_labels(gpus, SharingSettings())
    # GFD's choice between models is Go map order (random); ours is NVML order, last model written wins
    assert labels["nvidia.com/gpu.product"] == "Tesla-V100-SXM2-16GB"
    assert labels["nvidia.com/gpu.count"] == "1"
    assert labels["nvidia.com/gpu.family"] == "volta"


# -- versions and machine type ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("driver", "major", "minor", "rev"),
    [("550.90.07", "550", "90", "07"), ("470.57", "470", "57", ""), ("1.2.3", "1", "2", "3")],
)
def test_driver_version_shapes(driver: str, major: str, minor: str, rev: str) -> None:
    labels = version_labels(driver, "12.4")
    assert labels["nvidia.com/cuda.driver-version.major"] == labels["nvidia.com/cuda.driver.major"] == major
    assert labels["nvidia.com/cuda.driver-version.minor"] == labels["nvidia.com/cuda.driver.minor"] == minor
    assert labels["nvidia.com/cuda.driver-version.revision"] == labels["nvidia.com/cuda.driver.rev"] == rev
    assert labels["nvidia.com/cuda.driver-version.full"] == driver


@pytest.mark.parametrize("driver", ["550", "550.90.07.1", ""])
def test_malformed_driver_version_fails_like_gfd(driver: str) -> None:
    with pytest.raises(LabelError, match=rf'Version "{driver}" does not match format "X.Y\[.Z\]"'):
        version_labels(driver, "12.4")


def test_cuda_version_labels() -> None:
    labels = version_labels("550.90.07", "12.10")
    assert labels["nvidia.com/cuda.runtime-version.full"] == "12.10"
    assert labels["nvidia.com/cuda.runtime.major"] == labels["nvidia.com/cuda.runtime-version.major"] == "12"
    assert labels["nvidia.com/cuda.runtime.minor"] == labels["nvidia.com/cuda.runtime-version.minor"] == "10"


@pytest.mark.parametrize("cuda", ["", "12", "twelve.4"])
def test_unreadable_cuda_version_fails(cuda: str) -> None:
    with pytest.raises(LabelError, match="error getting cuda driver version"):
        version_labels("550.90.07", cuda)


@pytest.mark.parametrize(
    ("machine", "label"),
    [
        (None, "unknown"),
        ("DGX A100", "DGX-A100"),
        ("ProLiant DL380 Gen10 (P20174)", "ProLiant-DL380-Gen10-P20174"),
    ],
)
def test_machine_type(machine: str | None, label: str) -> None:
    assert machine_type_labels(machine) == {"nvidia.com/gpu.machine": label}


# -- mode, fabric, vGPU ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("classes", "mode"),
    [
        (["0x030200", "0x030200"], "compute"),
        (["0x030000", "0x030000"], "graphics"),
        (["0x030200", "0x030000"], "unknown"),  # mixed
        (["0x030200", None], "unknown"),  # one unreadable
        (["0x038000", "0x038000"], "unknown"),
    ],
)
def test_gpu_mode(classes: list[str | None], mode: str) -> None:
    gpus = [gpu(0), gpu(1)]
    facts = NodeFacts(pci_classes={g.uuid: c for g, c in zip(gpus, classes, strict=True)})
    assert gpu_mode_labels(gpus, facts) == {"nvidia.com/gpu.mode": mode}


CLUSTER = "8a8c4f43-1f2c-4bd3-9c1d-6b5bb4c8f3a1"


@pytest.mark.parametrize(
    ("fabric", "label"),
    [
        ({}, None),
        ({0: FabricIds(CLUSTER, 7), 1: FabricIds(CLUSTER, 7)}, f"{CLUSTER}.7"),
        ({0: FabricIds(CLUSTER, 7)}, f"{CLUSTER}.7"),  # GPUs not on the fabric do not count
        ({0: FabricIds(CLUSTER, 7), 1: FabricIds(CLUSTER, 8)}, None),  # cliques disagree
        ({0: FabricIds(CLUSTER, 7), 1: FabricIds(CLUSTER.replace("8a", "9b"), 7)}, None),
    ],
)
def test_clique(fabric: dict[int, FabricIds], label: str | None) -> None:
    gpus = [gpu(0), gpu(1)]
    facts = NodeFacts(fabric={gpus[i].uuid: ids for i, ids in fabric.items()})
    assert clique_labels(gpus, facts) == ({} if label is None else {"nvidia.com/gpu.clique": label})


def test_vgpu_labels() -> None:
    assert vgpu_labels(NodeFacts()) == {"nvidia.com/vgpu.present": "false"}
    facts = NodeFacts(
        vgpus=(VgpuInfo("0000:00:05.0", "460.16", "r460_00"), VgpuInfo("0000:00:06.0", "470.1", "r470"))
    )
    assert vgpu_labels(facts) == {
        "nvidia.com/vgpu.present": "true",
        "nvidia.com/vgpu.host-driver-version": "470.1",
        "nvidia.com/vgpu.host-driver-branch": "r470",
    }


def test_node_labels_merge_in_gfd_order() -> None:
    inventory = Inventory(gpus=(gpu(0),), driver_version="550.90.07", cuda_driver_version="12.4")
    labels = node_labels(inventory, NodeFacts(), mig_strategy="none", sharing=SharingSettings(), timestamp=42)
    assert labels["nvidia.com/gfd.timestamp"] == "42"
    assert labels["nvidia.com/gpu.machine"] == "unknown"
    assert labels["nvidia.com/vgpu.present"] == "false"
    # timestamp, machine, 12 versions, mig/mps capable, 8 gpu.*, mode, vgpu
    assert len(labels) == 26


def test_mig_labels_need_the_mig_attributes() -> None:
    mig = MigDevice("MIG-1", 0, 1, 0, "1g.5gb", 4864 * 1024 * 1024)
    parent = replace(
        gpu(0, "NVIDIA A100-SXM4-40GB", (8, 0)), mig_capable=True, mig_enabled=True, mig_devices=(mig,)
    )
    with pytest.raises(LabelError, match="unable to get attributes of MIG device MIG-1"):
        resource_labels([parent], NodeFacts(), "single", SharingSettings())


def test_unknown_mig_strategy() -> None:
    with pytest.raises(LabelError, match="unknown strategy: bogus"):
        resource_labels([gpu(0)], NodeFacts(), "bogus", SharingSettings())


# -- sharing as GFD sees it (adapter over the config) ---------------------------------------------


def sharing_of(text: str, allow_customization: bool = False) -> SharingSettings:
    from kubegpu.settings.nvidia_config import apply_nvidia_restrictions

    config, _ = parse_config_text(text)
    apply_nvidia_restrictions(config, allow_customization)
    return sharing_from_config(config)


def test_no_sharing_section() -> None:
    assert sharing_of("version: v1\n") == SharingSettings()


def test_time_slicing_names_are_qualified_and_not_renamed() -> None:
    sharing = sharing_of("sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 4}\n")
    assert sharing.strategy == "time-slicing"
    r = sharing.replication("nvidia.com/gpu")
    assert r is not None and (r.replicas, r.renamed) == (4, False)


def test_rename_by_default_renames() -> None:
    text = (
        "sharing:\n  timeSlicing:\n    renameByDefault: true\n"
        "    resources:\n    - {name: gpu, replicas: 4}\n"
    )
    r = sharing_of(text).replication("nvidia.com/gpu")
    assert r is not None and r.renamed


def test_explicit_rename_is_dropped_as_nvidia_does_unless_customization_is_allowed() -> None:
    text = "sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, rename: tesla, replicas: 4}\n"
    plain = sharing_of(text).replication("nvidia.com/gpu")
    custom = sharing_of(text, allow_customization=True).replication("nvidia.com/gpu")
    assert plain is not None and not plain.renamed
    assert custom is not None and custom.renamed


def test_mps_block_wins_over_time_slicing() -> None:
    text = (
        "sharing:\n"
        "  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 4}\n"
        "  mps:\n    resources:\n    - {name: other, replicas: 2}\n"
    )
    sharing = sharing_of(text)
    assert sharing.strategy == "mps"
    assert sharing.replication("nvidia.com/gpu") is None  # GFD looks only in the mps block
    assert sharing.replication("nvidia.com/other") is not None

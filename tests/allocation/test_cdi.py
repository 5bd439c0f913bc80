"""CDI spec generation against a fake driver root, validated with the CDI JSON schema; the spec writer."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubegpu.allocation.allocate import AllocateOptions, allocate_container
from kubegpu.allocation.cdi import CdiOptions, build_specs, gpu_spec, nonempty_modes, qualified_name
from kubegpu.allocation.resources import build_resources
from kubegpu.node.inventory import Inventory, MigDevice
from kubegpu.plugin.cdi_files import CdiSpecWriter
from kubegpu.settings.env import DaemonEnv
from kubegpu.settings.plugin import resolve
from tests.builders import gpu_uuid, make_gpus, make_inventory
from tests.cdi_schema import PUBLISHED, cdi_errors
from tests.settings.test_plugin_settings import defaults

VERSION = "550.90.07"
LIBDIR = "/usr/lib/x86_64-linux-gnu"


def fake_driver_root(root: Path) -> Path:
    """What a driver install leaves on a node: versioned libraries and their links, binaries, firmware,
    device nodes (plain files stand in for them), plus things that must not be picked up."""
    lib = root / LIBDIR.lstrip("/")
    lib.mkdir(parents=True)
    for name in ("libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so"):
        (lib / f"{name}.{VERSION}").write_bytes(b"\x7fELF")
        (lib / f"{name}.1").symlink_to(f"{name}.{VERSION}")
    (lib / "libcuda.so.535.104.05").write_bytes(b"old driver left behind")
    (lib / "libfoo.so.1.2").write_bytes(b"not the driver's")
    (root / "usr/lib64").mkdir(parents=True)
    (root / "usr/lib64/libnvidia-cfg.so.550.90.07").write_bytes(b"\x7fELF")
    (root / "usr/bin").mkdir(parents=True)
    for binary in ("nvidia-smi", "nvidia-cuda-mps-control", "python3"):
        (root / "usr/bin" / binary).write_bytes(b"#!")
    firmware = root / f"lib/firmware/nvidia/{VERSION}"
    firmware.mkdir(parents=True)
    (firmware / "gsp_ga10x.bin").write_bytes(b"fw")
    dev = root / "dev"
    (dev / "nvidia-caps-imex-channels").mkdir(parents=True)
    (dev / "infiniband").mkdir()
    for node in (
        "nvidiactl",
        "nvidia-uvm",
        "nvidia0",
        "gdrdrv",
        "infiniband/uverbs0",
        "infiniband/rdma_cm",
    ):
        (dev / node).write_bytes(b"")
    # The IMEX channel must be a character device (a plain file is no channel): a link to one.
    (dev / "nvidia-caps-imex-channels/channel0").symlink_to("/dev/null")
    return root


@pytest.fixture
def driver_root(tmp_path: Path) -> Path:
    return fake_driver_root(tmp_path / "driver-root")


def options(driver_root: Path, **kw: object) -> CdiOptions:
    # The plugin sees the host's /run/nvidia/driver at driver_root, as --driver-root-ctr-path says.
    base = CdiOptions(driver_root="/run/nvidia/driver", dev_root="/run/nvidia/driver")
    return replace(base, container_driver_root=str(driver_root), **kw)  # type: ignore[arg-type]


def valid(spec: dict) -> dict:
    errors = cdi_errors(spec)
    assert not errors, errors
    names = [d["name"] for d in spec["devices"]]
    assert len(names) == len(set(names)), names  # the runtime refuses duplicate device names
    return spec


INVENTORY = make_inventory(4)
INVENTORY = Inventory(gpus=INVENTORY.gpus, links=INVENTORY.links, driver_version=VERSION)


def test_gpu_spec_names_nodes_and_kind(driver_root: Path) -> None:
    spec = valid(gpu_spec(INVENTORY, options(driver_root)))
    assert spec["cdiVersion"] == "0.5.0" and spec["kind"] == "k8s.device-plugin.nvidia.com/gpu"
    devices = {d["name"]: d["containerEdits"]["deviceNodes"] for d in spec["devices"]}
    assert list(devices) == [gpu_uuid(i) for i in range(4)] + ["all"]
    assert devices[gpu_uuid(2)] == [{"path": "/dev/nvidia2", "hostPath": "/run/nvidia/driver/dev/nvidia2"}]
    assert [n["path"] for n in devices["all"]] == [f"/dev/nvidia{i}" for i in range(4)]
    index_spec = valid(gpu_spec(INVENTORY, options(driver_root, device_id_strategy="index")))
    assert [d["name"] for d in index_spec["devices"]] == ["0", "1", "2", "3", "all"]


def test_common_edits_mount_the_drivers_files_read_only_at_their_host_paths(driver_root: Path) -> None:
    edits = valid(gpu_spec(INVENTORY, options(driver_root)))["containerEdits"]
    mounts = {m["containerPath"]: m for m in edits["mounts"]}
    assert sorted(mounts) == sorted(
        [
            "/usr/lib64/libnvidia-cfg.so.550.90.07",
            f"{LIBDIR}/libcuda.so.{VERSION}",
            f"{LIBDIR}/libnvidia-ml.so.{VERSION}",
            f"{LIBDIR}/libnvidia-ptxjitcompiler.so.{VERSION}",
            "/usr/bin/nvidia-smi",
            "/usr/bin/nvidia-cuda-mps-control",
            f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin",
        ]
    )  # not the old driver's libcuda, not libfoo, not python3, not the .so.1 links
    libcuda = mounts[f"{LIBDIR}/libcuda.so.{VERSION}"]
    assert libcuda["hostPath"] == f"/run/nvidia/driver{LIBDIR}/libcuda.so.{VERSION}"
    assert "ro" in libcuda["options"] and "bind" in libcuda["options"]
    assert [n["path"] for n in edits["deviceNodes"]] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
    ]  # those that exist
    assert edits["env"] == ["NVIDIA_VISIBLE_DEVICES=void", f"NVIDIA_CTK_LIBCUDA_DIR={LIBDIR}"]


def test_hooks_use_the_configured_path(driver_root: Path) -> None:
    ctk = valid(gpu_spec(INVENTORY, options(driver_root)))["containerEdits"]["hooks"]
    assert [h["args"][:3] for h in ctk] == [
        ["nvidia-ctk", "hook", "create-symlinks"],
        ["nvidia-ctk", "hook", "update-ldcache"],
    ]
    assert ctk[0]["args"][3:] == ["--link", f"libcuda.so.1::{LIBDIR}/libcuda.so"]
    assert ctk[1]["args"][3:] == ["--folder", LIBDIR, "--folder", "/usr/lib64"]
    hook = "/usr/local/nvidia/toolkit/nvidia-cdi-hook"
    direct = gpu_spec(INVENTORY, options(driver_root, hook_path=hook))["containerEdits"]["hooks"]
    assert {h["path"] for h in direct} == {hook} and direct[1]["args"][:2] == [
        "nvidia-cdi-hook",
        "update-ldcache",
    ]
    assert {h["hookName"] for h in direct} == {"createContainer"}


def test_without_the_container_driver_root_the_plugin_looks_at_the_host_path(
    driver_root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    on_host = CdiOptions(
        driver_root=str(driver_root),
        dev_root=str(driver_root),
        container_driver_root=str(tmp_path / "absent"),
    )
    edits = valid(gpu_spec(INVENTORY, on_host))["containerEdits"]
    assert f"{driver_root}{LIBDIR}/libcuda.so.{VERSION}" in {m["hostPath"] for m in edits["mounts"]}
    empty = CdiOptions(driver_root=str(tmp_path), container_driver_root="")
    assert "mounts" in valid(gpu_spec(INVENTORY, empty))["containerEdits"]
    assert "no driver libraries" in caplog.text


def test_mig_devices_get_their_capability_nodes(driver_root: Path) -> None:
    parent = make_gpus(1)[0]
    migs = tuple(
        MigDevice(f"MIG-{i}", i, gi=i + 1, ci=0, profile="3g.20gb", memory_bytes=1) for i in range(2)
    )
    gpu = replace(parent, mig_enabled=True, mig_devices=migs)
    minors = {
        "gpu0/gi1/access": 21,
        "gpu0/gi1/ci0/access": 22,
        "gpu0/gi2/access": 30,
        "gpu0/gi2/ci0/access": 31,
    }
    inventory = Inventory(gpus=(gpu,), driver_version=VERSION)
    spec = valid(gpu_spec(inventory, options(driver_root, device_id_strategy="index", mig_minors=minors)))
    nodes = {d["name"]: [n["path"] for n in d["containerEdits"]["deviceNodes"]] for d in spec["devices"]}
    assert nodes["0:1"] == ["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap30", "/dev/nvidia-caps/nvidia-cap31"]
    assert list(nodes) == ["0", "0:0", "0:1", "all"]
    by_uuid = valid(gpu_spec(inventory, options(driver_root, mig_minors=minors)))
    assert [d["name"] for d in by_uuid["devices"]] == [gpu.uuid, "MIG-0", "MIG-1", "all"]


def test_mode_and_imex_specs(driver_root: Path) -> None:
    opts = options(driver_root, modes=("gdrcopy", "gds", "mofed"), imex_channels=("0",))
    assert nonempty_modes(opts) == ("gdrcopy", "mofed")  # no /dev/nvidia-fs* on this node
    specs = {k: valid(v) for k, v in build_specs(INVENTORY, opts).items()}
    assert sorted(specs) == ["gdrcopy", "gpu", "imex-channel", "mofed"]
    imex = specs["imex-channel"]
    assert imex["kind"] == "k8s.device-plugin.nvidia.com/imex-channel" and imex["devices"][0]["name"] == "0"
    mofed = specs["mofed"]["devices"][0]["containerEdits"]["deviceNodes"]
    assert [n["path"] for n in mofed] == ["/dev/infiniband/uverbs0", "/dev/infiniband/rdma_cm"]
    assert sorted(build_specs(INVENTORY, options(driver_root))) == ["gpu"]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.integers(1, 16),
    st.sampled_from(["uuid", "index"]),
    st.lists(st.sampled_from(["gdrcopy", "gds", "mofed"]), unique=True),
    st.data(),
)
def test_every_name_allocate_hands_out_is_in_a_valid_spec(
    driver_root: Path, count: int, id_strategy: str, modes: list[str], data: st.DataObject
) -> None:
    inventory = Inventory(gpus=make_gpus(count), driver_version=VERSION)
    opts = options(driver_root, device_id_strategy=id_strategy, modes=tuple(modes), imex_channels=("0",))
    specs = {k: valid(v) for k, v in build_specs(inventory, opts).items()}
    known = {qualified_name(k, d["name"]) for k, spec in specs.items() for d in spec["devices"]}
    resource = build_resources(inventory)[0]
    ids = data.draw(st.lists(st.sampled_from([d.id for d in resource.devices]), min_size=1, unique=True))
    allocate = AllocateOptions(
        device_list_strategies=("cdi-cri",),
        device_id_strategy=id_strategy,
        imex_channels=("0",),
        enabled_modes=tuple(modes),
        cdi_modes=nonempty_modes(opts),
    )
    names = allocate_container(resource, ids, allocate).cdi_devices
    assert names and set(names) <= known


def first_node(spec: dict[str, Any]) -> dict[str, Any]:
    node: dict[str, Any] = spec["devices"][0]["containerEdits"]["deviceNodes"][0]
    return node


@pytest.mark.parametrize(
    ("edit", "problem", "published_too"),
    [
        # Only the overlay: what the specification's prose requires and the published schema leaves out.
        (lambda s: s.update(kind="nvidia.com"), "does not match", False),
        (lambda s: s.update(cdiVersion="0.5"), "does not match", False),
        (lambda s: s.update(devices=[]), "should be non-empty", False),
        (lambda s: s["devices"][0].update(name="-bad"), "does not match", False),
        (lambda s: s["devices"][0].update(nickname="gpu0"), "Additional properties", False),
        (lambda s: first_node(s).update(path="dev/nvidia0"), "does not match", False),
        (lambda s: s["containerEdits"]["hooks"][0].update(hookName="onStart"), "is not one of", False),
        (lambda s: s["containerEdits"]["hooks"][0].update(timeout=0), "less than the minimum", False),
        (lambda s: s["containerEdits"].update(envs=["A=1"]), "Additional properties", False),
        (lambda s: s["containerEdits"]["env"].append("NOVALUE"), "does not match", False),
        (lambda s: s["containerEdits"]["env"].append(7), "is not of type 'string'", False),
        # The published schema refuses these too: its required fields and types, through defs.json.
        (lambda s: s.pop("cdiVersion"), "is a required property", True),
        (lambda s: s["devices"][0].pop("containerEdits"), "is a required property", True),
        (lambda s: first_node(s).pop("path"), "is a required property", True),
        (lambda s: first_node(s).update(uid=-1), "less than the minimum", True),
    ],
)
def test_the_schema_rejects_what_the_cdi_spec_forbids(
    driver_root: Path, edit: object, problem: str, published_too: bool
) -> None:
    spec = json.loads(json.dumps(gpu_spec(INVENTORY, options(driver_root))))
    assert not cdi_errors(spec)
    edit(spec)  # type: ignore[operator]
    assert any(problem in e for e in cdi_errors(spec))
    published = [e.message for e in PUBLISHED.iter_errors(spec)]
    assert any(problem in e for e in published) if published_too else not published


# -- the writer ----------------------------------------------------------------------------------------


def test_writer_is_atomic_idempotent_and_removes_only_its_files(driver_root: Path, tmp_path: Path) -> None:
    root = tmp_path / "cdi"
    writer = CdiSpecWriter(root)
    specs = build_specs(INVENTORY, options(driver_root, imex_channels=("0",)))
    writer.refresh(specs)
    gpu_file = root / "k8s.device-plugin.nvidia.com-gpu.json"
    assert sorted(p.name for p in root.iterdir()) == [
        "k8s.device-plugin.nvidia.com-gpu.json",
        "k8s.device-plugin.nvidia.com-imex-channel.json",
    ]  # no temporary files left behind
    assert json.loads(gpu_file.read_text()) == specs["gpu"]
    assert oct(gpu_file.stat().st_mode & 0o777) == "0o644"
    inode = gpu_file.stat().st_ino
    writer.refresh(specs)
    assert gpu_file.stat().st_ino == inode  # unchanged content: not rewritten
    (root / "vendor.example-gpu.json").write_text("{}")  # another vendor's spec
    bigger = Inventory(gpus=make_gpus(6), driver_version=VERSION)
    writer.refresh(build_specs(bigger, options(driver_root)))  # inventory changed, IMEX gone
    assert gpu_file.stat().st_ino != inode and len(json.loads(gpu_file.read_text())["devices"]) == 7
    assert not (root / "k8s.device-plugin.nvidia.com-imex-channel.json").exists()
    writer.remove()
    assert [p.name for p in root.iterdir()] == ["vendor.example-gpu.json"]


def test_cdi_root_defaults_to_var_run_cdi() -> None:
    assert DaemonEnv.from_environ({}).cdi_root == Path("/var/run/cdi")
    assert DaemonEnv.from_environ({"KUBEGPU_CDI_ROOT": ""}).cdi_root == Path("/var/run/cdi")
    assert DaemonEnv.from_environ({"KUBEGPU_CDI_ROOT": "/tmp/x"}).cdi_root == Path("/tmp/x")


def test_a_failed_write_leaves_the_old_file_and_no_temporary(
    driver_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "cdi"
    writer = CdiSpecWriter(root)
    writer.refresh(build_specs(INVENTORY, options(driver_root)))
    before = (root / "k8s.device-plugin.nvidia.com-gpu.json").read_bytes()

    def disk_full(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("kubegpu.allocation.cdi.os.replace", disk_full)
    with pytest.raises(OSError, match="No space"):
        writer.refresh(
            build_specs(Inventory(gpus=make_gpus(2), driver_version=VERSION), options(driver_root))
        )
    assert (root / "k8s.device-plugin.nvidia.com-gpu.json").read_bytes() == before
    assert [p.name for p in root.iterdir()] == ["k8s.device-plugin.nvidia.com-gpu.json"]


@pytest.mark.parametrize(
    ("disabled", "left"),
    [
        ([], ["create-symlinks", "update-ldcache"]),
        (["update-ldcache"], ["create-symlinks"]),
        (["create-symlinks", "enable-cuda-compat"], ["update-ldcache"]),
        (["all"], []),
    ],
)
def test_cdi_disable_hooks_leaves_hooks_out(driver_root: Path, disabled: list[str], left: list[str]) -> None:
    settings = resolve(defaults(cdi_disable_hooks=disabled))
    opts = replace(
        CdiOptions.from_settings(settings),
        driver_root="/run/nvidia/driver",
        dev_root="/run/nvidia/driver",
        container_driver_root=str(driver_root),
    )
    edits = valid(gpu_spec(INVENTORY, opts))["containerEdits"]
    assert [h["args"][2] for h in edits.get("hooks", [])] == left

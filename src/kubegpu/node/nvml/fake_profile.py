"""The fake NVML's node profiles: their schema, how one is loaded and validated, and the built-in list.

A profile (YAML, see `profiles/`) describes a node: GPU models (memory, compute capability, MIG profiles,
NVLink ports, ECC recovery, supported events), the GPUs (UUID, PCI bus ID, minor, NUMA node, place in the
PCIe tree, MIG layout) and the NVLink fabric. Validation names the offending field, so a hand-written
profile's mistake is found at load time, not as an odd NVML answer later.
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import pynvml
from msgspec import Meta

from kubegpu.common.files import MIB, FileProblem, read_text_file
from kubegpu.node.nvml.pci import parse_pci_bus_id
from kubegpu.settings.goyaml import GoYamlError
from kubegpu.settings.goyaml import load as load_yaml

PROFILE_LIMIT = MIB  # a node profile is a few KB; this stops a wrong file

_GPU_UUID = r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
_MIG_UUID = r"^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
_NVML_BUS_ID = r"^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]$"  # NVML's own form: 8-digit domain, upper case

EventName = Literal["xid", "single_bit_ecc", "double_bit_ecc", "pstate", "clock"]
EVENT_TYPES: dict[EventName, int] = {
    "xid": pynvml.nvmlEventTypeXidCriticalError,
    "single_bit_ecc": pynvml.nvmlEventTypeSingleBitEccError,
    "double_bit_ecc": pynvml.nvmlEventTypeDoubleBitEccError,
    "pstate": pynvml.nvmlEventTypePState,
    "clock": pynvml.nvmlEventTypeClock,
}


# Field constraints; msgspec checks them while it builds the classes.
_NonNegative = Annotated[int, Meta(ge=0)]
_Positive = Annotated[int, Meta(gt=0)]


class _Schema(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    pass


class GpuInstanceProfile(_Schema, frozen=True):
    """One GPU instance profile of a MIG-capable model: a row of `nvidia-smi mig -lgip`."""

    name: Annotated[str, Meta(pattern=r"^\d+g\.\d+gb([+-][a-z.,]+)?$")]  # e.g. "1g.5gb", "1g.5gb+me"
    # NVML_GPU_INSTANCE_PROFILE_*
    index: Annotated[int, Meta(ge=0, lt=pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT)]
    id: _NonNegative  # the profile ID NVML reports (the "ID" column of `nvidia-smi mig -lgip`)
    slices: Annotated[int, Meta(ge=1, le=8)]
    instances: Annotated[int, Meta(ge=1)]  # how many of it fit on an empty GPU
    memory_mib: _Positive
    multiprocessors: _Positive
    copy_engines: _NonNegative = 0
    decoders: _NonNegative = 0
    encoders: _NonNegative = 0
    jpegs: _NonNegative = 0
    ofas: _NonNegative = 0
    # Where NVML may create it (`nvidia-smi mig -lgipp`): the first memory slice of each possible placement,
    # and how many of the GPU's 8 memory slices it spans. Without them the profile cannot be created.
    placements: list[Annotated[int, Meta(ge=0, le=7)]] = msgspec.field(default_factory=list)
    placement_size: Annotated[int, Meta(ge=1, le=8)] | None = None

    def __post_init__(self) -> None:
        if bool(self.placements) != (self.placement_size is not None):
            raise ValueError(f"profiles: {self.name} needs both placements and placement_size, or neither")
        for start in self.placements:
            if start + (self.placement_size or 0) > 8:
                raise ValueError(
                    f"profiles: {self.name} placement {start} of size {self.placement_size} "
                    "goes past the 8 memory slices"
                )


class MigSupport(_Schema, frozen=True):
    """MIG capability of a GPU model. A model without it is not MIG capable."""

    profiles: Annotated[list[GpuInstanceProfile], Meta(min_length=1)]
    max_devices: Annotated[int, Meta(ge=1, le=254)] = 7

    def __post_init__(self) -> None:
        for attr in ("name", "index", "id"):
            values = [getattr(p, attr) for p in self.profiles]
            dupes = sorted({str(v) for v in values if values.count(v) > 1})
            if dupes:
                raise ValueError(f"profiles: duplicate {attr} {', '.join(dupes)}")

    def profile(self, name: str) -> GpuInstanceProfile | None:
        return next((p for p in self.profiles if p.name == name), None)


class GpuModel(_Schema, frozen=True):
    """What every GPU of one product has in common."""

    name: str  # as nvmlDeviceGetName reports it, e.g. "NVIDIA A100-SXM4-40GB"
    memory_mib: _Positive
    compute_capability: Annotated[str, Meta(pattern=r"^\d+\.\d+$")]  # quote it in YAML: "8.0"
    multiprocessors: _Positive
    pci_device_id: _NonNegative = 0  # e.g. 0x20B010DE
    nvlinks: Annotated[int, Meta(ge=0, le=pynvml.NVML_NVLINK_MAX_LINKS)] = 0  # NVLink ports per GPU
    ecc_recovery: Literal["row_remapping", "page_retirement", "none"] = "row_remapping"
    # supported event types
    events: list[EventName] = msgspec.field(default_factory=lambda: list(EVENT_TYPES))
    mig: MigSupport | None = None

    @property
    def cc(self) -> tuple[int, int]:
        major, minor = self.compute_capability.split(".")
        return int(major), int(minor)


class PciePlacement(_Schema, frozen=True):
    """Where a GPU hangs in the PCIe tree; the NVML topology level of two GPUs follows from it."""

    cpu: _NonNegative  # CPU socket of the root port
    host_bridge: str  # root complex / host bridge name
    # PCIe switches from the host bridge down to the GPU
    switches: list[str] = msgspec.field(default_factory=list)


class MigDeviceSpec(_Schema, frozen=True):
    uuid: Annotated[str, Meta(pattern=_MIG_UUID)]
    profile: str  # a GPU instance profile name of the model
    gi: _NonNegative  # GPU instance id
    ci: _NonNegative = 0  # compute instance id
    # slices of the compute instance; default: the whole GI
    compute_slices: Annotated[int, Meta(ge=1)] | None = None


class MigConfig(_Schema, frozen=True):
    enabled: bool = False
    devices: list[MigDeviceSpec] = msgspec.field(default_factory=list)  # in enumeration (slot) order


class GpuSpec(_Schema, frozen=True):
    model: str  # a key of `models`
    uuid: Annotated[str, Meta(pattern=_GPU_UUID)]
    pci_bus_id: Annotated[str, Meta(pattern=_NVML_BUS_ID)]
    minor: _NonNegative  # /dev/nvidia<minor>
    pcie: PciePlacement
    numa_node: _NonNegative | None = None  # None: sysfs reports -1
    mig: MigConfig = msgspec.field(default_factory=MigConfig)


class NvlinkPair(_Schema, frozen=True):
    gpus: tuple[int, int]  # GPU indices
    links: Annotated[int, Meta(ge=1)]


class NvlinkFabric(_Schema, frozen=True):
    # NVSwitch PCI bus ids; GPU links are spread over them
    switches: list[str] = msgspec.field(default_factory=list)
    switch_links_per_gpu: _NonNegative = 0
    pairs: list[NvlinkPair] = msgspec.field(default_factory=list)  # direct GPU-to-GPU links

    def __post_init__(self) -> None:
        for bus_id in self.switches:
            try:
                parse_pci_bus_id(bus_id)
            except ValueError as err:
                raise ValueError(f"switches: {err}") from None


class Profile(_Schema, frozen=True):
    """A node as the fake NVML presents it."""

    description: str  # one line, shown by `kubegpu fake-nvml profiles`
    driver_version: str = "550.90.07"
    cuda_driver_version: Annotated[str, Meta(pattern=r"^\d+\.\d+$")] = "12.4"
    init_error: str | None = None  # an NVML_ERROR_* name without the prefix, e.g. DRIVER_NOT_LOADED
    models: dict[str, GpuModel] = msgspec.field(default_factory=dict)
    gpus: list[GpuSpec] = msgspec.field(default_factory=list)
    nvlink: NvlinkFabric = msgspec.field(default_factory=NvlinkFabric)

    def __post_init__(self) -> None:
        if self.init_error is not None and not hasattr(pynvml, f"NVML_ERROR_{self.init_error}"):
            raise ValueError(
                f"init_error: {self.init_error!r} is not an NVML error name "
                "(e.g. DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND)"
            )
        self._check_models()
        self._check_unique()
        for i, gpu in enumerate(self.gpus):
            _check_mig(f"gpus[{i}]", gpu, self.models[gpu.model])
        self._check_nvlink()

    def _check_models(self) -> None:
        for i, gpu in enumerate(self.gpus):
            if gpu.model not in self.models:
                known = ", ".join(sorted(self.models)) or "none defined"
                raise ValueError(f"gpus[{i}].model: unknown model {gpu.model!r} (models: {known})")

    def _check_unique(self) -> None:
        uuids = [g.uuid for g in self.gpus] + [m.uuid for g in self.gpus for m in g.mig.devices]
        _no_dupes("uuid", uuids)
        _no_dupes("pci_bus_id", [g.pci_bus_id for g in self.gpus] + self.nvlink.switches)
        _no_dupes("minor", [g.minor for g in self.gpus])

    def _check_nvlink(self) -> None:
        fabric = self.nvlink
        if fabric.switch_links_per_gpu and not fabric.switches:
            raise ValueError("nvlink.switches: switch_links_per_gpu is set but no NVSwitch is listed")
        used = [fabric.switch_links_per_gpu] * len(self.gpus)
        for n, pair in enumerate(fabric.pairs):
            a, b = pair.gpus
            if a == b or not (0 <= a < len(self.gpus) and 0 <= b < len(self.gpus)):
                raise ValueError(f"nvlink.pairs[{n}].gpus: {list(pair.gpus)} must be two GPU indices")
            used[a] += pair.links
            used[b] += pair.links
        for i, gpu in enumerate(self.gpus):
            ports = self.models[gpu.model].nvlinks
            if used[i] > ports:
                raise ValueError(f"nvlink: GPU {i} uses {used[i]} NVLinks but model {gpu.model} has {ports}")


def _no_dupes(what: str, values: list[Any]) -> None:
    dupes = sorted({str(v) for v in values if values.count(v) > 1})
    if dupes:
        raise ValueError(f"gpus: duplicate {what} {', '.join(dupes)}")


def _check_mig(where: str, gpu: GpuSpec, model: GpuModel) -> None:
    mig = gpu.mig
    if mig.devices and not mig.enabled:
        raise ValueError(f"{where}.mig.devices: MIG devices are listed but mig.enabled is false")
    if not mig.enabled:
        return
    if model.mig is None:
        raise ValueError(f"{where}.mig.enabled: model {gpu.model} is not MIG capable (it has no mig section)")
    if len(mig.devices) > model.mig.max_devices:
        raise ValueError(
            f"{where}.mig.devices: {len(mig.devices)} devices, the model allows {model.mig.max_devices}"
        )
    gi_profiles: dict[int, GpuInstanceProfile] = {}
    for j, dev in enumerate(mig.devices):
        at = f"{where}.mig.devices[{j}]"
        profile = model.mig.profile(dev.profile)
        if profile is None:
            known = ", ".join(p.name for p in model.mig.profiles)
            raise ValueError(f"{at}.profile: {dev.profile!r} is not a MIG profile of {gpu.model} ({known})")
        if gi_profiles.setdefault(dev.gi, profile) != profile:
            raise ValueError(f"{at}.gi: GPU instance {dev.gi} is used with two profiles")
        if dev.compute_slices is not None and dev.compute_slices > profile.slices:
            raise ValueError(
                f"{at}.compute_slices: {dev.compute_slices} exceeds the {profile.slices} of {profile.name}"
            )
    _no_dupes("MIG gi/ci", [(d.gi, d.ci) for d in mig.devices])
    capacity = max(p.slices for p in model.mig.profiles)
    used = sum(p.slices for p in gi_profiles.values())
    if used > capacity:
        raise ValueError(f"{where}.mig.devices: GPU instances take {used} slices, the GPU has {capacity}")


class ProfileError(ValueError):
    """A fake NVML profile that cannot be found, read or validated. The message names the field."""


_PROFILE_SUFFIXES = (".yaml", ".yml")


def _builtin_dir() -> Any:
    return resources.files("kubegpu.node.nvml").joinpath("profiles")


def profile_names() -> list[str]:
    """Names of the profiles shipped with kubegpu."""
    names = (
        entry.name.rsplit(".", 1)[0]
        for entry in _builtin_dir().iterdir()
        if entry.name.endswith(_PROFILE_SUFFIXES)
    )
    return sorted(names)


def load_profile(ref: str) -> tuple[str, Profile]:
    """(name, profile) for a built-in profile name or a path to a .yaml profile."""
    if ref.endswith(_PROFILE_SUFFIXES) or os.sep in ref:
        path = Path(ref)
        try:
            text = read_text_file(path, limit=PROFILE_LIMIT, what="fake NVML profile")
        except FileProblem as err:
            raise ProfileError(f"cannot read fake NVML profile {err}") from err
        return path.stem, parse_profile(text, str(path))
    if ref not in profile_names():
        raise ProfileError(
            f"unknown fake NVML profile {ref!r}: use one of {', '.join(profile_names())}, "
            "or a path to a .yaml profile"
        )
    return ref, parse_profile(_builtin_dir().joinpath(f"{ref}.yaml").read_text(), ref)


def parse_profile(text: str, source: str) -> Profile:
    try:
        data = load_yaml(text).value
    except GoYamlError as err:
        where = f" (line {err.line}, column {err.column})" if err.line else ""
        raise ProfileError(f"fake NVML profile {source} is not valid YAML: {err}{where}") from err
    if not isinstance(data, dict):
        raise ProfileError(f"fake NVML profile {source} must be a YAML mapping")
    try:
        return msgspec.convert(data, Profile)
    except msgspec.ValidationError as err:
        raise ProfileError(f"fake NVML profile {source} is invalid: {_located(str(err))}") from err


def _located(message: str) -> str:
    """msgspec's `<what> - at `$.gpus[0].uuid`` as `gpus[0].uuid: <what>`; a missing or unknown field is
    named in the place. Whole-profile checks name their field in the message."""
    what, _, at = message.partition(" - at `$")
    where = at.removesuffix("`").lstrip(".")
    for prefix, problem in (
        ("Object missing required field `", "a required field is missing"),
        ("Object contains unknown field `", "unknown field"),
    ):
        if what.startswith(prefix):
            key = what.removeprefix(prefix).removesuffix("`")
            return f"{where}.{key}: {problem}" if where else f"{key}: {problem}"
    return f"{where}: {what}" if where else what


@dataclass(frozen=True, slots=True)
class ProfileSummary:
    name: str
    description: str
    gpus: str  # e.g. "8x NVIDIA A100-SXM4-40GB"


def summarize(name: str, profile: Profile) -> ProfileSummary:
    counts = collections.Counter(profile.models[g.model].name for g in profile.gpus)
    gpus = ", ".join(f"{n}x {model}" for model, n in counts.items()) or "none"
    return ProfileSummary(name, profile.description, gpus)


def list_profiles() -> list[ProfileSummary]:
    return [summarize(*load_profile(name)) for name in profile_names()]

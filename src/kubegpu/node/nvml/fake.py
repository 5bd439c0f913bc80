"""A fake NVML at the nvidia-ml-py (`pynvml`) API surface, driven by a node profile.

`FakeNvml` has the functions the plugin calls, with pynvml's names and signatures, returning pynvml's
own structs and raising pynvml's own `NVMLError` subclasses with the real codes. Device, GPU instance
and event set handles are real pynvml ctypes pointer types whose (never dereferenced) addresses encode
what they point at, so code that works on them works on real NVML handles too: they do not compare
equal, and `kubegpu.nvml.device_handle_id()` identifies them. pynvml constants and classes are
reachable as attributes (`fake.NVML_ERROR_NOT_FOUND`); a pynvml function the fake lacks raises
NVML_ERROR_FUNCTION_NOT_FOUND, as an old driver would.

Behaviour worth knowing:
- Every call before nvmlInit (or after the last nvmlShutdown) raises NVML_ERROR_UNINITIALIZED; nvmlInit
  raises the profile's `init_error` (driver not loaded, library not found, ...).
- A lost GPU (`kubegpu fake-nvml inject --lost`) makes every call on it, its MIG devices and its GPU
  instances raise NVML_ERROR_GPU_IS_LOST, nvmlDeviceGetHandleByIndex included.
- MIG device handles support UUID, name, memory, attributes, GI/CI id, PCI info and compute capability
  (the parent's); other calls on them raise NVML_ERROR_NOT_SUPPORTED.
- NVLink slots past the model's link count raise NOT_SUPPORTED (as real GPUs do, which is why
  go-gpuallocator skips that code); past NVML_NVLINK_MAX_LINKS, INVALID_ARGUMENT.
- Events come from the state directory (see `state.py`); an event set delivers only events appended
  after it was created and its device registered, for the registered types.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import os
import random
import shutil
import tempfile
import threading
import time
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal, NoReturn

import pynvml
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kubegpu.common.files import write_atomic
from kubegpu.node.nvml.fake_state import EventRecord, StateDir
from kubegpu.node.nvml.pci import parse_pci_bus_id, sysfs_bus_id

log = logging.getLogger(__name__)

MIB = 1024 * 1024

# ------------------------------------------------------------------------------------------------
# Profile schema
# ------------------------------------------------------------------------------------------------

_GPU_UUID = r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
_MIG_UUID = r"^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
_NVML_BUS_ID = r"^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]$"  # NVML's own form: 8-digit domain, upper case

EVENT_TYPES: dict[str, int] = {
    "xid": pynvml.nvmlEventTypeXidCriticalError,
    "single_bit_ecc": pynvml.nvmlEventTypeSingleBitEccError,
    "double_bit_ecc": pynvml.nvmlEventTypeDoubleBitEccError,
    "pstate": pynvml.nvmlEventTypePState,
    "clock": pynvml.nvmlEventTypeClock,
}
EventName = Literal["xid", "single_bit_ecc", "double_bit_ecc", "pstate", "clock"]


class _Schema(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuInstanceProfile(_Schema):
    """One GPU instance profile of a MIG-capable model: a row of `nvidia-smi mig -lgip`."""

    name: str = Field(pattern=r"^\d+g\.\d+gb([+-][a-z.,]+)?$")  # e.g. "1g.5gb", "1g.5gb+me"
    index: int = Field(ge=0, lt=pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT)  # NVML_GPU_INSTANCE_PROFILE_*
    id: int = Field(ge=0)  # the profile ID NVML reports (the "ID" column of `nvidia-smi mig -lgip`)
    slices: int = Field(ge=1, le=8)
    instances: int = Field(ge=1)  # how many of it fit on an empty GPU
    memory_mib: int = Field(gt=0)
    multiprocessors: int = Field(gt=0)
    copy_engines: int = Field(0, ge=0)
    decoders: int = Field(0, ge=0)
    encoders: int = Field(0, ge=0)
    jpegs: int = Field(0, ge=0)
    ofas: int = Field(0, ge=0)


class MigSupport(_Schema):
    """MIG capability of a GPU model. A model without it is not MIG capable."""

    max_devices: int = Field(7, ge=1, le=254)
    profiles: list[GpuInstanceProfile] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> MigSupport:
        for attr in ("name", "index", "id"):
            values = [getattr(p, attr) for p in self.profiles]
            dupes = sorted({str(v) for v in values if values.count(v) > 1})
            if dupes:
                raise ValueError(f"profiles: duplicate {attr} {', '.join(dupes)}")
        return self

    def profile(self, name: str) -> GpuInstanceProfile | None:
        return next((p for p in self.profiles if p.name == name), None)


class GpuModel(_Schema):
    """What every GPU of one product has in common."""

    name: str  # as nvmlDeviceGetName reports it, e.g. "NVIDIA A100-SXM4-40GB"
    memory_mib: int = Field(gt=0)
    compute_capability: str = Field(pattern=r"^\d+\.\d+$")  # quote it in YAML: "8.0"
    multiprocessors: int = Field(gt=0)
    pci_device_id: int = Field(0, ge=0)  # e.g. 0x20B010DE
    nvlinks: int = Field(0, ge=0, le=pynvml.NVML_NVLINK_MAX_LINKS)  # NVLink ports per GPU
    ecc_recovery: Literal["row_remapping", "page_retirement", "none"] = "row_remapping"
    events: list[EventName] = Field(default_factory=lambda: list(EVENT_TYPES))  # supported event types
    mig: MigSupport | None = None

    @property
    def cc(self) -> tuple[int, int]:
        major, minor = self.compute_capability.split(".")
        return int(major), int(minor)


class PciePlacement(_Schema):
    """Where a GPU hangs in the PCIe tree; the NVML topology level of two GPUs follows from it."""

    cpu: int = Field(ge=0)  # CPU socket of the root port
    host_bridge: str  # root complex / host bridge name
    switches: list[str] = Field(default_factory=list)  # PCIe switches from the host bridge down to the GPU


class MigDeviceSpec(_Schema):
    uuid: str = Field(pattern=_MIG_UUID)
    profile: str  # a GPU instance profile name of the model
    gi: int = Field(ge=0)  # GPU instance id
    ci: int = Field(0, ge=0)  # compute instance id
    compute_slices: int | None = Field(None, ge=1)  # slices of the compute instance; default: the whole GI


class MigConfig(_Schema):
    enabled: bool = False
    devices: list[MigDeviceSpec] = Field(default_factory=list)  # in enumeration (slot) order


class GpuSpec(_Schema):
    model: str  # a key of `models`
    uuid: str = Field(pattern=_GPU_UUID)
    pci_bus_id: str = Field(pattern=_NVML_BUS_ID)
    minor: int = Field(ge=0)  # /dev/nvidia<minor>
    numa_node: int | None = Field(None, ge=0)  # None: sysfs reports -1
    pcie: PciePlacement
    mig: MigConfig = Field(default_factory=MigConfig)


class NvlinkPair(_Schema):
    gpus: tuple[int, int]  # GPU indices
    links: int = Field(ge=1)


class NvlinkFabric(_Schema):
    switches: list[str] = Field(default_factory=list)  # NVSwitch PCI bus ids; GPU links are spread over them
    switch_links_per_gpu: int = Field(0, ge=0)
    pairs: list[NvlinkPair] = Field(default_factory=list)  # direct GPU-to-GPU links

    @field_validator("switches")
    @classmethod
    def _bus_ids(cls, value: list[str]) -> list[str]:
        for bus_id in value:
            parse_pci_bus_id(bus_id)
        return value


class Profile(_Schema):
    """A node as the fake NVML presents it."""

    description: str  # one line, shown by `kubegpu fake-nvml profiles`
    driver_version: str = "550.90.07"
    cuda_driver_version: str = Field("12.4", pattern=r"^\d+\.\d+$")
    init_error: str | None = None  # an NVML_ERROR_* name without the prefix, e.g. DRIVER_NOT_LOADED
    models: dict[str, GpuModel] = Field(default_factory=dict)
    gpus: list[GpuSpec] = Field(default_factory=list)
    nvlink: NvlinkFabric = Field(default_factory=NvlinkFabric)

    @field_validator("init_error")
    @classmethod
    def _known_error(cls, value: str | None) -> str | None:
        if value is not None and not hasattr(pynvml, f"NVML_ERROR_{value}"):
            raise ValueError(
                f"{value!r} is not an NVML error name (e.g. DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND)"
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Profile:
        self._check_models()
        self._check_unique()
        for i, gpu in enumerate(self.gpus):
            _check_mig(f"gpus[{i}]", gpu, self.models[gpu.model])
        self._check_nvlink()
        return self

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
            text = path.read_text()
        except OSError as err:
            raise ProfileError(f"cannot read fake NVML profile {path}: {err.strerror}") from err
        return path.stem, parse_profile(text, str(path))
    if ref not in profile_names():
        raise ProfileError(
            f"unknown fake NVML profile {ref!r}: use one of {', '.join(profile_names())}, "
            "or a path to a .yaml profile"
        )
    return ref, parse_profile(_builtin_dir().joinpath(f"{ref}.yaml").read_text(), ref)


def parse_profile(text: str, source: str) -> Profile:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ProfileError(f"fake NVML profile {source} is not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ProfileError(f"fake NVML profile {source} must be a YAML mapping")
    try:
        return Profile.model_validate(data)
    except ValidationError as err:
        lines = [
            f"  {_error_location(e['loc'])}{e['msg'].removeprefix('Value error, ')}" for e in err.errors()
        ]
        raise ProfileError(f"fake NVML profile {source} is invalid:\n" + "\n".join(lines)) from err


def _error_location(loc: tuple[int | str, ...]) -> str:
    if not loc:
        return ""  # whole-profile checks name their field in the message
    text = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")
    return f"{text}: "


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


# ------------------------------------------------------------------------------------------------
# The fake
# ------------------------------------------------------------------------------------------------

# Handles are pynvml pointer types with made-up addresses (never dereferenced): BASE | (gpu+1) << 8 | x.
_DEVICE_BASE = 0x7E57_0000_0000  # x = MIG slot + 1, 0 for the GPU itself
_GPU_INSTANCE_BASE = 0x7E58_0000_0000  # x = GPU instance id
_EVENT_SET_BASE = 0x7E59_0000_0000  # low bits = event set serial
_POLL_S = 0.002  # event wait polls the events log this often: injected -> delivered in a few ms


def _fail(code: int) -> NoReturn:
    raise pynvml.NVMLError(code)


def _pointer(ptr_type: Any, address: int) -> Any:
    return ctypes.cast(ctypes.c_void_p(address), ptr_type)


def _address(handle: Any, ptr_type: Any) -> int:
    if not isinstance(handle, ptr_type):
        _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


def _pci_info(bus_id: str, device_id: int = 0) -> Any:
    domain, bus, device, function = parse_pci_bus_id(bus_id)
    info = pynvml.nvmlPciInfo_t()
    info.busIdLegacy = f"{domain:04X}:{bus:02X}:{device:02X}.{function:X}"
    info.busId = f"{domain:08X}:{bus:02X}:{device:02X}.{function:X}"
    info.domain, info.bus, info.device = domain, bus, device
    info.pciDeviceId = device_id
    info.pciSubSystemId = 0
    return info


@dataclass(frozen=True, slots=True)
class _Link:
    remote_bus_id: str
    remote_type: int  # NVML_NVLINK_DEVICE_TYPE_*
    remote_device_id: int = 0


@dataclass(frozen=True, slots=True)
class _Mig:
    slot: int
    spec: MigDeviceSpec
    gi_profile: GpuInstanceProfile
    compute_slices: int

    @property
    def profile_name(self) -> str:
        if self.compute_slices == self.gi_profile.slices:
            return self.gi_profile.name
        return f"{self.compute_slices}c.{self.gi_profile.name}"


@dataclass(frozen=True, slots=True)
class _Gpu:
    index: int
    spec: GpuSpec
    model: GpuModel
    links: tuple[_Link | None, ...]  # one per NVLink port; None = inactive
    migs: tuple[_Mig, ...] = ()

    def mig_by_gi(self, gi: int) -> _Mig | None:
        return next((m for m in self.migs if m.spec.gi == gi), None)


@dataclass
class _EventSet:
    cursor: int  # events-log offset read so far
    registered: dict[int, tuple[int, int]] = field(default_factory=dict)  # gpu -> (event types, since offset)
    pending: collections.deque[EventRecord] = field(default_factory=collections.deque)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def wants(self, offset: int, record: EventRecord) -> bool:
        if record.kind == "wait_error":
            return True
        types_, since = self.registered.get(record.gpu if record.gpu is not None else -1, (0, 0))
        return bool(types_ & record.event_type) and offset >= since


def _build_gpus(profile: Profile) -> tuple[_Gpu, ...]:
    ports: list[list[_Link | None]] = [[] for _ in profile.gpus]

    def link_to(i: int) -> _Link:
        gpu = profile.gpus[i]
        return _Link(
            gpu.pci_bus_id, pynvml.NVML_NVLINK_DEVICE_TYPE_GPU, profile.models[gpu.model].pci_device_id
        )

    for pair in profile.nvlink.pairs:
        a, b = pair.gpus
        ports[a] += [link_to(b)] * pair.links
        ports[b] += [link_to(a)] * pair.links
    switches = profile.nvlink.switches
    for links in ports:
        for n in range(profile.nvlink.switch_links_per_gpu):  # spread round-robin, as on DGX boards
            links.append(_Link(switches[n % len(switches)], pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH))
    gpus = []
    for i, spec in enumerate(profile.gpus):
        model = profile.models[spec.model]
        links = tuple(ports[i] + [None] * (model.nvlinks - len(ports[i])))
        gpus.append(_Gpu(i, spec, model, links, _build_migs(spec, model)))
    return tuple(gpus)


def _build_migs(spec: GpuSpec, model: GpuModel) -> tuple[_Mig, ...]:
    if not spec.mig.enabled or model.mig is None:
        return ()
    migs = []
    for slot, dev in enumerate(spec.mig.devices):
        gi_profile = model.mig.profile(dev.profile)
        assert gi_profile is not None  # checked by the schema
        migs.append(_Mig(slot, dev, gi_profile, dev.compute_slices or gi_profile.slices))
    return tuple(migs)


def _topology_level(a: PciePlacement, b: PciePlacement) -> int:
    if a.cpu != b.cpu:
        return pynvml.NVML_TOPOLOGY_SYSTEM
    if a.host_bridge != b.host_bridge:
        return pynvml.NVML_TOPOLOGY_NODE
    if not a.switches or not b.switches or a.switches[0] != b.switches[0]:
        return pynvml.NVML_TOPOLOGY_HOSTBRIDGE
    return pynvml.NVML_TOPOLOGY_SINGLE if a.switches == b.switches else pynvml.NVML_TOPOLOGY_MULTIPLE


class FakeNvml:
    """A node's NVML as described by a `Profile`, with faults and events from a `StateDir`."""

    def __init__(self, profile: Profile, *, name: str = "custom", state_dir: Path | None = None) -> None:
        self.profile = profile
        self.profile_name = name
        if state_dir is None:
            state_dir = Path(tempfile.mkdtemp(prefix="kubegpu-fake-nvml-"))
            weakref.finalize(self, shutil.rmtree, state_dir, ignore_errors=True)
        self.state = StateDir(state_dir).create()
        self._gpus = _build_gpus(profile)
        self._lock = threading.Lock()
        self._init_count = 0
        self._event_sets: dict[int, _EventSet] = {}
        self._next_event_set = 1
        self._write_sysfs()
        self.state.write_meta(
            {
                "profile": name,
                "pid": os.getpid(),
                "gpus": [{"index": g.index, "uuid": g.spec.uuid} for g in self._gpus],
            }
        )

    @classmethod
    def from_profile(cls, ref: str, *, state_dir: Path | None = None) -> FakeNvml:
        name, profile = load_profile(ref)
        return cls(profile, name=name, state_dir=state_dir)

    @property
    def sysfs_root(self) -> Path:
        return self.state.sysfs_root

    @property
    def description(self) -> str:
        if self.profile.init_error:
            what = f"nvmlInit fails with NVML_ERROR_{self.profile.init_error}"
        else:
            what = summarize(self.profile_name, self.profile).gpus
        return f"fake NVML, profile {self.profile_name} ({what}), state {self.state.path}"

    def _write_sysfs(self) -> None:
        for gpu in self._gpus:
            directory = self.sysfs_root / "bus" / "pci" / "devices" / sysfs_bus_id(gpu.spec.pci_bus_id)
            directory.mkdir(parents=True, exist_ok=True)
            numa = gpu.spec.numa_node if gpu.spec.numa_node is not None else -1
            write_atomic(directory / "numa_node", f"{numa}\n".encode(), durable=False)
            # PCI class 0x0302xx: a 3D controller, i.e. a GPU in compute mode (GFD's gpu.mode label).
            write_atomic(directory / "class", b"0x030200\n", durable=False)

    def __getattr__(self, name: str) -> Any:
        # Constants, structs and NVMLError classes are pynvml's own; functions the fake lacks fail
        # the way a missing symbol in an old libnvidia-ml does.
        value = getattr(pynvml, name)  # AttributeError for names pynvml does not have either
        if isinstance(value, types.FunctionType) and name.startswith("nvml"):
            return _missing_function(name)
        return value

    # -- handles ------------------------------------------------------------------------------------

    def _require_init(self) -> None:
        if self._init_count == 0:
            _fail(pynvml.NVML_ERROR_UNINITIALIZED)

    def _check_alive(self, gpu: _Gpu) -> None:
        faults = self.state.faults().gpu(gpu.index)
        if faults.lost:
            _fail(pynvml.NVML_ERROR_GPU_IS_LOST)
        if faults.flaky and random.random() < faults.flaky:
            _fail(pynvml.NVML_ERROR_UNKNOWN)

    def _device_handle(self, gpu: int, mig_slot: int | None = None) -> Any:
        low = (gpu + 1) << 8 | (0 if mig_slot is None else mig_slot + 1)
        return _pointer(pynvml.c_nvmlDevice_t, _DEVICE_BASE | low)

    def _resolve(self, handle: Any) -> tuple[_Gpu, _Mig | None]:
        self._require_init()
        low = _address(handle, pynvml.c_nvmlDevice_t) - _DEVICE_BASE
        gpu_index, slot = (low >> 8) - 1, (low & 0xFF) - 1
        if not (0 < low < 1 << 32 and 0 <= gpu_index < len(self._gpus)):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self._gpus[gpu_index]
        self._check_alive(gpu)
        if slot < 0:
            return gpu, None
        mig = next((m for m in gpu.migs if m.slot == slot), None)
        if mig is None:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu, mig

    def _gpu(self, handle: Any) -> _Gpu:
        """The physical GPU behind a full-GPU handle; MIG handles are not supported by the caller."""
        gpu, mig = self._resolve(handle)
        if mig is not None:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def _mig(self, handle: Any) -> tuple[_Gpu, _Mig]:
        gpu, mig = self._resolve(handle)
        if mig is None:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu, mig

    def _gpu_by_index(self, index: int) -> _Gpu:
        self._require_init()
        if not 0 <= index < len(self._gpus):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self._gpus[index]
        self._check_alive(gpu)
        return gpu

    # -- library ------------------------------------------------------------------------------------

    def nvmlInitWithFlags(self, flags: int) -> None:
        if self.profile.init_error:
            _fail(getattr(pynvml, f"NVML_ERROR_{self.profile.init_error}"))
        with self._lock:
            self._init_count += 1

    def nvmlInit(self) -> None:
        self.nvmlInitWithFlags(0)

    def nvmlShutdown(self) -> None:
        with self._lock:
            if self._init_count == 0:
                _fail(pynvml.NVML_ERROR_UNINITIALIZED)
            self._init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._require_init()
        return self.profile.driver_version

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._require_init()
        return f"{self.profile.cuda_driver_version.split('.')[0]}.{self.profile.driver_version}"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._require_init()
        major, minor = self.profile.cuda_driver_version.split(".")
        return int(major) * 1000 + int(minor) * 10

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return self.nvmlSystemGetCudaDriverVersion()

    # -- devices ------------------------------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        self._require_init()
        return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return self._device_handle(self._gpu_by_index(index).index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> Any:
        self._require_init()
        wanted = uuid.decode() if isinstance(uuid, bytes) else uuid
        for gpu in self._gpus:
            slot = None
            if gpu.spec.uuid != wanted:
                slot = next((m.slot for m in gpu.migs if m.spec.uuid == wanted), None)
                if slot is None:
                    continue
            self._check_alive(gpu)
            return self._device_handle(gpu.index, slot)
        _fail(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetHandleByPciBusId(self, pciBusId: str | bytes) -> Any:
        self._require_init()
        wanted = parse_pci_bus_id(pciBusId.decode() if isinstance(pciBusId, bytes) else pciBusId)
        for gpu in self._gpus:
            if parse_pci_bus_id(gpu.spec.pci_bus_id) == wanted:
                self._check_alive(gpu)
                return self._device_handle(gpu.index)
        _fail(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return self._gpu(handle).index

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        gpu, mig = self._resolve(handle)
        return mig.spec.uuid if mig else gpu.spec.uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        gpu, mig = self._resolve(handle)
        return f"{gpu.model.name} MIG {mig.profile_name}" if mig else gpu.model.name

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        gpu, mig = self._resolve(handle)
        total = (mig.gi_profile.memory_mib if mig else gpu.model.memory_mib) * MIB
        memory = pynvml.c_nvmlMemory_v2_t() if version else pynvml.c_nvmlMemory_t()
        if version:
            memory.version = version
        memory.total, memory.free, memory.used = total, total, 0
        return memory

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return self._gpu(handle).spec.minor

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        return self._resolve(handle)[0].model.cc

    def nvmlDeviceGetPciInfo_v3(self, handle: Any) -> Any:
        gpu, _ = self._resolve(handle)
        return _pci_info(gpu.spec.pci_bus_id, gpu.model.pci_device_id)

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        return self.nvmlDeviceGetPciInfo_v3(handle)

    # -- MIG ----------------------------------------------------------------------------------------

    def _mig_capable(self, device: Any) -> tuple[_Gpu, MigSupport]:
        gpu = self._gpu(device)
        if gpu.model.mig is None:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu, gpu.model.mig

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        gpu, _ = self._mig_capable(device)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.spec.mig.enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]  # [current, pending]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        return self._mig_capable(device)[1].max_devices

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        gpu, mig = self._mig_capable(device)
        if not 0 <= index < mig.max_devices:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not any(m.slot == index for m in gpu.migs):
            _fail(pynvml.NVML_ERROR_NOT_FOUND)
        return self._device_handle(gpu.index, index)

    def nvmlDeviceIsMigDeviceHandle(self, device: Any) -> Any:
        # pynvml returns the ctypes c_uint itself here, not its value; so does the fake.
        return ctypes.c_uint(int(self._resolve(device)[1] is not None))

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Any) -> Any:
        gpu, mig = self._resolve(migDevice)
        if mig is None:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._device_handle(gpu.index)

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        return self._mig(device)[1].spec.gi

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        return self._mig(device)[1].spec.ci

    def nvmlDeviceGetAttributes_v2(self, device: Any) -> Any:
        _, mig = self._mig(device)
        gi = mig.gi_profile
        attrs = pynvml.c_nvmlDeviceAttributes()
        attrs.multiprocessorCount = gi.multiprocessors * mig.compute_slices // gi.slices
        attrs.sharedCopyEngineCount = gi.copy_engines
        attrs.sharedDecoderCount = gi.decoders
        attrs.sharedEncoderCount = gi.encoders
        attrs.sharedJpegCount = gi.jpegs
        attrs.sharedOfaCount = gi.ofas
        attrs.gpuInstanceSliceCount = gi.slices
        attrs.computeInstanceSliceCount = mig.compute_slices
        attrs.memorySizeMB = gi.memory_mib
        return attrs

    def nvmlDeviceGetAttributes(self, device: Any) -> Any:
        return self.nvmlDeviceGetAttributes_v2(device)

    def nvmlDeviceGetGpuInstanceProfileInfo(self, device: Any, profile: int, version: int = 2) -> Any:
        _, mig = self._mig_capable(device)
        if not 0 <= profile < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        found = next((p for p in mig.profiles if p.index == profile), None)
        if found is None:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if version == 2:
            info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
            info.name = f"MIG {found.name}".encode()
        elif version == 1:
            info = pynvml.c_nvmlGpuInstanceProfileInfo_t()
        else:
            _fail(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        info.id, info.isP2pSupported, info.sliceCount = found.id, 0, found.slices
        info.instanceCount, info.multiprocessorCount = found.instances, found.multiprocessors
        info.copyEngineCount, info.decoderCount, info.encoderCount = (
            found.copy_engines,
            found.decoders,
            found.encoders,
        )
        info.jpegCount, info.ofaCount, info.memorySizeMB = found.jpegs, found.ofas, found.memory_mib
        return info

    def nvmlDeviceGetGpuInstanceById(self, device: Any, gpuInstanceId: int) -> Any:
        gpu, _ = self._mig_capable(device)
        if gpu.mig_by_gi(gpuInstanceId) is None:
            _fail(pynvml.NVML_ERROR_NOT_FOUND)
        return _pointer(pynvml.c_nvmlGpuInstance_t, _GPU_INSTANCE_BASE | (gpu.index + 1) << 8 | gpuInstanceId)

    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> Any:
        self._require_init()
        low = _address(gpuInstance, pynvml.c_nvmlGpuInstance_t) - _GPU_INSTANCE_BASE
        gpu_index, gi = (low >> 8) - 1, low & 0xFF
        if not (0 < low < 1 << 32 and 0 <= gpu_index < len(self._gpus)):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self._gpus[gpu_index]
        self._check_alive(gpu)
        mig = gpu.mig_by_gi(gi)
        if mig is None:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        info = pynvml.c_nvmlGpuInstanceInfo_t()
        info.device = self._device_handle(gpu.index)
        info.id, info.profileId = gi, mig.gi_profile.id
        info.placement.start, info.placement.size = 0, mig.gi_profile.slices
        return info

    # -- topology -----------------------------------------------------------------------------------

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: Any, device2: Any) -> int:
        a, b = self._gpu(device1), self._gpu(device2)
        if a.index == b.index:
            return pynvml.NVML_TOPOLOGY_INTERNAL
        return _topology_level(a.spec.pcie, b.spec.pcie)

    def _nvlink(self, device: Any, link: int) -> _Link | None:
        gpu = self._gpu(device)
        if not 0 <= link < pynvml.NVML_NVLINK_MAX_LINKS:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if link >= len(gpu.links):
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.links[link]

    def _active_nvlink(self, device: Any, link: int) -> _Link:
        found = self._nvlink(device, link)
        if found is None:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return found

    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        active = self._nvlink(device, link) is not None
        return pynvml.NVML_FEATURE_ENABLED if active else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: Any, link: int) -> Any:
        found = self._active_nvlink(device, link)
        return _pci_info(found.remote_bus_id, found.remote_device_id)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        return self._active_nvlink(handle, link).remote_type

    # -- health -------------------------------------------------------------------------------------

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: Any) -> int:
        gpu = self._gpu(device)
        if gpu.model.ecc_recovery != "page_retirement":
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        pending = self.state.faults().gpu(gpu.index).remap_pending
        return pynvml.NVML_FEATURE_ENABLED if pending else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        gpu = self._gpu(device)
        if gpu.model.ecc_recovery != "row_remapping":
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        faults = self.state.faults().gpu(gpu.index)
        return (0, faults.ecc_uncorrected, int(faults.remap_pending), 0)  # corr, unc, pending, failure

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        gpu = self._gpu(handle)
        if gpu.model.ecc_recovery == "none":
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        faults = self.state.faults().gpu(gpu.index)
        if errorType == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return faults.ecc_corrected
        if errorType == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return faults.ecc_uncorrected
        _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    # -- events -------------------------------------------------------------------------------------

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        gpu = self._gpu(handle)
        mask = 0
        for name in gpu.model.events:
            mask |= EVENT_TYPES[name]
        return mask

    def nvmlEventSetCreate(self) -> Any:
        self._require_init()
        with self._lock:
            serial = self._next_event_set
            self._next_event_set += 1
            self._event_sets[serial] = _EventSet(cursor=self.state.events_end())
        return _pointer(pynvml.c_nvmlEventSet_t, _EVENT_SET_BASE | serial)

    def _event_set(self, eventSet: Any) -> _EventSet:
        self._require_init()
        found = self._event_sets.get(_address(eventSet, pynvml.c_nvmlEventSet_t) - _EVENT_SET_BASE)
        if found is None:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return found

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        gpu = self._gpu(handle)
        event_set = self._event_set(eventSet)
        if eventTypes & ~self.nvmlDeviceGetSupportedEventTypes(handle):
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        with event_set.lock:
            old_types, since = event_set.registered.get(gpu.index, (0, self.state.events_end()))
            event_set.registered[gpu.index] = (old_types | eventTypes, since)

    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int) -> Any:
        event_set = self._event_set(eventSet)
        deadline = time.monotonic() + timeoutms / 1000
        while True:
            record = self._next_event(event_set)
            if record is not None:
                return self._event_data(record)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                _fail(pynvml.NVML_ERROR_TIMEOUT)
            time.sleep(min(_POLL_S, remaining))

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> Any:
        return self.nvmlEventSetWait_v2(eventSet, timeoutms)

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        self._event_set(eventSet)
        with self._lock:
            del self._event_sets[_address(eventSet, pynvml.c_nvmlEventSet_t) - _EVENT_SET_BASE]

    def _next_event(self, event_set: _EventSet) -> EventRecord | None:
        with event_set.lock:
            if not event_set.pending:
                records, event_set.cursor = self.state.read_events(event_set.cursor)
                event_set.pending.extend(r for offset, r in records if event_set.wants(offset, r))
            return event_set.pending.popleft() if event_set.pending else None

    def _event_data(self, record: EventRecord) -> Any:
        if record.kind == "wait_error":
            _fail(pynvml.NVML_ERROR_UNKNOWN)
        data = pynvml.c_nvmlEventData_t()
        data.device = self._device_handle(record.gpu or 0)
        data.eventType, data.eventData = record.event_type, record.data
        data.gpuInstanceId, data.computeInstanceId = record.gi, record.ci
        return data


def _missing_function(name: str) -> Callable[..., NoReturn]:
    def missing(*args: Any, **kwargs: Any) -> NoReturn:
        log.debug("fake NVML has no %s; raising NVML_ERROR_FUNCTION_NOT_FOUND", name)
        _fail(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    missing.__name__ = name
    return missing

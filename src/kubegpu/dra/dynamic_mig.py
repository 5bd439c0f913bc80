"""DynamicMIG: MIG partitions created at Prepare and destroyed at Unprepare, as NVIDIA's DRA driver does.

- `read_tables` reads each MIG-mode GPU's profile table from NVML once at start (`dra.partitions` turns it
  into the devices and counters that are published).
- `DynamicMig.create` makes the GPU instance at the placement the device's name encodes and the compute
  instance spanning it, and returns the MIG device (for its CDI entry). A live MIG device of that name is
  adopted instead: the same claim prepared again after its checkpoint entry was lost, or a claim sharing the
  partition with ConsumableShares (Prepare has already refused a device another claim may not share); a
  failed Prepare destroys only what it created. Errors carry NVIDIA's texts.
- `DynamicMig.destroy` finds the MIG device by its name (parent minor, GPU instance profile ID, placement
  start: what NVIDIA's checkpoint would record is read back from the GPU, so nothing is lost with the
  checkpoint) and destroys compute then GPU instance. Gone already is success.
- `DynamicMig.reconcile` destroys, at start, every MIG device of a partitioned GPU that no prepared claim
  holds (NVIDIA's `DestroyUnknownMIGDevices`).

MIG mode is never toggled (NVIDIA's A100 rule, kept for every GPU): a GPU takes part only when an
administrator enabled MIG mode before the driver started.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pynvml

from kubegpu.dra.claims import ClaimError
from kubegpu.dra.devices import DraDevice, device_entry
from kubegpu.dra.partitions import (
    NAME,
    MigProfile,
    Partition,
    partition_name,
    partitioned_node,
    partitions,
    published_entries,
)
from kubegpu.node.discovery_mig import GI_PROFILE_COUNT, engines_of, gi_profile_name
from kubegpu.node.inventory import Gpu, Inventory, MigDevice
from kubegpu.node.nvml.backend import NvmlApi
from kubegpu.settings.feature_gates import FeatureGates

log = logging.getLogger(__name__)

MIB = 1024 * 1024
NVMLError = pynvml.NVMLError

# NVML_COMPUTE_INSTANCE_PROFILE_* of the compute instance that spans a GPU instance of n compute slices
_FULL_CI_PROFILE = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4, 8: 0x5, 6: 0x6}

# nvmlErrorString's texts for the codes MIG management answers (NVIDIA's errors quote them).
_NVML_TEXT = {
    pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES: "Insufficient Resources",
    pynvml.NVML_ERROR_IN_USE: "In use by another client",
    pynvml.NVML_ERROR_NOT_FOUND: "Not Found",
    pynvml.NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    pynvml.NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    pynvml.NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    pynvml.NVML_ERROR_GPU_IS_LOST: "GPU is lost",
}


def dynamic_mig_enabled(gates: FeatureGates) -> bool:
    """Whether NVIDIA's DynamicMIG gate is on (`--feature-gates DynamicMIG=true`): the one place that asks."""
    return gates["DynamicMIG"]


def nvml_text(err: NVMLError) -> str:
    return _NVML_TEXT.get(err.value) or str(err)


class MigError(ClaimError):
    """A partition could not be created or destroyed; the message is NVIDIA's. The kubelet retries."""

    kind = "mig"


def read_tables(api: NvmlApi, inventory: Inventory) -> dict[str, tuple[MigProfile, ...]]:
    """Each MIG-mode GPU's profiles whose compute instance spans the GPU instance, with placements, by UUID.
    A GPU NVML cannot describe is left out (logged): it publishes nothing rather than a guess."""
    out: dict[str, tuple[MigProfile, ...]] = {}
    for gpu in inventory.gpus:
        if not gpu.mig_enabled:
            continue
        try:
            handle = api.nvmlDeviceGetHandleByUUID(gpu.uuid)
            table = tuple(_profiles(api, handle, gpu))
        except NVMLError as err:
            log.warning("DynamicMIG: cannot read the MIG profiles of GPU %s: %s", gpu.uuid, nvml_text(err))
            continue
        if table:
            out[gpu.uuid] = table
    return out


def _profiles(api: NvmlApi, handle: Any, gpu: Gpu) -> Iterable[MigProfile]:
    for index in range(GI_PROFILE_COUNT):
        try:
            info = api.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
        except NVMLError as err:
            if err.value in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT):
                continue  # not a profile of this GPU (NVIDIA skips these too)
            raise
        if info.sliceCount not in _FULL_CI_PROFILE:
            continue
        count = ctypes.c_uint(0)
        api.nvmlDeviceGetGpuInstancePossiblePlacements(handle, info.id, None, ctypes.byref(count))
        placements = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
        api.nvmlDeviceGetGpuInstancePossiblePlacements(handle, info.id, placements, ctypes.byref(count))
        found = [(p.start, p.size) for p in placements[: count.value]]
        if not found:
            continue
        yield MigProfile(
            name=gi_profile_name(index, info.sliceCount, info.memorySizeMB, gpu.memory_bytes),
            gi_profile_id=info.id,
            ci_profile=_FULL_CI_PROFILE[info.sliceCount],
            memory_bytes=info.memorySizeMB * MIB,
            engines=engines_of(info),
            placement_size=found[0][1],
            placements=tuple(start for start, _ in found),
        )


@dataclass(frozen=True, slots=True)
class LiveMig:
    """A MIG device that exists on a partitioned GPU, under its canonical name."""

    name: str
    gpu: Gpu
    device: MigDevice


class DynamicMig:
    """The partitions of the node's MIG-mode GPUs, and their creation and destruction through NVML."""

    def __init__(self, api: NvmlApi, tables: Mapping[str, tuple[MigProfile, ...]]) -> None:
        self.api = api
        self.tables = dict(tables)

    def devices(self, inventory: Inventory, include: Collection[str] | None = None) -> dict[str, DraDevice]:
        """The partition devices of the partitioned GPUs (all, or those whose UUID is in `include`)."""
        out: dict[str, DraDevice] = {}
        for gpu in sorted(inventory.gpus, key=lambda g: g.minor):
            if gpu.uuid in self.tables and (include is None or gpu.uuid in include):
                for p in partitions(gpu, self.tables[gpu.uuid]):
                    out[p.name] = DraDevice(p.name, gpu, dynamic=True)
        return out

    def partition(self, device: DraDevice) -> Partition:
        for p in partitions(device.gpu, self.tables.get(device.gpu.uuid, ())):
            if p.name == device.name:
                return p
        raise MigError(f"{device.name} is not a partition of GPU {device.gpu.uuid}")

    def table(
        self, table: Mapping[str, DraDevice], inventory: Inventory, include: Collection[str]
    ) -> dict[str, DraDevice]:
        """`table` (the node's devices) with each partitioned GPU's devices replaced by its partitions."""
        kept = {name: d for name, d in table.items() if d.gpu.uuid not in self.tables}
        return {**kept, **self.devices(inventory, include)}

    def entries(
        self, table: Mapping[str, DraDevice], inventory: Inventory, include: Collection[str], driver_name: str
    ) -> list[dict[str, Any]]:
        """What the node publishes: the devices of `table` not on a partitioned GPU, then the partitioned
        GPUs' counter sets and partition devices (those of an unhealthy GPU with its taint)."""
        plain = [
            device_entry(d, inventory, driver_name) for d in table.values() if d.gpu.uuid not in self.tables
        ]
        gpus = [g for g in inventory.gpus if g.uuid in include]
        node = partitioned_node(inventory, self.tables, gpus, driver_name)
        return plain + published_entries(node)

    # ---- create --------------------------------------------------------------------------------------

    def prepare(self, what: str, devices: list[DraDevice]) -> list[DraDevice]:
        """Prepare's seam: the claim's devices with its partitions created. When one cannot be, those this
        call created are destroyed again and MigError says why (NVIDIA's text)."""
        out: list[DraDevice] = []
        made: list[DraDevice] = []
        try:
            for device in devices:
                if not device.dynamic:
                    out.append(device)
                    continue
                ready, created = self._create(device)
                if created:  # one adopted (another claim shares it) is not this call's to undo
                    made.append(ready)
                out.append(ready)
        except MigError as err:
            for device in made:
                assert device.mig is not None
                try:
                    self._destroy(LiveMig(device.name, device.gpu, device.mig))
                except MigError as undo:
                    log.error("%s", undo)
            raise MigError(f"{what}: prepare devices failed: {err}") from None
        return out

    # ---- create --------------------------------------------------------------------------------------

    def create(self, device: DraDevice) -> DraDevice:
        """The device with its MIG device, created (or adopted when it is live already)."""
        return self._create(device)[0]

    def _create(self, device: DraDevice) -> tuple[DraDevice, bool]:
        """`create`, and whether the MIG device was created now (False: adopted)."""
        partition = self.partition(device)
        live = {m.name: m for m in self.live([partition.gpu])}
        if partition.name in live:
            log.info(
                "MIG device %s exists already (%s): using it",
                partition.name,
                live[partition.name].device.uuid,
            )
            return DraDevice(device.name, device.gpu, live[partition.name].device, dynamic=True), False
        api, profile = self.api, partition.profile
        try:
            handle = api.nvmlDeviceGetHandleByUUID(partition.gpu.uuid)
            placement = pynvml.c_nvmlGpuInstancePlacement_t()
            placement.start, placement.size = partition.start, profile.placement_size
            gi = api.nvmlDeviceCreateGpuInstanceWithPlacement(handle, profile.gi_profile_id, placement)
        except NVMLError as err:
            raise MigError(
                f"error creating MIG device: error creating GPU instance for '{partition.name}': "
                f"{nvml_text(err)}"
            ) from None
        try:
            info = api.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, profile.ci_profile, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            )
            ci = api.nvmlGpuInstanceCreateComputeInstance(gi, info.id)
            gi_id = api.nvmlGpuInstanceGetInfo(gi).id
            ci_id = api.nvmlComputeInstanceGetInfo(ci).id
        except NVMLError as err:
            with _logged("GPU instance of " + partition.name):
                api.nvmlGpuInstanceDestroy(gi)
            raise MigError(
                f"error creating MIG device: error creating Compute instance for '{partition.name}': "
                f"{nvml_text(err)}"
            ) from None
        for found in self.live([partition.gpu]):
            if (found.device.gi, found.device.ci) == (gi_id, ci_id):
                log.info("created MIG device %s (%s)", partition.name, found.device.uuid)
                return DraDevice(device.name, device.gpu, found.device, dynamic=True), True
        raise MigError(f"error creating MIG device: '{partition.name}' was created but NVML does not list it")

    # ---- what exists ---------------------------------------------------------------------------------

    def live(self, gpus: Iterable[Gpu]) -> list[LiveMig]:
        """The MIG devices on these GPUs (partitioned ones only), named as their partition is. MigError
        when NVML cannot list a GPU's (a lost GPU): what is on it is not known."""
        out = []
        for gpu in gpus:
            try:
                out += self._live_on(gpu)
            except NVMLError as err:
                raise MigError(f"cannot list the MIG devices of GPU {gpu.uuid}: {nvml_text(err)}") from None
        return out

    def _live_on(self, gpu: Gpu) -> list[LiveMig]:
        out = []
        table = {p.gi_profile_id: p for p in self.tables.get(gpu.uuid, ())}
        if table:
            parent = self.api.nvmlDeviceGetHandleByUUID(gpu.uuid)
            for slot in range(self.api.nvmlDeviceGetMaxMigDeviceCount(parent)):
                try:
                    handle = self.api.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot)
                    gi = self.api.nvmlDeviceGetGpuInstanceId(handle)
                    ci = self.api.nvmlDeviceGetComputeInstanceId(handle)
                    info = self.api.nvmlGpuInstanceGetInfo(self.api.nvmlDeviceGetGpuInstanceById(parent, gi))
                    uuid = self.api.nvmlDeviceGetUUID(handle)
                except NVMLError as err:
                    if err.value != pynvml.NVML_ERROR_NOT_FOUND:
                        raise
                    continue
                profile = table.get(info.profileId)
                if profile is None:
                    continue
                device = _mig_device(uuid, slot, gi, ci, profile, info.placement.start)
                out.append(LiveMig(partition_name(gpu.minor, profile, info.placement.start), gpu, device))
        return out

    # ---- destroy -------------------------------------------------------------------------------------

    def destroy(self, names: Iterable[str], inventory: Inventory) -> None:
        """Destroy the MIG devices of these partition names (others are ignored); gone already is fine.
        MigError (NVIDIA's text) when NVML refuses: the kubelet retries Unprepare."""
        wanted = {n for n in names if NAME.match(n)}
        if not wanted:
            return
        minors = {int(NAME.match(n).group(1)) for n in wanted}  # type: ignore[union-attr]
        for found in self.live(g for g in inventory.gpus if g.minor in minors):
            if found.name in wanted:
                self._destroy(found)

    def _destroy(self, found: LiveMig) -> None:
        api = self.api
        try:
            parent = api.nvmlDeviceGetHandleByUUID(found.gpu.uuid)
            gi = api.nvmlDeviceGetGpuInstanceById(parent, found.device.gi)
        except NVMLError as err:
            if err.value == pynvml.NVML_ERROR_NOT_FOUND:
                return
            raise MigError(f"error deleting MIG device {found.name}: {nvml_text(err)}") from None
        try:
            api.nvmlComputeInstanceDestroy(api.nvmlGpuInstanceGetComputeInstanceById(gi, found.device.ci))
        except NVMLError as err:
            if err.value != pynvml.NVML_ERROR_NOT_FOUND:
                raise MigError(
                    f"error deleting MIG device {found.name}: error destroying Compute instance: "
                    f"{nvml_text(err)}"
                ) from None
        try:
            api.nvmlGpuInstanceDestroy(gi)
        except NVMLError as err:
            raise MigError(
                f"error deleting MIG device {found.name}: error destroying GPU Instance: {nvml_text(err)}"
            ) from None
        log.info("destroyed MIG device %s (%s)", found.name, found.device.uuid)

    def reconcile(self, inventory: Inventory, held: Collection[str]) -> list[str]:
        """At start: destroy the MIG devices of partitioned GPUs that no prepared claim holds. A GPU NVML
        cannot list (lost) is left as it is, logged: the driver starts and serves the others."""
        destroyed = []
        found_all: list[LiveMig] = []
        for gpu in inventory.gpus:
            try:
                found_all += self.live([gpu])
            except MigError as err:
                log.error("%s; its MIG devices are left as they are", err)
        for found in found_all:
            if found.name not in held:
                log.warning("Found unexpected MIG device (%s), attempt to tear down", found.name)
                try:
                    self._destroy(found)
                except MigError as err:
                    log.error("%s", err)
                    continue
                destroyed.append(found.name)
        return destroyed


def _mig_device(uuid: str, slot: int, gi: int, ci: int, profile: MigProfile, start: int) -> MigDevice:
    return MigDevice(
        uuid=uuid,
        index=slot,
        gi=gi,
        ci=ci,
        profile=profile.name,
        memory_bytes=profile.memory_bytes,
        gi_profile_id=profile.gi_profile_id,
        placement_start=start,
        placement_size=profile.placement_size,
        engines=profile.engines,
    )


class _logged:
    """Run a clean-up step whose failure must not hide the error being raised: log it instead."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, err: Any, tb: Any) -> bool:
        if isinstance(err, NVMLError):
            log.error("cannot destroy the %s: %s", self.what, nvml_text(err))
            return True
        return False

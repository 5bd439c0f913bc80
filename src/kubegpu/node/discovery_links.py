"""Discovery of the links between GPUs: their PCIe topology level and the NVLinks that join them."""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pynvml

from kubegpu.node.inventory import Gpu, GpuLink, LinkLevel
from kubegpu.node.nvml.backend import NvmlApi
from kubegpu.node.nvml.pci import parse_pci_bus_id

log = logging.getLogger(__name__)

NVMLError = pynvml.NVMLError
_ABSENT = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)  # a call the driver lacks
_NO_SUCH_LINK = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT)


@dataclass(frozen=True)
class _NvlinkPeers:
    gpus: Counter[tuple[int, int, int, int]]  # NVLinks per remote GPU PCI address
    switch_links: int


def read_links(api: NvmlApi, gpus: Sequence[tuple[Gpu, Any]]) -> tuple[tuple[GpuLink, ...], dict[int, str]]:
    """The links between every two of the GPUs (each with its NVML handle), and, by GPU index, the
    problem of each GPU that NVML reported lost while its links were read."""
    addresses = {_pci_key(gpu.pci_bus_id) for gpu, _ in gpus}
    peers: dict[int, _NvlinkPeers] = {}
    lost: dict[int, str] = {}
    for gpu, handle in gpus:
        try:
            peers[gpu.index] = _nvlink_peers(api, handle, addresses)
        except NVMLError as err:
            _link_failure(gpu, "NVLinks", err, lost)
    links = []
    for (a, a_handle), (b, b_handle) in itertools.combinations(gpus, 2):
        if a.index not in peers or b.index not in peers:
            continue  # one of them failed: leave the pair out rather than guess
        try:
            level = LinkLevel(api.nvmlDeviceGetTopologyCommonAncestor(a_handle, b_handle))
        except NVMLError as err:
            log.warning("no link for GPUs %d-%d: cannot read their PCIe topology: %s", a.index, b.index, err)
            continue
        pa, pb = peers[a.index], peers[b.index]
        nvlinks = pa.gpus[_pci_key(b.pci_bus_id)] + min(pa.switch_links, pb.switch_links)
        links.append(GpuLink(a.index, b.index, level, nvlinks))
    return tuple(links), lost


def _link_failure(gpu: Gpu, what: str, err: NVMLError, lost: dict[int, str]) -> None:
    log.warning(
        "GPU index=%d uuid=%s: leaving out its links, cannot read its %s: %s",
        gpu.index,
        gpu.uuid,
        what,
        err,
    )
    if err.value == pynvml.NVML_ERROR_GPU_IS_LOST:
        lost[gpu.index] = f"GPU is lost (fallen off the bus): {err}"


def _pci_key(bus_id: str) -> tuple[int, int, int, int]:
    try:
        return parse_pci_bus_id(bus_id)
    except ValueError:
        return (-1, -1, -1, -1)


def _nvlink_peers(api: NvmlApi, handle: Any, gpu_addresses: set[tuple[int, int, int, int]]) -> _NvlinkPeers:
    """Who each active NVLink of a GPU reaches: counts per remote GPU, and links into NVSwitches."""
    gpus: Counter[tuple[int, int, int, int]] = Counter()
    switch_links = 0
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            if api.nvmlDeviceGetNvLinkState(handle, link) != pynvml.NVML_FEATURE_ENABLED:
                continue
            remote = _pci_key(api.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
        except NVMLError as err:
            if err.value in _NO_SUCH_LINK:
                continue  # past this GPU's last NVLink, or a GPU without NVLink
            raise
        if remote in gpu_addresses:
            gpus[remote] += 1
        elif _remote_is_switch(api, handle, link):
            switch_links += 1
    return _NvlinkPeers(gpus, switch_links)


def _remote_is_switch(api: NvmlApi, handle: Any, link: int) -> bool:
    try:
        return api.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link) == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
    except NVMLError as err:
        if err.value in _ABSENT:
            return False  # driver too old to tell; a link to something that is not one of our GPUs
        raise

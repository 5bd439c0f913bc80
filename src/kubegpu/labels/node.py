"""One labelling pass: read the node through NVML and sysfs, then compute GFD's labels."""

from __future__ import annotations

import logging
from contextlib import ExitStack

import pynvml

from kubegpu.labels.compute import node_labels
from kubegpu.labels.errors import LabelError
from kubegpu.labels.facts import NodeFacts, gather_facts
from kubegpu.labels.resource_labels import Labels
from kubegpu.labels.settings import LabelSettings
from kubegpu.labels.vgpu import find_vgpus
from kubegpu.node.discovery import discover, explain_nvml_error, nvml_session
from kubegpu.node.inventory import Inventory
from kubegpu.node.nvml.backend import NvmlBackend

log = logging.getLogger(__name__)


def read_node(backend: NvmlBackend, settings: LabelSettings) -> tuple[Inventory | None, NodeFacts]:
    """The inventory and facts; inventory None when NVML cannot start and that is tolerated.

    Raises LabelError.
    """
    with ExitStack() as stack:
        try:
            api = stack.enter_context(nvml_session(backend))
        except pynvml.NVMLError as err:
            if settings.fail_on_init_error:
                raise LabelError(f"failed to initialize NVML: {explain_nvml_error(err)}") from err
            # GFD's null manager: no device labels, only timestamp and vGPU
            log.warning(
                "NVML is not available, labelling without GPU labels (--fail-on-init-error=false): %s",
                explain_nvml_error(err),
            )
            return None, NodeFacts(vgpus=find_vgpus(backend.sysfs_root))
        try:
            inventory = discover(backend)
            facts = gather_facts(
                api,
                backend.sysfs_root,
                inventory,
                settings.machine_type_file,
                mig_attributes=settings.mig_strategy != "none",
            )
        except pynvml.NVMLError as err:
            raise LabelError(f"error getting devices: {err}") from err
    return inventory, facts


def label_node(backend: NvmlBackend, settings: LabelSettings, timestamp: int | None) -> Labels:
    """GFD's labels for this node now. Raises LabelError."""
    inventory, facts = read_node(backend, settings)
    return node_labels(
        inventory,
        facts,
        mig_strategy=settings.mig_strategy,
        sharing=settings.sharing,
        timestamp=timestamp,
    )

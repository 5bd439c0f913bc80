"""Contract tests: `kubegpu plugin` as a separate process against the kubelet simulator on unix sockets."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from kubegpu.demo.simnode import SimulatedNode
from kubegpu.node.discovery import discover, nvml_session
from kubegpu.node.inventory import Inventory
from kubegpu.node.nvml.backend import load_nvml
from kubegpu.settings.env import NvmlSelection


def profile_inventory(profile: str) -> Inventory:
    """What the plugin should find: the real discovery code on the same fake profile, in this process."""
    backend = load_nvml(NvmlSelection.fake(profile))
    with nvml_session(backend.nvml):
        return discover(backend)


@pytest.fixture
async def node() -> AsyncIterator[SimulatedNode]:
    async with SimulatedNode("dgx-a100") as n:
        yield n


@pytest.fixture
async def running(node: SimulatedNode) -> SimulatedNode:
    node.start_plugin()
    await node.wait_allocatable(8)
    return node

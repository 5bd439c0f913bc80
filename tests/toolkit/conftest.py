from __future__ import annotations

import pytest

from kubegpu.toolkit.snapshot import Snapshot, load_snapshot

from .paths import CLUSTER


@pytest.fixture(scope="session")
def cluster() -> Snapshot:
    """The fixture cluster, decoded once; tests that change it load their own copy."""
    return load_snapshot(CLUSTER, keep=[("ml", "train-llm-8gpu")])

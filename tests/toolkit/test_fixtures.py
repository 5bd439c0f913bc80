"""The committed cluster snapshot is exactly what its builder makes (edit make_cluster.py, then rerun it)."""

from __future__ import annotations

import importlib.util
import json

from .paths import CLUSTER, FIXTURES


def test_cluster_json_is_fresh() -> None:
    spec = importlib.util.spec_from_file_location("make_cluster", FIXTURES / "make_cluster.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert json.loads(CLUSTER.read_text()) == module.build(), (
        "tests/fixtures/toolkit/cluster.json is stale: run python tests/fixtures/toolkit/make_cluster.py"
    )

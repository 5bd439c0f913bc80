"""Paths and helpers for the deployment checks: the chart, the static manifests, the examples, the image.

The renderer (scripts/helmlite.py) and the static-manifest generator (scripts/render_static.py) are scripts,
not part of the kubegpu package; they are imported from scripts/ here.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import helmlite  # noqa: E402
import render_static  # noqa: E402, F401  (re-exported for the tests)

CHART = ROOT / "deployments/helm/kubegpu"
VALUES_EXAMPLES = ROOT / "deployments/helm/examples"
STATIC = ROOT / "deployments/static"
EXAMPLES = ROOT / "deployments/examples"
CONFIGS = EXAMPLES / "configs"
RELEASE, NAMESPACE = "kubegpu", "kubegpu"

# Every example config, as `--set-file config.map.<name>=...` (what values-sharing.yaml's comment runs).
CONFIG_FILES = {f"config.map.{p.stem}": p for p in sorted(CONFIGS.glob("*.yaml"))}


@pytest.fixture(scope="session")
def chart() -> helmlite.Chart:
    return helmlite.load_chart(CHART)


def render(
    chart: helmlite.Chart,
    values: dict[str, Any] | None = None,
    files: list[Path] = (),  # type: ignore[assignment]
    set_files: dict[str, Path] | None = None,
    namespace: str = NAMESPACE,
) -> list[dict[str, Any]]:
    """The chart's objects for these values (nested dicts, merged over the defaults like --set)."""
    merged = helmlite.merge_values(chart, files, None, set_files)
    merged = helmlite.coalesce(merged, values or {})
    return [m.obj for m in helmlite.render(chart, merged, RELEASE, namespace)]


def by_kind(objs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == kind}


def containers(pod_owner: dict[str, Any], init: bool = False) -> dict[str, dict[str, Any]]:
    spec = pod_owner["spec"]["template"]["spec"]
    return {c["name"]: c for c in spec.get("initContainers" if init else "containers") or []}


def env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env") or []}


def load_docs(path: Path) -> Iterator[dict[str, Any]]:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc:
            yield doc


def example_values_files() -> list[Path]:
    return sorted(VALUES_EXAMPLES.glob("*.yaml"))

"""Where the toolkit's test fixtures live."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).parent.parent / "fixtures" / "toolkit"
MANIFESTS = FIXTURES / "manifests"
CLUSTER = FIXTURES / "cluster.json"

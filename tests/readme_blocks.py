"""The README's YAML examples that are also tests: the block after an HTML comment marker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_yaml(marker: str) -> dict[str, Any]:
    """The YAML block that follows `<!-- marker -->` in the README, as one object."""
    text = README.read_text()
    block = text.split(f"<!-- {marker} -->", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    loaded = yaml.safe_load(block)
    assert isinstance(loaded, dict)
    return loaded

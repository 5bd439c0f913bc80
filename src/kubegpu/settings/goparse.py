"""Values spelled the way NVIDIA's Go flags and env vars accept them."""

from __future__ import annotations

from collections.abc import Sequence


def parse_bool(text: str) -> bool:
    """Go's strconv.ParseBool, which NVIDIA's flags use for env vars."""
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise ValueError(f"invalid boolean {text!r}: use true or false")


def parse_list(text: str | Sequence[str]) -> list[str]:
    items = [text] if isinstance(text, str) else list(text)
    return [part.strip() for item in items for part in item.split(",") if part.strip()]

"""How GFD turns NVML names into label values: the sanitiser, product names and the architecture family."""

from __future__ import annotations

import re
from collections.abc import Iterable

# GFD keeps letters, digits, '-', '_', '.' and spaces; label values allow no other characters.
_NOT_ALLOWED = re.compile(r"[^A-Za-z0-9\-_. ]")


def sanitise(text: str) -> str:
    """GFD's sanitise(): drop characters a label value cannot hold, then join the words with '-'.

    "NVIDIA-TITAN-X-(Pascal)" -> "NVIDIA-TITAN-X-Pascal", "some [ / thing / ]else" -> "some-thing-else".
    """
    # After the filter the only whitespace left is ' ', so str.split() is Go's strings.Fields here.
    return "-".join(_NOT_ALLOWED.sub("", text).split())


def product_name(parts: Iterable[str], *, shared_suffix: bool = False) -> str:
    """GFD's product label: the non-empty parts sanitised and joined with '-', "-SHARED" when asked.

    Parts are skipped only when empty before sanitising (a part that sanitises to "" still adds a '-'),
    and an all-empty name stays "" even when shared: both as GFD does.
    """
    kept = [sanitise(p) for p in parts if p != ""]
    if not kept:
        return ""
    if shared_suffix:
        kept.append("SHARED")
    return "-".join(kept)


def arch_family(major: int, minor: int) -> str:
    """The `gpu.family` label for a CUDA compute capability (GFD's family map)."""
    match major:
        case 1:
            return "tesla"
        case 2:
            return "fermi"
        case 3:
            return "kepler"
        case 5:
            return "maxwell"
        case 6:
            return "pascal"
        case 7:
            return "volta" if minor < 5 else "turing"
        case 8:
            return "ampere" if minor < 9 else "ada-lovelace"
        case 9:
            return "hopper"
        case 10 | 12:
            return "blackwell"
        case 13:
            return "rubin"
    return "undefined"


def mig_profile_name(profile: str) -> str:
    """A MIG profile as GFD names it in labels and resources: "1g.10gb+me" -> "1g.10gb.me"."""
    return profile.replace("+", ".")

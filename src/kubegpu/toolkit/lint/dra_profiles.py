"""KG023: a DRA selector that pins `device.attributes["gpu.nvidia.com"].profile == "<p>"` to a MIG profile no
node can create.

With a snapshot whose ResourceSlices NVIDIA's driver wrote, the profiles a node can create are the ones its
slices publish: DynamicMIG's partition devices (every profile the GPU could hold) and static MIG devices.
Without one, the profile is held against NVIDIA's MIG profile names of the GPU models kubegpu knows (the
fake NVML's node profiles carry each model's `nvidia-smi mig -lgip` table); a GPU model kubegpu does not
know may have it, so that is a warning. A pin the selector can do without (under `||`, `!`, a ternary) is a
warning too: that comparison never holds, but the selector may.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache

from kubegpu.resourceapi.cel_pins import attribute_pins
from kubegpu.resourceapi.model import ResourceSlice
from kubegpu.toolkit.dra_facts import NVIDIA_DRIVER
from kubegpu.toolkit.lint.rules import WARNING

_COMPUTE_INSTANCE = re.compile(r"^\d+c\.(\d+g\..+)$")  # 1c.3g.20gb: a compute instance of a 3g.20gb
_GROUPS_SHOWN = 3
_MEMORY_NAMES = "MIG profile names carry the GPU's memory: an A100 40GB's 1g.5gb is a 1g.10gb on an A100 80GB"


@dataclass(frozen=True)
class ProfileProblem:
    message: str
    fix: str
    severity: str | None  # None: the rule's own (an error)


@lru_cache(maxsize=1)
def model_profiles() -> Mapping[str, tuple[str, ...]]:
    """GPU model name -> NVIDIA's MIG (GPU instance) profile names, from the shipped fake NVML profiles."""
    from kubegpu.node.nvml.fake_profile import load_profile, profile_names

    out: dict[str, tuple[str, ...]] = {}
    for ref in profile_names():
        for model in load_profile(ref)[1].models.values():
            if model.mig is not None:
                out.setdefault(model.name, tuple(p.name for p in model.mig.profiles))
    return out


def published_profiles(slices: Iterable[ResourceSlice]) -> dict[str, set[str]] | None:
    """Node name -> the MIG profiles NVIDIA's driver publishes for it; None when no slice is the driver's
    (then nothing is known of the nodes' GPUs)."""
    out: dict[str, set[str]] | None = None
    for s in slices:
        if s.driver != NVIDIA_DRIVER:
            continue
        found = out if out is not None else {}
        out = found
        profiles = found.setdefault(s.node_name or "(no single node)", set())
        for device in s.devices:
            value = device.attribute(f"{NVIDIA_DRIVER}/profile", NVIDIA_DRIVER)
            if isinstance(value, Mapping) and isinstance(value.get("string"), str):
                profiles.add(value["string"])
    return out


def _creatable(profile: str, known: set[str]) -> bool:
    if profile in known:
        return True
    instance = _COMPUTE_INSTANCE.match(profile)
    return instance is not None and instance.group(1) in known


def _did_you_mean(profile: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(profile, sorted(known), n=1, cutoff=0.75)
    return f"did you mean {close[0]!r}? " if close else ""


def _grouped(by_key: Mapping[str, Iterable[str]]) -> str:
    """`a, b: p1, p2; c: p3`: keys with the same profiles together (the first few groups, then a count)."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for key, profiles in sorted(by_key.items()):
        groups.setdefault(tuple(sorted(profiles)), []).append(key)
    shown = [
        f"{', '.join(keys)}: {', '.join(profiles) or 'none'}"
        for profiles, keys in list(groups.items())[:_GROUPS_SHOWN]
    ]
    rest = len(groups) - _GROUPS_SHOWN
    return "; ".join(shown) + (f"; and {rest} more" if rest > 0 else "")


def profile_problems(
    where: str, expression: str, published: Mapping[str, set[str]] | None
) -> list[ProfileProblem]:
    """KG023's findings for one selector (`where`: how the finding names it); `published`: what the
    snapshot's nodes publish (`published_profiles`), None to check against the known GPU models."""
    problems = []
    for pin in attribute_pins(expression):
        if pin.domain != NVIDIA_DRIVER or pin.name != "profile":
            continue
        head = f"{where} pins MIG profile {pin.value!r}"
        never = "the request never allocates" if pin.required else "that comparison never holds"
        if published is not None:
            problem = _against_nodes(pin.value, head, never, published)
            if problem is not None:
                problems.append(ProfileProblem(*problem, None if pin.required else WARNING))
        else:
            problem = _against_models(pin.value, head, never)
            if problem is not None:
                problems.append(ProfileProblem(*problem, WARNING))
    return problems


def _against_nodes(
    profile: str, head: str, never: str, published: Mapping[str, set[str]]
) -> tuple[str, str] | None:
    known = set().union(*published.values())
    if _creatable(profile, known):
        return None
    if not known:
        return (
            f"{head}, but no node publishes a MIG device or partition; {never}",
            "enable MIG mode on a node's GPUs and run the DRA driver with --feature-gates DynamicMIG=true "
            "(or create the MIG devices), or ask for a whole GPU (class gpu.nvidia.com)",
        )
    return (
        f"{head}, which no node can create (the nodes publish {_grouped(published)}); {never}",
        f"{_did_you_mean(profile, known)}pin a profile a node publishes (the profile attribute of its mig "
        f"devices: kubectl get resourceslices -o yaml); {_MEMORY_NAMES}",
    )


def _against_models(profile: str, head: str, never: str) -> tuple[str, str] | None:
    models = model_profiles()
    known = {p for profiles in models.values() for p in profiles}
    if _creatable(profile, known):
        return None
    return (
        f"{head}, which is not a MIG profile of the GPU models kubegpu knows ({_grouped(models)}); "
        f"unless the cluster's GPUs have it, {never}",
        f"{_did_you_mean(profile, known)}check the name with `nvidia-smi mig -lgip` on the node, or lint "
        f"with --snapshot to check it against the profiles the nodes publish; {_MEMORY_NAMES}",
    )

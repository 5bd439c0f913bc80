"""Which GpuConfig sharing strategies the feature gates allow, with NVIDIA's per-claim refusal text.

NVIDIA's driver refuses a claim whose config selects a strategy whose gate is off (TimeSlicing needs
TimeSlicingSettings, MPS needs MPSSupport); so does kubegpu, with NVIDIA's words and the fix.
"""

from __future__ import annotations

from kubegpu.dra.gpuconfig import MPS, TIME_SLICING, ConfigError, Sharing
from kubegpu.settings.feature_gates import BY_NAME, FeatureGates

GATE_OF_STRATEGY = {TIME_SLICING: "TimeSlicingSettings", MPS: "MPSSupport"}


def check_strategy(sharing: Sharing | None, gates: FeatureGates) -> None:
    """ConfigError when `sharing` selects a strategy whose gate is off."""
    if sharing is None:
        return
    gate = GATE_OF_STRATEGY[sharing.strategy]
    if gates[gate]:
        return
    fix = (
        f"start the driver with --feature-gates {gate}=true"
        if BY_NAME[gate].implemented
        else f"kubegpu does not implement {gate} yet: leave the sharing out of the claim's config"
    )
    raise ConfigError(
        f'"{sharing.strategy}" is selected as the GPU sharing strategy, but the "{gate}" feature gate is '
        f"not enabled; {fix}"
    )

"""NVIDIA's DRA driver feature gates (`--feature-gates`, `FEATURE_GATES`): names, defaults, stages, parsing.

The gates are NVIDIA's 13 (`pkg/featuregates/featuregates.go` of the GPU driver), plus the logging gates and
`AllAlpha`/`AllBeta` that component-base registers on the same flag. The text is parsed as component-base's
`featuregate.Set` parses it (a comma list of `Name=bool`, Go's ParseBool), with its error texts. Then, in
this order: NVIDIA's start-up rules between gates (`ValidateFeatureGates`, NVIDIA's texts), and kubegpu's own
refusal of a gate that is on but that kubegpu does not implement yet, so that no gate pretends.

A gate's `implemented` field is the one switch: the engineer who lands a gate's code flips it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from kubegpu.settings.goparse import parse_bool
from kubegpu.settings.gotext import go_quote

Stage = Literal["Alpha", "Beta", "GA"]
# Whose gate it is: the GPU plugin's, the ComputeDomain driver's (which NVIDIA's GPU plugin accepts on the
# same flag and never reads), or component-base's logging.
Scope = Literal["gpu", "compute-domain", "logging"]


@dataclass(frozen=True, slots=True)
class Gate:
    name: str
    default: bool
    stage: Stage
    since: str  # NVIDIA's driver version that added it
    scope: Scope
    # True: turning it on does what NVIDIA's gate does (or is what kubegpu always does). False: kubegpu
    # refuses to start with it on (`not_implemented`) until its code lands.
    implemented: bool
    what: str


_LOGGING = "component-base logging; no effect here"

GATES: tuple[Gate, ...] = (
    Gate("TimeSlicingSettings", False, "Alpha", "0.2", "gpu", True,
         "`strategy: TimeSlicing`: the interval set with nvidia-smi at Prepare, reset at Unprepare"),
    Gate("MPSSupport", False, "Alpha", "0.2", "gpu", True,
         "GpuConfig/MigDeviceConfig `strategy: MPS`: an MPS control-daemon Deployment per claim, as NVIDIA "
         "runs it"),
    Gate("IMEXDaemonsWithDNSNames", True, "Beta", "0.2", "compute-domain", True,
         "ComputeDomain driver only; accepted, no effect on GPUs (as in NVIDIA's GPU plugin)"),
    Gate("PassthroughSupport", False, "Alpha", "0.3", "gpu", False,
         "VFIO devices `gpu-vfio-<i>`, a GPU bound to vfio-pci at Prepare"),
    Gate("DynamicMIG", False, "Alpha", "0.3", "gpu", True,
         "every possible MIG partition published with shared counters, created at Prepare; MIG mode is never "
         "toggled"),
    Gate("NVMLDeviceHealthCheck", False, "Alpha", "0.3", "gpu", True,
         "XID taints; kubegpu watches device health whatever this gate says"),
    Gate("ComputeDomainCliques", True, "Beta", "0.3", "compute-domain", True,
         "ComputeDomain driver only; accepted, no effect on GPUs (as in NVIDIA's GPU plugin)"),
    Gate("CrashOnNVLinkFabricErrors", True, "Beta", "0.3", "compute-domain", True,
         "ComputeDomain driver only; accepted, no effect on GPUs (as in NVIDIA's GPU plugin)"),
    Gate("DeviceMetadata", False, "Alpha", "0.4", "gpu", False,
         "KEP-5304 device metadata files (VFIO devices only)"),
    Gate("DRAListTypeAttributes", False, "Alpha", "0.4", "gpu", False,
         "`resource.kubernetes.io/numaNode` published as a one-element list"),
    Gate("FabricManagerPartitioning", False, "Alpha", "0.5", "gpu", False,
         "NVSwitch partitions activated at Prepare"),
    Gate("HostManagedIMEXDaemon", False, "Alpha", "0.5", "compute-domain", True,
         "ComputeDomain driver only; accepted, no effect on GPUs (as in NVIDIA's GPU plugin)"),
    Gate("ConsumableShares", False, "Alpha", "0.5", "gpu", True,
         "`--consumable-shares` takes effect: several claims on one device, NVIDIA's request policies; "
         "what each consumed in its env and status"),
    # component-base's logging gates, on the same flag
    Gate("ContextualLogging", True, "Beta", "", "logging", True, _LOGGING),
    Gate("LoggingAlphaOptions", False, "Alpha", "", "logging", True, _LOGGING),
    Gate("LoggingBetaOptions", True, "Beta", "", "logging", True, _LOGGING),
)  # fmt: skip

BY_NAME: Mapping[str, Gate] = {g.name: g for g in GATES}
NVIDIA_GATES = tuple(g for g in GATES if g.scope != "logging")  # the driver's 13
ALL_ALPHA = "AllAlpha"
ALL_BETA = "AllBeta"
_KNOWN = (*BY_NAME, ALL_ALPHA, ALL_BETA)

# NVIDIA's ValidateFeatureGates, in its order: (gate, the gate it needs on, or the gate it excludes).
_REQUIRES = (("ComputeDomainCliques", "IMEXDaemonsWithDNSNames"),)
_EXCLUSIVE = (
    ("DynamicMIG", "PassthroughSupport"),
    ("DynamicMIG", "NVMLDeviceHealthCheck"),
    ("DynamicMIG", "MPSSupport"),
    ("PassthroughSupport", "NVMLDeviceHealthCheck"),
)
_REQUIRES_LAST = (("DeviceMetadata", "PassthroughSupport"),)


class FeatureGateError(ValueError):
    """A `--feature-gates` text component-base refuses; the message is component-base's text."""


@dataclass(frozen=True, slots=True)
class FeatureGates:
    """Every known gate's value: the defaults, with what `--feature-gates` set on top."""

    enabled: Mapping[str, bool]
    explicit: frozenset[str] = frozenset()  # the gates the text named (AllAlpha/AllBeta not included)

    def __getitem__(self, name: str) -> bool:
        return self.enabled[name]

    def on(self) -> list[str]:
        return [g.name for g in NVIDIA_GATES if self.enabled[g.name]]

    def text(self) -> str:
        """The driver's gates as `Name=bool` pairs, in NVIDIA's order (the start-up log's gate map)."""
        return ",".join(f"{g.name}={str(self.enabled[g.name]).lower()}" for g in NVIDIA_GATES)


DEFAULT_GATES = FeatureGates({g.name: g.default for g in GATES})


def parse_feature_gates(text: str) -> FeatureGates:
    """component-base's `featuregate.Set`: FeatureGateError with its text for a bad item or unknown gate.

    Items are split on commas; a zero-length item is skipped; the name and the value are trimmed; the
    value is Go's ParseBool. `AllAlpha=<b>` / `AllBeta=<b>` set every alpha / beta gate the text does not
    name itself.
    """
    given: dict[str, bool] = {}
    for item in text.split(","):
        if not item:
            continue
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep:
            raise FeatureGateError(f"missing bool value for {name}")
        raw = raw.strip()
        try:
            given[name] = parse_bool(raw)
        except ValueError:
            raise FeatureGateError(
                f"invalid value of {name}={raw}, err: strconv.ParseBool: parsing {go_quote(raw)}: "
                "invalid syntax"
            ) from None
    for name in given:
        if name not in _KNOWN:
            raise FeatureGateError(f"unrecognized feature gate: {name}")
    enabled = {g.name: g.default for g in GATES}
    named = {n: v for n, v in given.items() if n in BY_NAME}
    for everything, stage in ((ALL_ALPHA, "Alpha"), (ALL_BETA, "Beta")):
        if everything in given:
            for gate in GATES:
                if gate.stage == stage and gate.name not in named:
                    enabled[gate.name] = given[everything]
    enabled.update(named)
    return FeatureGates(enabled, frozenset(named))


def validation_failure(gates: FeatureGates) -> str | None:
    """NVIDIA's ValidateFeatureGates: the first rule that fails, with NVIDIA's text; None when all hold."""
    for gate, needed in _REQUIRES:
        if gates[gate] and not gates[needed]:
            return f"feature gate {gate} requires {needed} to also be enabled"
    for gate, other in _EXCLUSIVE:
        if gates[gate] and gates[other]:
            return f"feature gate {gate} is currently mutually exclusive with {other}"
    for gate, needed in _REQUIRES_LAST:
        if gates[gate] and not gates[needed]:
            return f"feature gate {gate} requires {needed} to also be enabled"
    return None


def not_implemented(gates: FeatureGates) -> str | None:
    """kubegpu's refusal of the first gate that is on but not implemented yet (NVIDIA's order)."""
    for gate in NVIDIA_GATES:
        if gates[gate.name] and not gate.implemented:
            return (
                f"feature gate {gate.name} is not implemented by kubegpu yet ({gate.what}): set "
                f"{gate.name}=false in --feature-gates (FEATURE_GATES), or run NVIDIA's driver for it"
            )
    return None

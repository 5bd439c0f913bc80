"""NVIDIA's DRA driver flags as `kubegpu dra` takes them: checked once, by the driver and `config check-dra`.

`driver_flags(given)` turns the given values of NVIDIA's flags into what the driver acts on: the feature
gates (parsed, NVIDIA's rules between them, then kubegpu's refusal of a gate not implemented yet), the
consumable-shares mode (NVIDIA's texts), the driver roots and the hook path. NVIDIA's flags that change
nothing here are accepted; each one given with a value other than its default gets one warning that says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kubegpu.settings.choices import DEFAULT_HOOK_PATH
from kubegpu.settings.feature_gates import (
    NVIDIA_GATES,
    FeatureGateError,
    FeatureGates,
    not_implemented,
    parse_feature_gates,
    validation_failure,
)
from kubegpu.settings.given import FlagValue, value_of
from kubegpu.settings.gotext import go_quote
from kubegpu.settings.nvidia_config import ConfigError
from kubegpu.settings.setting import DRA
from kubegpu.settings.table import lookup
from kubegpu.settings.values import XidList, default_text, text_of

DISABLED = "disabled"
SHARE_MODES = (DISABLED, "memory", "unlimited")

# NVIDIA's flags kubegpu accepts but does not act on, and why (the end of the warning).
NO_EFFECT: Mapping[str, str] = {
    "host-root": "only PassthroughSupport uses it, which kubegpu does not implement",
    "healthcheck-port": "kubegpu serves no grpc.health.v1 port; probe the DRA socket or --http-endpoint",
    "kube-api-qps": "the Kubernetes Python client has no client-side rate limit",
    "kube-api-burst": "the Kubernetes Python client has no client-side rate limit",
    "v": "kubegpu logs at info level; -v (--verbose) turns on debug logging",
    "vmodule": "kubegpu does not log through klog",
    "logging-format": "kubegpu logs text",
    "log-flush-frequency": "kubegpu writes each log line at once",
    "log-text-split-stream": "kubegpu does not log through component-base",
    "log-text-info-buffer-size": "kubegpu does not log through component-base",
    "log-json-split-stream": "kubegpu does not log through component-base",
    "log-json-info-buffer-size": "kubegpu does not log through component-base",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class DriverFlags:
    gates: FeatureGates
    consumable_shares: str | int  # DISABLED, "memory", "unlimited" or the number of shares
    driver_root: str  # host view
    container_driver_root: str  # where the driver sees the driver root
    hook_path: str
    xids_to_ignore: frozenset[int] = frozenset()
    warnings: tuple[str, ...] = field(default=())
    mps: MpsDeploymentFlags | None = None  # set when MPSSupport is on


# What NVIDIA's MPS flags say about the control-daemon Deployments (MPSSupport; NVIDIA's flags of the same
# names). They act only with the gate on; without it a given value changes nothing (one warning).
MPS_FLAGS: Mapping[str, str] = {
    "namespace": "it places MPS control-daemon Deployments, which run only with MPSSupport=true",
    "image-name": "it is the image of MPS control-daemon Deployments, which run only with MPSSupport=true",
    "image-pull-secrets": "they are for MPS control-daemon Deployments, which run only with MPSSupport=true",
    "image-pull-policy": "it is for MPS control-daemon Deployments, which run only with MPSSupport=true",
    "service-account-name": "it is for MPS control-daemon Deployments, which run only with MPSSupport=true",
}  # fmt: skip

IMAGE_NAME_REQUIRED = (
    "invalid CLI flags: --image-name (IMAGE_NAME) is required when the MPSSupport feature gate is enabled: "
    "set it to the image the MPS control-daemon Deployments run (the driver's own image, as NVIDIA's chart "
    "sets it)"
)


@dataclass(frozen=True, slots=True)
class MpsDeploymentFlags:
    """NVIDIA's flags that shape the MPS control-daemon Deployments."""

    namespace: str
    image: str
    pull_secrets: tuple[str, ...] = ()
    pull_policy: str = ""  # empty: Kubernetes' default
    service_account: str = ""  # empty: the namespace's default


def parse_consumable_shares(text: str) -> str | int:
    """NVIDIA's `--consumable-shares`: a mode or a positive integer; ValueError with NVIDIA's text."""
    if text in SHARE_MODES:
        return text
    if text.isascii() and text.isdigit() and int(text) > 0:
        return int(text)
    raise ValueError(
        f"invalid value for --consumable-shares: {go_quote(text)} (must be 'disabled', 'memory', "
        "'unlimited', or a positive integer)"
    )


def driver_flags(given: Mapping[str, FlagValue]) -> DriverFlags:
    """NVIDIA's flags of `kubegpu dra`, checked as the driver checks them at start.

    Raises ConfigError with one line: component-base's text for a bad `--feature-gates`, NVIDIA's
    `feature gate validation failed: ...` or `invalid CLI flags: ...`, or kubegpu's refusal of a gate it does
    not implement yet."""

    def value(name: str) -> object:
        return value_of(given, lookup(DRA, name))

    gates_given = given.get("feature-gates")
    origin = gates_given.origin if gates_given is not None and gates_given.explicit else "--feature-gates"
    try:
        gates = parse_feature_gates(str(value("feature-gates")))
    except FeatureGateError as err:
        known = ", ".join(g.name for g in NVIDIA_GATES)
        fix = (
            f" (NVIDIA's gates: {known})"
            if str(err).startswith("unrecognized")
            else " (use Name=true,Name=false)"
        )
        raise ConfigError(f"invalid {origin}: {err}{fix}") from None
    failure = validation_failure(gates)
    if failure is not None:
        raise ConfigError(f"feature gate validation failed: {failure}")
    refused = not_implemented(gates)
    if refused is not None:
        raise ConfigError(refused)
    try:
        shares = parse_consumable_shares(str(value("consumable-shares")))
    except ValueError as err:
        raise ConfigError(f"invalid CLI flags: {err}") from None
    if shares != DISABLED and not gates["ConsumableShares"]:
        raise ConfigError(
            "invalid CLI flags: --consumable-shares requires feature gate ConsumableShares to be enabled"
        )
    ignored = value("additional-xids-to-ignore")
    mps = None
    if gates["MPSSupport"]:
        image = str(value("image-name"))
        if not image:
            raise ConfigError(IMAGE_NAME_REQUIRED)
        secrets = value("image-pull-secrets")
        mps = MpsDeploymentFlags(
            namespace=str(value("namespace")) or "default",
            image=image,
            pull_secrets=tuple(str(s) for s in secrets) if isinstance(secrets, list | tuple) else (),
            pull_policy=str(value("image-pull-policy")),
            service_account=str(value("service-account-name")),
        )
    return DriverFlags(
        gates=gates,
        consumable_shares=shares,
        driver_root=str(value("nvidia-driver-root")) or "/",
        container_driver_root=str(value("container-driver-root")),
        hook_path=str(value("nvidia-cdi-hook-path")) or DEFAULT_HOOK_PATH,
        xids_to_ignore=ignored.ids if isinstance(ignored, XidList) else frozenset(),
        warnings=tuple(_no_effect_warnings(given, mps_on=mps is not None)),
        mps=mps,
    )


def _no_effect_warnings(given: Mapping[str, FlagValue], *, mps_on: bool) -> list[str]:
    out = []
    for name, why in {**NO_EFFECT, **({} if mps_on else MPS_FLAGS)}.items():
        found = given.get(name)
        setting = lookup(DRA, name)
        if found is None or not found.explicit or text_of(setting, found.value) == default_text(setting):
            continue
        out.append(f"{found.origin} is accepted for NVIDIA compatibility and changes nothing here: {why}")
    return out


DEFAULT_DRIVER_FLAGS = driver_flags({})  # NVIDIA's defaults: what a driver started without flags does

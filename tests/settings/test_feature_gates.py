"""NVIDIA's DRA driver feature gates: component-base's parsing and texts, NVIDIA's start-up rules, kubegpu's
refusal of gates it does not implement yet, and the driver's other flags. Texts are written out: NVIDIA's
(`pkg/featuregates/featuregates.go`, `cmd/gpu-kubelet-plugin/main.go`) and component-base's
(`featuregate.Set`)."""

from __future__ import annotations

import pytest

from kubegpu.settings.dra_driver import DriverFlags, driver_flags
from kubegpu.settings.feature_gates import (
    DEFAULT_GATES,
    FeatureGateError,
    not_implemented,
    parse_feature_gates,
    validation_failure,
)
from kubegpu.settings.given import read_given
from kubegpu.settings.nvidia_config import ConfigError
from kubegpu.settings.setting import DRA
from kubegpu.settings.table import for_command


def test_defaults_are_nvidias() -> None:
    assert DEFAULT_GATES.text() == (
        "TimeSlicingSettings=false,MPSSupport=false,IMEXDaemonsWithDNSNames=true,PassthroughSupport=false,"
        "DynamicMIG=false,NVMLDeviceHealthCheck=false,ComputeDomainCliques=true,CrashOnNVLinkFabricErrors=true,"
        "DeviceMetadata=false,DRAListTypeAttributes=false,FabricManagerPartitioning=false,"
        "HostManagedIMEXDaemon=false,ConsumableShares=false"
    )
    assert parse_feature_gates("") == DEFAULT_GATES


def test_component_base_syntax() -> None:
    gates = parse_feature_gates(
        " TimeSlicingSettings = T ,,NVMLDeviceHealthCheck=1,IMEXDaemonsWithDNSNames=False,"
    )
    assert gates["TimeSlicingSettings"] and gates["NVMLDeviceHealthCheck"]
    assert not gates["IMEXDaemonsWithDNSNames"]
    assert gates.explicit == {"TimeSlicingSettings", "NVMLDeviceHealthCheck", "IMEXDaemonsWithDNSNames"}
    # the logging gates share the flag
    assert not parse_feature_gates("ContextualLogging=false")["ContextualLogging"]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("DynamicMIG", "missing bool value for DynamicMIG"),
        (" DynamicMIG ,", "missing bool value for DynamicMIG"),
        ("DynamicMIG=yes",
         'invalid value of DynamicMIG=yes, err: strconv.ParseBool: parsing "yes": invalid syntax'),
        ("DynamicMIG=", 'invalid value of DynamicMIG=, err: strconv.ParseBool: parsing "": invalid syntax'),
        ("Bogus=true", "unrecognized feature gate: Bogus"),
        ("dynamicmig=true", "unrecognized feature gate: dynamicmig"),  # names are case-sensitive
        # every item is parsed before any name is looked up
        ("Bogus=true,DynamicMIG=maybe",
         'invalid value of DynamicMIG=maybe, err: strconv.ParseBool: parsing "maybe": invalid syntax'),
    ],
)  # fmt: skip
def test_component_base_errors(text: str, error: str) -> None:
    with pytest.raises(FeatureGateError) as err:
        parse_feature_gates(text)
    assert str(err.value) == error


def test_all_alpha_and_all_beta_set_the_gates_not_named() -> None:
    gates = parse_feature_gates("AllAlpha=true,DynamicMIG=false")
    assert gates["TimeSlicingSettings"] and gates["MPSSupport"] and not gates["DynamicMIG"]
    assert gates["IMEXDaemonsWithDNSNames"]  # beta: untouched
    # AllAlpha turns on exclusive alphas: NVIDIA's validation then fails, as NVIDIA's docs warn
    assert validation_failure(parse_feature_gates("AllAlpha=true")) == (
        "feature gate DynamicMIG is currently mutually exclusive with PassthroughSupport"
    )
    assert not parse_feature_gates("AllBeta=false")["ComputeDomainCliques"]


@pytest.mark.parametrize(
    ("text", "failure"),
    [
        ("IMEXDaemonsWithDNSNames=false",
         "feature gate ComputeDomainCliques requires IMEXDaemonsWithDNSNames to also be enabled"),
        ("DynamicMIG=true,PassthroughSupport=true,NVMLDeviceHealthCheck=true,MPSSupport=true",
         "feature gate DynamicMIG is currently mutually exclusive with PassthroughSupport"),
        ("DynamicMIG=true,NVMLDeviceHealthCheck=true,MPSSupport=true",
         "feature gate DynamicMIG is currently mutually exclusive with NVMLDeviceHealthCheck"),
        ("DynamicMIG=true,MPSSupport=true",
         "feature gate DynamicMIG is currently mutually exclusive with MPSSupport"),
        ("PassthroughSupport=true,NVMLDeviceHealthCheck=true",
         "feature gate PassthroughSupport is currently mutually exclusive with NVMLDeviceHealthCheck"),
        ("DeviceMetadata=true", "feature gate DeviceMetadata requires PassthroughSupport to also be enabled"),
        # NVIDIA's order: the first rule that fails wins
        ("IMEXDaemonsWithDNSNames=false,DynamicMIG=true,MPSSupport=true",
         "feature gate ComputeDomainCliques requires IMEXDaemonsWithDNSNames to also be enabled"),
        # the docs' MPSSupport + NVMLDeviceHealthCheck exclusion is not in NVIDIA's code
        ("MPSSupport=true,NVMLDeviceHealthCheck=true", None),
        ("ComputeDomainCliques=false,IMEXDaemonsWithDNSNames=false", None),
    ],
)  # fmt: skip
def test_nvidias_rules_between_gates(text: str, failure: str | None) -> None:
    assert validation_failure(parse_feature_gates(text)) == failure


@pytest.mark.parametrize(
    "gate",
    ["PassthroughSupport", "DeviceMetadata", "DRAListTypeAttributes", "FabricManagerPartitioning"],
)  # fmt: skip
def test_a_gate_not_implemented_yet_is_refused(gate: str) -> None:
    refusal = not_implemented(parse_feature_gates(f"{gate}=true"))
    assert refusal is not None
    assert refusal.startswith(f"feature gate {gate} is not implemented by kubegpu yet (")
    assert refusal.endswith(
        f"set {gate}=false in --feature-gates (FEATURE_GATES), or run NVIDIA's driver for it"
    )


@pytest.mark.parametrize(
    "gate",
    ["TimeSlicingSettings", "NVMLDeviceHealthCheck", "IMEXDaemonsWithDNSNames", "ComputeDomainCliques",
     "CrashOnNVLinkFabricErrors", "HostManagedIMEXDaemon", "DynamicMIG", "MPSSupport", "ConsumableShares"],
)  # fmt: skip
def test_implemented_and_compute_domain_gates_are_accepted(gate: str) -> None:
    assert not_implemented(parse_feature_gates(f"{gate}=true")) is None


def flags(environ: dict[str, str], cli: dict[str, str] | None = None) -> DriverFlags:
    return driver_flags(read_given(for_command(DRA), cli or {}, environ))


@pytest.mark.parametrize(
    ("environ", "error"),
    [
        ({"FEATURE_GATES": "Bogus=true"},
         "invalid FEATURE_GATES: unrecognized feature gate: Bogus (NVIDIA's gates: TimeSlicingSettings, "
         "MPSSupport, IMEXDaemonsWithDNSNames, PassthroughSupport, DynamicMIG, NVMLDeviceHealthCheck, "
         "ComputeDomainCliques, CrashOnNVLinkFabricErrors, DeviceMetadata, DRAListTypeAttributes, "
         "FabricManagerPartitioning, HostManagedIMEXDaemon, ConsumableShares)"),
        ({"FEATURE_GATES": "DynamicMIG=on"},
         'invalid FEATURE_GATES: invalid value of DynamicMIG=on, err: strconv.ParseBool: parsing "on": '
         "invalid syntax (use Name=true,Name=false)"),
        ({"FEATURE_GATES": "DynamicMIG=true,NVMLDeviceHealthCheck=true"},
         "feature gate validation failed: feature gate DynamicMIG is currently mutually exclusive with "
         "NVMLDeviceHealthCheck"),
        ({"CONSUMABLE_SHARES": "memory"},
         "invalid CLI flags: --consumable-shares requires feature gate ConsumableShares to be enabled"),
        ({"CONSUMABLE_SHARES": "4"},
         "invalid CLI flags: --consumable-shares requires feature gate ConsumableShares to be enabled"),
        ({"CONSUMABLE_SHARES": "0"},
         "invalid CLI flags: invalid value for --consumable-shares: \"0\" (must be 'disabled', 'memory', "
         "'unlimited', or a positive integer)"),
        ({"CONSUMABLE_SHARES": "Memory"},
         "invalid CLI flags: invalid value for --consumable-shares: \"Memory\" (must be 'disabled', "
         "'memory', 'unlimited', or a positive integer)"),
    ],
)  # fmt: skip
def test_the_driver_flags_refusals(environ: dict[str, str], error: str) -> None:
    with pytest.raises(ConfigError) as err:
        flags(environ)
    assert str(err.value) == error


def test_the_flag_is_named_when_the_gates_come_from_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"^invalid --feature-gates: unrecognized feature gate: X "):
        flags({}, {"feature-gates": "X=true"})


def test_flags_that_change_nothing_are_accepted_with_one_warning_each() -> None:
    got = flags(
        {"NAMESPACE": "nvidia-dra", "IMAGE_NAME": "nvcr.io/nvidia/k8s-dra-driver-gpu:v25.12.0",
         "HEALTHCHECK_PORT": "51516", "KUBE_API_QPS": "5", "SERVICE_ACCOUNT_NAME": ""},
        {"v": "4"},
    )  # fmt: skip
    assert got.warnings == (
        "HEALTHCHECK_PORT is accepted for NVIDIA compatibility and changes nothing here: kubegpu serves no "
        "grpc.health.v1 port; probe the DRA socket or --http-endpoint",
        "--v is accepted for NVIDIA compatibility and changes nothing here: kubegpu logs at info level; -v "
        "(--verbose) turns on debug logging",
        "NAMESPACE is accepted for NVIDIA compatibility and changes nothing here: it places MPS "
        "control-daemon Deployments, which run only with MPSSupport=true",
        "IMAGE_NAME is accepted for NVIDIA compatibility and changes nothing here: it is the image of MPS "
        "control-daemon Deployments, which run only with MPSSupport=true",
    )  # KUBE_API_QPS at its default and an empty SERVICE_ACCOUNT_NAME say nothing


def test_mps_support_needs_the_image_name_and_takes_the_deployment_flags() -> None:
    with pytest.raises(ConfigError) as err:
        flags({"FEATURE_GATES": "MPSSupport=true"})
    assert str(err.value) == (
        "invalid CLI flags: --image-name (IMAGE_NAME) is required when the MPSSupport feature gate is "
        "enabled: set it to the image the MPS control-daemon Deployments run (the driver's own image, as "
        "NVIDIA's chart sets it)"
    )
    got = flags(
        {"FEATURE_GATES": "MPSSupport=true", "NAMESPACE": "nvidia-dra", "IMAGE_NAME": "registry/kubegpu:1",
         "IMAGE_PULL_SECRETS": "regcred,other", "IMAGE_PULL_POLICY": "IfNotPresent",
         "SERVICE_ACCOUNT_NAME": "kubegpu-dra"}
    )  # fmt: skip
    assert got.warnings == ()  # they act now
    assert got.mps is not None
    assert (got.mps.namespace, got.mps.image, got.mps.pull_secrets, got.mps.pull_policy) == (
        "nvidia-dra", "registry/kubegpu:1", ("regcred", "other"), "IfNotPresent"
    )  # fmt: skip
    assert got.mps.service_account == "kubegpu-dra"
    assert flags({"IMAGE_NAME": "registry/kubegpu:1"}).mps is None


def test_the_flags_the_driver_acts_on() -> None:
    got = flags(
        {"HOST_DRIVER_ROOT": "/run/nvidia/driver", "DRIVER_ROOT_CTR_PATH": "/drv",
         "ADDITIONAL_XIDS_TO_IGNORE": "61, x,62", "CONSUMABLE_SHARES": "disabled",
         "FEATURE_GATES": "TimeSlicingSettings=true"},
    )  # fmt: skip
    assert got.driver_root == "/run/nvidia/driver"
    assert got.container_driver_root == "/drv"
    assert got.hook_path == "/usr/bin/nvidia-ctk"
    assert got.xids_to_ignore == frozenset({61, 62})
    assert got.gates["TimeSlicingSettings"]


@pytest.mark.parametrize(("shares", "mode"), [("memory", "memory"), ("unlimited", "unlimited"), ("4", 4)])
def test_consumable_shares_with_its_gate_is_taken(shares: str, mode: str | int) -> None:
    got = flags({"FEATURE_GATES": "ConsumableShares=true", "CONSUMABLE_SHARES": shares})
    assert got.consumable_shares == mode
    assert got.gates["ConsumableShares"]

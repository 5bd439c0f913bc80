"""`kubegpu config check-dra` says what `kubegpu dra` would say at start about the same flags and env vars:
the same refusal, the same warnings, the same gates (one code path; a property over generated sets)."""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubegpu.cli.params import given_values
from kubegpu.configcheck.dra import check_dra_cmd, check_driver
from kubegpu.dra.cli import _settings
from kubegpu.settings.nvidia_config import ConfigError
from kubegpu.settings.setting import DRA

GATE_NAMES = [
    "TimeSlicingSettings", "MPSSupport", "IMEXDaemonsWithDNSNames", "PassthroughSupport", "DynamicMIG",
    "NVMLDeviceHealthCheck", "ComputeDomainCliques", "CrashOnNVLinkFabricErrors", "DeviceMetadata",
    "DRAListTypeAttributes", "FabricManagerPartitioning", "HostManagedIMEXDaemon", "ConsumableShares",
    "AllAlpha", "AllBeta", "ContextualLogging", "Bogus",
]  # fmt: skip
VALUES = ["true", "false", "1", "0", "T", "F", "TRUE", "False", "yes", "", " true "]

item = st.one_of(
    st.builds(lambda n, v: f"{n}={v}", st.sampled_from(GATE_NAMES), st.sampled_from(VALUES)),
    st.sampled_from(GATE_NAMES),  # no value
    st.just(""),
)
gate_texts = st.lists(item, max_size=5).map(",".join)
shares = st.sampled_from(["disabled", "memory", "unlimited", "1", "8", "0", "-1", "all", "Memory"])
no_effect = st.dictionaries(
    st.sampled_from(["namespace", "image-name", "healthcheck-port", "v", "logging-format", "host-root"]),
    st.sampled_from(["0", "1", "51516", "json", "text", "default", "x"]),
    max_size=3,
)


def the_daemon(params: dict[str, Any]) -> tuple[list[str], list[str]]:
    """What `kubegpu dra` logs at start: its refusal, else its warnings (kubegpu.dra.cli)."""
    try:
        driver = _settings(given_values(params, DRA)).driver
    except ConfigError as err:
        return err.problems, []
    return [], list(driver.warnings)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(gates=gate_texts, consumable=shares, other=no_effect)
def test_config_check_dra_agrees_with_the_daemon(gates: str, consumable: str, other: dict[str, str]) -> None:
    params: dict[str, Any] = {
        "node_name": "node-a",
        "feature_gates": gates,
        "consumable_shares": consumable,
        **{k.replace("-", "_"): v for k, v in other.items()},
    }
    errors, warnings = the_daemon(params)
    report = check_driver(params)
    assert (report.errors, report.warnings) == (errors, warnings)
    if not errors:
        assert report.gates == _settings(given_values(params, DRA)).driver.gates


def test_the_command_exit_codes_and_json() -> None:
    runner = CliRunner()
    bad = runner.invoke(check_dra_cmd, ["--feature-gates", "DynamicMIG=true,PassthroughSupport=true"], env={})
    assert bad.exit_code == 1
    assert (
        "feature gate validation failed: feature gate DynamicMIG is currently mutually exclusive with "
        "PassthroughSupport"
    ) in bad.output
    good = runner.invoke(
        check_dra_cmd, ["--json"], env={"FEATURE_GATES": "TimeSlicingSettings=true", "IMAGE_NAME": "x"}
    )
    assert good.exit_code == 0
    out = json.loads(good.output)
    assert out["errors"] == []
    assert out["feature_gates"]["TimeSlicingSettings"] is True
    assert out["warnings"] == [
        "IMAGE_NAME is accepted for NVIDIA compatibility and changes nothing here: it is the image of MPS "
        "control-daemon Deployments, which run only with MPSSupport=true"
    ]

"""NVIDIA's GpuConfig / MigDeviceConfig (resource.nvidia.com/v1beta1) as opaque claim config: decoding,
validation (NVIDIA's texts where it has them), and which config applies to which request."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubegpu.dra.gpuconfig import ConfigError, Sharing, configs_for_results, parse

API = "resource.nvidia.com/v1beta1"


def gpu_config(sharing: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "GpuConfig", "sharing": sharing}


def test_time_slicing() -> None:
    config = parse(gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}))
    assert config.kind == "GpuConfig"
    assert config.sharing == Sharing("TimeSlicing", interval="Long")
    assert parse(gpu_config({"strategy": "TimeSlicing"})).sharing == Sharing(
        "TimeSlicing", interval="Default"
    )


def test_mps_env() -> None:
    config = parse(
        gpu_config(
            {
                "strategy": "MPS",
                "mpsConfig": {
                    "defaultActiveThreadPercentage": 25,
                    "defaultPinnedDeviceMemoryLimit": "2Gi",
                    "defaultPerDevicePinnedMemoryLimit": {"1": "512Mi"},
                },
            }
        )
    )
    assert config.sharing is not None
    assert config.sharing.env(["GPU-a", "GPU-b"]) == [
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=GPU-a=2048M,GPU-b=512M",
    ]


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        (gpu_config({"strategy": "Magic"}), "unknown GPU sharing strategy: Magic; use TimeSlicing or MPS"),
        (gpu_config({"strategy": "Fabric"}), "fabric GPU sharing strategy is not enabled"),
        (
            gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Forever"}}),
            "unknown time-slice interval: Forever; use one of Default, Short, Medium, Long",
        ),
        (
            gpu_config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 101}}),
            "active thread percentage must not be greater than 100",
        ),
        (
            gpu_config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": -1}}),
            "active thread percentage must not be negative",
        ),
        (
            gpu_config({"strategy": "MPS", "timeSlicingConfig": {}}),
            "cannot use TimeSlicingConfig with the 'MPS' strategy",
        ),
        (
            gpu_config({"strategy": "TimeSlicing", "mpsConfig": {}}),
            "cannot use MpsConfig with the 'TimeSlicing' strategy",
        ),
        (
            gpu_config({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "100Ki"}}),
            "invalid limit: default value set too low: 100Ki; use at least 1Mi",
        ),
        (
            {"apiVersion": "gpu.resource.nvidia.com/v1alpha1", "kind": "GpuConfig"},
            "unknown opaque config gpu.resource.nvidia.com/v1alpha1/GpuConfig: use apiVersion "
            "resource.nvidia.com/v1beta1 with kind GpuConfig or MigDeviceConfig",
        ),
        (
            {"apiVersion": API, "kind": "GpuConfig", "sharng": {}},
            'GpuConfig: unknown field "sharng"; known fields: apiVersion, kind, sharing',
        ),
        (
            {"apiVersion": API, "kind": "MigDeviceConfig", "sharing": {"strategy": "TimeSlicing"}},
            "unknown GPU sharing strategy: TimeSlicing; use MPS",
        ),
        ("GpuConfig", "opaque parameters must be an object with apiVersion and kind, got a string"),
    ],
)
def test_invalid_configs_fail_with_one_line(parameters: Any, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(parameters)
    assert str(caught.value) == message


def test_per_device_limit_by_unknown_index() -> None:
    sharing = parse(
        gpu_config({"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"3": "1Gi"}}})
    )
    assert sharing.sharing is not None
    with pytest.raises(ConfigError, match="invalid device: invalid device index: 3"):
        sharing.sharing.env(["GPU-a"])


def test_which_config_applies() -> None:
    ts = gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}})
    mps = gpu_config({"strategy": "MPS"})
    configs = [
        # the claim's config comes after the class's even when listed first, and wins
        {"source": "FromClaim", "requests": ["b"], "opaque": {"driver": "gpu.nvidia.com", "parameters": mps}},
        {"source": "FromClass", "requests": [], "opaque": {"driver": "gpu.nvidia.com", "parameters": ts}},
        {"source": "FromClaim", "opaque": {"driver": "other.example.com", "parameters": {"x": 1}}},
    ]
    out = configs_for_results(configs, "gpu.nvidia.com", ["a", "b"])
    assert {r: (c.sharing.strategy if c.sharing else None) for r, c in out.items()} == {
        "a": "TimeSlicing",
        "b": "MPS",
    }


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)


@given(st.dictionaries(st.sampled_from(["strategy", "mpsConfig", "timeSlicingConfig", "x"]), json_values))
def test_any_sharing_block_parses_or_fails_with_a_config_error(sharing: dict[str, Any]) -> None:
    try:
        parse(gpu_config(sharing))
    except ConfigError as err:
        assert "\n" not in str(err)


@given(json_values)
def test_any_parameters_parse_or_fail_with_a_config_error(parameters: Any) -> None:
    try:
        parse(parameters)
    except ConfigError as err:
        assert "\n" not in str(err)

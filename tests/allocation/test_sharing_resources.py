"""Config -> resources for every MIG strategy and sharing mode, on the fake profiles (table-driven)."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from functools import cache

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubegpu.allocation.from_settings import resource_options
from kubegpu.allocation.resources import (
    Resource,
    ResourceError,
    ResourceOptions,
    build_resources,
    parse_mig_minors,
)
from kubegpu.node.discovery import discover, nvml_session
from kubegpu.node.inventory import Health, Inventory
from kubegpu.node.nvml.backend import load_nvml
from kubegpu.settings.env import NvmlSelection
from kubegpu.settings.nvidia_config import ConfigError
from kubegpu.settings.nvidia_sharing import (
    ReplicatedDevices,
    ReplicatedResource,
    SharingStrategy,
    resource_name,
)
from kubegpu.settings.plugin import resolve
from tests.settings.test_plugin_settings import defaults


@cache
def inventory(profile: str) -> Inventory:
    backend = load_nvml(NvmlSelection.fake(profile))
    with nvml_session(backend.nvml):
        return discover(backend)


def counts(profile: str, config: str = "", **flags: object) -> dict[str, int]:
    return {r.name: len(r.devices) for r in resources(profile, config, **flags)}


def resources(profile: str, config: str = "", **flags: object) -> list[Resource]:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(config)
    settings = resolve(defaults(config_file=f.name, **flags))
    return build_resources(inventory(profile), resource_options(settings))


TIME_SLICING_4 = """
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""


@pytest.mark.parametrize(
    ("profile", "strategy", "expected"),
    [
        ("dgx-a100", "none", {"nvidia.com/gpu": 8}),
        ("a100-mig", "none", {"nvidia.com/gpu": 4}),
        ("a100-mig", "mixed", {"nvidia.com/gpu": 1, "nvidia.com/mig-1g.5gb": 8,
                               "nvidia.com/mig-2g.10gb": 1, "nvidia.com/mig-3g.20gb": 3}),
        ("a100-mig-single", "single", {"nvidia.com/gpu": 14}),
        ("a100-mig-single", "mixed", {"nvidia.com/mig-1g.5gb": 14}),
        ("a100-mig-invalid", "mixed", {"nvidia.com/mig-3g.20gb": 2}),
        ("t4-pcie", "single", {"nvidia.com/gpu": 4}),  # no MIG on the node: single behaves like none
    ],
)  # fmt: skip
def test_mig_strategies(profile: str, strategy: str, expected: dict[str, int]) -> None:
    assert counts(profile, mig_strategy=strategy) == expected


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        # MIG devices of three kinds (and one full GPU): NVIDIA's uniformity check comes before the
        # migEnabled one, with go-nvlib's visitor prefixes.
        (
            "a100-mig",
            "error building device map from config.resources: invalid MIG configuration: error visiting "
            "devices: error visiting device: error visiting device: error visiting MIG device: error "
            "visiting MIG device: more than one MIG device type present on node",
        ),
        # A MIG-enabled GPU without MIG devices: the first check.
        (
            "a100-mig-invalid",
            "error building device map from config.resources: invalid MIG configuration: at least one device "
            "with migEnabled=true was not configured correctly: error visiting device: device 1 has no MIG "
            "devices configured",
        ),
    ],
)
def test_single_strategy_errors(profile: str, message: str) -> None:
    with pytest.raises(ResourceError) as err:
        counts(profile, mig_strategy="single")
    assert str(err.value) == message


def test_single_strategy_partial_node_has_no_mig_prefix() -> None:
    """One kind of MIG device next to a full GPU: NVIDIA's text has no "invalid MIG configuration"."""
    inv = inventory("a100-mig-single")
    partial = replace(inv, gpus=(inv.gpus[0], replace(inv.gpus[1], mig_enabled=False, mig_devices=())))
    with pytest.raises(ResourceError) as err:
        build_resources(partial, ResourceOptions("single"))
    assert str(err.value) == (
        "error building device map from config.resources: all devices on the node must be configured with "
        "the same migEnabled value"
    )


def test_single_strategy_empty_gpu_wins_over_a_partial_node() -> None:
    inv = inventory("a100-mig-single")
    gpus = (replace(inv.gpus[0], mig_devices=()), replace(inv.gpus[1], mig_enabled=False, mig_devices=()))
    with pytest.raises(ResourceError) as err:
        build_resources(replace(inv, gpus=gpus), ResourceOptions("single"))
    assert str(err.value).endswith("error visiting device: device 0 has no MIG devices configured")


def test_mig_devices_take_parent_numa_index_and_capability_nodes() -> None:
    inv = inventory("a100-mig")
    minors = parse_mig_minors("config 1\nmonitor 2\ngpu2/gi1/access 21\ngpu2/gi1/ci0/access 22\n")
    (three_g,) = [
        r for r in build_resources(inv, ResourceOptions("mixed", mig_minors=minors)) if "3g" in r.name
    ]
    on_gpu2 = [d for d in three_g.devices if d.gpu_index == 2]
    assert [d.index for d in on_gpu2] == ["2:0"]
    assert on_gpu2[0].numa_node == inv.gpus[2].numa_node
    assert on_gpu2[0].paths == (
        "/dev/nvidia2",
        "/dev/nvidia-caps/nvidia-cap21",
        "/dev/nvidia-caps/nvidia-cap22",
    )
    assert not three_g.is_whole_gpus


def test_time_slicing_replicas() -> None:
    (gpu,) = resources("t4-pcie", TIME_SLICING_4)
    uuids = [g.uuid for g in inventory("t4-pcie").gpus]
    assert gpu.name == "nvidia.com/gpu" and gpu.sharing == "time-slicing"
    assert [d.id for d in gpu.devices[:5]] == [f"{uuids[0]}::{r}" for r in range(4)] + [f"{uuids[1]}::0"]
    assert len(gpu.devices) == 16 and not gpu.is_whole_gpus
    assert not gpu.fail_requests_greater_than_one


def test_rename_by_default_and_socket() -> None:
    config = TIME_SLICING_4.replace("timeSlicing:", "timeSlicing:\n    renameByDefault: true")
    (shared,) = resources("t4-pcie", config)
    assert shared.name == "nvidia.com/gpu.shared" and shared.socket_name == "nvidia-gpu.shared.sock"


def test_mps_defaults_to_failing_requests_over_one() -> None:
    config = TIME_SLICING_4.replace("timeSlicing", "mps")
    (gpu,) = resources("t4-pcie", config, mps_root="/run/nvidia/mps")
    assert gpu.sharing == "mps" and gpu.fail_requests_greater_than_one


def test_mps_errors() -> None:
    config = TIME_SLICING_4.replace("timeSlicing", "mps")
    with pytest.raises(ConfigError, match="using MPS requires --mps-root to be specified"):
        resources("t4-pcie", config)
    with pytest.raises(ConfigError, match="using --mig-strategy=mixed is not supported with MPS"):
        resources("a100-mig", config, mps_root="/m", mig_strategy="mixed")
    mig_config = config.replace("nvidia.com/gpu", "nvidia.com/gpu")
    with pytest.raises(ResourceError) as err:
        resources("a100-mig-single", mig_config, mps_root="/m", mig_strategy="single")
    assert str(err.value) == "sharing using MPS is not supported for MIG devices"


def test_replicas_of_mig_devices_under_mixed() -> None:
    config = """
sharing:
  timeSlicing:
    renameByDefault: true
    resources:
    - {name: nvidia.com/mig-3g.20gb, replicas: 2}
"""
    got = counts("a100-mig", config, mig_strategy="mixed")
    assert got["nvidia.com/mig-3g.20gb.shared"] == 6 and "nvidia.com/mig-3g.20gb" not in got


SUBSET = """
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      rename: nvidia.com/gpu-shared
      devices: [0, 1]
      replicas: 3
"""


def test_nvidia_ignores_rename_and_devices_with_warnings() -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(SUBSET)
    settings = resolve(defaults(config_file=f.name))
    assert any(
        "Customizing the 'rename' field in 'sharing.timeSlicing.resources'" in w for w in settings.warnings
    )
    assert any("Customizing the 'devices' field" in w for w in settings.warnings)
    assert counts("t4-pcie", SUBSET) == {"nvidia.com/gpu": 12}  # all 4 GPUs x 3, same name


def test_opt_in_honours_rename_and_devices() -> None:
    got = counts("t4-pcie", SUBSET, allow_resource_customization=True)
    assert got == {"nvidia.com/gpu": 2, "nvidia.com/gpu-shared": 6}  # GPUs 2,3 stay whole


def test_opt_in_custom_resource_patterns() -> None:
    config = """
resources:
  gpus:
  - {pattern: "Tesla T4", name: t4}
"""
    assert counts("t4-pcie", config) == {"nvidia.com/gpu": 4}  # NVIDIA: ignored, with a warning
    assert counts("t4-pcie", config, allow_resource_customization=True) == {"nvidia.com/t4": 4}


def test_strict_mode_turns_warnings_into_errors() -> None:
    with pytest.raises(ConfigError, match="strict config"):
        counts("t4-pcie", SUBSET, strict_config=True)


def test_xid_marks_every_replica_of_the_gpu() -> None:
    inv = inventory("t4-pcie")
    sick = inv.with_gpu_health({inv.gpus[2].uuid: Health.failed("XID 48", 48)})
    block = SharingStrategy(resources=[ReplicatedResource(name="gpu", replicas=4)])
    (gpu,) = build_resources(sick, ResourceOptions(sharing_kind="time-slicing", sharing=block))
    unhealthy = [d.id for d in gpu.devices if not d.health.healthy]
    assert unhealthy == [f"{inv.gpus[2].uuid}::{r}" for r in range(4)]  # NVIDIA marks only one (#1929)


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ("sharing: {timeSlicing: {}}", "no resources specified"),
        ("sharing: {timeSlicing: {resources: []}}", "no resources specified"),
        ("sharing: {timeSlicing: {resources: [{replicas: 2}]}}", "no resource name specified"),
        ("sharing: {timeSlicing: {resources: [{name: gpu}]}}", "no replicas specified"),
        ("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 1}]}}",
         "number of replicas must be >= 2"),
        ("sharing: {mps: {resources: [{name: gpu, replicas: -1}]}}", "number of replicas must be >= 2"),
        ("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, devices: not-all}]}}",
         "devices set as 'not-all' but the only valid string input is 'all'"),
        ("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, devices: -2}]}}",
         "devices set as '-2' but a count of devices must be > 0"),
        # NVIDIA prints "%v, %T" of the string it failed to read the item into: -1 is not a string, so "".
        ("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, devices: [-1]}]}}",
         "unsupported type for device in devices list: , string"),
        ("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, devices: [GPU-UUID]}]}}",
         "unsupported type for device in devices list: GPU-UUID, string"),
        # 2.0 reaches NVIDIA as the JSON text 2 (a count); 2.5 stays 2.5.
        ("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, devices: 2.5}]}}",
         "unrecognized type for devices spec: 2.5"),
        ("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, devices: {a: 1}}]}}",
         'unrecognized type for devices spec: {"a":1}'),
        ("sharing: {timeSlicing: {resources: [{name: $invalid$, replicas: 2}]}}",
         "incorrect format for resource name 'nvidia.com/$invalid$'"),
        ("sharing: {timeSlicing: {resources: [{name: " + "a" * 60 + ", replicas: 2}]}}",
         "fully-qualified resource name must be 63 characters or less"),
        ("resources: {gpus: [{name: gpu}]}", "resources must have a 'pattern' field set"),
        ("resources: {gpus: [{pattern: '*'}]}", "resources must have a 'name' field set"),
        ("imex: {channelIDs: [1, 2]}",
         "invalid IMEX channel IDs: invalid IMEX config: channelIDs must be [] or [0]; found [1 2]"),
    ],
)  # fmt: skip
def test_nvidia_config_errors(block: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        counts("t4-pcie", block)
    assert message in str(err.value)


@pytest.mark.parametrize(
    "raw",
    ["all", 3, [0, "1", "0:0", "GPU-6ebfd3ec-1a10-4a6f-8ea5-3a0f41ccbf1d",
                "MIG-6ebfd3ec-1a10-4a6f-8ea5-3a0f41ccbf1d"],
     ["MIG-GPU-6ebfd3ec-1a10-4a6f-8ea5-3a0f41ccbf1d/1/0"]],
)  # fmt: skip
def test_valid_device_specs(raw: object) -> None:
    spec = ReplicatedDevices.parse(raw)
    assert spec.all or spec.count or spec.ids


@given(st.text(max_size=70))
def test_resource_name_never_crashes(raw: str) -> None:
    try:
        name = resource_name(raw)
    except ValueError as err:
        assert "resource name" in str(err)
    else:
        assert name.startswith("nvidia.com/") and len(name) <= 63


def test_a_float_count_that_json_writes_as_an_integer_is_a_count() -> None:
    # go-yaml reads 2.0 as a float; sigs.k8s.io/yaml writes it as the JSON text 2, which NVIDIA's
    # ReplicatedDevices reads as a count. So 2 of the 4 GPUs get replicas, as with `devices: 2`.
    block = "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 3, devices: 2.0}]}}"
    with_float = counts("t4-pcie", block, allow_resource_customization=True)
    assert with_float == counts("t4-pcie", block.replace("2.0", "2"), allow_resource_customization=True)
    assert sum(with_float.values()) == 2 * 3 + 2

"""The config's classes: null read as Go reads it, checks that also run on direct construction, the dump."""

from __future__ import annotations

import json

import pytest

from kubegpu.settings.nvidia_config import ConfigError, parse_config_text
from kubegpu.settings.nvidia_sharing import ReplicatedResource, SharingStrategy
from kubegpu.settings.schema import dump


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # encoding/json leaves a field it reads null into at its zero value; NVIDIA starts with these.
        ("flags: null\n", {"version": "v1", "flags": {}}),
        (
            "resources: {gpus: null, mig: null}\n",
            {"version": "v1", "flags": {}, "resources": {"gpus": [], "mig": []}},
        ),
        ("imex: {channelIDs: [null]}\n", {"version": "v1", "flags": {}, "imex": {"channelIDs": [0]}}),
    ],
)
def test_null_is_the_zero_value_as_nvidia_reads_it(text: str, expected: dict[str, object]) -> None:
    config, warnings = parse_config_text(text)
    assert dump(config) == expected and warnings == []


def test_every_problem_is_listed_with_its_place_and_value() -> None:
    text = (
        "flags: {gfd: {sleepInterval: -1s}}\n"
        "sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 1}\n"
        "    - {name: gpu, replicas: 2, devices: some}\n"
    )
    with pytest.raises(ConfigError) as err:
        parse_config_text(text, "c.yaml")
    assert err.value.problems == [
        "flags.gfd.sleepInterval: sleepInterval -1s is not positive: GFD would relabel without pause; use a "
        "duration such as 60s, or infinite (got -1000000000)",
        "sharing.timeSlicing.resources.0: number of replicas must be >= 2 "
        '(got {"name": "gpu", "replicas": 1})',
        "sharing.timeSlicing.resources.1.devices: devices set as 'some' but the only valid string input is "
        "'all' (got \"some\")",
    ]


def test_checks_run_when_code_builds_a_block() -> None:
    block = SharingStrategy(resources=[ReplicatedResource(name="gpu", replicas=4)], renameByDefault=True)
    assert block.resources is not None
    assert (block.resources[0].name, block.resources[0].rename) == ("nvidia.com/gpu", "nvidia.com/gpu.shared")
    with pytest.raises(ValueError) as empty:
        SharingStrategy(resources=[])
    assert str(empty.value) == "no resources specified"
    with pytest.raises(ValueError) as one:
        ReplicatedResource(name="gpu", replicas=1)
    assert str(one.value) == "number of replicas must be >= 2"


def test_the_start_up_dump_leaves_out_unset_fields() -> None:
    config, _ = parse_config_text("flags: {migStrategy: single, plugin: {passDeviceSpecs: true}}\n")
    assert json.loads(json.dumps(dump(config))) == {
        "version": "v1",
        "flags": {"migStrategy": "single", "plugin": {"passDeviceSpecs": True}},
    }

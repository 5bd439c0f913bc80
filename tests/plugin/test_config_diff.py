"""The reload log line: only what changed in the merged config, on one line."""

from __future__ import annotations

import json

from kubegpu.plugin.config_diff import config_changes


def merged(**flags: object) -> str:
    config = {"version": "v1", "flags": {"migStrategy": "none", **flags}, "sharing": {"timeSlicing": {}}}
    return json.dumps(config, indent=2)


def test_the_changed_fields_with_old_and_new_values() -> None:
    before = merged()
    after = json.dumps(
        {
            "version": "v1",
            "flags": {"migStrategy": "mixed"},
            "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}},
        }
    )
    assert config_changes(before, after) == (
        'config changed: flags.migStrategy "none" -> "mixed", sharing.timeSlicing {} -> (unset), '
        'sharing.timeSlicing.resources.0.name (unset) -> "nvidia.com/gpu", '
        "sharing.timeSlicing.resources.0.replicas (unset) -> 4"
    )


def test_unchanged_and_many_changes() -> None:
    assert config_changes(merged(), merged()) == "config unchanged"
    many = merged(**{f"k{i}": i for i in range(10)})
    line = config_changes(merged(), many)
    assert line.startswith("config changed: flags.k0 (unset) -> 0, flags.k1 (unset) -> 1, ")
    assert line.endswith(" and 2 more") and "\n" not in line

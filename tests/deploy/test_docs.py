"""docs/install.md names files, values and object names that exist: the guide cannot drift from the chart."""

from __future__ import annotations

import re

import pytest

from .conftest import CONFIG_FILES, DEFAULTS, ROOT, HelmError, by_kind, render

GUIDE = (ROOT / "docs/install.md").read_text()


def test_every_repository_path_in_the_guide_exists() -> None:
    paths = set(re.findall(r"(?<![\w/.-])((?:deployments|scripts|tests|docs)/[\w./*-]*[\w*])", GUIDE))
    assert "deployments/static/kubegpu-device-plugin.yml" in paths
    missing = sorted(p for p in paths if not list(ROOT.glob(p)))
    assert missing == []


def test_every_value_the_guide_lists_is_a_chart_value() -> None:
    section = GUIDE.split("Values that mean the same:")[1].split("Defaults that differ")[0]
    names = re.findall(r"`([a-zA-Z.*]+)`", section)
    assert len(names) > 30
    for name in names:
        node = DEFAULTS
        for part in name.split("."):
            if part == "*":
                break
            assert isinstance(node, dict) and part in node, name
            node = node[part]


def test_the_names_the_guide_gives_are_the_rendered_ones() -> None:
    objs = render({"gfd": {"enabled": True}}, set_files=CONFIG_FILES)
    daemonsets = by_kind(objs, "DaemonSet")
    for name in ("kubegpu-device-plugin", "kubegpu-labels", "kubegpu-mps-control-daemon"):
        assert name in daemonsets and name in GUIDE
    plugin = daemonsets["kubegpu-device-plugin"]["spec"]["template"]["spec"]
    names = [c["name"] for c in plugin["initContainers"] + plugin["containers"]]
    assert names == [
        "kubegpu-device-plugin-init",
        "kubegpu-device-plugin-ctr",
        "kubegpu-device-plugin-sidecar",
    ]
    assert (
        "-c kubegpu-device-plugin-sidecar" in GUIDE
        and "`kubegpu-device-plugin-ctr`, `-init`, `-sidecar`" in GUIDE
    )


def test_the_schema_error_the_guide_quotes_is_the_one_helm_prints() -> None:
    quoted = re.search(r"names it \(`([^`]+)`\)", GUIDE)
    assert quoted, "the guide should quote helm's error for a value the chart does not know"
    with pytest.raises(HelmError) as err:
        render({"migStrategey": "mixed"})
    assert " ".join(quoted.group(1).split()) in str(err.value)

"""docs/dra-coexistence.md: its DeviceClass is one the API server takes and its table matches the parser."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from kubernetes import client

from kubegpu.apisim import ApiServerSim
from kubegpu.resourceapi.cel import compile_error
from kubegpu.settings.dra_selection import parse_gpu_selection

DOC = (Path(__file__).resolve().parents[2] / "docs/dra-coexistence.md").read_text()


def test_the_bridge_device_class_is_valid() -> None:
    (block,) = re.findall(r"```yaml\n(.*?)```", DOC, re.S)
    device_class = yaml.safe_load(block)
    assert device_class["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    for selector in device_class["spec"]["selectors"]:
        assert compile_error(selector["cel"]["expression"]) is None
    with ApiServerSim() as api, client.ApiClient(client.Configuration(host=api.url)) as api_client:
        client.CustomObjectsApi(api_client).create_cluster_custom_object(
            "resource.k8s.io", "v1", "deviceclasses", device_class
        )
        assert api.get("deviceclasses", "gpu.nvidia.com")["spec"]["extendedResourceName"] == "nvidia.com/gpu"


def test_every_value_in_the_table_parses() -> None:
    for value in ("none", "all", "0,2"):
        assert f"`{value}`" in DOC
        parse_gpu_selection(value)

"""What `kubegpu config check FILE` was given: a plain config, ConfigMaps, or a Helm values file.

Users hold their configs in three shapes: the plain file the plugin reads (`--config-file`), a ConfigMap
(one `data` key per named config, NVIDIA's way: config-manager mounts it as a directory and a node's
`nvidia.com/device-plugin.config` label picks a key), possibly inside a multi-document YAML (`helm
template` output, a `kubectl get -o yaml` List), or the chart's values file (`config.map`, which the chart
turns into that ConfigMap). This module finds the named configs inside; it reads no files and runs no
check (check.py does).
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from kubegpu.common.k8s_names import is_qualified_name

PLAIN = "config"
CONFIGMAP = "ConfigMap"
VALUES = "Helm values"

# The chart's values that decide what an unlabelled node gets (deployments/helm/kubegpu/values.yaml).
CHART_FALLBACKS = ("named", "single")
CHART_MPS_ROOT = "/run/nvidia/mps"

# A ConfigMap key as the API server accepts it (IsConfigMapKey): [-._a-zA-Z0-9]+, at most 253 bytes.
_KEY_CHARS = frozenset("-._abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# A top-level `kind:` (a Kubernetes object or List) or `config:` (the chart's values) at a line's start.
_WRAPPED = re.compile(r"^(?:kind|config)\s*:", re.M)


@dataclass(frozen=True)
class Named:
    """One config of a ConfigMap or values file: its key (the label value that selects it) and bytes."""

    key: str  # as reported: "KEY", or "CONFIGMAP/KEY" when the file holds several ConfigMaps
    data: bytes
    bare: str  # the data key as written: what a node label selects


@dataclass
class Source:
    kind: str  # PLAIN, CONFIGMAP or VALUES
    configs: list[Named] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # the ConfigMap's own mistakes (findings: exit 1)
    warnings: list[str] = field(default_factory=list)
    unusable: str = ""  # nothing to check in it (bad input: exit 2)
    default: str = ""  # values: config.default
    fallbacks: tuple[str, ...] = ()  # values: config.fallbackStrategies
    mps_root: str = ""  # values: mps.root, which the chart gives the plugin as MPS_ROOT


def classify(text: str, file: str) -> Source:
    """The configs `text` holds. A file that is none of the wrapped shapes is a plain config."""
    if not _WRAPPED.search(text):
        return Source(PLAIN)  # most files: read once, by the plugin's own bounded loader
    try:
        documents = [d for d in yaml.load_all(text, Loader=_LOADER) if d is not None]
    except (yaml.YAMLError, RecursionError, ValueError, TypeError):
        return Source(PLAIN)  # the plain check reports the problem as the plugin would
    objects = [d for d in _flatten(documents) if _is_object(d)]
    if objects:
        return _configmaps(objects, file)
    values = next((d for d in documents if _is_values(d)), None)
    if values is not None:
        return _values(values, file)
    return Source(PLAIN)


def _flatten(documents: list[Any]) -> list[Any]:
    """Documents, with the items of a `kind: List` (what `kubectl get -o yaml` writes) in its place."""
    out: list[Any] = []
    for doc in documents:
        if isinstance(doc, dict) and doc.get("kind") == "List" and isinstance(doc.get("items"), list):
            out.extend(doc["items"])
        else:
            out.append(doc)
    return out


def _is_object(doc: Any) -> bool:
    return isinstance(doc, dict) and isinstance(doc.get("kind"), str) and "apiVersion" in doc


def _is_values(doc: Any) -> bool:
    """The chart's values: a top-level `config` block with its keys. NVIDIA's config file has no `config`."""
    block = doc.get("config") if isinstance(doc, dict) else None
    return isinstance(block, dict) and bool({"map", "name", "default", "fallbackStrategies"} & set(block))


def _configmaps(objects: list[dict[str, Any]], file: str) -> Source:
    maps = [o for o in objects if o.get("kind") == "ConfigMap"]
    if not maps:
        kinds = ", ".join(sorted({str(o["kind"]) for o in objects}))
        return Source(
            CONFIGMAP,
            unusable=f"{file} holds Kubernetes objects ({kinds}) but no ConfigMap: give the ConfigMap that "
            "holds the configs, or the config file itself",
        )
    source = Source(CONFIGMAP)
    several = len(maps) > 1
    for cm in maps:
        metadata = cm.get("metadata")
        meta: dict[str, Any] = metadata if isinstance(metadata, dict) else {}
        name = str(meta.get("name") or "(unnamed)")
        prefix = f"{name}/" if several else ""
        data = cm.get("data") or {}
        binary = cm.get("binaryData") or {}
        if not isinstance(data, dict) or not isinstance(binary, dict):
            source.problems.append(f"ConfigMap {name}: data and binaryData must be maps of key to value")
            continue
        if not data and not binary:
            # config-manager's words for an empty directory
            source.problems.append(
                f"ConfigMap {name}: no configuration files available (it has no data keys)"
            )
        for key, value in data.items():
            key = _key_text(key)
            if not isinstance(value, str):
                source.problems.append(
                    f"ConfigMap {name}: data.{key} is a {_yaml_type(value)}, not a string: the API server "
                    f"refuses it; write the config as a block scalar (`{key}: |` and the file indented below)"
                )
                continue
            source.configs.append(Named(prefix + key, value.encode(), key))
        for key, value in binary.items():
            key = _key_text(key)
            try:
                raw = base64.b64decode(str(value), validate=True)
            except (binascii.Error, ValueError):
                source.problems.append(
                    f"ConfigMap {name}: binaryData.{key} is not base64: the API server refuses it"
                )
                continue
            source.configs.append(Named(prefix + key, raw, key))
    _check_keys(source)
    return source


def _values(values: dict[str, Any], file: str) -> Source:
    block = values["config"]
    mps = values.get("mps")
    root: dict[str, Any] = mps if isinstance(mps, dict) else {}
    fallbacks = block.get("fallbackStrategies", list(CHART_FALLBACKS))
    source = Source(
        VALUES,
        default=str(block.get("default") or ""),
        fallbacks=tuple(str(f) for f in fallbacks) if isinstance(fallbacks, list) else CHART_FALLBACKS,
        mps_root=str(root.get("root") or CHART_MPS_ROOT),
    )
    entries = block.get("map") or {}
    if not isinstance(entries, dict):
        source.unusable = f"{file}: config.map must be a map of config name to config text"
        return source
    if not entries:
        where = block.get("name")
        hint = (
            f"config.name={where} names a ConfigMap made beforehand: check it with `kubectl get configmap "
            f"{where} -n NAMESPACE -o yaml > cm.yaml && kubegpu config check cm.yaml`"
            if where
            else "put the configs under config.map (name: config text), or give the config file itself"
        )
        source.unusable = f"{file} is a Helm values file with an empty config.map: {hint}"
        return source
    for key, value in entries.items():
        key = _key_text(key)
        if not isinstance(value, str):
            source.problems.append(
                f"config.map.{key} is a {_yaml_type(value)}, not a string: the chart writes it into the "
                f"ConfigMap as text; write it as a block scalar (`{key}: |`) or use --set-file "
                f"config.map.{key}=FILE"
            )
            continue
        source.configs.append(Named(key, value.encode(), key))
    _check_keys(source)
    return source


def _check_keys(source: Source) -> None:
    """A key that no node label can name is a config no node can ever get; a key the API server refuses
    is reported and not checked further (no node gets that ConfigMap at all)."""
    valid = []
    for named in source.configs:
        key = named.bare
        refused = key in ("", ".") or key.startswith("..") or len(key.encode()) > 253
        if refused or not set(key) <= _KEY_CHARS:
            source.problems.append(
                f"{key}: not a valid ConfigMap key (the API server refuses it): use letters, digits, '-', "
                "'_', '.'"
            )
            continue
        valid.append(named)
        if not is_qualified_name(key):  # a label value: at most 63 characters, alphanumeric at both ends
            source.warnings.append(
                f"{key}: no node can select this config: the label nvidia.com/device-plugin.config={key} is "
                "not a "
                "valid label value (at most 63 characters, starting and ending with a letter or digit)"
            )
    source.configs = valid


def _key_text(key: Any) -> str:
    """A key as sigs.k8s.io/yaml hands it over: `1` and `true` become their text."""
    if isinstance(key, bool):
        return "true" if key else "false"
    return str(key)


def _yaml_type(value: Any) -> str:
    if isinstance(value, dict):
        return "map"
    if isinstance(value, list):
        return "list"
    if value is None:
        return "null"
    return type(value).__name__.replace("str", "string").replace("int", "number").replace("float", "number")

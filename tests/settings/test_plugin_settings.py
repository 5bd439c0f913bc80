from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.settings.flags import PLUGIN_SETTINGS, merge_flags
from kubegpu.settings.given import FlagValue, read_given
from kubegpu.settings.goparse import parse_bool
from kubegpu.settings.nvidia_config import ConfigError, parse_config_text
from kubegpu.settings.plugin import resolve
from kubegpu.settings.setting import PLUGIN
from kubegpu.settings.table import for_command


def defaults(**explicit: object) -> dict[str, FlagValue]:
    """Every flag at its default, except those given, which count as set on the command line/env."""
    out = {
        s.name: FlagValue(list(s.default) if s.kind == "list" else s.default, False) for s in PLUGIN_SETTINGS
    }
    for name, value in explicit.items():
        out[name.replace("_", "-")] = FlagValue(value, True)
    return out


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


def test_empty_file_is_all_defaults(tmp_path: Path) -> None:
    settings = resolve(defaults(config_file=write(tmp_path, "")))
    assert settings.flags.migStrategy == "none"
    assert settings.flags.failOnInitError is True
    assert settings.device_list_strategies == ("envvar",)
    assert settings.plugin.deviceIDStrategy == "uuid"
    assert settings.flags.nvidiaDevRoot == "/"  # copied from the driver root


def test_file_beats_default_but_explicit_flag_beats_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "version: v1\nflags:\n  failOnInitError: false\n  plugin:\n    deviceIDStrategy: index\n",
    )
    settings = resolve(defaults(config_file=path))
    assert settings.flags.failOnInitError is False  # a false in the file survives the default true
    assert settings.plugin.deviceIDStrategy == "index"
    settings = resolve(defaults(config_file=path, device_id_strategy="uuid", fail_on_init_error=True))
    assert settings.plugin.deviceIDStrategy == "uuid"
    assert settings.flags.failOnInitError is True


def test_json_file_and_string_or_list_strategy(tmp_path: Path) -> None:
    path = write(tmp_path, '{"version": "v1", "flags": {"plugin": {"deviceListStrategy": "volume-mounts"}}}')
    assert resolve(defaults(config_file=path)).device_list_strategies == ("volume-mounts",)
    path = write(tmp_path, "flags:\n  plugin:\n    deviceListStrategy: [envvar, volume-mounts]\n")
    assert resolve(defaults(config_file=path)).device_list_strategies == ("envvar", "volume-mounts")


def test_dev_root_follows_driver_root(tmp_path: Path) -> None:
    settings = resolve(defaults(driver_root="/run/nvidia/driver"))
    assert settings.flags.nvidiaDevRoot == "/run/nvidia/driver"
    settings = resolve(defaults(driver_root="/run/nvidia/driver", dev_root="/"))
    assert settings.flags.nvidiaDevRoot == "/"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("version: v2\n", "unable to parse config file: error parsing config file: unknown version: v2"),
        ("flags:\n  plugin:\n    deviceListStrategy: 5\n", "invalid deviceListStrategy: 5"),
        ("flags:\n  failOnInitError: maybe\n", "flags.failOnInitError"),
        ("- just\n- a list\n", "expected a mapping"),
        ("flags: [\n", "error parsing config file"),
    ],
)
def test_bad_files_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolve(defaults(config_file=write(tmp_path, text)))
    assert message in str(err.value)


# go-yaml v2's texts (a port of libyaml, with its line arithmetic: scanner errors name the problem's line,
# parser errors the line before), wrapped as NVIDIA's loader and sigs.k8s.io/yaml wrap them.
@pytest.mark.parametrize(
    ("text", "nvidia", "where"),
    [
        ("version: v1\nflags: [\n", "yaml: line 2: did not find expected node content", "line 3, column 1"),
        ("flags:\n\tmigStrategy: none\n", "yaml: line 2: found character that cannot start any token",
         "line 2, column 1"),
        ("a: b\n c: d\n", "yaml: line 2: mapping values are not allowed in this context", "line 2, column 3"),
        ("flags:\n  migStrategy: none\n plugin: {}\n", "yaml: line 2: did not find expected key",
         "line 3, column 2"),
        ("flags: 'none\n", "yaml: line 2: found unexpected end of stream", "line 2, column 1"),
        ("a: [1, 2\nb: 3\n", "yaml: line 1: did not find expected ',' or ']'", "line 2, column 2"),
    ],
)  # fmt: skip
def test_yaml_syntax_errors_are_nvidias_text_then_the_place(
    tmp_path: Path, text: str, nvidia: str, where: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        resolve(defaults(config_file=path))
    assert str(err.value) == (
        "unable to parse config file: error parsing config file: unmarshal error: error converting YAML to "
        f"JSON: {nvidia} (at {where} of {path}; fix the YAML there (indentation, a missing ':' or an "
        "unclosed quote or bracket))"
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            {"device_list_strategy": ["bogus"]},
            "unable to validate flags: invalid --device-list-strategy option: invalid strategy: bogus",
        ),
        (
            {"device_id_strategy": "serial"},
            "unable to validate flags: invalid --device-id-strategy option: serial",
        ),
        ({"mig_strategy": "weird"}, "unable to validate flags: unknown MIG strategy: weird"),
    ],
)
def test_nvidia_validation_texts(flags: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolve(defaults(**flags))
    assert str(err.value) == message


def test_missing_file_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="CONFIG_FILE"):
        resolve(defaults(config_file=str(tmp_path / "nope.yaml")))


def test_unknown_keys_become_warnings(tmp_path: Path) -> None:
    path = write(tmp_path, "flags:\n  renameByDefault: true\n  plugin:\n    passDeviceSpec: true\n")
    settings = resolve(defaults(config_file=path))
    assert any("flags.renameByDefault" in w for w in settings.warnings)
    assert any("flags.plugin.passDeviceSpec" in w for w in settings.warnings)


def test_merge_does_not_mutate_the_parsed_file() -> None:
    config, _ = parse_config_text("flags:\n  migStrategy: none\n")
    merge_flags(config, defaults(pass_device_specs=True))
    assert config.flags.plugin is None


def test_a_merged_config_shares_no_list_with_the_flags() -> None:
    # The daemon merges the same flags again on every reload: a list the merge handed out by reference
    # would carry one config's later edits into the next.
    flags = read_given(for_command(PLUGIN), environ={"DEVICE_LIST_STRATEGY": "envvar,cdi-cri"})
    config, _ = parse_config_text("")
    first = merge_flags(config, flags)
    assert first.flags.plugin is not None
    first.flags.plugin.deviceListStrategy.append("volume-mounts")
    again = merge_flags(config, flags)
    assert again.flags.plugin is not None and again.flags.plugin.deviceListStrategy == ["envvar", "cdi-cri"]


@pytest.mark.parametrize("text", ["1", "t", "T", "TRUE", "true", "True"])
def test_go_bool_true(text: str) -> None:
    assert parse_bool(text) is True


def test_go_bool_rejects_yes() -> None:
    with pytest.raises(ValueError, match="use true or false"):
        parse_bool("yes")


yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=10,
)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["version", "flags", "sharing", "other"]),
        yaml_values
        | st.dictionaries(st.sampled_from(["migStrategy", "plugin", "failOnInitError"]), yaml_values),
        max_size=4,
    )
)
def test_random_documents_give_a_config_or_a_clear_error(doc: dict[str, object]) -> None:
    try:
        config, warnings = parse_config_text(yaml.safe_dump(doc))
    except ConfigError as err:
        assert str(err)
    else:
        assert config.version == "v1"
        assert all(isinstance(w, str) for w in warnings)


def test_the_start_up_dump_holds_no_unknown_keys(tmp_path: Path) -> None:
    # NVIDIA's "Running with config:" is its Go structs: unknown keys, and anchors under them, never appear.
    path = tmp_path / "c.yaml"
    path.write_text("a: &a [x, x]\nb: [*a, *a]\nflags:\n  migStrategy: none\n  extra: [*a]\n")
    settings = resolve(defaults(config_file=str(path)))
    dump = json.loads(settings.log_json())
    assert "a" not in dump and "b" not in dump and "extra" not in dump["flags"]
    assert settings.warnings[:3] == (
        "unknown config key a is ignored; check its spelling and where it belongs",
        "unknown config key b is ignored; check its spelling and where it belongs",
        "unknown config key flags.extra is ignored; check its spelling and where it belongs",
    )


def test_a_config_that_is_not_utf8_is_a_config_error_not_a_crash(tmp_path: Path) -> None:
    # The daemon's config watcher catches ConfigError and keeps watching; a UnicodeDecodeError killed it.
    path = tmp_path / "c.yaml"
    path.write_bytes(b"version: v1\n# caf\xe9\n")
    with pytest.raises(ConfigError) as err:
        resolve(defaults(config_file=str(path)))
    assert str(err.value) == (
        f"unable to read config file {path}: is not UTF-8 text: byte 0xe9 at offset 17 (line 2, column 6) is "
        "not valid UTF-8; save the config file as UTF-8 text (e.g. iconv -f latin1 -t utf-8); check "
        "--config-file / CONFIG_FILE"
    )


@pytest.mark.parametrize(
    ("flags", "file"),
    [
        ({"device_discovery_strategy": "magic"}, ""),
        ({}, "version: v1\nflags:\n  deviceDiscoveryStrategy: magic\n"),
        ({"device_discovery_strategy": "vfio"}, ""),  # GFD's fourth choice; the plugin refuses it
    ],
)
def test_device_discovery_strategy_is_validated_as_nvidia_does(
    tmp_path: Path, flags: dict[str, object], file: str
) -> None:
    with pytest.raises(ConfigError) as err:
        resolve(defaults(config_file=write(tmp_path, file), **flags))
    value = flags.get("device_discovery_strategy", "magic")
    assert str(err.value) == f"unable to validate flags: invalid --device-discovery-strategy option {value}"


def test_device_discovery_strategy_from_the_env_var_is_read() -> None:
    given = read_given(for_command(PLUGIN), {}, {"DEVICE_DISCOVERY_STRATEGY": "magic"})
    with pytest.raises(ConfigError) as err:
        resolve(given)
    assert str(err.value) == "unable to validate flags: invalid --device-discovery-strategy option magic"
    given = read_given(for_command(PLUGIN), {}, {"DEVICE_DISCOVERY_STRATEGY": "nvml"})
    settings = resolve(given)
    assert settings.flags.deviceDiscoveryStrategy == "nvml" and settings.warnings == ()
    assert json.loads(settings.log_json())["flags"]["deviceDiscoveryStrategy"] == "nvml"


def test_tegra_and_cdi_flags_kubegpu_cannot_act_on_are_said_once() -> None:
    settings = resolve(
        defaults(
            device_discovery_strategy="tegra",
            cdi_disable_hooks=["all", "chmod"],
            cdi_feature_flags=["enable-coherent-annotations"],
            strict_config=True,  # notes, not config warnings: strict mode does not refuse them
        )
    )
    assert settings.cdi_disable_hooks == ("all", "chmod")
    assert settings.cdi_feature_flags == ("enable-coherent-annotations",)
    assert settings.warnings == (
        "--device-discovery-strategy=tegra asks for Tegra (Jetson, integrated GPUs) discovery through "
        "CUDA, which kubegpu does not implement: it discovers GPUs through NVML as with nvml, so GPUs NVML "
        "does not see are not advertised; use auto or nvml to silence this",
        "--cdi-disable-hooks: chmod is not a hook name NVIDIA's CDI library knows (all, create-symlinks, "
        "update-ldcache, enable-cuda-compat, disable-device-node-modification); ignored, as NVIDIA ignores "
        "it",
        "--cdi-feature-flags=enable-coherent-annotations: these switch features of NVIDIA's CDI library "
        "(nvcdi), which kubegpu does not use: its own CDI specs are unchanged; drop the flag to silence "
        "this",
    )

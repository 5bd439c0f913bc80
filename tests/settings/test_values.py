"""Each kind of setting's parse and its one-line error, whole: NVIDIA's words (Go's flag package on the
command line, urfave/cli for env vars) for NVIDIA's settings, kubegpu's with the default for its own."""

from __future__ import annotations

import pytest

from kubegpu.settings.given import FlagValue, read_given
from kubegpu.settings.setting import CONFIG_MANAGER, DRA, LABELS, PLUGIN
from kubegpu.settings.table import for_command, lookup
from kubegpu.settings.values import SettingError, XidList, help_text, parse_xid_list, text_of


def given(command: str, env: dict[str, str], cli: dict[str, str] | None = None) -> dict[str, FlagValue]:
    return read_given(for_command(command), cli or {}, env)


def error_of(command: str, env: dict[str, str], cli: dict[str, str] | None = None) -> str:
    with pytest.raises(SettingError) as info:
        given(command, env, cli)
    return str(info.value)


# --- NVIDIA's settings: Go's words ------------------------------------------------------------------------


def test_a_float_go_cannot_parse_has_strconvs_words() -> None:
    assert error_of(DRA, {"KUBE_API_QPS": "fast"}) == (
        'could not parse "fast" as float64 value from environment variable "KUBE_API_QPS" for flag '
        'kube-api-qps: strconv.ParseFloat: parsing "fast": invalid syntax'
    )
    assert (
        error_of(DRA, {}, {"kube-api-qps": "fast"})
        == 'invalid value "fast" for flag -kube-api-qps: parse error'
    )
    # A number Go reads but that is not finite: kubegpu's fix, in the flag package's frame.
    assert error_of(DRA, {}, {"kube-api-qps": "1e999"}) == (
        'invalid value "1e999" for flag -kube-api-qps: use a finite number'
    )


def test_an_int_go_cannot_parse_has_strconvs_words() -> None:
    assert error_of(DRA, {"KUBE_API_BURST": "ten"}) == (
        'could not parse "ten" as int value from environment variable "KUBE_API_BURST" for flag '
        'kube-api-burst: strconv.ParseInt: parsing "ten": invalid syntax'
    )
    # Only ASCII spaces around the number, as strconv (str.strip would also take "\x1f").
    assert error_of(DRA, {"KUBE_API_BURST": "5\x1f"}) == (
        'could not parse "5\\x1f" as int value from environment variable "KUBE_API_BURST" for flag '
        'kube-api-burst: strconv.ParseInt: parsing "5\\x1f": invalid syntax'
    )


def test_whole_numbers_of_up_to_40_characters_are_read() -> None:
    assert given(DRA, {"KUBE_API_BURST": "0" * 39 + "7"})["kube-api-burst"].value == 7
    assert error_of(DRA, {"KUBE_API_BURST": "0" * 40 + "7"}) == (
        f'could not parse "{"0" * 40}7" as int value from environment variable "KUBE_API_BURST" for flag '
        "kube-api-burst: use a whole number"
    )


def test_a_bound_is_inclusive_and_named_in_the_fix() -> None:
    assert given(CONFIG_MANAGER, {"SIGNAL": "64"})["signal"].value == 64
    assert error_of(CONFIG_MANAGER, {"SIGNAL": "65"}) == (
        'could not parse "65" as int value from environment variable "SIGNAL" for flag signal: '
        "use a whole number from 1 to 64"
    )
    # Only a maximum: the fix still says which numbers (it said "use a whole number" for 70000).
    assert error_of(DRA, {"HEALTHCHECK_PORT": "70000"}) == (
        'could not parse "70000" as int value from environment variable "HEALTHCHECK_PORT" for flag '
        "healthcheck-port: use a whole number of at most 65535"
    )
    assert error_of(LABELS, {"KUBE_API_BURST": "-1"}) == (  # GFD's: 0 or more
        'could not parse "-1" as int value from environment variable "KUBE_API_BURST" for flag '
        "kube-api-burst: use a whole number of 0 or more"
    )


def test_a_duration_go_cannot_parse_has_its_words() -> None:
    assert error_of(LABELS, {"GFD_SLEEP_INTERVAL": "soon"}) == (
        'could not parse "soon" from environment variable "GFD_SLEEP_INTERVAL" as value for flag '
        'sleep-interval: time: invalid duration "soon"'
    )


def test_a_long_value_is_cut_after_its_first_quote_only() -> None:
    ys = "y" * 256
    assert error_of(PLUGIN, {"FAIL_ON_INIT_ERROR": ys}) == (
        f'could not parse "{ys}" as bool value from environment variable "FAIL_ON_INIT_ERROR" for flag '
        f'fail-on-init-error: strconv.ParseBool: parsing "{ys}": invalid syntax'
    )
    assert error_of(PLUGIN, {"FAIL_ON_INIT_ERROR": "y" * 300}) == (
        f'could not parse "{ys}"... (300 characters) as bool value from environment variable '
        f'"FAIL_ON_INIT_ERROR" for flag fail-on-init-error: strconv.ParseBool: parsing "{ys}": invalid syntax'
    )


# --- kubegpu's settings: what, the value, the fix and the default ---------------------------------------


def test_kubegpus_errors_name_the_kind_and_the_default_when_there_is_one() -> None:
    assert error_of(PLUGIN, {"KUBEGPU_PROC_ROOT": "  "}) == (
        "KUBEGPU_PROC_ROOT='  ' is not a valid path: use a non-empty path, e.g. /proc (the default)"
    )
    assert error_of(PLUGIN, {"KUBEGPU_XID_ACTIONS": "  "}) == (
        "KUBEGPU_XID_ACTIONS='  ' is not a valid path: use a non-empty path"  # no default to show
    )
    assert error_of(PLUGIN, {"KUBEGPU_DRA_GPUS": "x"}) == (
        "KUBEGPU_DRA_GPUS='x' is not a valid GPU selection: 'x' is neither a GPU index nor a GPU UUID; use "
        "all, none, GPU indices (0,2) or GPU UUIDs (GPU-<uuid>), comma-separated, e.g. none (the default)"
    )
    ones = "1" * 100  # quoted whole up to 256 characters
    assert error_of(PLUGIN, {"KUBEGPU_HTTP_PORT": ones}) == (
        f"KUBEGPU_HTTP_PORT='{ones}' is not a valid whole number: use a whole number from 0 to 65535, "
        "e.g. 0 (the default)"
    )


# --- NVIDIA's XID lists ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("48,,79", XidList(False, frozenset({48, 79}))),  # an empty entry is skipped, not the end
        ("48, XIDS", XidList(True)),  # `xids` as `all`, any case
        ("48,all,79", XidList(True, frozenset({79}))),  # `all` drops what came before, keeps what follows
    ],
)
def test_xid_lists(text: str, expected: XidList) -> None:
    assert parse_xid_list(text) == expected


def test_xid_lists_as_text() -> None:
    assert str(XidList(True, frozenset({48}))) == "all"
    assert str(XidList(False, frozenset({79, 48, 13}))) == "13,48,79"
    assert str(XidList()) == ""


# --- --help and the start-up block ----------------------------------------------------------------------


def test_help_says_env_vars_default_and_bounds() -> None:
    probe = lookup(PLUGIN, "health-probe-seconds")  # positive: 0 excluded
    assert help_text(probe) == (
        f"{probe.help}  [env var: KUBEGPU_HEALTH_PROBE_SECONDS; default: 5; 0<x<=86400]"
    )
    grace = lookup(PLUGIN, "health-grace-period")
    assert (
        help_text(grace) == f"{grace.help}  [env var: KUBEGPU_HEALTH_GRACE_SECONDS; default: 60; 0<=x<=86400]"
    )
    config = lookup(LABELS, "config-file")  # two env vars, no default
    assert help_text(config) == f'{config.help}  [env var: GFD_CONFIG_FILE, CONFIG_FILE; default: ""]'


def test_a_list_is_written_comma_separated() -> None:
    hooks = lookup(PLUGIN, "cdi-disable-hooks")
    assert text_of(hooks, ["create-symlinks", "update-ldcache"]) == "create-symlinks,update-ldcache"


def test_an_nvidia_path_left_blank_is_refused_in_urfaves_frame() -> None:
    assert error_of(DRA, {"CDI_ROOT": "  "}) == (
        'could not parse "  " as path value from environment variable "CDI_ROOT" for flag cdi-root: '
        "use a non-empty path"
    )

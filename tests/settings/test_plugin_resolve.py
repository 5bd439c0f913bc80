"""resolve() and validate(), field by field: every setting outside the config file reaches the daemon, and
each refusal has its whole text (the HTTP address's checks, NVIDIA's validation, strict config)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubegpu.settings.dra_selection import GpuSelection
from kubegpu.settings.given import read_given
from kubegpu.settings.nvidia_config import Config, ConfigError
from kubegpu.settings.plugin import PluginSettings, http_address_problem, resolve, validate
from kubegpu.settings.setting import PLUGIN
from kubegpu.settings.table import for_command


def from_env(env: dict[str, str]) -> PluginSettings:
    return resolve(read_given(for_command(PLUGIN), {}, env))


def refusal(env: dict[str, str]) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        from_env(env)
    return err.value


def test_every_setting_outside_the_config_file_reaches_the_daemon() -> None:
    settings = from_env(
        {
            "KUBELET_SOCKET": "/k/kubelet.sock",
            "KUBEGPU_MPS_CLIENT_LIMITS": "false",
            "KUBEGPU_HTTP_PORT": "9400",
            "KUBEGPU_HTTP_ADDRESS": "10.0.0.7",
            "KUBEGPU_POD_RESOURCES_SOCKET": "/p/kubelet.sock",
            "KUBEGPU_HEALTH_GRACE_SECONDS": "5.5",
            "KUBEGPU_METRICS_INTERVAL_SECONDS": "2.5",
            "KUBEGPU_IDLE_THRESHOLD": "7",
            "KUBEGPU_PROC_ROOT": "/host/proc",
            "KUBEGPU_NODE_NAME": "node-a",
            "KUBEGPU_DRA_GPUS": "1",
            "KUBEGPU_CDI_ROOT": "/run/cdi-test",
        }
    )
    assert settings.kubelet_socket == "/k/kubelet.sock"
    assert settings.config_file == ""
    assert settings.mps_client_limits is False
    assert settings.http_port == 9400
    assert settings.http_address == "10.0.0.7"
    assert settings.pod_resources_socket == "/p/kubelet.sock"
    assert settings.health_grace_s == 5.5
    assert settings.metrics_interval_s == 2.5
    assert settings.idle_threshold_percent == 7
    assert settings.proc_root == Path("/host/proc")
    assert settings.node_name == "node-a"
    assert settings.dra_gpus == GpuSelection(indices=frozenset({1}))
    assert settings.env.cdi_root == Path("/run/cdi-test")
    assert "  env      KUBEGPU_NODE_NAME=node-a" in settings.log_settings().splitlines()


def test_no_flags_at_all_are_the_defaults() -> None:
    settings = resolve({})  # another command's caller, or a test: nothing given, not even --config-file
    assert (settings.config_file, settings.kubelet_socket) == (
        "",
        "/var/lib/kubelet/device-plugins/kubelet.sock",
    )
    assert settings.sharing_strategy() == ("none", None)
    assert settings.mps_client_limits is True  # kubegpu's limits for MPS containers, on unless turned off
    assert settings.log_json() == '{\n  "version": "v1",\n  "flags": {}\n}'


def test_the_config_dump_is_indented_json_that_keeps_non_ascii_text(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags:\n  mpsRoot: /run/nvidia/mps-é\n", encoding="utf-8")
    dump = from_env({"CONFIG_FILE": str(config)}).log_json()
    assert '\n    "mpsRoot": "/run/nvidia/mps-é",\n' in dump


def test_a_config_with_nothing_set_validates_as_nvidias_defaults() -> None:
    validate(PluginSettings(config=Config(), kubelet_socket="", config_file=""))  # no error


def test_every_validation_problem_is_listed_and_joined(tmp_path: Path) -> None:
    error = refusal({"DEVICE_ID_STRATEGY": "serial", "MIG_STRATEGY": "weird"})
    assert error.problems == [
        "unable to validate flags: invalid --device-id-strategy option: serial",
        "unable to validate flags: unknown MIG strategy: weird",
    ]
    assert str(error) == (
        "unable to validate flags: invalid --device-id-strategy option: serial; unknown MIG strategy: weird"
    )
    config = tmp_path / "mps.yaml"
    config.write_text(
        "version: v1\nsharing:\n  mps:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n"
    )
    error = refusal({"CONFIG_FILE": str(config), "MIG_STRATEGY": "mixed", "MPS_ROOT": "/run/nvidia/mps"})
    assert str(error) == "unable to validate flags: using --mig-strategy=mixed is not supported with MPS"


def test_strict_config_lists_each_warning(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nextra: 1\nmore: 2\n")
    error = refusal({"CONFIG_FILE": str(config), "KUBEGPU_STRICT_CONFIG": "true"})
    extra = "unknown config key extra is ignored; check its spelling and where it belongs"
    more = "unknown config key more is ignored; check its spelling and where it belongs"
    assert str(error) == f"strict config: {extra}; {more}"
    assert error.problems == [f"strict config: {extra}", f"strict config: {more}"]


@pytest.mark.parametrize(
    "address",
    [
        "",
        "10.0.0.7",
        "[::1]",
        "2001:db8::1",
        "[fe80::1%eth0]",
        "gpu-node-1",
        "gpu-node.example.com.",
        "ünï.example",
    ],
)
def test_ip_addresses_and_host_names_can_be_listened_on(address: str) -> None:
    assert http_address_problem(address) is None


LABEL_63 = "a" * 63
NAME_253 = ".".join([LABEL_63, LABEL_63, LABEL_63, "b" * 61])


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        ("two words", "it holds spaces or control characters"),
        ("node\n", "it holds spaces or control characters"),
        ("a..b", "it has an empty label (two dots in a row)"),
        (".a", "it has an empty label (two dots in a row)"),
        (NAME_253 + "b", "it is 254 characters, over the 253 of a DNS name"),
        (f"{LABEL_63}a.example", "a label of it is 64 characters, over the 63 of a DNS label"),
    ],
)
def test_what_the_resolver_refuses_is_named(address: str, problem: str) -> None:
    assert http_address_problem(address) == problem


def test_the_dns_limits_are_inclusive() -> None:
    assert len(NAME_253) == 253
    assert http_address_problem(NAME_253) is None
    assert http_address_problem(NAME_253 + ".") is None  # the root's dot is not part of the name
    assert http_address_problem(f"{LABEL_63}.example") is None


def test_a_name_idna_cannot_encode_is_refused() -> None:
    problem = http_address_problem("a\u2ff0b")  # an ideographic description character: printable, not a name
    assert problem is not None and problem.startswith("it is not a valid host name (")


def test_a_bad_http_address_fails_the_settings_with_the_fix() -> None:
    assert str(refusal({"KUBEGPU_HTTP_ADDRESS": "a..b"})) == (
        "invalid --http-address (KUBEGPU_HTTP_ADDRESS) 'a..b': it has an empty label (two dots in a row); "
        'give an IP address or host name of this node, or "" to listen on every interface'
    )
    long = str(refusal({"KUBEGPU_HTTP_ADDRESS": "a" * 300}))  # cut at 256 characters in the message
    assert long == (
        "invalid --http-address (KUBEGPU_HTTP_ADDRESS) '" + "a" * 256 + "'... (300 characters): it is 300 "
        "characters, over the 253 of a DNS name; give an IP address or host name of this node, "
        'or "" to listen on every interface'
    )

"""Hostile and malformed config files: a clear one-line error, in bounded time and memory, and the same
verdict from the daemon's start-up path and from `kubegpu config check`.

The corpus (hostile_corpus.py) is built in the test. Each file goes through (1) the daemon's start-up
sequence in its order (plugin/cli.py, then Daemon._serve: the settings load, the options Allocate needs,
the resources), measured with tracemalloc, and (2) `kubegpu config check --profile dgx-a100 --json`.
The real daemon process is run on a few of them in tests/contract/test_config_verdicts.py.
"""

from __future__ import annotations

import json
import time
import tracemalloc
from functools import cache
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubegpu.allocation.from_settings import allocate_options, resource_options
from kubegpu.allocation.resources import ResourceError, build_resources
from kubegpu.configcheck.check import config_group
from kubegpu.node.discovery import discover, nvml_session
from kubegpu.node.driverfiles import ImexChannelError
from kubegpu.node.inventory import Inventory
from kubegpu.node.nvml.backend import load_nvml
from kubegpu.settings.env import NvmlSelection
from kubegpu.settings.nvidia_config import ConfigError
from kubegpu.settings.plugin import resolve
from tests.settings.hostile_corpus import ACCEPT, REFUSE, Case, corpus
from tests.settings.test_plugin_settings import defaults

MEMORY_CEILING = 100 * 2**20  # bytes allocated at the peak, as tracemalloc counts them
# Not a timing test (bench/hostile_config_bench.py has the numbers): a ceiling that only a hang or an
# exponential blow-up reaches, however loaded the machine and however much tracemalloc slows Python.
HANG_CEILING_S = 60.0


@cache
def inventory() -> Inventory:
    backend = load_nvml(NvmlSelection.fake("dgx-a100"))
    with nvml_session(backend.nvml):
        return discover(backend)


def daemon_start(path: Path) -> tuple[list[str], list[str]]:
    """(errors, warnings) of the daemon's start with this config file, in the daemon's order."""
    try:
        settings = resolve(defaults(config_file=str(path)))
        allocate_options(settings)
        build_resources(inventory(), resource_options(settings))
    except ConfigError as err:
        return err.problems, []
    except (ImexChannelError, ResourceError) as err:
        return [str(err)], []
    return [], list(settings.warnings)


def config_check(path: Path) -> tuple[int, dict]:
    result = CliRunner().invoke(config_group, ["check", str(path), "--profile", "dgx-a100", "--json"])
    return result.exit_code, json.loads(result.stdout)


def measured(path: Path) -> tuple[list[str], list[str], float, int]:
    tracemalloc.start()
    started = time.perf_counter()
    try:
        errors, warnings = daemon_start(path)
        return errors, warnings, time.perf_counter() - started, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


CORPUS = corpus()


def test_the_corpus_covers_the_issues_cases() -> None:
    assert len(CORPUS) >= 230
    verdicts = {c.verdict for c in CORPUS}
    assert verdicts == {ACCEPT, REFUSE}


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.name)
def test_hostile_config(tmp_path: Path, case: Case) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(case.data)
    errors, warnings, elapsed, peak = measured(path)
    assert (REFUSE if errors else ACCEPT) == case.verdict, errors
    assert peak < MEMORY_CEILING, f"{peak / 2**20:.0f} MiB at the peak"
    assert elapsed < HANG_CEILING_S
    for line in (*errors, *warnings):
        assert "\n" not in line and len(line) < 2000, line
    assert len(warnings) <= 42  # 20 named unknown keys, 20 case-folded ones, one count, one spare
    if case.says:
        assert case.says in " | ".join(errors or warnings)
    # `config check` gives the same verdict and the same texts.
    code, report = config_check(path)
    assert code == (1 if errors else 0), report
    assert report["errors"] == errors
    assert report["warnings"][: len(warnings)] == warnings


# Documents shaped like configs, with values of every YAML type in every slot.
_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["none", "single", "mixed", "envvar", "uuid", "all", "gpu", "4", "yes", "60s", "-1s"]),
    st.text(max_size=8),
)
_value = st.recursive(
    _leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
_resource = st.fixed_dictionaries(
    {"name": st.sampled_from(["gpu", "nvidia.com/gpu", "bad name", ""]) | _leaf},
    optional={
        "replicas": st.integers(min_value=-2, max_value=10_000) | _leaf,
        "devices": _value,
        "rename": _leaf,
    },
)
_documents = st.fixed_dictionaries(
    {},
    optional={
        "version": st.sampled_from(["v1", "", "v2"]) | _leaf,
        "flags": st.fixed_dictionaries(
            {},
            optional={
                "migStrategy": st.sampled_from(["none", "single", "mixed"]) | _leaf,
                "failOnInitError": _leaf,
                "plugin": st.fixed_dictionaries(
                    {}, optional={"passDeviceSpecs": _leaf, "deviceListStrategy": _value}
                ),
                "gfd": st.fixed_dictionaries({}, optional={"sleepInterval": _leaf}),
                "unknownFlag": _value,
            },
        ),
        "sharing": st.fixed_dictionaries(
            {},
            optional={
                "timeSlicing": st.fixed_dictionaries(
                    {}, optional={"resources": st.lists(_resource, max_size=2), "renameByDefault": _leaf}
                )
            },
        ),
        "imex": st.fixed_dictionaries({}, optional={"channelIDs": _value, "required": _leaf}),
        "other": _value,
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_documents)
def test_config_check_and_the_daemon_agree_on_any_document(tmp_path: Path, document: dict) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(document, allow_unicode=True))
    errors, _ = daemon_start(path)
    code, report = config_check(path)
    assert code == (1 if errors else 0)
    assert report["errors"] == errors

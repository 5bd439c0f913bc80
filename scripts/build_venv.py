"""Build kubegpu's runtime virtual environment from the pinned requirements: what the Dockerfile runs,
and what tests/deploy runs (slow, opt-in) to prove the pins install from PyPI.

Usage:
    python scripts/build_venv.py deps    --venv DIR --src DIR   # the pinned dependencies only
    python scripts/build_venv.py project --venv DIR --src DIR   # then kubegpu itself, as a wheel
    python scripts/build_venv.py all     --venv DIR --src DIR   # both, then `kubegpu --help`
    python scripts/build_venv.py prune   --venv DIR             # then drop pip and setuptools (image)

Dependencies are installed from wheels only and must match the hashes in requirements/runtime.txt.
kubegpu is built as a wheel in a throwaway venv holding only the pinned build backend
(requirements/build.txt), from a copy of pyproject.toml, README.md and src/ (the source tree stays clean),
and installed without dependencies, so nothing unpinned reaches the runtime venv.

--pip-cert names a CA bundle for pip, used only when the file exists: the Dockerfile passes its optional
`pip-ca` build secret, which a build behind a TLS-intercepting proxy sets and every other build leaves out
(a secret is mounted for one RUN step only, so the bundle never reaches an image layer).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

PROJECT_FILES = ("pyproject.toml", "README.md", "src")


def run(*cmd: str | Path) -> None:
    print("+", " ".join(map(str, cmd)), flush=True)
    subprocess.run([str(c) for c in cmd], check=True)


PIP_OPTIONS: list[str] = ["--no-cache-dir", "--disable-pip-version-check"]


def pip(env: Path, *args: str | Path) -> None:
    run(env / "bin/python", "-m", "pip", *PIP_OPTIONS, *args)


def ensure_venv(path: Path) -> None:
    if not (path / "bin/python").exists():
        venv.create(path, with_pip=True)


def install_deps(env: Path, src: Path) -> None:
    ensure_venv(env)
    pip(env, "install", "--require-hashes", "--only-binary=:all:", "-r", src / "requirements/runtime.txt")


def install_project(env: Path, src: Path) -> None:
    ensure_venv(env)
    with tempfile.TemporaryDirectory(prefix="kubegpu-build-") as tmp:
        work = Path(tmp)
        for name in PROJECT_FILES:
            source = src / name
            if source.is_dir():
                shutil.copytree(
                    source,
                    work / "project" / name,
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"),
                )
            else:
                (work / "project").mkdir(exist_ok=True)
                shutil.copy2(source, work / "project" / name)
        builder = work / "builder"
        venv.create(builder, with_pip=True)
        pip(
            builder,
            "install",
            "--require-hashes",
            "--only-binary=:all:",
            "-r",
            src / "requirements/build.txt",
        )
        pip(
            builder,
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            work / "dist",
            work / "project",
        )
        (wheel,) = (work / "dist").glob("kubegpu-*.whl")
        pip(env, "install", "--no-deps", "--no-index", wheel)
    pip(env, "check")


# Parts of pinned packages the image leaves out: (package directory under site-packages, why). The
# kubernetes client ships an asyncio copy of itself (68 MB of 280 with its .pyc) that kubegpu never
# imports (tests/deploy/test_image.py checks that src/ does not).
UNUSED_PARTS = (("kubernetes/aio", "the asyncio client; kubegpu uses the synchronous one"),)


def prune(env: Path) -> None:
    """The image ships no installer (pip and setuptools, which ensurepip put in the venv, go) and none of
    UNUSED_PARTS."""
    pip(env, "uninstall", "--yes", "pip", "setuptools")
    (site_packages,) = env.glob("lib/python3.*/site-packages")
    for part, why in UNUSED_PARTS:
        print(f"+ rm -r {site_packages / part}  # {why}", flush=True)
        shutil.rmtree(site_packages / part)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("step", choices=("deps", "project", "all", "prune"))
    ap.add_argument("--venv", type=Path, required=True)
    ap.add_argument("--src", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--pip-cert", type=Path, help="CA bundle for pip, if the file exists")
    args = ap.parse_args(argv)
    if args.pip_cert is not None and args.pip_cert.is_file():
        PIP_OPTIONS.append(f"--cert={args.pip_cert}")
    env, src = args.venv.absolute(), args.src.absolute()
    if args.step in ("deps", "all"):
        install_deps(env, src)
    if args.step in ("project", "all"):
        install_project(env, src)
    if args.step == "all":
        run(env / "bin/kubegpu", "--help")
    if args.step == "prune":
        prune(env)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Build kubegpu's runtime virtual environment from the pinned requirements: what the Dockerfile runs,
and what tests/deploy runs (slow, opt-in) to prove the pins install from PyPI.

Usage:
    python scripts/build_venv.py deps    --venv DIR --src DIR   # the pinned dependencies only
    python scripts/build_venv.py project --venv DIR --src DIR   # then kubegpu itself, as a wheel
    python scripts/build_venv.py all     --venv DIR --src DIR   # both, then `kubegpu --help`

Dependencies are installed from wheels only and must match the hashes in requirements/runtime.txt.
kubegpu is built as a wheel in a throwaway venv holding only the pinned build backend
(requirements/build.txt), from a copy of pyproject.toml, README.md and src/ (the source tree stays clean),
and installed without dependencies, so nothing unpinned reaches the runtime venv.
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


def pip(env: Path, *args: str | Path) -> None:
    run(env / "bin/python", "-m", "pip", "--no-cache-dir", "--disable-pip-version-check", *args)


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("step", choices=("deps", "project", "all"))
    ap.add_argument("--venv", type=Path, required=True)
    ap.add_argument("--src", type=Path, default=Path(__file__).resolve().parent.parent)
    args = ap.parse_args(argv)
    env, src = args.venv.absolute(), args.src.absolute()
    if args.step in ("deps", "all"):
        install_deps(env, src)
    if args.step in ("project", "all"):
        install_project(env, src)
    if args.step == "all":
        run(env / "bin/kubegpu", "--help")
    return 0


if __name__ == "__main__":
    sys.exit(main())

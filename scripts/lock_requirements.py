"""Re-pin requirements/*.txt with pip-compile (pip-tools): versions and sha256 hashes from PyPI.

Usage: python scripts/lock_requirements.py [--upgrade]
- requirements/runtime.txt: the dependencies in pyproject.toml, what the container image installs;
- requirements/build.txt: the wheel build backend (requirements/build.in).
Run it after changing dependencies in pyproject.toml; tests/deploy/test_requirements.py fails until then.
Pins are resolved for the Python running this script, which must be the image's (3.11, see Dockerfile).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMON = [
    "--quiet",
    "--generate-hashes",
    "--strip-extras",
    "--allow-unsafe",  # setuptools is what build.txt is for
    "--no-emit-index-url",
    "--no-emit-find-links",  # a local wheel directory must not leak into the image build
    "--no-emit-trusted-host",
]


def main() -> int:
    extra = ["--upgrade"] if "--upgrade" in sys.argv[1:] else []
    if sys.version_info[:2] != (3, 11):
        print("warning: the image runs Python 3.11; pins made here may differ", file=sys.stderr)
    jobs = [
        ("requirements/runtime.txt", "pyproject.toml"),
        ("requirements/build.txt", "requirements/build.in"),
    ]
    for out, src in jobs:
        cmd = [sys.executable, "-m", "piptools", "compile", *COMMON, *extra, "-o", out, src]
        subprocess.run(cmd, cwd=ROOT, check=True)
        print(f"pinned {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

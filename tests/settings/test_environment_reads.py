"""Only the settings package reads the environment for settings; everything else gets typed values.

A setting read where it is used escapes the table: no validation at start, not in the start-up log, not in
`config check`, not in the README. The few other reads of the environment are not settings; each is listed
here with why, and with how many reads the file has, so a new one cannot slip in beside them.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "kubegpu"
SETTINGS_PACKAGE = SRC / "settings"

ALLOWED = {
    # gRPC's C core reads GRPC_VERBOSITY when it is first imported: quiet its INFO chatter by default.
    "cli/main.py": 1,
    # MPS control daemons are started with PATH and LD_LIBRARY_PATH passed through (to find NVIDIA's
    # tools and libraries), and "not found on PATH" quotes the PATH it searched.
    "node/mps_control.py": 3,
    # `kubegpu doctor` diagnoses the environment the plugin would run in (DEVICE_LIST_STRATEGY, ...).
    "toolkit/doctor/node.py": 1,
    # The simulated nodes build their child daemon's environment from their own (the DRA node leaves out
    # the driver's own settings, which it passes explicitly).
    "demo/simnode.py": 1,
    "demo/dranode.py": 1,
}

_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


def environment_reads(path: Path) -> list[int]:
    """Line numbers of `os.environ`, `os.getenv` and friends, and of `from os import environ`."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in _NAMES:
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            lines += [node.lineno for alias in node.names if alias.name in _NAMES]
        elif isinstance(node, ast.keyword) and node.arg in ("envvar", "auto_envvar_prefix"):
            lines.append(node.lineno)  # click reading an env var behind the table's back
    return sorted(lines)


def test_nothing_outside_the_settings_package_reads_the_environment() -> None:
    found = {
        str(path.relative_to(SRC)): len(reads)
        for path in sorted(SRC.rglob("*.py"))
        if not path.is_relative_to(SETTINGS_PACKAGE) and (reads := environment_reads(path))
    }
    assert found == ALLOWED


def test_the_settings_package_does_read_it() -> None:
    """The scan finds real reads (it would pass vacuously otherwise)."""
    assert environment_reads(SETTINGS_PACKAGE / "given.py")

"""The walls between packages (docs/architecture.md §3), checked on the real import graph.

Every `import` and `from ... import` in src/kubegpu counts, function-level and TYPE_CHECKING ones included:
a lazy import is still a dependency, and a type-only one still couples the two sides.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

TOOLS = ("labels", "configmanager", "mps", "configcheck", "toolkit", "demo")
BELOW_PLUGIN = ("common", "settings", "node", "allocation", "api", "cli", "resourceapi")

# package -> the kubegpu packages (or modules) it may import besides its own.
ALLOWED: dict[str, tuple[str, ...]] = {
    "common": (),
    "settings": ("common",),
    "node": ("settings", "common"),
    "allocation": ("settings", "common", "node.inventory", "node.driverfiles"),
    "api": (),
    "resourceapi": ("common",),
    "apisim": ("common", "resourceapi"),
    "cli": ("settings", "common", "kubegpu"),
    "plugin": (*BELOW_PLUGIN, "kubegpu"),
    "dra": (*BELOW_PLUGIN, "kubegpu"),  # a daemon like plugin, but never the plugin itself
    "kubeletsim": ("api", "common"),
    **{tool: (*BELOW_PLUGIN, "kubeletsim", "apisim", *TOOLS, "kubegpu") for tool in TOOLS},
    "__main__": ("cli",),
}

# Third-party modules a package must not import: the pure core and the settings stay free of I/O frameworks.
FORBIDDEN_LIBRARIES: dict[str, tuple[str, ...]] = {
    "common": ("grpc", "pynvml", "asyncio"),
    "settings": ("grpc", "pynvml", "asyncio"),
    "allocation": ("grpc", "pynvml", "asyncio"),
    "node": ("grpc",),
    "kubeletsim": ("pynvml",),
    "resourceapi": ("grpc", "pynvml", "asyncio"),
    "apisim": ("grpc", "pynvml"),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, module: str) -> set[str]:
    """Every module `path` imports, as absolute dotted names (submodules resolved where they exist)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_package:
                    base.pop()
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        raw = imports_of(path, name)
        # Keep kubegpu modules that exist (a `from pkg import name` adds pkg.name only when it is a module)
        # and every third-party top-level name.
        graph[name] = {m for m in raw if m in modules or not m.startswith("kubegpu")}
    return graph


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "kubegpu"


def _allowed(importer: str, target: str) -> bool:
    own = package_of(importer)
    if target == "kubegpu":
        return "kubegpu" in ALLOWED.get(own, ())
    if package_of(target) == own:
        return True
    inner = target.removeprefix("kubegpu.")
    return any(inner == a or inner.startswith(a + ".") for a in ALLOWED.get(own, ()))


def wall_violations(graph: Mapping[str, Iterable[str]]) -> list[str]:
    out = []
    for importer, targets in sorted(graph.items()):
        own = package_of(importer)
        for target in sorted(targets):
            if target.startswith("kubegpu"):
                if not _allowed(importer, target):
                    out.append(f"{importer} imports {target}")
            elif target.split(".")[0] in FORBIDDEN_LIBRARIES.get(own, ()):
                out.append(f"{importer} imports {target}")
    return out


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), among kubegpu modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_every_package_is_covered_by_a_rule(graph: dict[str, set[str]]) -> None:
    packages = {package_of(m) for m in graph} - {"kubegpu"}
    assert packages <= set(ALLOWED), f"packages without a wall: {sorted(packages - set(ALLOWED))}"


def test_no_package_crosses_its_wall(graph: dict[str, set[str]]) -> None:
    assert wall_violations(graph) == []


def test_no_import_cycles(graph: dict[str, set[str]]) -> None:
    assert cycles(graph) == []


def test_the_plugin_daemon_is_imported_by_nothing_but_itself(graph: dict[str, set[str]]) -> None:
    importers = {
        m
        for m, targets in graph.items()
        if package_of(m) != "plugin" and any(t.startswith("kubegpu.plugin") for t in targets)
    }
    assert importers == set()


# Inside the toolkit, one room per command: a command's subpackage imports the shared modules beside it,
# never another command's room, and the shared modules import no room (only the click commands do).
TOOLKIT_COMMANDS = ("doctor", "lint", "explain", "top")
TOOLKIT_ENTRY_POINTS = ("kubegpu.toolkit.cli", "kubegpu.toolkit.kubectl_plugin")


def toolkit_room(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) > 3 and parts[:2] == ["kubegpu", "toolkit"] and parts[2] in TOOLKIT_COMMANDS:
        return parts[2]
    return None


def toolkit_room_violations(graph: Mapping[str, Iterable[str]]) -> list[str]:
    out = []
    for importer, targets in sorted(graph.items()):
        if not importer.startswith("kubegpu.toolkit") or importer in TOOLKIT_ENTRY_POINTS:
            continue
        own = toolkit_room(importer)
        for target in sorted(targets):
            room = toolkit_room(target)
            if room is not None and room != own:
                out.append(f"{importer} imports {target}")
    return out


def test_the_toolkit_commands_keep_to_their_rooms(graph: dict[str, set[str]]) -> None:
    assert toolkit_room_violations(graph) == []


def test_the_checker_catches_a_toolkit_command_entering_another_room() -> None:
    made_up = {
        "kubegpu.toolkit.lint.rules": {"kubegpu.toolkit.doctor.findings", "kubegpu.toolkit.model"},
        "kubegpu.toolkit.model": {"kubegpu.toolkit.explain.run"},
        "kubegpu.toolkit.cli": {"kubegpu.toolkit.explain.run", "kubegpu.toolkit.lint.run"},
        "kubegpu.toolkit.doctor.node": {"kubegpu.toolkit.doctor.findings"},
    }
    assert toolkit_room_violations(made_up) == [
        "kubegpu.toolkit.lint.rules imports kubegpu.toolkit.doctor.findings",
        "kubegpu.toolkit.model imports kubegpu.toolkit.explain.run",
    ]


# The checks themselves must be able to fail: each rule on a made-up graph that breaks it.


def test_the_checker_catches_a_core_module_importing_grpc_and_nvml() -> None:
    made_up = {"kubegpu.allocation.x": {"grpc", "kubegpu.node.nvml.backend", "kubegpu.node.inventory"}}
    assert wall_violations(made_up) == [
        "kubegpu.allocation.x imports grpc",
        "kubegpu.allocation.x imports kubegpu.node.nvml.backend",
    ]


def test_the_checker_catches_a_tool_importing_the_daemon_and_the_simulator_importing_the_plugin() -> None:
    made_up = {
        "kubegpu.toolkit.x": {"kubegpu.plugin.daemon"},
        "kubegpu.kubeletsim.y": {"kubegpu.allocation.resources", "kubegpu.api.v1beta1"},
        "kubegpu.settings.z": {"kubegpu.allocation.allocate"},
    }
    assert wall_violations(made_up) == [
        "kubegpu.kubeletsim.y imports kubegpu.allocation.resources",
        "kubegpu.settings.z imports kubegpu.allocation.allocate",
        "kubegpu.toolkit.x imports kubegpu.plugin.daemon",
    ]


def test_the_checker_keeps_the_dra_layers_apart() -> None:
    made_up = {
        "kubegpu.resourceapi.x": {"kubegpu.apisim.server", "grpc"},
        "kubegpu.apisim.y": {"kubegpu.resourceapi.cel", "kubegpu.kubeletsim.dra"},
        "kubegpu.kubeletsim.z": {"kubegpu.apisim.server", "kubegpu.resourceapi.model"},
        "kubegpu.plugin.w": {"kubegpu.resourceapi.model", "kubegpu.apisim.server"},
    }
    assert wall_violations(made_up) == [
        "kubegpu.apisim.y imports kubegpu.kubeletsim.dra",
        "kubegpu.kubeletsim.z imports kubegpu.apisim.server",
        "kubegpu.kubeletsim.z imports kubegpu.resourceapi.model",
        "kubegpu.plugin.w imports kubegpu.apisim.server",
        "kubegpu.resourceapi.x imports grpc",
        "kubegpu.resourceapi.x imports kubegpu.apisim.server",
    ]


def test_the_checker_finds_a_cycle() -> None:
    made_up = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(made_up) == [["a", "b", "c"]]

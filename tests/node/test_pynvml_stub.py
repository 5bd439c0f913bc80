"""typings/pynvml.pyi (the types mypy uses for nvidia-ml-py, which ships none) against the real thing.

The stub must describe the installed pynvml (names, signatures, struct fields), the fake NVML must have
pynvml's signatures for every function it implements, and every NVML name the code touches must be
declared (calls through the untyped `NvmlApi` are invisible to mypy, so this test is their check).
"""

from __future__ import annotations

import ast
import builtins
import ctypes
import inspect
import re
from collections.abc import Callable
from pathlib import Path

import pynvml
import pytest

from kubegpu.node.nvml.fake import FakeNvml

ROOT = Path(__file__).resolve().parents[2]
STUB = ast.parse((ROOT / "typings" / "pynvml.pyi").read_text())
STUB_ONLY = {"_Chars"}  # typing helpers with no runtime counterpart

FUNCTIONS = {n.name: n for n in STUB.body if isinstance(n, ast.FunctionDef)}
CLASSES = {n.name: n for n in STUB.body if isinstance(n, ast.ClassDef) and n.name not in STUB_ONLY}
ANNOTATED = {
    n.target.id: n for n in STUB.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
}
CONSTANTS = sorted(name for name, n in ANNOTATED.items() if ast.unparse(n.annotation) == "int")
ALIASES = {
    name: ast.unparse(n.value)
    for name, n in ANNOTATED.items()
    if ast.unparse(n.annotation) == "TypeAlias" and n.value is not None
}
DECLARED = set(FUNCTIONS) | set(CLASSES) | set(ANNOTATED)


def stub_params(name: str) -> list[tuple[str, bool]]:
    """(parameter name, has a default) of a function declared in the stub."""
    args = FUNCTIONS[name].args
    with_default = len(args.defaults)
    return [(a.arg, i >= len(args.args) - with_default) for i, a in enumerate(args.args)]


def runtime_params(func: Callable[..., object], skip_self: bool = False) -> list[tuple[str, bool]]:
    params = list(inspect.signature(func).parameters.values())
    return [(p.name, p.default is not inspect.Parameter.empty) for p in params[1 if skip_self else 0 :]]


def test_the_stub_declares_something() -> None:
    assert len(FUNCTIONS) > 40 and len(ALIASES) == 4 and "NVMLError" in CLASSES
    assert "NVML_ERROR_NOT_FOUND" in CONSTANTS


@pytest.mark.parametrize("name", sorted(DECLARED))
def test_every_declared_name_exists_in_pynvml(name: str) -> None:
    assert hasattr(pynvml, name), f"typings/pynvml.pyi declares {name}, which pynvml does not have"


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_functions_have_pynvml_signatures(name: str) -> None:
    assert stub_params(name) == runtime_params(getattr(pynvml, name))


@pytest.mark.parametrize("name", CONSTANTS)
def test_constants_are_ints(name: str) -> None:
    assert isinstance(getattr(pynvml, name), int)


@pytest.mark.parametrize("name", sorted(ALIASES))
def test_handles_are_pointers_to_the_declared_struct(name: str) -> None:
    match = re.fullmatch(r"_Pointer\[(\w+)\]", ALIASES[name])
    assert match, f"{name}: only handle pointer aliases are expected, found {ALIASES[name]}"
    handle = getattr(pynvml, name)
    assert issubclass(handle, ctypes._Pointer) and handle._type_ is getattr(pynvml, match[1])


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_classes_have_the_declared_bases_and_fields(name: str) -> None:
    real = getattr(pynvml, name)
    for base in CLASSES[name].bases:
        base_name = ast.unparse(base)
        expected = getattr(ctypes, base_name, None) or getattr(pynvml, base_name, None)
        expected = expected or getattr(builtins, base_name)
        assert issubclass(real, expected), f"{name} is not a {base_name}"
    fields = [n.target.id for n in CLASSES[name].body if isinstance(n, ast.AnnAssign)]
    if issubclass(real, ctypes.Structure) and fields:
        assert fields == [f[0] for f in real._fields_], f"{name}: fields differ from pynvml's _fields_"


def fake_functions() -> list[str]:
    return sorted(n for n in dir(FakeNvml) if n.startswith("nvml") and callable(getattr(FakeNvml, n)))


def test_the_fake_implements_what_the_plugin_needs() -> None:
    assert {"nvmlInit", "nvmlDeviceGetHandleByIndex", "nvmlEventSetWait_v2"} <= set(fake_functions())


@pytest.mark.parametrize("name", fake_functions())
def test_fake_functions_have_pynvml_signatures(name: str) -> None:
    assert name in FUNCTIONS, f"FakeNvml.{name} is not declared in typings/pynvml.pyi"
    assert runtime_params(getattr(FakeNvml, name), skip_self=True) == stub_params(name)


NVML_NAME = re.compile(r"^(nvml[A-Z]|NVML_|NVMLError)")


def nvml_names_used() -> dict[str, str]:
    """Every `x.nvmlSomething` / `x.NVML_...` / `x.NVMLError...` in src/kubegpu, with a file using it."""
    used: dict[str, str] = {}
    for path in sorted((ROOT / "src" / "kubegpu").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and NVML_NAME.match(node.attr):
                used.setdefault(node.attr, str(path.relative_to(ROOT)))
    return used


def test_every_nvml_name_the_code_uses_is_declared() -> None:
    used = nvml_names_used()
    assert "nvmlDeviceGetHandleByIndex" in used  # the scan finds calls through the untyped NvmlApi
    missing = {name: where for name, where in used.items() if name not in DECLARED}
    assert not missing, f"add these to typings/pynvml.pyi: {missing}"

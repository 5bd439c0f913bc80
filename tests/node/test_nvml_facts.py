"""Facts about NVML that the real and fake backends share live in one place (node/nvml/pci.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import kubegpu
from kubegpu.node.nvml.pci import WHOLE_GPU

SRC = Path(kubegpu.__file__).parent


def test_whole_gpu_is_nvmls_all_ones_instance_id() -> None:
    assert WHOLE_GPU == 0xFFFFFFFF == 4294967295


def test_whole_gpu_has_one_home() -> None:
    homes = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and node.value == 0xFFFFFFFF and type(node.value) is int:
                homes.append(str(path.relative_to(SRC)))
    assert homes == ["node/nvml/pci.py"]

"""Regenerate the committed gRPC stubs from our protos: the Device Plugin API (v1beta1), PodResources (v1),
the plugin registration API, the DRA node service (v1, v1beta1) and the DRA health service (v1alpha1).

Usage: python scripts/gen_proto.py [OUT_DIR]   (default: src, i.e. in place)
The stubs are committed so that installing kubegpu never needs grpcio-tools; tests/plugin/test_proto_stubs.py
regenerates into a temp dir and fails when the committed files differ. Besides protoc's own modules and
message stubs (api_pb2.py, api_pb2.pyi, api_pb2_grpc.py), mypy-protobuf's plugin writes api_pb2_grpc.pyi, the
typed servicer and client classes mypy checks our gRPC methods against (grpcio-tools writes none).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTOS = (
    "kubegpu/api/v1beta1/api.proto",
    "kubegpu/api/podresources/v1/api.proto",
    "kubegpu/api/pluginregistration/v1/api.proto",
    "kubegpu/api/dra/v1/api.proto",
    "kubegpu/api/dra/v1beta1/api.proto",
    "kubegpu/api/drahealth/v1alpha1/api.proto",
)


def grpc_typing_plugin() -> str:
    """mypy-protobuf's protoc plugin, installed next to this Python (the dev extras) or on PATH."""
    beside = Path(sys.executable).parent / "protoc-gen-mypy_grpc"
    found = str(beside) if beside.exists() else shutil.which("protoc-gen-mypy_grpc")
    if found is None:
        raise SystemExit("protoc-gen-mypy_grpc not found: install the dev extras (pip install -e '.[dev]')")
    return found


def generate(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    include = Path(protoc.__file__).parent / "_proto"
    rc = protoc.main(
        [
            "protoc",
            f"-I{ROOT / 'src'}",
            f"-I{include}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            f"--plugin=protoc-gen-mypy_grpc={grpc_typing_plugin()}",
            f"--mypy_grpc_out=quiet:{out_dir}",
            *(str(ROOT / "src" / proto) for proto in PROTOS),
        ]
    )
    if rc != 0:
        raise SystemExit(f"protoc failed with exit code {rc}")


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "src")

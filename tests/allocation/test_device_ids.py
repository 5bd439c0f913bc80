"""The replica-ID format, against NVIDIA's AnnotatedID (k8s-device-plugin internal/rm/devices.go)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubegpu.allocation.device_ids import AnnotatedId, any_annotated, backing_id, replica_id

GPU = "GPU-8c4a7e0b-3f1d-4b2e-9a6c-0d5e7f8a9b1c"
MIG = "MIG-5c9f2d1e-7a3b-5e8c-b1d4-2f6a8c0e3d7b"


def test_builds_nvidia_format() -> None:
    assert AnnotatedId.of(GPU, 0) == "GPU-8c4a7e0b-3f1d-4b2e-9a6c-0d5e7f8a9b1c::0"
    assert AnnotatedId.of(MIG, 17) == "MIG-5c9f2d1e-7a3b-5e8c-b1d4-2f6a8c0e3d7b::17"
    assert AnnotatedId.of("MIG-GPU-8c4a7e0b/1/0", 2) == "MIG-GPU-8c4a7e0b/1/0::2"
    assert replica_id(GPU, 5) == "GPU-8c4a7e0b-3f1d-4b2e-9a6c-0d5e7f8a9b1c::5"
    assert type(replica_id(GPU, 5)) is str


@pytest.mark.parametrize(
    ("text", "annotated", "parts"),
    [
        (f"{GPU}::3", True, (GPU, 3)),
        (GPU, False, (GPU, 0)),
        ("MIG-GPU-8c4a7e0b/1/0::2", True, ("MIG-GPU-8c4a7e0b/1/0", 2)),
        # Go's SplitN(id, "::", 2) cuts at the first separator; ParseInt's error is ignored, giving 0.
        ("GPU-a::1::2", True, ("GPU-a", 0)),
        ("GPU-a::", True, ("GPU-a", 0)),
        ("GPU-a::x", True, ("GPU-a", 0)),
        ("GPU-a:: 1", True, ("GPU-a", 0)),
        ("GPU-a::1_000", True, ("GPU-a", 0)),
        ("GPU-a::\u0663", True, ("GPU-a", 0)),  # an Arabic-Indic 3: Python's int() reads it, Go's does not
        ("GPU-a::+7", True, ("GPU-a", 7)),
        ("GPU-a::-1", True, ("GPU-a", -1)),
        ("GPU-a::007", True, ("GPU-a", 7)),
        # Out of int64 range: ParseInt returns the bound with its (ignored) range error.
        ("GPU-a::9223372036854775808", True, ("GPU-a", 9223372036854775807)),
        ("GPU-a::-9223372036854775809", True, ("GPU-a", -9223372036854775808)),
        ("GPU-a:1", False, ("GPU-a:1", 0)),
        ("", False, ("", 0)),
    ],
)
def test_splits_as_nvidia(text: str, annotated: bool, parts: tuple[str, int]) -> None:
    ident = AnnotatedId(text)
    assert ident.has_annotations is annotated
    assert ident.parts() == parts
    assert ident.backing_id == parts[0]
    assert backing_id(text) == parts[0]


def test_backing_id_is_a_plain_string() -> None:
    assert type(AnnotatedId.of(GPU, 1).backing_id) is str
    assert type(backing_id(GPU)) is str
    assert type(AnnotatedId(GPU).parts()[0]) is str


def test_any_annotated() -> None:
    assert any_annotated([GPU, f"{MIG}::0"])
    assert not any_annotated([GPU, MIG])
    assert not any_annotated([])


# Any device ID NVIDIA's format can carry: no "::" inside, and no trailing ":" to merge with the separator.
device_ids = st.text(min_size=1).filter(lambda s: "::" not in s and not s.endswith(":"))


@given(device_ids, st.integers(min_value=0, max_value=2**63 - 1))
def test_round_trip(device_id: str, replica: int) -> None:
    ident = AnnotatedId.of(device_id, replica)
    assert ident == replica_id(device_id, replica)
    assert ident.has_annotations
    assert ident.parts() == (device_id, replica)
    assert ident.backing_id == device_id
    assert AnnotatedId(device_id).parts() == (device_id, 0)
    assert not AnnotatedId(device_id).has_annotations


@given(st.text())
def test_split_then_build_gives_the_id_back(text: str) -> None:
    device_id, replica = AnnotatedId(text).parts()
    if AnnotatedId(text).has_annotations and text == f"{device_id}::{replica}":
        assert AnnotatedId.of(device_id, replica) == text
    assert text.startswith(device_id)

"""Which GPUs go to DRA: the `--gpus` / `--dra-gpus` text, parsed and applied to GPUs."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubegpu.settings.dra_selection import GpuSelection, parse_gpu_selection

U0 = "GPU-907a70c3-1012-4037-b64c-e4228c38fb29"
U1 = "GPU-1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f"


@dataclass(frozen=True)
class G:
    index: int
    uuid: str


HEX = "0123456789abcdef"


def _uuid_from(draw_hex: str) -> str:
    h = draw_hex
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


UUIDS = st.text(alphabet=HEX, min_size=32, max_size=32).map(_uuid_from)
INDICES = st.integers(min_value=0, max_value=9999)


@pytest.mark.parametrize("text", ["", "   ", "none", "NONE", " None "])
def test_none_and_empty_select_nothing(text: str) -> None:
    sel = parse_gpu_selection(text)
    assert sel.empty and not sel.everything
    assert not sel.includes(G(0, U0))
    assert str(sel) == "none"


@pytest.mark.parametrize("text", ["all", "ALL", " All "])
def test_all_selects_every_gpu(text: str) -> None:
    sel = parse_gpu_selection(text)
    assert sel.everything and not sel.empty
    assert sel.includes(G(0, U0)) and sel.includes(G(7, U1))
    assert str(sel) == "all"


def test_indices_and_uuids_mix() -> None:
    sel = parse_gpu_selection(f"2, 0,{U1}")
    assert sel.indices == frozenset({0, 2})
    assert sel.uuids == frozenset({U1})
    assert sel.includes(G(0, U0))
    assert sel.includes(G(5, U1))
    assert not sel.includes(G(1, U0))
    assert str(sel) == f"0,2,{U1}"


def test_uuid_case_does_not_matter() -> None:
    sel = parse_gpu_selection(U0.upper().replace("GPU-", "gpu-"))
    assert sel.includes(G(3, U0))
    assert sel.includes(G(3, U0.upper()))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0,,1", "invalid GPU selection '0,,1': an empty item; use all, none, GPU indices (0,2) or GPU UUIDs "
                 "(GPU-<uuid>), comma-separated"),
        ("all,0", "invalid GPU selection 'all,0': 'all' cannot be mixed with other items; use all, none, GPU "
                  "indices (0,2) or GPU UUIDs (GPU-<uuid>), comma-separated"),
        ("-1", "invalid GPU selection '-1': '-1' is neither a GPU index nor a GPU UUID; use all, none, GPU "
               "indices (0,2) or GPU UUIDs (GPU-<uuid>), comma-separated"),
        ("GPU-1234", "invalid GPU selection 'GPU-1234': 'GPU-1234' is neither a GPU index nor a GPU UUID; "
                     "use all, none, GPU indices (0,2) or GPU UUIDs (GPU-<uuid>), comma-separated"),
        ("MIG-907a70c3-1012-4037-b64c-e4228c38fb29",
         "invalid GPU selection 'MIG-907a70c3-1012-4037-b64c-e4228c38fb29': "
         "'MIG-907a70c3-1012-4037-b64c-e4228c38fb29' is a MIG device; MIG devices follow their parent GPU, "
         "name the GPU; use all, none, GPU indices (0,2) or GPU UUIDs (GPU-<uuid>), comma-separated"),
    ],
)  # fmt: skip
def test_bad_items_are_named_with_the_accepted_forms(text: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_gpu_selection(text)
    assert str(err.value) == message


def test_a_huge_bad_item_is_cut_in_the_message() -> None:
    with pytest.raises(ValueError) as err:
        parse_gpu_selection("x" * 5000)
    assert len(str(err.value)) < 400
    assert "(5000 characters)" in str(err.value)


def test_unmatched_names_the_items_no_gpu_has() -> None:
    sel = parse_gpu_selection(f"0,3,{U1}")
    assert sel.unmatched([G(0, U0), G(1, "GPU-00000000-0000-0000-0000-000000000000")]) == ["3", U1]
    assert parse_gpu_selection("all").unmatched([]) == []


@given(st.lists(INDICES, max_size=6), st.lists(UUIDS, max_size=6), st.data())
def test_round_trip_and_membership(indices: list[int], uuids: list[str], data: st.DataObject) -> None:
    items = data.draw(st.permutations([str(i) for i in indices] + uuids))
    text = " , ".join(items)
    sel = parse_gpu_selection(text)
    assert sel.indices == frozenset(indices)
    assert sel.uuids == frozenset(uuids)
    assert sel.empty is (not items)
    assert parse_gpu_selection(str(sel)) == sel
    for i in indices:
        assert sel.includes(G(i, "GPU-ffffffff-ffff-ffff-ffff-ffffffffffff"))
    for u in uuids:
        assert sel.includes(G(10_000, u))


@given(st.text(max_size=40))
def test_any_text_parses_or_fails_with_one_line(text: str) -> None:
    try:
        sel = parse_gpu_selection(text)
    except ValueError as err:
        msg = str(err)
        assert "\n" not in msg
        assert msg.startswith("invalid GPU selection")
        assert msg.endswith("use all, none, GPU indices (0,2) or GPU UUIDs (GPU-<uuid>), comma-separated")
    else:
        assert isinstance(sel, GpuSelection)
        assert parse_gpu_selection(str(sel)) == sel


def test_the_plugins_setting_reads_the_env_var_and_names_it_in_errors() -> None:
    from kubegpu.settings.given import read_given
    from kubegpu.settings.setting import PLUGIN
    from kubegpu.settings.table import lookup
    from kubegpu.settings.values import SettingError

    setting = lookup(PLUGIN, "dra-gpus")
    assert read_given([setting], {}, {})["dra-gpus"].value.empty
    given = read_given([setting], {}, {"KUBEGPU_DRA_GPUS": f"1,{U0}"})["dra-gpus"]
    assert given.value.includes(G(1, U1)) and given.value.includes(G(0, U0))
    assert not given.value.includes(G(0, U1))
    assert read_given([setting], {"dra-gpus": "all"}, {"KUBEGPU_DRA_GPUS": "0"})["dra-gpus"].value.everything
    with pytest.raises(SettingError) as err:
        read_given([setting], {}, {"KUBEGPU_DRA_GPUS": "0;1"})
    assert str(err.value) == (
        "KUBEGPU_DRA_GPUS='0;1' is not a valid GPU selection: '0;1' is neither a GPU index nor a GPU UUID; "
        "use all, none, GPU indices (0,2) or GPU UUIDs (GPU-<uuid>), comma-separated, e.g. none (the default)"
    )

"""The XID actions file (KUBEGPU_XID_ACTIONS): its shape, and one line naming every problem in it."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from kubegpu.node.xids import XidAction, XidCatalogError, load_catalog
from kubegpu.settings.goyaml import load as load_yaml

EXPECTED = (
    "; expected e.g. 'xids: {48: {action: reset_gpu, meaning: double-bit ECC error}}' with actions "
    "ignore, restart_app, reset_gpu, reboot_node"
)


def test_the_built_in_catalog_loads_and_a_user_file_extends_it(tmp_path: Path) -> None:
    builtin = load_catalog()
    assert builtin[79].action is XidAction.RESET_GPU and builtin[79].meaning == "GPU has fallen off the bus"
    path = tmp_path / "x.yaml"
    path.write_text('xids:\n  "48": {action: ignore}\n  999: {action: reboot_node, meaning: ours}\n')
    merged = load_catalog(path)
    assert (merged[48].action, merged[48].meaning) == (XidAction.IGNORE, "")
    assert (merged[999].action, merged[999].meaning) == (XidAction.REBOOT_NODE, "ours")
    assert merged[79] == builtin[79]
    path.write_text("")  # an empty file changes nothing
    assert load_catalog(path) == builtin


@pytest.mark.parametrize(
    ("body", "problems"),
    [
        (
            "xids: {48: {action: bogus}}",
            'xids.48.action: must be one of ignore, restart_app, reset_gpu, reboot_node (got "bogus")',
        ),
        ("xids: {x: {action: ignore}}", 'xids.x: "x" is not an XID number (e.g. 48)'),
        (
            "xids: {48: {action: ignore, extra: 1}}",
            "xids.48.extra: unknown key (an entry has action and meaning)",
        ),
        ("foo: 1", "xids: missing; foo: unknown key (the file has only xids)"),
        ("xids: []", "xids: must be a mapping of XID numbers (got [])"),
        ("[1]", "the file must be a mapping with the key xids (got [1])"),
        ("xids: {48: {meaning: 3}}", "xids.48.action: missing; xids.48.meaning: must be text (got 3)"),
        ("xids: {48: null}", "xids.48: must be a mapping with action and meaning (got null)"),
        # Every problem, not the first one only.
        (
            "xids: {x: {action: ignore}, 48: {action: bogus}}",
            'xids.x: "x" is not an XID number (e.g. 48); xids.48.action: must be one of ignore, '
            'restart_app, reset_gpu, reboot_node (got "bogus")',
        ),
        (
            "xids: {48: 5, 49: {action: bogus}}",
            "xids.48: must be a mapping with action and meaning (got 5); xids.49.action: must be one of "
            'ignore, restart_app, reset_gpu, reboot_node (got "bogus")',
        ),
        ("xids: {-1: {action: ignore}}", 'xids.-1: "-1" is not an XID number (e.g. 48)'),
        # The YAML reader's own error, with its place.
        ("xids: {48: [}", "yaml: did not find expected node content (line 1, column 13)"),
        (
            "xids:\n  48: {action: ignore\n",
            "yaml: line 3: did not find expected ',' or '}' (line 4, column 1)",
        ),
    ],
)
def test_a_bad_file_names_every_problem_on_one_line(tmp_path: Path, body: str, problems: str) -> None:
    path = tmp_path / "x.yaml"
    path.write_text(body + "\n")
    with pytest.raises(XidCatalogError) as err:
        load_catalog(path)
    assert str(err.value) == f"invalid XID actions file {path} (KUBEGPU_XID_ACTIONS): {problems}{EXPECTED}"


def test_the_built_in_catalog_reads_as_the_yaml_reader_reads_it() -> None:
    # The daemon reads the shipped file line by line (no YAML reader on its path); it must agree with YAML.
    text = resources.files("kubegpu.node").joinpath("xid_catalog.yaml").read_text()
    entries = load_yaml(text).value["xids"]
    assert {int(k): (v["action"], v["meaning"]) for k, v in entries.items()} == {
        k: (e.action.value, e.meaning) for k, e in load_catalog().items()
    }
    assert len(entries) >= 20


def test_xid_0_is_an_xid(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("xids: {0: {action: ignore, meaning: zero}}\n")
    assert (load_catalog(path)[0].action, load_catalog(path)[0].meaning) == (XidAction.IGNORE, "zero")


def test_a_missing_file_is_named_as_the_xid_actions_file(tmp_path: Path) -> None:
    path = tmp_path / "xids.yaml"
    with pytest.raises(XidCatalogError) as err:
        load_catalog(path)
    assert str(err.value) == (
        f"invalid XID actions file {path} (KUBEGPU_XID_ACTIONS): {path}: no such file or directory; check "
        f"the path of the XID actions file{EXPECTED}"
    )

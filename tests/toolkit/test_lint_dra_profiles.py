"""`kubegpu lint` KG023: a selector that pins a MIG profile no node can create, through the click command,
with a snapshot (the profiles the nodes' slices publish) and without (NVIDIA's MIG profile names of the GPU
models kubegpu knows); findings written out. And the selector reader (`resourceapi.cel_pins`), with
Hypothesis."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from kubegpu.resourceapi.cel_pins import Pin, attribute_pins
from tests import dra_objects as dra
from tests.toolkit.test_lint_dra import node, run, snapshot, write

MIG_CLASS = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"
PROFILE = 'device.attributes["gpu.nvidia.com"].profile'
SELECTOR_PATH = "spec.devices.requests[0].exactly.selectors[0].cel.expression"
NEVER = "unless the cluster's GPUs have it, the request never allocates"
MEMORY_NAMES = "MIG profile names carry the GPU's memory: an A100 40GB's 1g.5gb is a 1g.10gb on an A100 80GB"


def mig_claim(name: str, expression: str) -> dict[str, Any]:
    return dra.claim(
        name, [dra.request("mig", device_class_name="mig.nvidia.com", selectors=[expression])], namespace="ml"
    )


def mig_template(name: str, expression: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"spec": mig_claim(name, expression)["spec"]},
    }


def mig_device(name: str, profile: str) -> dict[str, Any]:
    """A MIG device as NVIDIA's driver publishes it: a DynamicMIG partition or a static MIG device."""
    return {
        "name": name,
        "attributes": {
            "type": {"string": "mig"},
            "profile": {"string": profile},
            "parentUUID": {"string": "GPU-00000000-0000-0000-0000-000000000000"},
            "productName": {"string": "NVIDIA A100-SXM4-80GB"},
        },
        "capacity": {"memory": {"value": "10Gi"}},
    }


def findings(report: dict[str, Any]) -> list[tuple[str, str, str, str, str, str]]:
    return [
        (f["rule"], f["severity"], f["object"], f["path"], f["message"], f["fix"])
        for f in report["findings"]
        if f["rule"] == "KG023"
    ]


def test_without_a_snapshot_a_profile_no_known_gpu_model_has_is_a_warning(tmp_path: Path) -> None:
    objects = [
        mig_claim("typo", f'{PROFILE} == "1g.10g"'),
        mig_claim("known", f'{PROFILE} == "1g.10gb"'),
        mig_claim("h200", '"3g.71gb" == device.attributes["gpu.nvidia.com"]["profile"]'),
        mig_claim("compute-instance", f'{PROFILE} == "1c.3g.20gb"'),
        mig_claim("other-driver", 'device.attributes["example.com"].profile == "1g.10g"'),
        mig_claim("not-equal", f'{PROFILE} != "9g.99gb"'),
        mig_template("template", f'device.driver == "gpu.nvidia.com" && {PROFILE} == "1g.5gb-me"'),
    ]
    code, report = run(write(tmp_path, "claims.yaml", objects))
    assert code == 0  # warnings only: the cluster's GPUs are unknown
    models = (
        "NVIDIA A100-SXM4-40GB: 1g.10gb, 1g.5gb, 1g.5gb+me, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb; "
        "NVIDIA A100-SXM4-80GB, NVIDIA H100 80GB HBM3: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, "
        "4g.40gb, 7g.80gb; "
        "NVIDIA H200: 1g.18gb, 1g.18gb+me, 1g.35gb, 2g.35gb, 3g.71gb, 4g.71gb, 7g.141gb"
    )
    check = (
        "check the name with `nvidia-smi mig -lgip` on the node, or lint with --snapshot to check it against "
        f"the profiles the nodes publish; {MEMORY_NAMES}"
    )
    assert findings(report) == [
        (
            "KG023",
            "warning",
            "ResourceClaim/ml/typo",
            SELECTOR_PATH,
            "request 'mig' selector #0 pins MIG profile '1g.10g', which is not a MIG profile of the GPU "
            f"models kubegpu knows ({models}); {NEVER}",
            f"did you mean '1g.10gb'? {check}",
        ),
        (
            "KG023",
            "warning",
            "ResourceClaimTemplate/ml/template",
            "spec.spec.devices.requests[0].exactly.selectors[0].cel.expression",
            "request 'mig' selector #0 pins MIG profile '1g.5gb-me', which is not a MIG profile of the GPU "
            f"models kubegpu knows ({models}); {NEVER}",
            f"did you mean '1g.5gb+me'? {check}",
        ),
    ]


def cluster_with_mig(tmp_path: Path) -> Path:
    return snapshot(
        tmp_path,
        [
            node("dynamic-1"),
            node("dynamic-2"),
            node("static"),
            node("whole"),
            # DynamicMIG partitions (every profile the A100 80GB could hold, a few shown)
            *(
                dra.resource_slice(
                    n,
                    [
                        mig_device("gpu-0-mig-1g10gb-19-0", "1g.10gb"),
                        mig_device("gpu-0-mig-2g20gb-14-0", "2g.20gb"),
                        mig_device("gpu-0-mig-7g80gb-0-0", "7g.80gb"),
                    ],
                )
                for n in ("dynamic-1", "dynamic-2")
            ),
            # a static MIG device on an A100 40GB
            dra.resource_slice("static", [mig_device("gpu-0-mig-3g20gb-9-0", "3g.20gb")]),
            dra.resource_slice("whole", [dra.gpu(0)]),
            dra.device_class("mig.nvidia.com", MIG_CLASS),
        ],
    )


def test_with_a_snapshot_the_profiles_the_nodes_publish_decide(tmp_path: Path) -> None:
    objects = [
        mig_claim("a100-40gb-name", f'{PROFILE} == "1g.5gb"'),
        mig_claim("partition", f'{PROFILE} == "2g.20gb"'),
        mig_claim("static", f'{PROFILE} == "3g.20gb"'),
        mig_claim("either", f'{PROFILE} == "4g.40gb" || {PROFILE} == "7g.80gb"'),
    ]
    code, report = run(write(tmp_path, "claims.yaml", objects), "--snapshot", cluster_with_mig(tmp_path))
    assert code == 1
    nodes = "dynamic-1, dynamic-2: 1g.10gb, 2g.20gb, 7g.80gb; static: 3g.20gb; whole: none"
    pin_fix = (
        "pin a profile a node publishes (the profile attribute of its mig devices: kubectl get "
        f"resourceslices -o yaml); {MEMORY_NAMES}"
    )
    assert findings(report) == [
        (
            "KG023",
            "error",
            "ResourceClaim/ml/a100-40gb-name",
            SELECTOR_PATH,
            f"request 'mig' selector #0 pins MIG profile '1g.5gb', which no node can create (the nodes "
            f"publish {nodes}); the request never allocates",
            f"did you mean '1g.10gb'? {pin_fix}",
        ),
        (
            "KG023",
            "warning",  # the other half of the || may hold
            "ResourceClaim/ml/either",
            SELECTOR_PATH,
            f"request 'mig' selector #0 pins MIG profile '4g.40gb', which no node can create (the nodes "
            f"publish {nodes}); that comparison never holds",
            pin_fix,
        ),
    ]


def test_a_snapshot_without_mig_devices_says_so(tmp_path: Path) -> None:
    snap = snapshot(tmp_path, [node("whole"), dra.resource_slice("whole", [dra.gpu(0), dra.gpu(1)])])
    code, report = run(
        write(tmp_path, "c.yaml", [mig_claim("c", f'{PROFILE} == "1g.10gb"')]), "--snapshot", snap
    )
    assert code == 1
    assert findings(report) == [
        (
            "KG023",
            "error",
            "ResourceClaim/ml/c",
            SELECTOR_PATH,
            "request 'mig' selector #0 pins MIG profile '1g.10gb', but no node publishes a MIG device or "
            "partition; the request never allocates",
            "enable MIG mode on a node's GPUs and run the DRA driver with --feature-gates DynamicMIG=true "
            "(or create the MIG devices), or ask for a whole GPU (class gpu.nvidia.com)",
        )
    ]


# --- the selector reader ---------------------------------------------------------------------------------

values = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E).filter(lambda c: c not in "\"'\\"), max_size=12
)
others = st.sampled_from(
    [
        'device.driver == "gpu.nvidia.com"',
        'device.attributes["gpu.nvidia.com"].type == "mig"',
        'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("10Gi")) >= 0',
        "true",
    ]
)


@st.composite
def selectors(draw: st.DrawFn) -> tuple[str, list[str], bool]:
    """A selector of clauses joined by && and ||, some of them profile pins written in any of the ways CEL
    allows; the pinned values in order, and whether the selector is a plain conjunction."""
    clauses: list[str] = []
    pinned: list[str] = []
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.booleans()):
            value = draw(values)
            quote = draw(st.sampled_from(['"', "'"]))
            literal = f"{quote}{value}{quote}"
            access = draw(
                st.sampled_from([PROFILE, "device.attributes['gpu.nvidia.com']['profile']", f"({PROFILE})"])
            )
            clauses.append(f"{access} == {literal}" if draw(st.booleans()) else f"{literal} == {access}")
            pinned.append(value)
        else:
            clauses.append(draw(others))
    ops = [draw(st.sampled_from(["&&", "||"])) for _ in clauses[1:]]
    text = clauses[0] + "".join(f" {op} {clause}" for op, clause in zip(ops, clauses[1:], strict=True))
    if draw(st.booleans()):
        text = f"({text})"
    return text, pinned, "||" not in ops


def profile_pins(text: str) -> list[Pin]:
    return [pin for pin in attribute_pins(text) if pin.name == "profile"]


@given(selectors())
def test_every_pin_is_found_and_required_exactly_in_a_conjunction(case: tuple[str, list[str], bool]) -> None:
    text, pinned, conjunction = case
    expected = list(dict.fromkeys(Pin("gpu.nvidia.com", "profile", v, conjunction) for v in pinned))
    assert profile_pins(text) == expected


@given(selectors())
def test_a_negated_or_ternary_pin_is_never_required(case: tuple[str, list[str], bool]) -> None:
    text, pinned, _ = case
    for wrapped in (f"!({text})", f"true ? false : ({text})"):
        assert all(not pin.required for pin in profile_pins(wrapped))
        assert [p.value for p in profile_pins(wrapped)] == list(dict.fromkeys(pinned))


@given(st.text(max_size=80))
def test_any_text_reads_without_raising(text: str) -> None:
    for pin in attribute_pins(text):
        assert pin.value in text and pin.domain in text

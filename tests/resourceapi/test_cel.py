"""DRA's CEL environment: what selectors see and the Kubernetes libraries they call.

Semantics checked against the Kubernetes docs (CELDeviceSelector: unknown domain -> empty map, unknown
field -> error; the quantity and semver libraries; cel.bind) with the values written out.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubegpu.resourceapi.cel import CelError, compile_error, compile_selector, device_activation
from tests.dra_objects import gpu

DEVICE = gpu(
    3, product="NVIDIA H100 80GB HBM3", memory="80Gi", driver_version="550.54.15", compute_capability="9.0.0"
)
ACTIVATION = device_activation("gpu.nvidia.com", DEVICE["attributes"], DEVICE["capacity"])


def run(expression: str) -> bool:
    return compile_selector(expression).matches(ACTIVATION)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('device.driver == "gpu.nvidia.com"', True),
        ('device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"', True),
        ('device.attributes["gpu.nvidia.com"].type == "gpu"', True),
        ('device.attributes["resource.kubernetes.io"].pciBusID == "0000:04:00.0"', True),
        ('device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0', True),
        ('device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("80Gi"))', False),
        ('device.capacity["gpu.nvidia.com"].memory == quantity("81920Mi")', True),
        ('device.attributes["gpu.nvidia.com"].driverVersion.isGreaterThan(semver("550.0.0"))', True),
        ('device.attributes["gpu.nvidia.com"].driverVersion.isLessThan(semver("535.0.0"))', False),
        ('device.attributes["gpu.nvidia.com"].cudaComputeCapability.compareTo(semver("8.0.0")) > 0', True),
        ('device.attributes["gpu.nvidia.com"].cudaComputeCapability.major() == 9', True),
        ('device.attributes["gpu.nvidia.com"].driverVersion == semver("550.54.15")', True),
        ('has(device.attributes["gpu.nvidia.com"].minor)', False),
        ('"index" in device.attributes["gpu.nvidia.com"]', False),
        ('device.attributes["dra.example.com"].size() == 0', True),  # unknown domain: an empty map
        ('cel.bind(g, device.attributes["gpu.nvidia.com"], g.brand == "Nvidia" && g.type == "gpu")', True),
        ('device.attributes["gpu.nvidia.com"].productName.lowerAscii().contains("h100")', True),
        ('device.attributes["gpu.nvidia.com"].productName.matches("^NVIDIA (A|H)100")', True),
        ('device.attributes["gpu.nvidia.com"].productName.split(" ")[1] == "H100"', True),
        ('device.attributes["gpu.nvidia.com"].uuid.startsWith("GPU-")', True),
        ('isSemver("1.2.3") && !isSemver("v1.2") && isSemver("v1.2", true)', True),
        ('semver("v1.02", true) == semver("1.2.0")', True),
        (
            'quantity("1Gi").add(quantity("1Gi")) == quantity("2Gi") '
            '&& quantity("3").sub(1) == quantity("2")',
            True,
        ),
        ('quantity("500m").isInteger() == false && quantity("2k").asInteger() == 2000', True),
        ('isQuantity("1.5Gi") && !isQuantity("1.5GB")', True),
        ("[3, 1, 2].exists(x, x > 2) && [1, 2, 3].isSorted() && [1, 2].sum() == 3", True),
    ],
)
def test_selectors_as_users_write_them(expression: str, expected: bool) -> None:
    assert run(expression) is expected


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ('device.attributes["gpu.nvidia.com"].minor == 0', "no such key: minor"),
        (
            'device.attributes["gpu.nvidia.com"].productName',
            "CEL result of type string could not be converted to bool",
        ),
        (
            'quantity("80GB").sign() == 1',
            "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
        ),
        ('semver("550.54").major() == 550', "could not parse '550.54' as a semantic version"),
    ],
)
def test_evaluation_errors_abort_with_a_reason(expression: str, message: str) -> None:
    with pytest.raises(CelError) as err:
        run(expression)
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        (
            'device.driver == "a" &&',
            "compilation failed: ERROR: <input>:1:22: Syntax error: unexpected end of input",
        ),
        ('dev.driver == "a"', "compilation failed: ERROR: <input>: undeclared reference to 'dev'"),
        ('device.drivr == "a"', "compilation failed: ERROR: <input>: undefined field 'drivr'"),
        (
            "device.driver.lengthOf() > 0",
            "compilation failed: ERROR: <input>: undeclared reference to 'lengthOf'",
        ),
        ("cel.bind(x, 1, x + y > 0)", "compilation failed: ERROR: <input>: undeclared reference to 'y'"),
    ],
)
def test_compile_errors(expression: str, message: str) -> None:
    assert compile_error(expression) == message


def test_macro_and_bind_variables_are_declared() -> None:
    assert compile_error("[1, 2].all(x, x > 0) && cel.bind(y, 2, y == 2)") is None


def test_a_version_attribute_that_is_not_semver_fails_the_device() -> None:
    with pytest.raises(CelError) as err:
        device_activation("d", {"v": {"version": "1.2"}}, {})
    assert str(err.value) == "attribute v: parse semantic version: '1.2' is not a semantic version"


VERSIONS = st.tuples(st.integers(0, 30), st.integers(0, 30), st.integers(0, 30))


@given(a=VERSIONS, b=VERSIONS)
def test_semver_ordering_is_numeric_per_part(a: tuple[int, int, int], b: tuple[int, int, int]) -> None:
    va, vb = ".".join(map(str, a)), ".".join(map(str, b))
    activation = device_activation("d", {"v": {"version": va}}, {})
    expression = f'device.attributes["d"].v.isLessThan(semver("{vb}"))'
    assert compile_selector(expression).matches(activation) is (a < b)
    equal = f'device.attributes["d"].v.compareTo(semver("{vb}")) == 0'
    assert compile_selector(equal).matches(activation) is (a == b)


@given(mib=st.integers(0, 10**6))
def test_quantities_compare_by_value_across_units(mib: int) -> None:
    activation = device_activation("d", {}, {"memory": {"value": f"{mib}Mi"}})
    assert compile_selector(f'device.capacity["d"].memory == quantity("{mib * 1024}Ki")').matches(activation)
    bigger = f'device.capacity["d"].memory.isLessThan(quantity("{mib * 1024 * 1024 + 1}"))'
    assert compile_selector(bigger).matches(activation)


# --- the per-device memo: devices equal in what a selector reads get the answer without evaluating ------

MEMO_SELECTORS = [
    'device.attributes["gpu.nvidia.com"].productName == "NVIDIA A100-SXM4-80GB"',
    'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0',
    "device.attributes['gpu.nvidia.com'].cudaComputeCapability.isGreaterThan(semver('8.0.0'))",
    '"profile" in device.attributes["gpu.nvidia.com"] && device.driver == "gpu.nvidia.com"',
    'device.attributes["gpu.nvidia.com"].index == 0',  # not published: a CEL error, remembered too
    'device.attributes["gpu.nvidia.com"].exists(k, k == "uuid")',  # reads the whole map: never memoized
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    picks=st.lists(
        st.tuples(
            st.sampled_from(MEMO_SELECTORS),
            st.sampled_from(["NVIDIA A100-SXM4-80GB", "Tesla T4"]),
            st.sampled_from(["16Gi", "40Gi", "80Gi"]),
            st.sampled_from(["7.5.0", "8.0.0", "9.0.0"]),
            st.booleans(),
            st.integers(0, 7),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_memoized_answers_equal_fresh_evaluation(picks: list[tuple[str, str, str, str, bool, int]]) -> None:
    from kubegpu.resourceapi.cel import Selector

    for expression, product, memory, cc, mig, minor in picks:
        attributes: dict[str, Any] = {
            "productName": {"string": product},
            "uuid": {"string": f"GPU-{minor}"},
            "cudaComputeCapability": {"version": cc},
        }
        if mig:
            attributes["profile"] = {"string": "1g.10gb"}
        activation = device_activation("gpu.nvidia.com", attributes, {"memory": {"value": memory}})
        memoized = compile_selector(expression)
        fresh = Selector(expression, memoized._program)  # no projection: always evaluates
        try:
            want: bool | str = fresh.matches(activation)
        except CelError as err:
            want = str(err)
        try:
            got: bool | str = memoized.matches(activation)
        except CelError as err:
            got = str(err)
        assert got == want, (expression, product, memory, cc, mig)


def test_only_selectors_that_read_named_values_are_memoized() -> None:
    assert compile_selector(MEMO_SELECTORS[0])._reads == (("attributes", "gpu.nvidia.com", "productName"),)
    assert compile_selector(MEMO_SELECTORS[3])._reads == (("attributes", "gpu.nvidia.com", "profile"),)
    assert compile_selector(MEMO_SELECTORS[5])._reads is None
    assert compile_selector("true")._reads == ()

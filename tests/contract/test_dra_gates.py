"""Every NVIDIA feature gate and every start-up refusal of `kubegpu dra`, with the driver as a process.

A refusal: `kubegpu dra` exits 1 at once with one error line whose text is asserted byte for byte (NVIDIA's
texts from docs/reference/dra-nvidia-features.md §1 and §2 inside kubegpu's line, written out), and `kubegpu
config check-dra` on the same flags and env says the same words and exits 1. A gate that turns something on:
the driver starts with it against the kubelet simulator and the fake API server, registers, publishes, logs
the gate map NVIDIA's way and nothing it should not (the ComputeDomain driver's gates are accepted silently,
as NVIDIA's GPU plugin accepts them)."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import subprocess
import sys

import pytest

from kubegpu.demo.dranode import SimulatedDraNode as DraNode

# NVIDIA's 13 gates in NVIDIA's order (pkg/featuregates/featuregates.go) with NVIDIA's defaults.
NVIDIA_DEFAULTS = {
    "TimeSlicingSettings": False,
    "MPSSupport": False,
    "IMEXDaemonsWithDNSNames": True,
    "PassthroughSupport": False,
    "DynamicMIG": False,
    "NVMLDeviceHealthCheck": False,
    "ComputeDomainCliques": True,
    "CrashOnNVLinkFabricErrors": True,
    "DeviceMetadata": False,
    "DRAListTypeAttributes": False,
    "FabricManagerPartitioning": False,
    "HostManagedIMEXDaemon": False,
    "ConsumableShares": False,
}
GATE_LIST = (
    "TimeSlicingSettings, MPSSupport, IMEXDaemonsWithDNSNames, PassthroughSupport, DynamicMIG, "
    "NVMLDeviceHealthCheck, ComputeDomainCliques, CrashOnNVLinkFabricErrors, DeviceMetadata, "
    "DRAListTypeAttributes, FabricManagerPartitioning, HostManagedIMEXDaemon, ConsumableShares"
)
VALIDATION = "feature gate validation failed: "
EXCLUSIVE = VALIDATION + "feature gate {} is currently mutually exclusive with {}"
REQUIRES = VALIDATION + "feature gate {} requires {} to also be enabled"
NOT_IMPLEMENTED = (
    "feature gate {} is not implemented by kubegpu yet ({}): set {}=false in --feature-gates "
    "(FEATURE_GATES), or run NVIDIA's driver for it"
)
SHARES_NEED_GATE = (
    "invalid CLI flags: --consumable-shares requires feature gate ConsumableShares to be enabled"
)
SHARES_VALUE = (
    "invalid CLI flags: invalid value for --consumable-shares: {} (must be 'disabled', 'memory', "
    "'unlimited', or a positive integer)"
)
IMAGE_REQUIRED = (
    "invalid CLI flags: --image-name (IMAGE_NAME) is required when the MPSSupport feature gate is enabled: "
    "set it to the image the MPS control-daemon Deployments run (the driver's own image, as NVIDIA's chart "
    "sets it)"
)


VFIO = "VFIO devices `gpu-vfio-<i>`, a GPU bound to vfio-pci at Prepare"


def not_implemented(gate: str, what: str) -> str:
    return NOT_IMPLEMENTED.format(gate, what, gate)


# (flags, env, the error line's text after "ERROR kubegpu: ")
REFUSALS: dict[str, tuple[tuple[str, ...], dict[str, str], str]] = {
    # component-base's parsing, with where the text came from and the fix
    "unrecognized gate (flag)": (
        ("--feature-gates", "Bogus=true"), {},
        f"invalid --feature-gates: unrecognized feature gate: Bogus (NVIDIA's gates: {GATE_LIST})",
    ),
    "unrecognized gate (env)": (
        (), {"FEATURE_GATES": "DynamicMIG=true,dynamicMIG=true"},
        f"invalid FEATURE_GATES: unrecognized feature gate: dynamicMIG (NVIDIA's gates: {GATE_LIST})",
    ),
    "missing bool": (
        ("--feature-gates", "TimeSlicingSettings=true, DynamicMIG"), {},
        "invalid --feature-gates: missing bool value for DynamicMIG (use Name=true,Name=false)",
    ),
    "invalid bool": (
        ("--feature-gates", "MPSSupport= maybe"), {},
        "invalid --feature-gates: invalid value of MPSSupport=maybe, err: strconv.ParseBool: parsing "
        '"maybe": invalid syntax (use Name=true,Name=false)',
    ),
    # NVIDIA's ValidateFeatureGates, in its order
    "cliques need DNS names": (
        ("--feature-gates", "IMEXDaemonsWithDNSNames=false"), {},  # ComputeDomainCliques is on by default
        REQUIRES.format("ComputeDomainCliques", "IMEXDaemonsWithDNSNames"),
    ),
    "cliques first": (
        ("--feature-gates", "ComputeDomainCliques=true,IMEXDaemonsWithDNSNames=false,DynamicMIG=true,"
                            "MPSSupport=true"), {},
        REQUIRES.format("ComputeDomainCliques", "IMEXDaemonsWithDNSNames"),
    ),
    "DynamicMIG and PassthroughSupport": (
        ("--feature-gates", "DynamicMIG=true,PassthroughSupport=true,NVMLDeviceHealthCheck=true"), {},
        EXCLUSIVE.format("DynamicMIG", "PassthroughSupport"),
    ),
    "DynamicMIG and NVMLDeviceHealthCheck": (
        ("--feature-gates", "DynamicMIG=true,NVMLDeviceHealthCheck=true,MPSSupport=true"), {},
        EXCLUSIVE.format("DynamicMIG", "NVMLDeviceHealthCheck"),
    ),
    "DynamicMIG and MPSSupport": (
        ("--feature-gates", "DynamicMIG=true,MPSSupport=true", "--image-name", "kubegpu:1"), {},
        EXCLUSIVE.format("DynamicMIG", "MPSSupport"),
    ),
    "PassthroughSupport and NVMLDeviceHealthCheck": (
        ("--feature-gates", "PassthroughSupport=true,NVMLDeviceHealthCheck=true"), {},
        EXCLUSIVE.format("PassthroughSupport", "NVMLDeviceHealthCheck"),
    ),
    "DeviceMetadata needs PassthroughSupport": (
        ("--feature-gates", "DeviceMetadata=true"), {},
        REQUIRES.format("DeviceMetadata", "PassthroughSupport"),
    ),
    "AllAlpha turns on exclusive alphas": (
        ("--feature-gates", "AllAlpha=true"), {},
        EXCLUSIVE.format("DynamicMIG", "PassthroughSupport"),
    ),
    # kubegpu's refusal of a gate it does not implement yet, after NVIDIA's rules
    "PassthroughSupport not implemented": (
        ("--feature-gates", "PassthroughSupport=true"), {},
        not_implemented("PassthroughSupport", VFIO),
    ),
    "DeviceMetadata with PassthroughSupport: PassthroughSupport first": (
        ("--feature-gates", "DeviceMetadata=true,PassthroughSupport=true"), {},
        not_implemented("PassthroughSupport", VFIO),
    ),
    "DRAListTypeAttributes not implemented": (
        ("--feature-gates", "DRAListTypeAttributes=true"), {},
        not_implemented(
            "DRAListTypeAttributes", "`resource.kubernetes.io/numaNode` published as a one-element list"
        ),
    ),
    "FabricManagerPartitioning not implemented": (
        (), {"FEATURE_GATES": "FabricManagerPartitioning=1"},
        not_implemented("FabricManagerPartitioning", "NVSwitch partitions activated at Prepare"),
    ),
    # --consumable-shares (NVIDIA's texts): the gates first, then the value, then the gate it needs
    "shares without the gate": (
        ("--consumable-shares", "memory"), {}, SHARES_NEED_GATE,
    ),
    "shares without the gate (env)": (
        (), {"CONSUMABLE_SHARES": "8"}, SHARES_NEED_GATE,
    ),
    "shares: not a mode": (
        ("--feature-gates", "ConsumableShares=true", "--consumable-shares", "Memory"), {},
        SHARES_VALUE.format('"Memory"'),
    ),
    "shares: zero": (
        ("--feature-gates", "ConsumableShares=true", "--consumable-shares", "0"), {},
        SHARES_VALUE.format('"0"'),
    ),
    "shares: bad value before the missing gate": (
        ("--consumable-shares", "-1"), {}, SHARES_VALUE.format('"-1"'),
    ),
    "gates before shares": (
        ("--feature-gates", "Bogus=true", "--consumable-shares", "x"), {},
        f"invalid --feature-gates: unrecognized feature gate: Bogus (NVIDIA's gates: {GATE_LIST})",
    ),
    # MPSSupport needs --image-name
    "MPSSupport without --image-name": (
        ("--feature-gates", "MPSSupport=true"), {}, IMAGE_REQUIRED,
    ),
    "MPSSupport with an empty IMAGE_NAME": (
        (), {"FEATURE_GATES": "MPSSupport=true", "IMAGE_NAME": ""}, IMAGE_REQUIRED,
    ),
}  # fmt: skip

TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3} ")


def bare_env(**extra: str) -> dict[str, str]:
    """The environment without any setting of the driver's (a test runner's FEATURE_GATES would leak in)."""
    kept = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "PYTHONPATH", "TMPDIR")}
    return {**kept, "NODE_NAME": "node-a", **extra}


def run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kubegpu", *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("case", list(REFUSALS))
def test_the_driver_refuses_to_start_with_the_text_byte_for_byte(case: str) -> None:
    flags, env, text = REFUSALS[case]
    # no kubeconfig, no kubelet, no NVML: the flags are refused before any of them is touched; the driver
    # and `config check-dra` run side by side (each is a Python start-up)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        started = pool.submit(run, "dra", *flags, env=bare_env(**env))
        checked = pool.submit(run, "config", "check-dra", *flags, env=bare_env(**env)).result()
        driver = started.result()
    assert driver.returncode == 1
    assert driver.stdout == ""
    assert TIMESTAMP.match(driver.stderr), driver.stderr
    assert TIMESTAMP.sub("", driver.stderr, count=1) == f"ERROR kubegpu: {text}\n"
    assert (checked.returncode, checked.stdout, checked.stderr) == (1, f"error: {text}\n", "")


def test_config_check_dra_json_lists_the_same_error() -> None:
    flags, env, text = REFUSALS["DynamicMIG and MPSSupport"]
    checked = run("config", "check-dra", "--json", *flags, env=bare_env(**env))
    assert checked.returncode == 1
    assert json.loads(checked.stdout) == {"feature_gates": None, "warnings": [], "errors": [text]}


def gate_map(**on: bool) -> str:
    """The start-up log's gate map, NVIDIA's 13 in NVIDIA's order."""
    values = {**NVIDIA_DEFAULTS, **on}
    return ",".join(f"{name}={str(value).lower()}" for name, value in values.items())


# (profile, flags, extra env, the gates the map shows changed, what the gate shows on the published devices)
STARTS: dict[str, tuple[str, tuple[str, ...], dict[str, str], dict[str, bool], str]] = {
    "no gates": ("t4-pcie", (), {}, {}, "whole"),
    "TimeSlicingSettings": ("t4-pcie", ("--feature-gates", "TimeSlicingSettings=true"), {},
                            {"TimeSlicingSettings": True}, "whole"),
    "MPSSupport": ("t4-pcie", ("--feature-gates", "MPSSupport=true", "--image-name", "kubegpu:1"), {},
                   {"MPSSupport": True}, "whole"),
    "NVMLDeviceHealthCheck": ("t4-pcie", (), {"FEATURE_GATES": "NVMLDeviceHealthCheck=true"},
                              {"NVMLDeviceHealthCheck": True}, "whole"),
    "ConsumableShares": ("t4-pcie", ("--feature-gates", "ConsumableShares=true", "--consumable-shares", "4"),
                         {}, {"ConsumableShares": True}, "shared"),
    "ConsumableShares, flag left disabled": ("t4-pcie", ("--feature-gates", "ConsumableShares=true"), {},
                                             {"ConsumableShares": True}, "whole"),
    "DynamicMIG": ("mig-dynamic", ("--feature-gates", "DynamicMIG=true"), {}, {"DynamicMIG": True},
                   "partitions"),
    # the ComputeDomain driver's gates: accepted and silent, as in NVIDIA's GPU plugin
    "HostManagedIMEXDaemon": ("t4-pcie", ("--feature-gates", "HostManagedIMEXDaemon=true"), {},
                              {"HostManagedIMEXDaemon": True}, "whole"),
    "ComputeDomain gates off": (
        "t4-pcie",
        ("--feature-gates", "IMEXDaemonsWithDNSNames=false,ComputeDomainCliques=false,"
                            "CrashOnNVLinkFabricErrors=false"), {},
        {"IMEXDaemonsWithDNSNames": False, "ComputeDomainCliques": False, "CrashOnNVLinkFabricErrors": False},
        "whole",
    ),
    "ComputeDomain gates on, AllBeta and the logging gates": (
        "t4-pcie",
        ("--feature-gates", "AllBeta=true,IMEXDaemonsWithDNSNames=true,ComputeDomainCliques=true,"
                            "CrashOnNVLinkFabricErrors=true,ContextualLogging=false,LoggingAlphaOptions=true,"),
        {}, {}, "whole",
    ),
}  # fmt: skip


def published_as(node: DraNode) -> str:
    """How the driver publishes the node's GPUs: partitions with counter sets (DynamicMIG), devices for
    several claims (ConsumableShares), or whole devices; "" until the pool is complete."""
    slices, published = node.slices(), node.published()
    if not slices or len(slices) != slices[0]["spec"]["pool"]["resourceSliceCount"]:
        return ""
    if any(s["spec"].get("sharedCounters") for s in slices):
        return "partitions"
    return "shared" if all(d.get("allowMultipleAllocations") for d in published.values()) else "whole"


# What each way of publishing looks like on the profile's GPUs.
DEVICES = {
    "whole": [f"gpu-{i}" for i in range(4)],
    "shared": [f"gpu-{i}" for i in range(4)],
    "partitions": sorted(
        f"gpu-{gpu}-mig-{name}-{profile}-{start}"
        for gpu, table in enumerate((
            # A100 40GB, A100 80GB, H100 80GB, H200: (name, GI profile ID, placements)
            (("1g5gb", 19, range(7)), ("1g5gb-me", 20, range(7)), ("1g10gb", 15, (0, 2, 4, 6)),
             ("2g10gb", 14, (0, 2, 4)), ("3g20gb", 9, (0, 4)), ("4g20gb", 5, (0,)), ("7g40gb", 0, (0,))),
            (("1g10gb", 19, range(7)), ("1g10gb-me", 20, range(7)), ("1g20gb", 15, (0, 2, 4, 6)),
             ("2g20gb", 14, (0, 2, 4)), ("3g40gb", 9, (0, 4)), ("4g40gb", 5, (0,)), ("7g80gb", 0, (0,))),
            (("1g10gb", 19, range(7)), ("1g10gb-me", 20, range(7)), ("1g20gb", 15, (0, 2, 4, 6)),
             ("2g20gb", 14, (0, 2, 4)), ("3g40gb", 9, (0, 4)), ("4g40gb", 5, (0,)), ("7g80gb", 0, (0,))),
            (("1g18gb", 19, range(7)), ("1g18gb-me", 20, range(7)), ("1g35gb", 15, (0, 2, 4, 6)),
             ("2g35gb", 14, (0, 2, 4)), ("3g71gb", 9, (0, 4)), ("4g71gb", 5, (0,)), ("7g141gb", 0, (0,))),
        ))
        for name, profile, starts in table
        for start in starts
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(STARTS))
async def test_the_driver_starts_with_each_gate_that_turns_something_on(case: str) -> None:
    profile, flags, env, changed, shows = STARTS[case]
    async with DraNode(profile, env=env) as node:
        node.start_driver(*flags)
        await node.wait_registered()
        await node.wait(lambda: published_as(node) == shows, f"{shows} devices published")
        assert sorted(node.published()) == DEVICES[shows]
        if shows == "shared":
            assert {d["capacity"]["shares"]["value"] for d in node.published().values()} == {"4"}
        log = node.log()
        assert f"INFO kubegpu: feature gates: {gate_map(**changed)}\n" in log
        assert [line for line in log.splitlines() if " WARNING " in line or " ERROR " in line] == []
        assert await node.stop_driver() == 0


def test_every_nvidia_gate_is_turned_on_or_off_by_some_case_above() -> None:
    """The cases cover NVIDIA's 13 (DeviceMetadata's own not-implemented text cannot show: it needs
    PassthroughSupport, which is refused first)."""
    texts = [" ".join((*flags, *env.values())) for flags, env, _ in REFUSALS.values()]
    texts += [" ".join((*flags, *env.values())) for _, flags, env, _, _ in STARTS.values()]
    named = {name for text in texts for name in re.findall(r"(\w+)=", text)}
    assert set(NVIDIA_DEFAULTS) <= named
    assert len(NVIDIA_DEFAULTS) == 13

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubegpu.allocation.allocate import (
    AllocateOptions,
    AllocationRequestError,
    allocate_container,
    validate_allocate,
    validate_containers,
    validate_request,
)
from kubegpu.allocation.resources import Device, Resource, build_resources
from kubegpu.node.driverfiles import MODES
from kubegpu.node.inventory import Health
from kubegpu.settings.choices import DEVICE_ID_STRATEGIES, DEVICE_LIST_STRATEGIES
from tests.builders import gpu_uuid, make_inventory

RESOURCE = build_resources(make_inventory(8))[0]


def test_envvar_uuid() -> None:
    ids = [gpu_uuid(3), gpu_uuid(1)]
    out = allocate_container(RESOURCE, ids, AllocateOptions())
    assert out.envs == {"NVIDIA_VISIBLE_DEVICES": f"{gpu_uuid(3)},{gpu_uuid(1)}"}  # request order kept
    assert out.mounts == [] and out.devices == []


def test_envvar_index() -> None:
    out = allocate_container(
        RESOURCE, [gpu_uuid(3), gpu_uuid(1)], AllocateOptions(device_id_strategy="index")
    )
    assert out.envs["NVIDIA_VISIBLE_DEVICES"] == "3,1"


def test_volume_mounts() -> None:
    out = allocate_container(
        RESOURCE, [gpu_uuid(0)], AllocateOptions(device_list_strategies=("volume-mounts",))
    )
    assert out.envs == {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"}
    assert [(m.container_path, m.host_path) for m in out.mounts] == [
        (f"/var/run/nvidia-container-devices/{gpu_uuid(0)}", "/dev/null")
    ]


def test_pass_device_specs_under_dev_root() -> None:
    options = AllocateOptions(
        pass_device_specs=True,
        dev_root="/run/nvidia/driver",
        control_devices=("/dev/nvidiactl", "/dev/nvidia-uvm"),
    )
    out = allocate_container(RESOURCE, [gpu_uuid(2), gpu_uuid(5)], options)
    assert [(d.container_path, d.host_path, d.permissions) for d in out.devices] == [
        ("/dev/nvidiactl", "/run/nvidia/driver/dev/nvidiactl", "rw"),
        ("/dev/nvidia-uvm", "/run/nvidia/driver/dev/nvidia-uvm", "rw"),
        ("/dev/nvidia2", "/run/nvidia/driver/dev/nvidia2", "rw"),
        ("/dev/nvidia5", "/run/nvidia/driver/dev/nvidia5", "rw"),
    ]


def test_unknown_device_has_nvidias_exact_text() -> None:
    with pytest.raises(AllocationRequestError) as err:
        validate_request(RESOURCE, [gpu_uuid(0), "GPU-nope"])
    assert (
        str(err.value)
        == 'invalid allocation request for "nvidia.com/gpu": invalid request: unknown device: GPU-nope'
    )
    assert err.value.nvidia_compatible


def test_an_unknown_id_is_named_before_the_count_is_checked() -> None:
    """NVIDIA checks that every ID is known first: [known, unknown] on a one-device resource gets its text."""
    one = build_resources(make_inventory(1))[0]
    with pytest.raises(AllocationRequestError) as err:
        validate_request(one, [one.devices[0].id, "GPU-nope"])
    assert (
        str(err.value)
        == 'invalid allocation request for "nvidia.com/gpu": invalid request: unknown device: GPU-nope'
    )
    assert err.value.nvidia_compatible
    with pytest.raises(AllocationRequestError) as err:
        validate_request(RESOURCE, [*(gpu_uuid(i % 8) for i in range(20)), "GPU-late"])
    assert str(err.value).endswith("invalid request: unknown device: GPU-late")


@pytest.mark.parametrize(
    ("ids", "fragment"),
    [
        ([], "no devices requested"),
        ([gpu_uuid(1), gpu_uuid(1)], "requested more than once"),
        ([gpu_uuid(i % 8) for i in range(10_000)], "10000 devices requested but this node advertises only 8"),
        (["G" * 64], "is 64 characters; device IDs are at most 63"),
    ],
)
def test_bad_requests_are_explained(ids: list[str], fragment: str) -> None:
    with pytest.raises(AllocationRequestError) as err:
        validate_request(RESOURCE, ids)
    assert fragment in str(err.value)
    assert str(err.value).startswith('invalid allocation request for "nvidia.com/gpu": invalid request: ')
    assert not err.value.nvidia_compatible


def test_an_unknown_id_that_would_forge_a_log_line_is_quoted() -> None:
    # NVIDIA's text is kept for every printable ID; one with a newline or escape sequence would end the log
    # line there and start a fake one, so it is quoted and escaped instead.
    with pytest.raises(AllocationRequestError) as err:
        validate_request(RESOURCE, ["GPU-x\n2026-01-01T00:00:00.000 ERROR kubegpu: fake"])
    assert str(err.value) == (
        'invalid allocation request for "nvidia.com/gpu": invalid request: unknown device: '
        "'GPU-x\\n2026-01-01T00:00:00.000 ERROR kubegpu: fake'"
    )
    assert err.value.nvidia_compatible


@pytest.mark.parametrize(
    ("counts", "message"),
    [
        ([], "no container requests (the kubelet sends one per container)"),
        ([3, 3, 3], "9 devices requested in 3 containers but this node advertises only 8 for nvidia.com/gpu"),
        ([5, 4], "9 devices requested in 2 containers but this node advertises only 8 for nvidia.com/gpu"),
    ],
)
def test_whole_requests_beyond_the_node_are_refused(counts: list[int], message: str) -> None:
    with pytest.raises(AllocationRequestError) as err:
        validate_containers(RESOURCE, counts)
    assert str(err.value) == f'invalid allocation request for "nvidia.com/gpu": {message}'
    assert not err.value.nvidia_compatible


def test_requests_the_kubelet_sends_pass_the_whole_request_check() -> None:
    validate_containers(RESOURCE, [1])
    validate_containers(RESOURCE, [8])
    validate_containers(RESOURCE, [4, 4])


def test_the_edges_of_a_single_container_request() -> None:
    validate_request(RESOURCE, [gpu_uuid(i) for i in range(8)])  # every device the node advertises
    validate_request(shared("mps", True), [f"{gpu_uuid(0)}::3"])  # one replica where only one is allowed
    prefix = 'invalid allocation request for "nvidia.com/gpu": invalid request: '
    with pytest.raises(AllocationRequestError) as err:
        validate_request(RESOURCE, [])
    assert str(err.value) == prefix + "no devices requested; the kubelet sends at least one ID"
    longest = "GPU-" + "f" * 59  # 63 characters: still an ID we could have, so NVIDIA's refusal
    with pytest.raises(AllocationRequestError) as err:
        validate_request(RESOURCE, [longest])
    assert str(err.value) == prefix + f"unknown device: {longest}" and err.value.nvidia_compatible
    with pytest.raises(AllocationRequestError) as err:
        validate_request(RESOURCE, [longest + "f"])
    assert str(err.value) == (
        prefix + f"device ID {longest!r}... is 64 characters; device IDs are at most 63, "
        "so it cannot be one of ours"
    )


known = st.sampled_from([gpu_uuid(i) for i in range(8)])


@given(st.lists(known | st.text(max_size=80), max_size=20))
def test_validation_never_crashes_and_accepts_only_clean_requests(ids: list[str]) -> None:
    try:
        validate_request(RESOURCE, ids)
    except AllocationRequestError as err:
        assert str(err)
    else:
        assert ids and len(set(ids)) == len(ids) and all(RESOURCE.device(i) for i in ids)
        out = allocate_container(RESOURCE, ids, AllocateOptions())
        assert out.envs["NVIDIA_VISIBLE_DEVICES"].split(",") == ids


# -- device-list strategies, their combinations and NVIDIA's order (spec §4 step 3) --------------------

GPU = "k8s.device-plugin.nvidia.com/gpu="
TWO = [gpu_uuid(3), gpu_uuid(1)]


def cdi_options(*strategies: str, **kw: object) -> AllocateOptions:
    return AllocateOptions(device_list_strategies=strategies, response_id=lambda: "fixed-id", **kw)  # type: ignore[arg-type]


def test_cdi_annotations_only() -> None:
    out = allocate_container(RESOURCE, TWO, cdi_options("cdi-annotations", pass_device_specs=True))
    assert out.annotations == {
        "cdi.k8s.io/nvidia-device-plugin_fixed-id": f"{GPU}{gpu_uuid(3)},{GPU}{gpu_uuid(1)}"
    }
    # CDI only: no NVIDIA_VISIBLE_DEVICES, mounts or device specs, even with passDeviceSpecs.
    assert out.envs == {} and out.mounts == [] and out.devices == [] and out.cdi_devices == []


def test_cdi_cri_only_with_index_ids() -> None:
    out = allocate_container(RESOURCE, TWO, cdi_options("cdi-cri", device_id_strategy="index"))
    assert out.cdi_devices == [f"{GPU}3", f"{GPU}1"] and out.annotations == {} and out.envs == {}


def test_annotation_key_is_random_per_response_and_takes_a_custom_prefix() -> None:
    options = AllocateOptions(
        device_list_strategies=("cdi-annotations",), cdi_annotation_prefix="nvidia.cdi.k8s.io/"
    )
    keys = [next(iter(allocate_container(RESOURCE, TWO, options).annotations)) for _ in range(2)]
    assert keys[0] != keys[1]
    for key in keys:
        prefix, _, response_id = key.partition("nvidia-device-plugin_")
        assert prefix == "nvidia.cdi.k8s.io/" and len(response_id) == 36  # a UUID
        assert len(key.split("/", 1)[1]) <= 63  # the CDI library's limit on the name part


def test_envvar_with_cdi_keeps_both() -> None:
    out = allocate_container(RESOURCE, TWO, cdi_options("envvar", "cdi-annotations", "cdi-cri"))
    assert out.envs == {"NVIDIA_VISIBLE_DEVICES": f"{gpu_uuid(3)},{gpu_uuid(1)}"}
    assert len(out.annotations) == 1 and len(out.cdi_devices) == 2


def test_volume_mounts_override_envvar() -> None:
    out = allocate_container(RESOURCE, TWO, cdi_options("envvar", "volume-mounts"))
    assert out.envs == {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"}
    assert [m.container_path for m in out.mounts] == [
        f"/var/run/nvidia-container-devices/{gpu_uuid(3)}",
        f"/var/run/nvidia-container-devices/{gpu_uuid(1)}",
    ]


def test_mode_envs_are_set_with_cdi_only_and_named_only_when_their_spec_is_not_empty() -> None:
    options = cdi_options(
        "cdi-cri", enabled_modes=("gdrcopy", "gds", "mofed"), cdi_modes=("mofed", "gdrcopy")
    )
    out = allocate_container(RESOURCE, [gpu_uuid(0)], options)
    assert out.envs == {"NVIDIA_GDRCOPY": "enabled", "NVIDIA_GDS": "enabled", "NVIDIA_MOFED": "enabled"}
    assert out.cdi_devices == [  # GPUs, then modes in NVIDIA's order (gds has no devices on this node)
        f"{GPU}{gpu_uuid(0)}",
        "k8s.device-plugin.nvidia.com/gdrcopy=all",
        "k8s.device-plugin.nvidia.com/mofed=all",
    ]


def test_imex_channel_in_every_strategy() -> None:
    options = cdi_options(
        "envvar", "volume-mounts", "cdi-cri", imex_channels=("0",), pass_device_specs=True, dev_root="/run/d"
    )
    out = allocate_container(RESOURCE, [gpu_uuid(2)], options)
    assert out.cdi_devices == [f"{GPU}{gpu_uuid(2)}", "k8s.device-plugin.nvidia.com/imex-channel=0"]
    assert out.envs["NVIDIA_IMEX_CHANNELS"] == "0"
    two = allocate_container(RESOURCE, [gpu_uuid(2)], cdi_options("envvar", imex_channels=("0", "1")))
    assert two.envs["NVIDIA_IMEX_CHANNELS"] == "0,1"
    assert [(m.container_path, m.host_path) for m in out.mounts][-1] == (
        "/var/run/nvidia-container-devices/imex/0",
        "/dev/null",
    )
    assert (out.devices[-1].container_path, out.devices[-1].host_path) == (
        "/dev/nvidia-caps-imex-channels/channel0",
        "/run/d/dev/nvidia-caps-imex-channels/channel0",
    )


def test_mig_index_ids_and_replicas_deduplicated() -> None:
    mig = Resource(
        "nvidia.com/mig-1g.5gb",
        tuple(
            Device(f"MIG-{m}::{r}", f"MIG-{m}", f"0:{m}", 0, Health.ok(), 0, ("/dev/nvidia0",))
            for m in range(2)
            for r in range(2)
        ),
        sharing="time-slicing",
    )
    ids = ["MIG-1::0", "MIG-1::1", "MIG-0::1"]
    assert allocate_container(mig, ids, cdi_options("cdi-cri", device_id_strategy="index")).cdi_devices == [
        f"{GPU}0:1",
        f"{GPU}0:0",
    ]
    assert allocate_container(mig, ids, cdi_options("envvar")).envs["NVIDIA_VISIBLE_DEVICES"] == "MIG-1,MIG-0"


def shared(kind: str, fail_greater_than_one: bool) -> Resource:
    devices = tuple(
        Device(f"{gpu_uuid(0)}::{r}", gpu_uuid(0), "0", 0, Health.ok(), 0, ("/dev/nvidia0",))
        for r in range(4)
    )
    return Resource(
        "nvidia.com/gpu", devices, sharing=kind, fail_requests_greater_than_one=fail_greater_than_one
    )


def test_mps_env_and_mounts_come_before_the_device_list_mounts() -> None:
    resource = shared("mps", True)
    options = cdi_options("volume-mounts", mps_root="/run/nvidia/mps")
    out = allocate_container(resource, [f"{gpu_uuid(0)}::2"], options)
    assert out.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu/pipe"
    assert [(m.container_path, m.host_path) for m in out.mounts] == [
        ("/mps/nvidia.com/gpu/pipe", "/run/nvidia/mps/nvidia.com/gpu/pipe"),
        ("/dev/shm", "/run/nvidia/mps/shm"),
        (f"/var/run/nvidia-container-devices/{gpu_uuid(0)}", "/dev/null"),
    ]


def test_shared_request_over_one_has_nvidias_text() -> None:
    ids = [f"{gpu_uuid(0)}::0", f"{gpu_uuid(0)}::1"]
    with pytest.raises(AllocationRequestError) as err:
        validate_request(shared("mps", True), ids)
    assert str(err.value) == (
        'invalid allocation request for "nvidia.com/gpu": invalid request: '
        "maximum request size for shared resources is 1; found 2"
    )
    assert err.value.nvidia_compatible
    validate_request(shared("time-slicing", False), ids)  # time-slicing allows it by default


strategy_sets = st.lists(st.sampled_from(DEVICE_LIST_STRATEGIES), min_size=1, max_size=4, unique=True)


@given(
    strategy_sets,
    st.sampled_from(DEVICE_ID_STRATEGIES),
    st.lists(known, min_size=1, max_size=8, unique=True),
    st.lists(st.sampled_from(MODES), unique=True),
    st.sampled_from([(), ("0",)]),
    st.booleans(),
)
def test_every_combination_follows_nvidias_rules(
    strategies: list[str],
    id_strategy: str,
    ids: list[str],
    modes: list[str],
    channels: tuple[str, ...],
    specs: bool,
) -> None:
    options = cdi_options(
        *strategies,
        device_id_strategy=id_strategy,
        enabled_modes=tuple(modes),
        cdi_modes=tuple(modes),
        imex_channels=channels,
        pass_device_specs=specs,
    )
    out = allocate_container(RESOURCE, ids, options)
    runtime_ids = [RESOURCE.device(i).index if id_strategy == "index" else i for i in ids]  # type: ignore[union-attr]
    names = [f"{GPU}{i}" for i in runtime_ids]
    names += [f"k8s.device-plugin.nvidia.com/imex-channel={c}" for c in channels]
    names += [f"k8s.device-plugin.nvidia.com/{m}=all" for m in MODES if m in modes]
    cdi_only = all(s.startswith("cdi-") for s in strategies)
    assert out.cdi_devices == (names if "cdi-cri" in strategies else [])
    assert list(out.annotations.values()) == ([",".join(names)] if "cdi-annotations" in strategies else [])
    for mode in MODES:
        assert (out.envs.get(f"NVIDIA_{mode.upper()}") == "enabled") == (mode in modes)
    visible = out.envs.get("NVIDIA_VISIBLE_DEVICES")
    if cdi_only:
        assert visible is None and out.mounts == [] and out.devices == []
    elif "volume-mounts" in strategies:
        assert visible == "/var/run/nvidia-container-devices"
        assert len(out.mounts) == len(runtime_ids) + len(channels)
    else:
        assert visible == ",".join(runtime_ids)
    assert ("NVIDIA_IMEX_CHANNELS" in out.envs) == bool(channels and "envvar" in strategies and not cdi_only)
    assert len(out.devices) == (0 if cdi_only or not specs else len(ids) + len(channels))


def mps_resource(replicas: int = 4, gpus: int = 2, memory: int = 16 << 30) -> Resource:
    devices = tuple(
        Device(f"{gpu_uuid(g)}::{r}", gpu_uuid(g), str(g), g, Health.ok(), 0, (f"/dev/nvidia{g}",), memory)
        for g in range(gpus)
        for r in range(replicas)
    )
    return Resource("nvidia.com/gpu", devices, sharing="mps", replicas=replicas)


def test_mps_client_limits_follow_the_replica_share() -> None:
    out = allocate_container(mps_resource(), [f"{gpu_uuid(1)}::3"], AllocateOptions(mps_root="/m"))
    assert out.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert (
        out.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    )  # 16 GiB / 4, as ordinal 0 in the container


def test_mps_client_limits_for_several_replicas_and_gpus() -> None:
    ids = [f"{gpu_uuid(0)}::0", f"{gpu_uuid(0)}::1", f"{gpu_uuid(1)}::0"]
    out = allocate_container(mps_resource(), ids, AllocateOptions(mps_root="/m"))
    assert out.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert out.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M,1=4096M"


def test_mps_client_limits_with_two_replicas_and_the_daemons_integer_share() -> None:
    out = allocate_container(mps_resource(replicas=2), [f"{gpu_uuid(1)}::1"], AllocateOptions(mps_root="/m"))
    assert out.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert out.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M"
    # NVIDIA's control daemon sets 100 / replicas, an integer division: 101 replicas get 0 %.
    many = allocate_container(
        mps_resource(replicas=101, gpus=1), [f"{gpu_uuid(0)}::100"], AllocateOptions(mps_root="/m")
    )
    assert many.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "0"


def test_an_mps_root_with_a_trailing_slash_mounts_the_same_host_paths() -> None:
    out = allocate_container(mps_resource(), [f"{gpu_uuid(0)}::0"], AllocateOptions(mps_root="/run/mps/"))
    assert [(m.container_path, m.host_path) for m in out.mounts] == [
        ("/mps/nvidia.com/gpu/pipe", "/run/mps/nvidia.com/gpu/pipe"),
        ("/dev/shm", "/run/mps/shm"),
    ]


def test_mps_client_limits_can_be_switched_off_for_nvidias_output() -> None:
    out = allocate_container(
        mps_resource(), [f"{gpu_uuid(0)}::0"], AllocateOptions(mps_root="/m", mps_client_limits=False)
    )
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in out.envs
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in out.envs
    assert out.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu/pipe"


# NVIDIA checks each container in turn, unknown IDs first and then the shared request size, and has no
# check across containers; its text and code win whenever it would refuse (the 12 MIG cases).
ONE_DEVICE = build_resources(make_inventory(1))[0]


def test_an_unknown_id_in_a_later_container_beats_the_count_across_containers() -> None:
    with pytest.raises(AllocationRequestError) as err:
        validate_allocate(ONE_DEVICE, [[gpu_uuid(0)], ["GPU-unknown"]])
    assert str(err.value) == (
        'invalid allocation request for "nvidia.com/gpu": invalid request: unknown device: GPU-unknown'
    )
    assert err.value.nvidia_compatible


def test_nvidias_shared_size_check_in_an_earlier_container_beats_a_later_unknown_id() -> None:
    ids = [f"{gpu_uuid(0)}::0", f"{gpu_uuid(0)}::1"]
    with pytest.raises(AllocationRequestError) as err:
        validate_allocate(shared("mps", True), [ids, ["GPU-unknown"]])
    assert str(err.value) == (
        'invalid allocation request for "nvidia.com/gpu": invalid request: '
        "maximum request size for shared resources is 1; found 2"
    )
    assert err.value.nvidia_compatible


def test_our_checks_come_only_after_every_container_passed_nvidias() -> None:
    with pytest.raises(AllocationRequestError) as err:
        validate_allocate(ONE_DEVICE, [[gpu_uuid(0)], [gpu_uuid(0)]])
    assert str(err.value) == (
        'invalid allocation request for "nvidia.com/gpu": '
        "2 devices requested in 2 containers but this node advertises only 1 for nvidia.com/gpu"
    )
    assert not err.value.nvidia_compatible
    with pytest.raises(AllocationRequestError) as err:
        validate_allocate(RESOURCE, [[gpu_uuid(0)], [gpu_uuid(1), gpu_uuid(1)]])
    assert str(err.value) == (
        'invalid allocation request for "nvidia.com/gpu": invalid request: '
        f"device '{gpu_uuid(1)}' requested more than once"
    )
    validate_allocate(RESOURCE, [[gpu_uuid(0)], [gpu_uuid(1), gpu_uuid(2)]])


def test_an_mps_roots_trailing_slash_is_dropped_and_nothing_else() -> None:
    out = allocate_container(mps_resource(), [f"{gpu_uuid(1)}::3"], AllocateOptions(mps_root="/run/mps-X/"))
    assert out.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu/pipe"
    assert [(m.container_path, m.host_path) for m in out.mounts] == [
        ("/mps/nvidia.com/gpu/pipe", "/run/mps-X/nvidia.com/gpu/pipe"),
        ("/dev/shm", "/run/mps-X/shm"),
    ]


def test_one_container_over_the_node_gets_the_per_container_text() -> None:
    four = build_resources(make_inventory(4))[0]
    with pytest.raises(AllocationRequestError) as err:
        validate_allocate(four, [[gpu_uuid(0)] * 5])
    assert str(err.value) == (
        'invalid allocation request for "nvidia.com/gpu": invalid request: 5 devices requested but this node '
        "advertises only 4 for nvidia.com/gpu"
    )

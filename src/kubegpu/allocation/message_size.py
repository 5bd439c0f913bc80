"""How large a resource's ListAndWatch message is, computed without building it.

The kubelet reads each ListAndWatch response with gRPC's default receive limit, 4 MiB (kubernetes#109304:
`grpc: received message larger than max (6464720 vs. 4194304)`; the PRs raising it were closed unmerged).
A device list encoded larger is never seen: the stream ends and the node advertises nothing. So a config
whose replicas would not fit is refused before the devices are built, with the count that would fit.

Sizes are the protobuf encoding of `ListAndWatchResponse{devices: [Device{ID, health, topology}]}`, with
the health taken as "Unhealthy" (the longer text), so a list that fits keeps fitting when GPUs fail.
"""

from __future__ import annotations

from collections.abc import Iterable

MAX_LIST_AND_WATCH_BYTES = 4 * 1024 * 1024  # gRPC's default max receive message size, which the kubelet keeps
_HEALTH_BYTES = len("Unhealthy")


def _varint(value: int) -> int:
    """Bytes of a protobuf varint (a negative int64 takes ten)."""
    if value < 0:
        return 10
    size = 1
    while value >= 0x80:
        value >>= 7
        size += 1
    return size


def _field(length: int) -> int:
    """A length-delimited field: tag, length, payload."""
    return 1 + _varint(length) + length


def device_bytes(id_length: int, numa_node: int | None) -> int:
    """One Device as an entry of the response's repeated `devices` field."""
    body = _field(id_length) + _field(_HEALTH_BYTES)
    if numa_node is not None:
        node = 0 if numa_node == 0 else 1 + _varint(numa_node)  # proto3 leaves a zero ID out
        body += _field(_field(node))  # TopologyInfo{nodes: [NUMANode{ID}]}
    return _field(body)


def list_bytes(devices: Iterable[tuple[int, int | None]]) -> int:
    """The response for devices given as (ID length, NUMA node)."""
    return sum(device_bytes(length, numa) for length, numa in devices)


def replicas_bytes(base_id_length: int, numa_node: int | None, replicas: int) -> int:
    """The entries of replicas `<id>::0` .. `<id>::<replicas-1>` of one device, in closed form."""
    total, digits, low = 0, 1, 0
    while low < replicas:
        high = min(replicas, 10**digits)  # replica numbers with `digits` digits: [low, high)
        total += (high - low) * device_bytes(base_id_length + 2 + digits, numa_node)
        low, digits = high, digits + 1
    return total


def max_replicas(base: Iterable[tuple[int, int | None]], budget: int) -> int:
    """The most replicas per device (of the given devices) whose entries fit in `budget` bytes."""
    devices = list(base)
    if not devices or budget <= 0:
        return 0
    low, high = 0, 1
    while sum(replicas_bytes(length, numa, high) for length, numa in devices) <= budget:
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        if sum(replicas_bytes(length, numa, middle) for length, numa in devices) <= budget:
            low = middle
        else:
            high = middle
    return low

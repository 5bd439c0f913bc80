"""How much one device-plugin socket takes in: the largest message.

The receive limit is sized to the largest request a kubelet can send for the devices served. That is a
GetPreferredAllocation: every free device listed as available, the devices the container must keep listed
again as must-include (a subset of them), and the size. For n devices its protobuf encoding is at most n
IDs twice, each at the longest ID the kubelet accepts (63 characters) plus 2 bytes of framing, plus the
size and the container entry's framing; `largest_request_bytes` is that sum, exactly (a test compares it
with the encoded message). An Allocate names each device at most once, so it is smaller.

The limit is that size for twice the devices served, so a reload can double them in place, and never below
64 KiB: 8 GPUs x 48 replicas stay far under it, and a 4 MB message (the fuzzer's) is refused by gRPC before
it is read. A server whose resource outgrows its limit restarts with a new one (`ResourceServer.update`).

HTTP/2 bandwidth-delay probing is off: it grows the flow-control window, and with it how much a client
can push ahead of gRPC's size check (100 connections each sending 4 MB held 150 MB before, 66 MB after).

How many calls run at once, streams and unary calls counted apart, is `admission`'s job.

What the limits buy is measured in `bench/serving_bounds.py` (peak RSS under 100 calls in flight).
"""

from __future__ import annotations

from kubegpu.allocation.allocate import MAX_DEVICE_ID_LENGTH

MIN_RECEIVE_BYTES = 64 * 1024
GROWTH_ROOM = 2  # devices may double in place before the server restarts with a larger limit


def _varint_bytes(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


def _field_bytes(payload: int) -> int:
    """A length-delimited field of `payload` bytes with a one-byte tag (field numbers below 16)."""
    return 1 + _varint_bytes(payload) + payload


def largest_request_bytes(devices: int) -> int:
    """Encoded size of a PreferredAllocationRequest naming `devices` IDs of the longest length twice."""
    ids = 2 * devices * _field_bytes(MAX_DEVICE_ID_LENGTH)
    size = 1 + _varint_bytes(devices) if devices else 0  # allocation_size; proto3 omits a zero
    return _field_bytes(ids + size)


def receive_limit(devices: int) -> int:
    """The receive limit for a server of `devices` devices."""
    return max(MIN_RECEIVE_BYTES, largest_request_bytes(GROWTH_ROOM * devices))


def server_options(limit: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", limit),
        # Without bandwidth-delay probing the HTTP/2 flow-control window stays at its initial 64 KiB, so
        # a peer cannot push megabytes into the daemon ahead of the size check; that probing is for fast
        # long-distance links, not a unix socket carrying messages of kilobytes.
        ("grpc.http2.bdp_probe", 0),
    ]

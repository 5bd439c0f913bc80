"""Small builders for inventories in unit tests (no NVML involved)."""

from __future__ import annotations

from kubegpu.node.inventory import Gpu, GpuLink, Inventory, LinkLevel


def gpu_uuid(index: int) -> str:
    return f"GPU-{index:08x}-1111-2222-3333-{index:012x}"


def make_gpus(count: int, numa: list[int | None] | None = None) -> tuple[Gpu, ...]:
    return tuple(
        Gpu(
            index=i,
            uuid=gpu_uuid(i),
            name="NVIDIA A100-SXM4-40GB",
            memory_bytes=40 * 1024**3,
            minor=i,
            compute_capability=(8, 0),
            pci_bus_id=f"00000000:{0x10 + i:02X}:00.0",
            numa_node=None if numa is None else numa[i],
        )
        for i in range(count)
    )


def make_inventory(
    count: int,
    nvlinks: dict[tuple[int, int], int] | None = None,
    numa: list[int | None] | None = None,
    level: LinkLevel = LinkLevel.SYSTEM,
) -> Inventory:
    nvlinks = nvlinks or {}
    links = tuple(
        GpuLink(a, b, level, nvlinks.get((a, b), nvlinks.get((b, a), 0)))
        for a in range(count)
        for b in range(a + 1, count)
    )
    return Inventory(
        gpus=make_gpus(count, numa), links=links, driver_version="550.90.07", cuda_driver_version="12.4"
    )

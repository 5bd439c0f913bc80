"""The telemetry series as dcgm-exporter names and labels them, formatted off the loop, in both formats."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from kubegpu.node.inventory import Gpu, Inventory, MigDevice
from kubegpu.node.usage import DeviceUse, ProcessUse, UsageSample
from kubegpu.plugin.metrics import PluginMetrics
from kubegpu.plugin.telemetry import Telemetry, TelemetrySnapshot
from kubegpu.plugin.telemetry_metrics import Exposition, TelemetryCollector
from kubegpu.plugin.usage_attribution import Holder

ROOT = Path(__file__).resolve().parents[2]
MIG = MigDevice("MIG-5c3d", 0, 7, 0, "1g.5gb", 5 << 30)
GPU = Gpu(
    2, "GPU-7f1e", "NVIDIA A100-SXM4-40GB", 40 << 30, 4, (8, 0), "00000000:47:00.0", mig_enabled=True,
    mig_devices=(MIG,),
)  # fmt: skip
WHOLE = DeviceUse(GPU.uuid, GPU, None, None, None, 5000.0, 35960.0, 95.5, 41.0, 1410.0, ())
ON_MIG = DeviceUse(
    MIG.uuid, GPU, MIG, None, None, 1200.0, 3664.0, 95.5, 41.0, 1410.0, (ProcessUse(77, 1200 << 20, None),)
)


def telemetry(*devices: DeviceUse) -> Telemetry:
    t = Telemetry(
        lambda: None, lambda: Inventory(), interval_s=1, idle_threshold_percent=5, proc_root=Path("/nope"),
        plugin_dir=Path("/nope"),
    )  # fmt: skip
    t.latest = TelemetrySnapshot(UsageSample(0.0, devices))
    return t


def collect(t: Telemetry, holders: list[Holder], xid: dict[str, int] | None = None) -> str:
    exposition = Exposition(
        TelemetryCollector(t, holders=lambda: holders, last_xid=lambda: xid or {}, hostname="n7")
    )
    assert t.latest is not None
    exposition.update(t.latest)
    return exposition.text(False).decode()


def test_mig_series_carry_the_parents_labels_and_the_instance() -> None:
    body = collect(
        telemetry(WHOLE, ON_MIG), [Holder("ml", "p", "c", "nvidia.com/mig-1g.5gb", MIG.uuid, MIG.uuid)]
    )
    (mig_line,) = [
        line for line in body.splitlines() if line.startswith("DCGM_FI_DEV_FB_USED{") and "GPU_I_ID" in line
    ]
    assert mig_line == (
        'DCGM_FI_DEV_FB_USED{GPU_I_ID="7",GPU_I_PROFILE="1g.5gb",Hostname="n7",UUID="GPU-7f1e",'
        'container="c",device="nvidia4",gpu="2",modelName="NVIDIA A100-SXM4-40GB",namespace="ml",'
        'pci_bus_id="00000000:47:00.0",pod="p"} 1200.0'
    )
    # NVML gives no utilisation on a MIG GPU: no series rather than a made-up 0.
    assert "DCGM_FI_DEV_GPU_UTIL{" not in body
    assert 'DCGM_FI_DEV_POWER_USAGE{GPU_I_ID="7"' in body  # the parent's, as dcgm-exporter reports
    assert (
        'kubegpu_container_gpu_memory_used_bytes{UUID="MIG-5c3d",container="c",gpu="2",namespace="ml",'
        'pod="p"} 1.2582912e+09' in body
    )
    assert "kubegpu_container_gpu_utilization_ratio{" not in body


def test_xid_is_the_last_code_and_zero_without_one() -> None:
    body = collect(telemetry(WHOLE), [], {GPU.uuid: 79})
    assert re.search(r'^DCGM_FI_DEV_XID_ERRORS\{.*UUID="GPU-7f1e".*\} 79\.0$', body, re.MULTILINE)
    assert re.search(r"^DCGM_FI_DEV_XID_ERRORS\{.*\} 0\.0$", collect(telemetry(WHOLE), []), re.MULTILINE)


def test_the_help_texts_are_dcgm_exporters() -> None:
    body = collect(telemetry(WHOLE), [])
    helps = dict(re.findall(r"^# HELP (DCGM_\w+) (.*)$", body, re.MULTILINE))
    assert helps == {
        "DCGM_FI_DEV_SM_CLOCK": "SM clock frequency (in MHz).",
        "DCGM_FI_DEV_GPU_TEMP": "GPU temperature (in C).",
        "DCGM_FI_DEV_POWER_USAGE": "Power draw (in W).",
        "DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %).",
        "DCGM_FI_DEV_MEM_COPY_UTIL": "Memory utilization (in %).",
        "DCGM_FI_DEV_FB_FREE": "Framebuffer memory free (in MiB).",
        "DCGM_FI_DEV_FB_USED": "Framebuffer memory used (in MiB).",
        "DCGM_FI_DEV_XID_ERRORS": "Value of the last XID error encountered.",
    }


def test_a_scrape_carries_the_telemetry_in_both_formats() -> None:
    metrics = PluginMetrics(process_metrics=False)
    t = telemetry(WHOLE, ON_MIG)
    exposition = Exposition(TelemetryCollector(t, holders=lambda: [], last_xid=lambda: {}, hostname="n7"))
    assert t.latest is not None
    exposition.update(t.latest)
    metrics.appendix = exposition.text
    text, _ = asyncio.run(metrics.render())
    names = {f.name for f in parse_text(text.decode())}
    assert {"DCGM_FI_DEV_FB_USED", "kubegpu_build_info", "kubegpu_device_idle_seconds"} <= names
    body, content_type = asyncio.run(metrics.render("application/openmetrics-text; version=1.0.0"))
    assert content_type.startswith("application/openmetrics-text") and body.endswith(b"# EOF\n")
    assert "DCGM_FI_DEV_FB_USED" in {f.name for f in parse_openmetrics(body.decode())}  # a valid document


def test_the_guide_lists_every_telemetry_series() -> None:
    guide = (ROOT / "docs" / "install.md").read_text()
    table = guide[guide.index("| telemetry series |") :].split("\n\n")[0]
    listed = set(re.findall(r"`((?:DCGM_FI_DEV|kubegpu)_\w+)`", table))
    holder = [Holder("ml", "p", "c", "nvidia.com/gpu", GPU.uuid, GPU.uuid)]
    whole = DeviceUse(GPU.uuid, GPU, None, 50.0, 5.0, 1.0, 2.0, 60.0, 33.0, 210.0, (ProcessUse(1, 1, 10),))
    body = collect(telemetry(whole), holder)
    served = set(re.findall(r"^# TYPE (\S+) ", body, re.MULTILINE))
    assert listed == served

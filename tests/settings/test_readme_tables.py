"""The README's settings tables say what the settings table says: no row missing, none extra, none different.

`python -m kubegpu.settings.docs` prints the tables to paste when a setting changes.
"""

from __future__ import annotations

from pathlib import Path

from kubegpu.settings.docs import (
    GATES_HEADER,
    KUBEGPU_HEADER,
    NVIDIA_DRA_HEADER,
    NVIDIA_HEADER,
    gate_rows,
    kubegpu_rows,
    nvidia_dra_rows,
    nvidia_plugin_rows,
)

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def _cells(line: str) -> tuple[str, ...]:
    return tuple(cell.strip() for cell in line.strip().strip("|").split("|"))


def readme_table(header: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The rows of the README table with this header."""
    lines = README.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("|") and _cells(line) == header]
    assert len(starts) == 1, f"the README has {len(starts)} tables headed {header}"
    rows = []
    for line in lines[starts[0] + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(_cells(line))
    return rows


def differences(
    readme: list[tuple[str, ...]], code: list[tuple[str, ...]], key: tuple[int, ...]
) -> list[str]:
    """Rows keyed by the cells at `key` (flag, env var, ...): what is missing, extra or differs."""
    by_key = {tuple(row[i] for i in key): row for row in readme}
    expected = {tuple(row[i] for i in key): row for row in code}
    assert len(expected) == len(code), "the key does not tell the code's rows apart"
    problems = [f"missing from the README: {row}" for key, row in expected.items() if key not in by_key]
    problems += [
        f"not a setting (extra in the README): {row}" for key, row in by_key.items() if key not in expected
    ]
    problems += [
        f"differs: README {by_key[key]} != code {row}"
        for key, row in expected.items()
        if key in by_key and by_key[key] != row
    ]
    return problems


def test_kubegpus_settings_table() -> None:
    readme = readme_table(KUBEGPU_HEADER)
    assert differences(readme, kubegpu_rows(), key=(0, 1, 3)) == []  # flag, env var, commands
    assert len(readme) == len(kubegpu_rows())  # no row twice
    # The variables that were once read outside the table are documented.
    listed = {row[1] for row in readme}
    for name in (
        "KUBEGPU_MPS_RETRY_SECONDS",
        "KUBEGPU_MPS_CONTAINER_ROOT",
        "KUBEGPU_SYSFS_ROOT",
        "KUBEGPU_FAKE_NVML",
        "KUBEGPU_FAKE_NVML_STATE",
        "KUBEGPU_DISCOVERY_RETRY_SECONDS",
        "KUBEGPU_HEALTH_PROBE_SECONDS",
    ):
        assert f"`{name}`" in listed, name
    probe = next(row for row in readme if row[1] == "`KUBEGPU_HEALTH_PROBE_SECONDS`")
    assert probe[2] == "`5`"


def test_nvidias_plugin_flags_table() -> None:
    readme = readme_table(NVIDIA_HEADER)
    assert differences(readme, nvidia_plugin_rows(), key=(0, 1)) == []
    assert len(readme) == len(nvidia_plugin_rows())
    assert (
        "`--nvidia-cdi-hook-path` (`--nvidia-ctk-path`)",
        "`NVIDIA_CDI_HOOK_PATH`, `NVIDIA_CTK_PATH`",
        "`/usr/bin/nvidia-ctk`",
        "`flags.plugin.nvidiaCTKPath`",
    ) in readme


def test_the_comparison_catches_each_kind_of_drift() -> None:
    code = [("`--a`", "`A`", "`1`"), ("", "`B`", "`2`")]
    assert differences(code, code, (0, 1)) == []
    assert differences(code[:1], code, (0, 1)) == ["missing from the README: ('', '`B`', '`2`')"]
    assert differences([*code, ("", "`C`", "")], code, (0, 1)) == [
        "not a setting (extra in the README): ('', '`C`', '')"
    ]
    changed = [code[0], ("", "`B`", "`3`")]
    assert differences(changed, code, (0, 1)) == [
        "differs: README ('', '`B`', '`3`') != code ('', '`B`', '`2`')"
    ]


def test_nvidia_dra_driver_flags_table() -> None:
    readme = readme_table(NVIDIA_DRA_HEADER)
    assert readme == nvidia_dra_rows()
    # NVIDIA's names, env vars and defaults (gpu-kubelet-plugin), written out
    assert [row[:3] for row in readme] == [
        ("`--node-name`", "`NODE_NAME`", ""),
        ("`--cdi-root`", "`CDI_ROOT`", "`/etc/cdi`"),
        ("`--kubelet-registrar-directory-path`", "`KUBELET_REGISTRAR_DIRECTORY_PATH`",
         "`/var/lib/kubelet/plugins_registry`"),
        ("`--kubelet-plugins-directory-path`", "`KUBELET_PLUGINS_DIRECTORY_PATH`",
         "`/var/lib/kubelet/plugins`"),
        ("`--kubeconfig`", "`KUBECONFIG`", ""),
        ("`--http-endpoint`", "`HTTP_ENDPOINT`", ""),
        ("`--metrics-path`", "`METRICS_PATH`", "`/metrics`"),
        ("`--feature-gates`", "`FEATURE_GATES`", ""),
        ("`--consumable-shares`", "`CONSUMABLE_SHARES`", "`disabled`"),
        ("`--nvidia-driver-root` (`--host_driver-root`)", "`NVIDIA_DRIVER_ROOT`, `HOST_DRIVER_ROOT`", "`/`"),
        ("`--container-driver-root`", "`DRIVER_ROOT_CTR_PATH`", "`/driver-root`"),
        ("`--nvidia-cdi-hook-path`", "`NVIDIA_CDI_HOOK_PATH`", ""),
        ("`--additional-xids-to-ignore`", "`ADDITIONAL_XIDS_TO_IGNORE`", ""),
        ("`--namespace`", "`NAMESPACE`", "`default`"),
        ("`--host-root`", "`HOST_ROOT`", "`/host-root`"),
        ("`--image-name`", "`IMAGE_NAME`", ""),
        ("`--image-pull-secrets`", "`IMAGE_PULL_SECRETS`", ""),
        ("`--image-pull-policy`", "`IMAGE_PULL_POLICY`", ""),
        ("`--service-account-name`", "`SERVICE_ACCOUNT_NAME`", ""),
        ("`--healthcheck-port`", "`HEALTHCHECK_PORT`", "`-1`"),
        ("`--kube-api-qps`", "`KUBE_API_QPS`", "`5`"),
        ("`--kube-api-burst`", "`KUBE_API_BURST`", "`10`"),
        ("`--v`", "`V`", "`0`"),
        ("`--vmodule`", "`VMODULE`", ""),
        ("`--logging-format`", "`LOGGING_FORMAT`", "`text`"),
        ("`--log-flush-frequency`", "`LOG_FLUSH_FREQUENCY`", "`5s`"),
        ("`--log-text-split-stream`", "`LOG_TEXT_SPLIT_STREAM`", "`false`"),
        ("`--log-text-info-buffer-size`", "`LOG_TEXT_INFO_BUFFER_SIZE`", "`0`"),
        ("`--log-json-split-stream`", "`LOG_JSON_SPLIT_STREAM`", "`false`"),
        ("`--log-json-info-buffer-size`", "`LOG_JSON_INFO_BUFFER_SIZE`", "`0`"),
    ]  # fmt: skip


def test_nvidia_dra_feature_gates_table() -> None:
    readme = readme_table(GATES_HEADER)
    assert readme == gate_rows()
    # NVIDIA's 13 gates, defaults and stages (pkg/featuregates/featuregates.go), written out
    assert [row[:3] for row in readme] == [
        ("`TimeSlicingSettings`", "`false`", "Alpha"),
        ("`MPSSupport`", "`false`", "Alpha"),
        ("`IMEXDaemonsWithDNSNames`", "`true`", "Beta"),
        ("`PassthroughSupport`", "`false`", "Alpha"),
        ("`DynamicMIG`", "`false`", "Alpha"),
        ("`NVMLDeviceHealthCheck`", "`false`", "Alpha"),
        ("`ComputeDomainCliques`", "`true`", "Beta"),
        ("`CrashOnNVLinkFabricErrors`", "`true`", "Beta"),
        ("`DeviceMetadata`", "`false`", "Alpha"),
        ("`DRAListTypeAttributes`", "`false`", "Alpha"),
        ("`FabricManagerPartitioning`", "`false`", "Alpha"),
        ("`HostManagedIMEXDaemon`", "`false`", "Alpha"),
        ("`ConsumableShares`", "`false`", "Alpha"),
    ]

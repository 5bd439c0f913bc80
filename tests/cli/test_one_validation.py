"""`config check` and the daemon accept and refuse exactly the same settings, with the same text.

Both run as processes, as a user runs them, on the same generated env vars (good and bad values of the
settings the daemon validates at start, the XID actions file among them): the daemon refuses by logging one
ERROR and exiting 1 before it runs; config check lists the same problem among its errors.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ERROR = re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+ ERROR kubegpu: (.*)$")
PROFILE = "t4-pcie"


def values(tmp: Path) -> dict[str, st.SearchStrategy[str]]:
    good_xids = tmp / "xids.yaml"
    good_xids.write_text("xids: {48: {action: reset_gpu, meaning: double-bit ECC error}}\n")
    bad_xids = tmp / "bad-xids.yaml"
    bad_xids.write_text("xids: {48: {action: explode}}\n")
    return {
        "KUBEGPU_XID_ACTIONS": st.sampled_from(["", "/nonexistent", str(good_xids), str(bad_xids)]),
        "KUBEGPU_HTTP_ADDRESS": st.sampled_from(["", "127.0.0.1", "a" * 70, "two words", "a..b"]),
        "KUBEGPU_POD_RESOURCES_SOCKET": st.sampled_from(["", str(tmp / "pr.sock"), "/" + "p" * 200]),
        "KUBEGPU_HEALTH_PROBE_SECONDS": st.sampled_from(["5", "0", "nan", "abc", "1e309"]),
        "DP_ENABLE_HEALTHCHECKS": st.sampled_from(["", "79", "all"]),
        "MIG_STRATEGY": st.sampled_from(["none", "single", "weird"]),
        "DEVICE_ID_STRATEGY": st.sampled_from(["uuid", "index", "serial"]),
        "FAIL_ON_INIT_ERROR": st.sampled_from(["true", "false", "maybe"]),
    }


def clean_env(chosen: dict[str, str]) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("KUBEGPU_", "CONFIG_FILE", "DP_", "MIG_"))
    }
    return {**env, **{k: v for k, v in chosen.items() if v}}


def daemon_verdict(env: dict[str, str], tmp: Path) -> str | None:
    """The daemon's one ERROR line when it refuses to start, None when it runs."""
    socket = tmp / "plugins" / "kubelet.sock"
    socket.parent.mkdir(exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "kubegpu", "plugin", "--kubelet-socket", str(socket)],
        env={**env, "KUBEGPU_FAKE_NVML": PROFILE},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    lines = []
    deadline = time.monotonic() + 30
    try:
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            if "Running with config" in line:
                return None  # past every check of its settings
            if time.monotonic() > deadline:
                break
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(10)
    errors = [m.group(1) for line in lines if (m := ERROR.match(line))]
    assert proc.returncode == 1 and len(errors) == 1, lines[-5:]
    return errors[0]


def config_check_errors(env: dict[str, str]) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "kubegpu", "config", "check", os.devnull, "--profile", PROFILE, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if proc.returncode == 2 and not proc.stdout:  # refused before the report (a flag's value): one line
        return [proc.stderr.strip().removeprefix("Error: ").removeprefix("error: ")]
    return list(json.loads(proc.stdout)["errors"])


def as_one_line(errors: list[str]) -> str:
    """The daemon's one line for config check's list: NVIDIA's flag problems are joined after one prefix."""
    prefix = "unable to validate flags: "
    if errors and all(e.startswith(prefix) for e in errors):
        return prefix + "; ".join(e.removeprefix(prefix) for e in errors)
    return "; ".join(errors)


@pytest.mark.timeout(600)  # a few dozen processes: slow on a loaded machine
def test_config_check_and_the_daemon_agree_on_every_generated_setting(tmp_path: Path) -> None:
    @settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(st.fixed_dictionaries(values(tmp_path)))
    def agree(chosen: dict[str, str]) -> None:
        env = clean_env(chosen)
        daemon = daemon_verdict(env, tmp_path)
        check = config_check_errors(env)
        assert (daemon is None) == (not check), (chosen, daemon, check)
        if daemon is not None:
            assert daemon == as_one_line(check), chosen

    agree()


def test_a_missing_xid_actions_file_is_refused_by_both() -> None:
    # config check exited 0 with KUBEGPU_XID_ACTIONS=/nonexistent, which the daemon refuses.
    env = clean_env({"KUBEGPU_XID_ACTIONS": "/nonexistent"})
    assert config_check_errors(env) == [
        "invalid XID actions file /nonexistent (KUBEGPU_XID_ACTIONS): /nonexistent: no such file or "
        "directory; check the path of the XID actions file; expected e.g. 'xids: {48: {action: "
        "reset_gpu, meaning: double-bit ECC error}}' with actions ignore, restart_app, reset_gpu, reboot_node"
    ]

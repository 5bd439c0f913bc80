"""MPS control daemons (`kubegpu mps-daemon`) against stand-in `nvidia-smi` and `nvidia-cuda-mps-control`.

The stand-ins are small scripts the tests write into a bin dir put first on PATH. Each call appends one
JSON line (tool, argv, CUDA_* env, stdin, what existed on disk at that moment) to one record file, so the
tests assert exactly what was asked and in which order. The control stand-in behaves like the real one
where it matters: `-d` creates the control pipe and control.log, `quit` removes the pipe, a client call
without a running daemon fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kubegpu.mps.daemon import CONTAINER_FILE_LABEL, DaemonOptions
from kubegpu.mps.manager import Manager, StartupError, discover_plans, prepare
from kubegpu.mps.plan import MpsConfigError, SharedGpu, check_replicas, max_clients
from kubegpu.node.mps_control import mps_daemon_alive
from kubegpu.node.mps_paths import CONTAINER_ROOT, MpsRoot
from kubegpu.node.mps_shm import FALLBACK_SIZE, is_mount_point, mount_command, mount_shm, shm_size
from kubegpu.node.nvml.backend import NvmlBackend, load_nvml
from kubegpu.settings.env import NvmlSelection
from kubegpu.settings.given import FlagValue
from kubegpu.settings.plugin import PluginSettings, resolve

MIB = 1024 * 1024
T4 = [  # t4-pcie: 4x Tesla T4, 15360 MiB, compute capability 7.5
    "GPU-0eaadbe4-c44f-4826-a1a6-b9dd837b9509",
    "GPU-5916575e-0280-41c6-9dbf-ffef04648c1d",
    "GPU-baa5e932-166b-430c-b886-92b700c035ac",
    "GPU-320a6cb1-1db8-4918-b43e-c11aa25a9f6f",
]
V100_COUNT = 8  # dgx1-volta: 8x V100-SXM2-16GB, 16160 MiB, compute capability 7.0

# A POSIX shell script rather than Python: it runs dozens of times per test and sh starts in a millisecond.
# One line per call, fields split by RS (\036), list items by US (\037).
STANDIN = r"""#!/bin/sh
US=$(printf '\037'); RS=$(printf '\036')
tool=${0##*/}
stdin=$(cat)
pipe=${CUDA_MPS_PIPE_DIRECTORY:-/nonexistent/r/pipe}
logdir=${CUDA_MPS_LOG_DIRECTORY:-/nonexistent}
root=${pipe%/*/*/*}
args=; for a in "$@"; do args="$args$a$US"; done
envs=$(env | grep '^CUDA_' | sort | tr '\n' "$US")
[ -e "$root/.ready" ] && ready=1 || ready=0
[ -e "${pipe%/*}/.started" ] && started=1 || started=0
[ -d "$pipe" ] && [ -d "$logdir" ] && dirs=1 || dirs=0
printf '%s\n' "$tool$RS$args$RS$envs$RS$stdin$RS$ready$RS$started$RS$dirs" >> "{record}"

case $tool in
nvidia-smi)
    if [ -e "{bin_dir}/nvidia-smi.fail" ]; then
        echo "Unable to set the compute mode for GPU: Insufficient Permissions" >&2; exit 4
    fi
    echo "Set compute mode to $4 for GPU $2."; exit 0;;
mount|umount) exit 0;;
esac
# nvidia-cuda-mps-control
if [ "$*" = "-d" ]; then
    if [ -e "$pipe/control" ]; then echo "An instance of this daemon is already running"; exit 1; fi
    : > "$pipe/control"
    echo "[stand-in] Control daemon started" >> "$logdir/control.log"
    exit 0
fi
[ -e "$pipe/control" ] || exit 1  # no daemon listening on this pipe
[ -e "$pipe/hang" ] && exec sleep 30
case $stdin in
quit) rm "$pipe/control";;
get_default_active_thread_percentage) echo "100.0";;
esac
exit 0
"""


@dataclass
class Tools:
    bin_dir: Path
    record: Path

    def calls(self) -> list[dict]:
        if not self.record.exists():
            return []
        out = []
        for line in self.record.read_text().split("\n")[:-1]:  # not splitlines(): \036 is a break to it
            tool, args, envs, stdin, ready, started, dirs = line.split("\036")
            out.append(
                {
                    "tool": tool,
                    "argv": args.split("\037")[:-1],
                    "env": dict(e.split("=", 1) for e in envs.split("\037") if e),
                    "stdin": stdin,
                    "ready": ready == "1",
                    "started": started == "1",
                    "dirs": dirs == "1",
                }
            )
        return out

    def asked(self) -> list[tuple[str, ...]]:
        """Each call as (tool, *argv) plus its stdin when there was one: the sequence to compare."""
        return [(c["tool"], *c["argv"], *([c["stdin"]] if c["stdin"] else [])) for c in self.calls()]

    def clear(self) -> None:
        self.record.unlink(missing_ok=True)

    @property
    def path(self) -> str:
        return f"{self.bin_dir}{os.pathsep}{os.environ['PATH']}"


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Tools:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "calls.rec"
    script = STANDIN.replace("{record}", str(record)).replace("{bin_dir}", str(bin_dir))
    for name in ("nvidia-smi", "nvidia-cuda-mps-control", "mount", "umount"):
        (bin_dir / name).write_text(script)
        (bin_dir / name).chmod(0o755)
    found = Tools(bin_dir, record)
    monkeypatch.setenv("PATH", found.path)
    # Our own CUDA settings must not reach the control daemon: it serves every GPU with the set defaults.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "7")
    return found


def mps_config(replicas: int, rename_by_default: bool = False) -> str:
    rename = "    renameByDefault: true\n" if rename_by_default else ""
    resources = f"    resources:\n    - name: nvidia.com/gpu\n      replicas: {replicas}\n"
    return f"version: v1\nsharing:\n  mps:\n{rename}{resources}"


def settings_for(tmp_path: Path, config: str) -> PluginSettings:
    path = tmp_path / "config.yaml"
    path.write_text(config)
    # What `kubegpu mps-daemon run --config-file` resolves: the file, defaults, mpsRoot defaulting to /mps.
    return resolve({"config-file": FlagValue(str(path), True), "mps-root": FlagValue("/mps", False)})


def fake(profile: str) -> NvmlBackend:
    return load_nvml(NvmlSelection.fake(profile))


# --- planning --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cc", "limit"),
    [("7.5", 48), ("v7.5", 48), ("9.0", 48), ("8.6", 48), ("7.0", 16), ("6.1", 16), ("bogus", 16),
     ((7, 5), 48), ((7, 0), 16), ((10, 0), 48)],
)  # fmt: skip
def test_max_clients_from_compute_capability(cc: str | tuple[int, int], limit: int) -> None:
    assert max_clients(cc) == limit


@pytest.mark.parametrize(
    ("cc", "replicas", "error"),
    [
        ((7, 0), 29, "invalid MPS configuration: invalid device maximum allowed replicas exceeded: 29 > 16"),
        ((9, 0), 49, "invalid MPS configuration: invalid device maximum allowed replicas exceeded: 49 > 48"),
        ((7, 0), 16, None),
        ((9, 0), 48, None),
    ],
)
def test_replica_limit_with_nvidias_text(cc: tuple[int, int], replicas: int, error: str | None) -> None:
    gpu = SharedGpu("GPU-x", "0", "some GPU", 16 * 1024 * MIB, cc, replicas)
    if error is None:
        check_replicas(gpu)
        return
    with pytest.raises(MpsConfigError) as raised:
        check_replicas(gpu)
    assert str(raised.value) == error
    assert "replicas to" in raised.value.hint


def test_plan_on_t4_node(tmp_path: Path) -> None:
    (plan,) = discover_plans(settings_for(tmp_path, mps_config(4)), fake("t4-pcie"))
    assert plan.resource == "nvidia.com/gpu"
    assert plan.uuids == tuple(T4)
    # 15360 MiB / 4 replicas = 3840 MiB per client; 100 // 4 = 25 % of the threads.
    assert plan.control_commands() == [
        *(f"set_default_device_pinned_mem_limit {i} 3840M" for i in range(4)),
        "set_default_active_thread_percentage 25",
    ]


def test_plan_follows_the_plugins_resource_names(tmp_path: Path) -> None:
    (plan,) = discover_plans(settings_for(tmp_path, mps_config(3, rename_by_default=True)), fake("t4-pcie"))
    assert plan.resource == "nvidia.com/gpu.shared"
    assert plan.control_commands()[0] == "set_default_device_pinned_mem_limit 0 5120M"
    assert plan.control_commands()[-1] == "set_default_active_thread_percentage 33"


@pytest.mark.parametrize(
    ("profile", "replicas", "error"),
    [
        ("dgx1-volta", 17, "17 > 16"),
        ("dgx1-volta", 16, None),
        ("t4-pcie", 49, "49 > 48"),
        ("t4-pcie", 48, None),
        ("hgx-h100", 48, None),
    ],
)
def test_max_replicas_on_fake_nodes(tmp_path: Path, profile: str, replicas: int, error: str | None) -> None:
    settings = settings_for(tmp_path, mps_config(replicas))
    if error is None:
        (plan,) = discover_plans(settings, fake(profile))
        assert {g.replicas for g in plan.gpus} == {replicas}
        return
    with pytest.raises(StartupError) as raised:
        discover_plans(settings, fake(profile))
    assert f"invalid MPS configuration: invalid device maximum allowed replicas exceeded: {error}" in str(
        raised.value
    )


def test_no_daemon_without_mps(tmp_path: Path) -> None:
    config = mps_config(4).replace("mps:", "timeSlicing:")
    assert discover_plans(settings_for(tmp_path, config), fake("t4-pcie")) == []


# --- starting and stopping, in process ------------------------------------------------------------


@pytest.fixture
def t4_manager(tmp_path: Path, tools: Tools) -> Iterator[Manager]:
    options = DaemonOptions(MpsRoot(tmp_path / "mps"), tmp_path / "no-selinux", 10.0, follow_logs=False)
    manager = prepare(settings_for(tmp_path, mps_config(4)), options, fake("t4-pcie"))
    yield manager
    manager.stop()


def test_start_asks_exactly_what_nvidia_asks(tmp_path: Path, tools: Tools, t4_manager: Manager) -> None:
    root = MpsRoot(tmp_path / "mps")
    assert t4_manager.start()
    assert tools.asked() == [
        *(("nvidia-smi", "-i", uuid, "-c", "EXCLUSIVE_PROCESS") for uuid in T4),
        ("nvidia-cuda-mps-control", "-d"),
        *(("nvidia-cuda-mps-control", f"set_default_device_pinned_mem_limit {i} 3840M") for i in range(4)),
        ("nvidia-cuda-mps-control", "set_default_active_thread_percentage 25"),
    ]
    control_calls = [c for c in tools.calls() if c["tool"] == "nvidia-cuda-mps-control"]
    expected_env = {
        "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "mps/nvidia.com/gpu/pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "mps/nvidia.com/gpu/log"),
    }
    assert all(c["env"] == expected_env for c in control_calls)  # and no CUDA_VISIBLE_DEVICES
    assert all(c["dirs"] for c in control_calls)  # pipe and log dirs exist before the daemon starts
    assert not any(c["started"] or c["ready"] for c in tools.calls())  # limits set before .started
    assert root.started_file("nvidia.com/gpu").exists()
    ready = json.loads(root.ready_file.read_text())
    assert ready == {
        "failRequestsGreaterThanOne": True,
        "resources": [{"name": "nvidia.com/gpu", "devices": "all", "replicas": 4}],
    }


def test_stop_removes_ready_first_then_quits_and_resets(
    tmp_path: Path, tools: Tools, t4_manager: Manager
) -> None:
    root = MpsRoot(tmp_path / "mps")
    assert t4_manager.start()
    tools.clear()
    assert t4_manager.stop() == []
    assert tools.asked() == [
        ("nvidia-cuda-mps-control", "quit"),
        *(("nvidia-smi", "-i", uuid, "-c", "DEFAULT") for uuid in T4),
    ]
    (quit_call,) = [c for c in tools.calls() if c["stdin"] == "quit"]
    assert not quit_call["ready"] and quit_call["started"]  # .ready went first, .started after quit
    assert not root.ready_file.exists() and not root.started_file("nvidia.com/gpu").exists()
    assert not root.log_dir("nvidia.com/gpu").exists()
    assert root.pipe_dir("nvidia.com/gpu").is_dir()  # the plugin keeps mounting it into containers


def test_failed_start_undoes_only_what_it_did(tmp_path: Path, tools: Tools, t4_manager: Manager) -> None:
    root = MpsRoot(tmp_path / "mps")
    pipe = root.pipe_dir("nvidia.com/gpu")
    pipe.mkdir(parents=True)
    (pipe / "control").touch()  # a daemon that is already running: `-d` refuses
    assert not t4_manager.start()
    assert tools.asked()[-1] == ("nvidia-cuda-mps-control", "-d")
    assert not root.ready_file.exists() and not root.started_file("nvidia.com/gpu").exists()
    tools.clear()
    t4_manager.stop()
    # No quit (we did not start that daemon), but every GPU we made exclusive goes back to DEFAULT.
    assert tools.asked() == [("nvidia-smi", "-i", uuid, "-c", "DEFAULT") for uuid in T4]


def test_compute_mode_failure_stops_the_start(tmp_path: Path, tools: Tools, t4_manager: Manager) -> None:
    (tools.bin_dir / "nvidia-smi.fail").touch()
    assert not t4_manager.start()
    assert tools.asked() == [("nvidia-smi", "-i", T4[0], "-c", "EXCLUSIVE_PROCESS")]
    tools.clear()
    assert t4_manager.stop() == []
    assert tools.asked() == []  # nothing was changed, nothing to undo


def test_pipe_dir_is_labelled_for_containers_when_selinux_is_on(tmp_path: Path, tools: Tools) -> None:
    selinux = tmp_path / "selinuxfs"
    selinux.mkdir()
    labelled: list[tuple[Path, str, bool]] = []

    def labeler(path: Path, label: str) -> None:
        daemon_started = any(c["argv"] == ["-d"] for c in tools.calls())
        labelled.append((path, label, daemon_started))

    root = MpsRoot(tmp_path / "mps")
    options = DaemonOptions(root, selinux, 10.0, follow_logs=False)
    manager = prepare(settings_for(tmp_path, mps_config(2)), options, fake("t4-pcie"), labeler)
    try:
        assert manager.start()
    finally:
        manager.stop()
    assert labelled == [(root.pipe_dir("nvidia.com/gpu"), CONTAINER_FILE_LABEL, False)]
    assert CONTAINER_FILE_LABEL == "system_u:object_r:container_file_t:s0"


# --- the plugin's liveness check ------------------------------------------------------------------


def test_liveness_alive(tmp_path: Path, tools: Tools, t4_manager: Manager) -> None:
    assert t4_manager.start()
    tools.clear()
    assert mps_daemon_alive(tmp_path / "mps", "nvidia.com/gpu", 5.0) == (True, "")
    (call,) = tools.calls()
    assert call["stdin"] == "get_default_active_thread_percentage"
    assert call["env"]["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "mps/nvidia.com/gpu/pipe")


def test_liveness_not_alive(tmp_path: Path, tools: Tools, t4_manager: Manager) -> None:
    alive, reason = mps_daemon_alive(tmp_path / "mps", "nvidia.com/gpu", 5.0)
    assert not alive and "does not exist" in reason and "nvidia.com/gpu" in reason
    assert t4_manager.start()
    t4_manager.stop()  # the daemon quit; its pipe dir stays
    alive, reason = mps_daemon_alive(tmp_path / "mps", "nvidia.com/gpu", 5.0)
    assert not alive and "does not answer" in reason and "exited with 1" in reason


def test_liveness_timeout(tmp_path: Path, tools: Tools, t4_manager: Manager) -> None:
    assert t4_manager.start()
    (MpsRoot(tmp_path / "mps").pipe_dir("nvidia.com/gpu") / "hang").touch()
    began = time.monotonic()
    alive, reason = mps_daemon_alive(tmp_path / "mps", "nvidia.com/gpu", 0.3)
    assert not alive and "did not finish within 0.3s" in reason
    assert time.monotonic() - began < 5
    (MpsRoot(tmp_path / "mps").pipe_dir("nvidia.com/gpu") / "hang").unlink()


def test_liveness_without_the_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mps/nvidia.com/gpu/pipe").mkdir(parents=True)
    monkeypatch.setenv("PATH", str(tmp_path))
    alive, reason = mps_daemon_alive(tmp_path / "mps", "nvidia.com/gpu", 1.0)
    assert not alive and "nvidia-cuda-mps-control not found on PATH" in reason


def test_default_root_is_nvidias() -> None:
    assert Path("/mps") == CONTAINER_ROOT
    assert MpsRoot().pipe_dir("nvidia.com/gpu") == Path("/mps/nvidia.com/gpu/pipe")
    assert MpsRoot().shm_dir == Path("/mps/shm")


# --- the manager as a process ---------------------------------------------------------------------


class Process:
    def __init__(self, args: list[str], env: dict[str, str], out: Path) -> None:
        self.out = out
        self._stdout = out.open("wb")
        # Own session: teardown can reap the manager and its `tail` children by group, nothing else.
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kubegpu.mps", *args],
            env=env,
            stdout=self._stdout,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_for(self, what: str, check: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{what}: not reached (exit {self.proc.poll()}):\n{self.out.read_text()}")
            time.sleep(0.05)

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=15)

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._stdout.close()


@pytest.fixture
def manager_process(tmp_path: Path, tools: Tools) -> Iterator[Callable[..., Process]]:
    started: list[Process] = []

    def start(config: str, profile: str, *extra: str) -> Process:
        path = tmp_path / "config.yaml"
        path.write_text(config)
        env = {
            **os.environ,
            "KUBEGPU_FAKE_NVML": profile,
            "CONFIG_FILE": str(path),
            "KUBEGPU_MPS_DAEMON_ROOT": str(tmp_path / "mps"),
            "KUBEGPU_SELINUX_FS": str(tmp_path / "no-selinux"),
        }
        process = Process(["run", *extra], env, tmp_path / "manager.log")
        started.append(process)
        return process

    yield start
    for process in started:
        process.close()


def test_manager_process_restarts_on_sighup_and_stops_cleanly_on_sigterm(
    tmp_path: Path, tools: Tools, manager_process: Callable[..., Process]
) -> None:
    root = MpsRoot(tmp_path / "mps")
    manager = manager_process(mps_config(16), "dgx1-volta")  # 16 = the most a 7.0 GPU accepts
    manager.wait_for(".ready", root.ready_file.exists)
    asked = tools.asked()
    v100 = [call[2] for call in asked if call[0] == "nvidia-smi"]
    assert len(v100) == V100_COUNT
    assert asked[V100_COUNT:] == [
        ("nvidia-cuda-mps-control", "-d"),
        # 16160 MiB / 16 = 1010 MiB per client; 100 // 16 = 6 %.
        *(("nvidia-cuda-mps-control", f"set_default_device_pinned_mem_limit {i} 1010M") for i in range(8)),
        ("nvidia-cuda-mps-control", "set_default_active_thread_percentage 6"),
    ]
    manager.wait_for("control.log on stdout", lambda: "Control daemon started" in manager.out.read_text())

    # SIGHUP: the re-read config renames the resource and lowers the replicas; everything is redone.
    tools.clear()
    (tmp_path / "config.yaml").write_text(mps_config(4, rename_by_default=True))
    manager.proc.send_signal(signal.SIGHUP)
    last = ("nvidia-cuda-mps-control", "set_default_active_thread_percentage 25")
    manager.wait_for("restart", lambda: last in tools.asked())
    manager.wait_for(".ready again", root.ready_file.exists)
    assert tools.asked() == [
        ("nvidia-cuda-mps-control", "quit"),
        *(("nvidia-smi", "-i", uuid, "-c", "DEFAULT") for uuid in v100),
        *(("nvidia-smi", "-i", uuid, "-c", "EXCLUSIVE_PROCESS") for uuid in v100),
        ("nvidia-cuda-mps-control", "-d"),
        *(("nvidia-cuda-mps-control", f"set_default_device_pinned_mem_limit {i} 4040M") for i in range(8)),
        last,
    ]
    assert tools.calls()[-1]["env"]["CUDA_MPS_PIPE_DIRECTORY"] == str(root.pipe_dir("nvidia.com/gpu.shared"))
    assert not root.log_dir("nvidia.com/gpu").exists()

    # SIGTERM: .ready first, then quit, compute modes back to DEFAULT, .started and logs gone.
    tools.clear()
    assert manager.stop(signal.SIGTERM) == 0
    quit_call, *rest = tools.calls()
    assert quit_call["stdin"] == "quit" and not quit_call["ready"] and quit_call["started"]
    assert [tuple(c["argv"]) for c in rest] == [("-i", uuid, "-c", "DEFAULT") for uuid in v100]
    assert not root.ready_file.exists() and not root.started_file("nvidia.com/gpu.shared").exists()
    assert not root.log_dir("nvidia.com/gpu.shared").exists()
    assert 'Received signal "SIGTERM", shutting down.' in manager.out.read_text()


def test_manager_process_refuses_too_many_replicas(
    tmp_path: Path, tools: Tools, manager_process: Callable[..., Process]
) -> None:
    manager = manager_process(mps_config(17), "dgx1-volta")
    assert manager.proc.wait(timeout=15) == 1
    assert (
        "invalid MPS configuration: invalid device maximum allowed replicas exceeded: 17 > 16"
        in manager.out.read_text()
    )
    assert tools.calls() == []  # nothing touched a GPU


# --- mount-shm ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("meminfo", "size"),
    [
        ("MemTotal:       16316296 kB\nMemFree:         1000000 kB\n", "8158148k"),
        ("MemAvailable:    2000 kB\nSwapTotal:       4000 kB\nMemTotal:        1024 kB\n", "512k"),
        ("MemTotal:        1025 kB\n", "512k"),
        ("MemTotal:        1024\n", "512"),
        ("MemTotal:   lots kB\n", FALLBACK_SIZE),
        ("MemTotal:\n", FALLBACK_SIZE),
        ("MemFree:         1000000 kB\n", FALLBACK_SIZE),
        ("", FALLBACK_SIZE),
        (None, FALLBACK_SIZE),  # unreadable
    ],
)
def test_shm_size_is_half_of_memtotal(tmp_path: Path, meminfo: str | None, size: str) -> None:
    path = tmp_path / "meminfo"
    if meminfo is not None:
        path.write_text(meminfo)
    assert shm_size(path) == size
    assert FALLBACK_SIZE == "65536k"


def test_mount_shm_remounts_with_nvidias_options(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       263856592 kB\n")
    shm = tmp_path / "my mps" / "shm"  # a space: mountinfo escapes it as \040
    mountinfo = tmp_path / "mountinfo"
    escaped = str(shm).replace(" ", "\\040")
    mountinfo.write_text(
        f"1280 1100 0:91 / {escaped} rw,nosuid,nodev,noexec,relatime - tmpfs shm rw,size=8k\n"
    )
    ran: list[list[str]] = []

    mount_shm(shm, meminfo, mountinfo, run=lambda argv: ran.append(list(argv)))
    assert ran == [
        ["umount", str(shm)],
        ["mount", "-t", "tmpfs", "-o", "rw,nosuid,nodev,noexec,relatime,size=131928296k", "shm", str(shm)],
    ]
    assert shm.is_dir()

    ran.clear()
    mountinfo.write_text("25 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n")
    mount_shm(shm, meminfo, mountinfo, run=lambda argv: ran.append(list(argv)))
    assert [argv[0] for argv in ran] == ["mount"]  # nothing mounted there: no umount
    assert not is_mount_point(shm, mountinfo)


def test_mount_shm_command_runs_mount_from_path(tmp_path: Path, tools: Tools) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       2000 kB\n")
    done = subprocess.run(
        [sys.executable, "-m", "kubegpu.mps", "mount-shm", "--root", str(tmp_path / "mps"),
         "--meminfo", str(meminfo), "--mountinfo", str(tmp_path / "no-mountinfo")],
        capture_output=True, text=True, timeout=30, env={**os.environ, "PATH": tools.path},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert tools.asked() == [
        ("mount", "-t", "tmpfs", "-o", "rw,nosuid,nodev,noexec,relatime,size=1000k", "shm",
         str(tmp_path / "mps/shm")),
    ]  # fmt: skip
    assert mount_command(Path("/mps/shm"), "8k")[-2:] == ["shm", "/mps/shm"]

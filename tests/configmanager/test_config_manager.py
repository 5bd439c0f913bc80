"""`kubegpu config-manager`: NVIDIA's selection rules and texts, the symlink, the signal, and the Node watch
against the simulated API server, which speaks list/watch over HTTP on 127.0.0.1 (kubegpu.apisim) through the
real `kubernetes` client."""

from __future__ import annotations

import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from kubegpu.apisim import ApiServerSim
from kubegpu.common.backoff import Backoff
from kubegpu.configmanager.cli import config_manager
from kubegpu.configmanager.errors import ConfigManagerError
from kubegpu.configmanager.manager import Settings, run, update_config
from kubegpu.configmanager.procsignal import (
    find_pid,
    matches,
    program_names,
    signal_name,
    signal_process,
)
from kubegpu.configmanager.selection import available_configs, select_config
from kubegpu.configmanager.symlink import update_symlink
from kubegpu.configmanager.watch import LabelTracker, NodeLabelWatcher, connect, watch_backoff

LABEL = "nvidia.com/device-plugin.config"
NODE = "gpu-node-1"


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    # A generous ceiling: it only bounds a failing run; a passing one returns as soon as the condition holds.
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


# ---- fixtures ----------------------------------------------------------------------------------------


def make_configmap_dir(root: Path, files: dict[str, str]) -> Path:
    """A directory laid out like a ConfigMap volume: keys are links into `..data`, a link to a
    timestamped directory, so the `..` entries are there to be ignored."""
    root.mkdir(parents=True)
    stamped = root / "..2024_05_01_12_00_00.000000001"
    stamped.mkdir()
    for name, text in files.items():
        (stamped / name).write_text(text)
    (root / "..data").symlink_to(stamped.name)
    for name in files:
        (root / name).symlink_to(f"..data/{name}")
    return root


@pytest.fixture
def srcdir(tmp_path: Path) -> Path:
    return make_configmap_dir(
        tmp_path / "available-configs",
        {"a": "version: v1\n", "b": "version: v1\n", "default": "version: v1\n"},
    )


@pytest.fixture
def dst(tmp_path: Path) -> Path:
    (tmp_path / "config").mkdir()
    return tmp_path / "config" / "config.yaml"


@dataclass
class Child:
    """A real process whose argv[0] is `name`; it appends each signal it gets to `record`."""

    name: str
    proc: subprocess.Popen[bytes]
    record: Path

    def signals(self) -> list[int]:
        return [int(line) for line in self.record.read_text().split()] if self.record.exists() else []


CHILD_SCRIPT = """
import pathlib, signal, sys, time
record = pathlib.Path(sys.argv[1])
def note(signum, frame):
    with record.open("a") as f:
        f.write(f"{signum}\\n")
signal.signal(signal.SIGHUP, note)
signal.signal(signal.SIGUSR1, note)
pathlib.Path(sys.argv[2]).write_text("ready")
while True:
    time.sleep(1)
"""


@pytest.fixture
def child(tmp_path: Path) -> Iterator[Child]:
    # A name of its own per test: the real /proc is searched, and nothing else on this machine may match.
    name = f"kubegpu-test-plugin-{secrets.token_hex(6)}"
    ready = tmp_path / "child.ready"
    proc = subprocess.Popen(
        [name, "-c", CHILD_SCRIPT, str(tmp_path / "child.signals"), str(ready)], executable=sys.executable
    )
    try:
        wait_until(ready.exists, what="the child to install its handlers")
        yield Child(name, proc, tmp_path / "child.signals")
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def api() -> Iterator[ApiServerSim]:
    server = ApiServerSim()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """The command configures the root logger (to the runner's stream); put it back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def settings_for(srcdir: Path, dst: Path, **overrides: object) -> Settings:
    base = Settings(
        node_name=NODE, config_file_srcdir=str(srcdir), config_file_dst=str(dst), send_signal=False
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


# ---- selection -----------------------------------------------------------------------------------------


def test_available_configs_skips_dotdot_entries_and_directories(srcdir: Path) -> None:
    (srcdir / "a-directory").mkdir()
    (srcdir / "link-to-directory").symlink_to("a-directory")
    (srcdir / "plain-file").write_text("version: v1\n")
    assert available_configs(srcdir) == ["a", "b", "default", "plain-file"]


def test_available_configs_missing_directory_has_nvidias_text(tmp_path: Path) -> None:
    with pytest.raises(ConfigManagerError) as err:
        available_configs(tmp_path / "nope")
    assert str(err.value) == (
        "error getting list of configuration files: error reading directory: "
        f"open {tmp_path / 'nope'}: no such file or directory"
    )


@pytest.mark.parametrize(
    ("label", "files", "default", "fallbacks", "expected"),
    [
        ("a", ["a", "b"], "", (), "a"),
        ("a", ["a", "b"], "b", ("empty",), "a"),  # the label beats the default
        ("a", ["a", "b"], "missing", (), "a"),  # ... even a broken default
        ("", ["a", "b"], "b", ("empty",), "b"),  # the default beats the fallbacks
        ("", ["a", "default"], "", ("named",), "default"),
        ("", ["a"], "", ("single",), "a"),
        ("", ["a", "b"], "", ("empty",), ""),
        # in the order given: the first that applies wins
        ("", ["a", "default"], "", ("single", "named"), "default"),
        ("", ["a"], "", ("named", "single"), "a"),
        ("", ["a", "b"], "", ("named", "single", "empty"), ""),
        ("", ["default"], "", ("empty", "named"), ""),
        ("", ["default"], "", ("single", "empty"), "default"),
        # an unknown strategy is an error only when reached
        ("", ["default"], "", ("named", "bogus"), "default"),
    ],
)
def test_selection(
    label: str, files: list[str], default: str, fallbacks: tuple[str, ...], expected: str
) -> None:
    assert select_config(label, files, default, fallbacks) == expected


@pytest.mark.parametrize(
    ("label", "files", "default", "fallbacks", "message"),
    [
        ("nope", ["a", "default"], "a", ("named",), "specified config nope does not exist"),
        ("", ["a", "b"], "missing", ("empty",), "specified config missing does not exist"),
        ("a", [], "", ("empty",), "no configuration files available"),
        ("", ["a", "b"], "", (), "no config was set, no default was provided, and all fallbacks failed"),
        (
            "",
            ["a", "b"],
            "",
            ("named", "single"),
            "no config was set, no default was provided, and all fallbacks failed",
        ),
        ("", ["a", "b"], "", ("single", "bogus", "empty"), "unknown fallback strategy: bogus"),
    ],
)
def test_selection_errors(
    label: str, files: list[str], default: str, fallbacks: tuple[str, ...], message: str
) -> None:
    with pytest.raises(ConfigManagerError) as err:
        select_config(label, files, default, fallbacks)
    assert str(err.value) == message


# ---- symlink -------------------------------------------------------------------------------------------


def test_symlink_created_switched_and_already_configured(srcdir: Path, dst: Path) -> None:
    assert update_symlink("a", str(srcdir), str(dst))
    assert os.readlink(dst) == str(srcdir / "a")
    assert not update_symlink("a", str(srcdir), str(dst))
    assert update_symlink("b", str(srcdir), str(dst))
    assert os.readlink(dst) == str(srcdir / "b")
    assert update_symlink("", str(srcdir), str(dst))
    assert os.readlink(dst) == "/dev/null"
    assert not update_symlink("", str(srcdir), str(dst))
    assert sorted(p.name for p in dst.parent.iterdir()) == ["config.yaml"]  # no temporary left behind


def test_symlink_same_file_through_other_links_is_already_configured(srcdir: Path, dst: Path) -> None:
    dst.symlink_to(srcdir / "..data" / "a")  # another route to the same file
    assert not update_symlink("a", str(srcdir), str(dst))


def test_symlink_stays_configured_when_the_configmap_content_changes(srcdir: Path, dst: Path) -> None:
    assert update_symlink("a", str(srcdir), str(dst))
    # The kubelet publishes new ConfigMap content by swapping `..data` to a new timestamped directory.
    fresh = srcdir / "..2024_05_02_12_00_00.000000002"
    fresh.mkdir()
    for name in ("a", "b", "default"):
        (fresh / name).write_text("version: v1\nflags: {migStrategy: single}\n")
    (srcdir / "..data_tmp").symlink_to(fresh.name)
    os.replace(srcdir / "..data_tmp", srcdir / "..data")
    assert not update_symlink("a", str(srcdir), str(dst))
    assert "migStrategy" in dst.read_text()


def test_symlink_replaces_a_regular_file_and_a_dangling_link(srcdir: Path, dst: Path) -> None:
    dst.write_text("version: v1\n")
    assert update_symlink("a", str(srcdir), str(dst))
    assert os.readlink(dst) == str(srcdir / "a")
    dst.unlink()
    dst.symlink_to(srcdir / "gone")
    assert update_symlink("b", str(srcdir), str(dst))
    assert os.readlink(dst) == str(srcdir / "b")


def test_symlink_is_never_missing_while_switching(srcdir: Path, dst: Path) -> None:
    """Replaced by rename: a reader (the plugin reloading) never finds the config file missing."""
    update_symlink("a", str(srcdir), str(dst))
    missing = 0
    done = threading.Event()

    def reader() -> None:
        nonlocal missing
        while not done.is_set():
            if not os.path.lexists(dst):
                missing += 1

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(100):
            update_symlink("b" if i % 2 == 0 else "a", str(srcdir), str(dst))
    finally:
        done.set()
        thread.join()
    assert missing == 0


def test_symlink_error_text(srcdir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigManagerError) as err:
        update_symlink("a", str(srcdir), str(tmp_path / "no-such-dir" / "config.yaml"))
    message = str(err.value)
    assert message.startswith(f"error creating symlink: symlink {srcdir / 'a'} {tmp_path / 'no-such-dir'}/")
    assert message.endswith(": no such file or directory")


# ---- finding and signalling the process ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv0", "target", "expected"),
    [  # NVIDIA's cmd/config-manager table (v0.20.1)
        ("mps-control-daemon", "mps-control-daemon", True),
        ("/usr/bin/mps-control-daemon", "/usr/bin/mps-control-daemon", True),
        ("mps-control-daemon", "/usr/bin/mps-control-daemon", True),
        ("/usr/bin/mps-control-daemon", "mps-control-daemon", True),
        ("/usr/local/bin/mps-control-daemon", "/usr/bin/mps-control-daemon", True),
        ("/usr/bin/nvidia-device-plugin", "/usr/bin/mps-control-daemon", False),
        ("mps-control", "mps-control-daemon", False),
    ],
)
def test_argv0_matching(argv0: str, target: str, expected: bool) -> None:
    assert matches(argv0, target) is expected


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["kubegpu", "plugin"], ["kubegpu"]),
        (
            ["/usr/bin/python3", "/usr/local/bin/kubegpu", "plugin"],
            ["/usr/bin/python3", "/usr/local/bin/kubegpu"],
        ),
        (["python3.11", "-u", "-W", "ignore", "/app/kubegpu", "plugin"], ["python3.11", "/app/kubegpu"]),
        (["python", "-m", "kubegpu", "plugin"], ["python", "kubegpu"]),
        (["python3", "-c", "import kubegpu"], ["python3"]),
        (["pythonista", "/app/kubegpu"], ["pythonista"]),
        ([], []),
    ],
)
def test_program_names(argv: list[str], names: list[str]) -> None:
    assert program_names(argv) == names


def fake_proc(root: Path, processes: dict[str, bytes | None]) -> Path:
    """A /proc with `<pid>/cmdline` files (None: an entry without a readable cmdline)."""
    for pid, cmdline in processes.items():
        (root / pid).mkdir(parents=True)
        if cmdline is not None:
            (root / pid / "cmdline").write_bytes(cmdline)
    return root


def test_find_pid_in_a_fake_proc(tmp_path: Path) -> None:
    proc = fake_proc(
        tmp_path / "proc",
        {
            "self": b"kubegpu\0",  # not a PID
            "2": b"",  # kernel thread
            "7": None,  # gone while we looked
            "10": b"/usr/bin/python3\0/usr/local/bin/kubegpu\0config-manager\0",
            "40": b"/usr/local/bin/kubegpu\0plugin\0",
            "300": b"kubegpu\0mps-daemon\0",
            "1000": b"nvidia-device-plugin\0",
        },
    )
    assert find_pid("kubegpu", proc_root=proc) == 10
    assert find_pid("kubegpu", proc_root=proc, exclude={10}) == 40  # the config-manager never picks itself
    assert find_pid("/usr/bin/kubegpu", proc_root=proc, exclude={10}) == 40
    assert find_pid("nvidia-device-plugin", proc_root=proc) == 1000
    with pytest.raises(ConfigManagerError, match=r"^no process found$"):
        find_pid("gpu-feature-discovery", proc_root=proc)


def test_signal_error_texts(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path / "proc", {"99999999": b"kubegpu\0"})  # above any pid_max: no such process
    with pytest.raises(ConfigManagerError) as err:
        signal_process("other", signal.SIGHUP, proc_root=proc)
    assert str(err.value) == "error finding pid: no process found"
    with pytest.raises(ConfigManagerError) as err:
        signal_process("kubegpu", signal.SIGHUP, proc_root=proc)
    assert str(err.value) == "error sending signal: no such process"
    with pytest.raises(ConfigManagerError) as err:
        signal_process("kubegpu", signal.SIGHUP, proc_root=tmp_path / "no-proc")
    assert str(err.value) == (
        f"error finding pid: error getting list of all procs: open {tmp_path / 'no-proc'}: "
        "no such file or directory"
    )


def test_signal_names_are_gos() -> None:
    assert signal_name(1) == "hangup"
    assert signal_name(15) == "terminated"
    assert signal_name(12345) == "signal 12345"


def test_signal_reaches_a_real_process_by_argv0(child: Child) -> None:
    assert signal_process(child.name, signal.SIGUSR1) == child.proc.pid
    wait_until(lambda: child.signals() == [signal.SIGUSR1], what="the signal")


# ---- one update ----------------------------------------------------------------------------------------


def test_update_config_switches_and_signals_once(
    srcdir: Path, dst: Path, child: Child, caplog: pytest.LogCaptureFixture
) -> None:
    settings = settings_for(srcdir, dst, send_signal=True, process_to_signal=child.name)
    caplog.set_level(logging.INFO, "kubegpu.configmanager")

    assert update_config("a", settings)
    wait_until(lambda: child.signals() == [signal.SIGHUP], what="SIGHUP")
    assert f"Sending signal 'hangup' to '{child.name}'" in caplog.messages

    caplog.clear()
    assert not update_config("a", settings)
    assert caplog.messages == ["Updating to config: a", "Already configured. Skipping update..."]
    time.sleep(0.1)
    assert child.signals() == [signal.SIGHUP]  # no signal when nothing changed

    assert update_config("b", settings)
    wait_until(lambda: child.signals() == [signal.SIGHUP] * 2, what="the second SIGHUP")
    assert os.readlink(dst) == str(srcdir / "b")


def test_update_config_error_keeps_the_current_config(srcdir: Path, dst: Path) -> None:
    settings = settings_for(srcdir, dst)
    update_config("a", settings)
    with pytest.raises(ConfigManagerError, match=r"^specified config typo does not exist$"):
        update_config("typo", settings)
    assert os.readlink(dst) == str(srcdir / "a")


def test_update_config_never_signals_itself(srcdir: Path, dst: Path, tmp_path: Path) -> None:
    proc = fake_proc(tmp_path / "proc", {str(os.getpid()): b"kubegpu\0config-manager\0"})
    settings = settings_for(srcdir, dst, send_signal=True, process_to_signal="kubegpu", proc_root=str(proc))
    with pytest.raises(ConfigManagerError, match=r"^error finding pid: no process found$"):
        update_config("a", settings)


def test_run_oneshot_stops_after_the_first_value(srcdir: Path, dst: Path) -> None:
    consumed: list[str] = []

    def labels() -> Iterator[str]:
        for value in ("a", "b"):
            consumed.append(value)
            yield value

    run(settings_for(srcdir, dst, oneshot=True), labels())
    assert consumed == ["a"]
    assert os.readlink(dst) == str(srcdir / "a")


# ---- the watch -----------------------------------------------------------------------------------------


def test_label_tracker_reports_first_sighting_changes_and_removal() -> None:
    tracker = LabelTracker(LABEL)
    assert tracker.seen({}) == ""  # start-up without the label still selects a default
    assert tracker.seen({"other": "x"}) is None
    assert tracker.seen({LABEL: "a"}) == "a"
    assert tracker.seen({LABEL: "a", "other": "y"}) is None
    assert tracker.gone() == ""
    assert tracker.gone() is None
    assert tracker.seen(None) is None
    assert tracker.seen({LABEL: "b"}) == "b"


@pytest.mark.parametrize(
    ("pick", "delays"),
    [
        # client-go's reflector: 800 ms doubling to 30 s, jitter up to 25% longer, never above 30 s.
        ("low", [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0]),
        ("high", [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]),
    ],
)
def test_watch_backoff_keeps_client_gos_bounds(pick: str, delays: list[float]) -> None:
    now = [0.0]
    backoff = replace(
        watch_backoff(), clock=lambda: now[0], uniform=lambda lo, hi: lo if pick == "low" else hi
    )
    assert [backoff.next_delay() for _ in range(8)] == pytest.approx(delays)
    now[0] = 120.0  # failures keep coming: no reset
    assert backoff.next_delay() == 30.0
    now[0] = 240.5  # over 2 minutes without a failure: start over
    assert backoff.next_delay() == pytest.approx(delays[0])


class Manager:
    """`run()` over a NodeLabelWatcher in a thread, as the sidecar runs it."""

    def __init__(self, api: ApiServerSim, settings: Settings, kubeconfig: Path) -> None:
        self.api = api
        self.watcher = NodeLabelWatcher(
            connect(str(kubeconfig)),
            settings.node_name,
            settings.node_label,
            backoff=Backoff(initial=0.05, maximum=0.2),
            watch_timeout=(5, 5),
            connect_timeout=1.0,
        )
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(settings,), daemon=True)
        self.thread.start()

    def _run(self, settings: Settings) -> None:
        try:
            run(settings, self.watcher.labels())
        except BaseException as err:
            self.error = err

    def stop(self) -> None:
        self.watcher.stop()
        deadline = time.monotonic() + 5
        while self.thread.is_alive() and time.monotonic() < deadline:
            # Ends the open watch, where the watcher notices the stop; again while it runs, for a watch
            # request that was on its way while the streams were being closed.
            self.api.close_streams()
            self.thread.join(0.05)
        assert not self.thread.is_alive()


@pytest.fixture
def manager(api: ApiServerSim, tmp_path: Path) -> Iterator[Callable[[Settings], Manager]]:
    started: list[Manager] = []

    def start(settings: Settings) -> Manager:
        started.append(Manager(api, settings, api.write_kubeconfig(tmp_path / "kubeconfig")))
        return started[-1]

    yield start
    for m in started:
        m.stop()


def link(dst: Path) -> str | None:
    return os.readlink(dst) if os.path.lexists(dst) else None


def test_watch_follows_label_changes_and_removal_and_signals(
    api: ApiServerSim, manager: Callable[[Settings], Manager], srcdir: Path, dst: Path, child: Child
) -> None:
    api.add_node(NODE, {LABEL: "a"})
    api.add_node("other-node", {LABEL: "b"})
    m = manager(
        settings_for(
            srcdir, dst, send_signal=True, process_to_signal=child.name, fallback_strategies=("named",)
        )
    )
    wait_until(lambda: link(dst) == str(srcdir / "a"), what="config a")
    wait_until(lambda: len(child.signals()) == 1, what="the first SIGHUP")

    api.set_label(NODE, LABEL, "b")
    wait_until(lambda: link(dst) == str(srcdir / "b"), what="config b")
    wait_until(lambda: len(child.signals()) == 2, what="SIGHUP for b")

    # Neither another node's label nor another label of ours is a change.
    api.set_label("other-node", LABEL, "a")
    api.set_label(NODE, "unrelated", "x")
    time.sleep(0.2)
    assert link(dst) == str(srcdir / "b")

    api.set_label(NODE, LABEL, None)  # removal: no default given, so the `named` fallback
    wait_until(lambda: link(dst) == str(srcdir / "default"), what="the named fallback")
    wait_until(lambda: len(child.signals()) == 3, what="SIGHUP for the fallback")
    assert child.signals() == [signal.SIGHUP] * 3
    assert m.error is None
    # Only our Node was ever asked for.
    assert all(q.get("fieldSelector") == f"metadata.name={NODE}" for _, q in api.requests)


def test_watch_label_naming_no_file_ends_the_run_with_nvidias_error(
    api: ApiServerSim, manager: Callable[[Settings], Manager], srcdir: Path, dst: Path
) -> None:
    api.add_node(NODE, {LABEL: "a"})
    m = manager(settings_for(srcdir, dst))
    wait_until(lambda: link(dst) == str(srcdir / "a"), what="config a")
    api.set_label(NODE, LABEL, "typo")
    m.thread.join(5)
    assert isinstance(m.error, ConfigManagerError)
    assert str(m.error) == "specified config typo does not exist"
    assert link(dst) == str(srcdir / "a")  # the plugin keeps its config


def test_watch_relists_after_410_gone(
    api: ApiServerSim, manager: Callable[[Settings], Manager], srcdir: Path, dst: Path
) -> None:
    api.add_node(NODE, {LABEL: "a"})
    manager(settings_for(srcdir, dst))
    wait_until(lambda: link(dst) == str(srcdir / "a"), what="config a")
    api.wait_for(lambda: len(api.watches()) == 1)

    # The change happens while the watcher is away and its event is compacted: only a new list shows it.
    api.set_label(NODE, LABEL, "b", record=False)
    api.compact()
    api.close_streams()

    wait_until(lambda: link(dst) == str(srcdir / "b"), what="config b after the re-list")
    assert len(api.lists()) == 2
    # Watching resumes from the new list, and nothing before it watched from past the compaction. (The
    # 410 may come to the first watch itself when its request is still on its way as history is compacted.)
    api.wait_for(lambda: int(api.watches()[-1]["resourceVersion"]) == api.compacted)
    assert all(int(w["resourceVersion"]) < api.compacted for w in api.watches()[:-1])


def test_watch_survives_the_api_server_going_away(
    api: ApiServerSim,
    manager: Callable[[Settings], Manager],
    srcdir: Path,
    dst: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "kubegpu.configmanager")
    api.add_node(NODE, {LABEL: "a"})
    api.stop()
    manager(settings_for(srcdir, dst))  # starts while the API server is down
    wait_until(lambda: len([m for m in caplog.messages if "retrying in" in m]) >= 2, what="retries")
    assert link(dst) is None

    api.start()
    wait_until(lambda: link(dst) == str(srcdir / "a"), what="config a")
    api.wait_for(lambda: len(api.watches()) >= 1)

    api.stop()
    api.set_label(NODE, LABEL, "b")  # changed while we cannot see it
    caplog.clear()
    wait_until(lambda: any("retrying in" in m for m in caplog.messages), what="a retry")
    api.start()
    wait_until(lambda: link(dst) == str(srcdir / "b"), what="config b after reconnecting")


# ---- the command ---------------------------------------------------------------------------------------


def command_env(api: ApiServerSim, tmp_path: Path, srcdir: Path, dst: Path, **extra: str) -> dict[str, str]:
    return {
        "KUBECONFIG": str(api.write_kubeconfig(tmp_path / "kubeconfig")),
        "NODE_NAME": NODE,
        "CONFIG_FILE_SRCDIR": str(srcdir),
        "CONFIG_FILE_DST": str(dst),
        **extra,
    }


@pytest.mark.usefixtures("restore_logging")
def test_command_oneshot_selects_once_and_exits(
    api: ApiServerSim, tmp_path: Path, srcdir: Path, dst: Path
) -> None:
    api.add_node(NODE, {})
    env = command_env(
        api, tmp_path, srcdir, dst, ONESHOT="true", SEND_SIGNAL="false", FALLBACK_STRATEGIES="single,empty"
    )
    result = CliRunner().invoke(config_manager, [], env=env)
    assert result.exit_code == 0, result.output
    assert link(dst) == "/dev/null"  # three files: `single` fails, `empty` applies
    assert "Successfully updated to empty config" in result.output
    assert api.watches() == []  # one list, no watch

    # As an init container on a pod restart: the same selection again changes nothing.
    result = CliRunner().invoke(config_manager, [], env=env)
    assert result.exit_code == 0, result.output
    assert "Already configured. Skipping update..." in result.output


@pytest.mark.usefixtures("restore_logging")
def test_command_flags_beat_env_vars(api: ApiServerSim, tmp_path: Path, srcdir: Path, dst: Path) -> None:
    api.add_node(NODE, {"example.com/config": "b"})
    env = command_env(api, tmp_path, srcdir, dst, ONESHOT="false", NODE_LABEL="nope", SEND_SIGNAL="true")
    args = ["--oneshot", "--node-label", "example.com/config", "--send-signal=false"]
    result = CliRunner().invoke(config_manager, args, env=env)
    assert result.exit_code == 0, result.output
    assert link(dst) == str(srcdir / "b")


@pytest.mark.usefixtures("restore_logging")
@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--node-name=", "invalid <node-name>: must not be empty string"),
        ("--node-label=", "invalid <node-label>: must not be empty string"),
        ("--config-file-srcdir=", "invalid <config-file-srcdir>: must not be empty string"),
        ("--config-file-dst=", "invalid <config-file-dst>: must not be empty string"),
    ],
)
def test_command_required_settings(
    api: ApiServerSim, tmp_path: Path, srcdir: Path, dst: Path, flag: str, message: str
) -> None:
    env = command_env(api, tmp_path, srcdir, dst, ONESHOT="true")
    result = CliRunner().invoke(config_manager, [flag], env=env)
    assert result.exit_code == 1
    assert message in result.output
    assert api.requests == []  # checked before anything else happens


@pytest.mark.usefixtures("restore_logging")
def test_command_bad_kubeconfig(tmp_path: Path, srcdir: Path, dst: Path) -> None:
    env = {
        "KUBECONFIG": str(tmp_path / "missing-kubeconfig"),
        "NODE_NAME": NODE,
        "CONFIG_FILE_SRCDIR": str(srcdir),
        "CONFIG_FILE_DST": str(dst),
    }
    result = CliRunner().invoke(config_manager, ["--oneshot"], env=env)
    assert result.exit_code == 1
    assert "error building kubernetes clientcmd config:" in result.output


def test_sidecar_process_signals_the_plugin_and_exits_on_a_bad_label(
    api: ApiServerSim, tmp_path: Path, srcdir: Path, dst: Path, child: Child
) -> None:
    """The sidecar as a process of its own, as in the pod: started, relabelled, then given a bad label."""
    api.add_node(NODE, {LABEL: "a"})
    env = {**os.environ, **command_env(api, tmp_path, srcdir, dst, PROCESS_TO_SIGNAL=child.name, SIGNAL="1")}
    sidecar = subprocess.Popen(
        [sys.executable, "-m", "kubegpu.configmanager.cli"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until(lambda: len(child.signals()) == 1, timeout=60, what="the first SIGHUP")
        assert link(dst) == str(srcdir / "a")
        api.set_label(NODE, LABEL, "b")
        wait_until(lambda: len(child.signals()) == 2, what="SIGHUP for b")
        assert link(dst) == str(srcdir / "b")
        api.set_label(NODE, LABEL, "typo")
        output, _ = sidecar.communicate(timeout=60)
    finally:
        if sidecar.poll() is None:
            sidecar.kill()
            sidecar.wait()
    assert sidecar.returncode == 1
    assert "specified config typo does not exist" in output
    assert "Label change detected: nvidia.com/device-plugin.config=typo" in output
    assert link(dst) == str(srcdir / "b")
    assert child.signals() == [signal.SIGHUP] * 2

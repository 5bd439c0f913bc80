"""Mutation testing of the modules whose bugs lose or misreport GPUs (`make mutate`; not run in CI).

Usage: python scripts/mutate.py [--budget-s S] [--jobs N] [--fresh] [--report-only] [MODULE ...]
    MODULE: a key of TARGETS (e.g. faults, allocate, daemon-reload); default: all, smallest first.

Each target is one module and the fast tests that cover it. mutmut runs it in its own work directory,
.mutation/<target>/ (src/ and tests/ linked in, a pyproject.toml with the target's [tool.mutmut]), so each
target has its own test selection and keeps its results between runs: a second run tests the mutants of
functions that changed and again those not killed. mutmut itself runs, for each mutant, only the selected
tests that call the mutated function. Then the table: per module the mutants, how many the tests killed, the
score, and every survivor not listed as equivalent in docs/mutation.md (`mutmut show NAME` in the work
directory shows one).

Score: (killed + timed out) / (mutants checked - equivalent ones listed in docs/mutation.md); a run cut
short by its budget says how many it did not check. "no tests" (no selected test calls the function)
counts as not killed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from fnmatch import fnmatch
from importlib.metadata import version
from pathlib import Path
from typing import TextIO

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".mutation"
EQUIVALENTS = ROOT / "docs/mutation.md"
MUTMUT = Path(sys.executable).parent / "mutmut"


@dataclass(frozen=True)
class Target:
    module: str  # path under src/
    tests: tuple[str, ...]  # the fast tests that cover it (no contract tests where unit tests do)
    functions: tuple[str, ...] = ()  # only mutants of these functions (mutmut names; fnmatch patterns)
    # Slow tests left out (pytest node IDs): a property test of the whole parser that every mutant of the
    # module would run for seconds, where fast tests check the same code.
    deselect: tuple[str, ...] = ()
    # A test over this fails (the mutant counts as killed). The daemon's tests pass in about a second each
    # but wait up to 20 s for a served state a mutant never reaches: 10 s keeps a margin of ten over a
    # loaded machine and halves what each such mutant costs.
    test_timeout_s: int = 60
    # pytest-timeout's "signal" fails the test and goes on, but a mutant that hangs the daemon can then hang
    # the event loop's teardown for good, until mutmut's own wall-clock limit (15 times the tests' time)
    # kills the run: minutes per mutant. "thread" ends the test process at the timeout (a kill).
    timeout_method: str = "signal"


DAEMON = "kubegpu.plugin.daemon.xǁDaemonǁ"
PREPARE = "kubegpu.plugin.prepare."
SERVING = "kubegpu.plugin.serving.xǁServingǁ"
# (test_a_cdi_root_that_cannot_be_written_on_reload_keeps_everything_running is left out: it counts applied
# reloads, and the file watcher can add one under mutmut's load.)
RELOAD_TESTS = (
    "tests/plugin/test_daemon_faults.py",
    "tests/plugin/test_daemon_passes.py",
    *(
        f"tests/plugin/test_daemon.py::{t}"
        for t in (
            "test_a_config_that_validates_but_does_not_build_keeps_the_old_one_and_its_monitor",
            "test_a_config_parse_over_its_budget_keeps_the_old_config_and_allocate_answers",
            "test_undecodable_config_fails_the_reload_and_the_watcher_picks_up_the_next_file",
            "test_a_restarted_health_reports_task_catches_up_with_what_it_missed",
        )
    ),
)
RANDOM_DOCUMENTS = (
    "tests/settings/test_plugin_settings.py::test_random_documents_give_a_config_or_a_clear_error"
)
# Prepare, its checkpoint and what one claim does on the node: the driver in this process, every test of
# tests/dra (about 15 s in all; mutmut runs for each mutant only the tests that call its function). A
# directory, so that a new test file there is picked up as new tests (mutmut collects its stats) instead of
# a changed selection, which would start the module over.
DRA_TESTS = ("tests/dra",)

# Smallest first: a run cut short by its budget has still scored the small modules.
TARGETS: dict[str, Target] = {
    "goparse": Target("kubegpu/settings/goparse.py", ("tests/settings/test_parsers.py",)),
    "flags": Target(
        "kubegpu/settings/flags.py",
        ("tests/settings/test_plugin_settings.py", "tests/allocation/test_allocation_config.py"),
        deselect=(RANDOM_DOCUMENTS,),
    ),
    "device_ids": Target(
        "kubegpu/allocation/device_ids.py",
        ("tests/allocation/test_device_ids.py", "tests/allocation/test_allocate.py"),
    ),
    "faults": Target("kubegpu/node/faults.py", ("tests/node/test_faults.py",)),
    "given": Target(
        "kubegpu/settings/given.py",
        (
            "tests/settings/test_given.py",
            "tests/settings/test_table.py",
            "tests/labels/test_settings.py",  # GFD's empty env vars (urfave/cli)
            "tests/settings/test_plugin_settings.py",
        ),
    ),
    "settings-plugin": Target(
        "kubegpu/settings/plugin.py",
        (
            "tests/settings/test_plugin_settings.py",
            "tests/settings/test_plugin_resolve.py",  # every field, every refusal's whole text
            "tests/settings/test_report.py",  # the start-up block
            "tests/allocation/test_allocation_config.py",
            "tests/allocation/test_sharing_resources.py",  # customization, strict config, MPS checks
        ),
        deselect=(RANDOM_DOCUMENTS,),
    ),
    "reconcile": Target("kubegpu/plugin/reconcile.py", ("tests/plugin/test_reconcile.py",)),
    "values": Target(
        "kubegpu/settings/values.py",
        (
            "tests/settings/test_values.py",  # each kind's error, whole; --help's suffix
            "tests/settings/test_parsers.py",
            "tests/settings/test_given.py",
            "tests/settings/test_table.py",
            "tests/labels/test_settings.py",  # GFD's settings (urfave/cli)
        ),
    ),
    "xids": Target(
        "kubegpu/node/xids.py",
        (
            "tests/node/test_xids.py",
            "tests/node/test_xid_catalog.py",
            "tests/node/test_health.py",  # the classifier built from KUBEGPU_XID_ACTIONS
        ),
    ),
    "preferred": Target(
        "kubegpu/allocation/preferred.py",
        ("tests/allocation/test_preferred.py",),
        # The exhaustive 16-GPU oracle checks are best_set.py's; the 8-GPU ones still run every path here.
        deselect=tuple(
            f"tests/allocation/test_preferred.py::{t}"
            for t in (
                "test_every_size_on_a_free_node_is_the_oracles_set[generated-16-boards]",
                "test_every_size_on_a_free_node_is_the_oracles_set[symmetric-16-quads]",
                "test_every_size_on_a_free_node_is_the_oracles_set[pcie-16]",
                "test_best_set_matches_the_oracle_on_arbitrary_16_gpu_weights",
            )
        ),
    ),
    "allocate": Target(
        "kubegpu/allocation/allocate.py",
        (
            "tests/allocation/test_allocate.py",
            "tests/allocation/test_allocation_config.py",
            "tests/plugin/test_server.py",
        ),
    ),
    "resources": Target(
        "kubegpu/allocation/resources.py",
        (
            "tests/allocation/test_resources.py",
            "tests/allocation/test_sharing_resources.py",
            "tests/allocation/test_message_size.py",
        ),
    ),
    # The reload path only, in its three modules: the daemon's passes, prepare (settings, rediscovery, lost
    # GPUs) and apply (faults, served snapshot); each scored by the same tests.
    "daemon-reload": Target(
        "kubegpu/plugin/daemon.py",
        RELOAD_TESTS,
        functions=tuple(
            f"{DAEMON}{f}__mutmut_*"
            for f in ("reload", "_reconcile", "_reconcile_once", "_prepare", "_apply", "_sync_health")
        ),
        test_timeout_s=10,
        timeout_method="thread",
    ),
    "reload-prepare": Target(
        "kubegpu/plugin/prepare.py",
        RELOAD_TESTS,
        functions=(
            f"{PREPARE}x_why_missing__mutmut_*",
            f"{PREPARE}xǁPreparerǁprepare__mutmut_*",
            f"{PREPARE}xǁSettingsLoaderǁload__mutmut_*",
        ),
        test_timeout_s=10,
        timeout_method="thread",
    ),
    "reload-serving": Target(
        "kubegpu/plugin/serving.py",
        RELOAD_TESTS,
        functions=tuple(f"{SERVING}{f}__mutmut_*" for f in ("take", "faults_changed", "build_served")),
        test_timeout_s=10,
        timeout_method="thread",
    ),
    "dra-checkpoint": Target("kubegpu/dra/checkpoint.py", DRA_TESTS),
    "dra-prepare": Target("kubegpu/dra/prepare.py", DRA_TESTS),
    # What Prepare and Unprepare do to the node for one claim (split from prepare.py).
    "dra-claim-devices": Target("kubegpu/dra/claim_devices.py", DRA_TESTS),
}

KILLED = {"killed", "timeout", "caught by type check"}


def mutmut_config(target: Target, test_timeout_s: int) -> str:
    def toml_list(items: tuple[str, ...] | list[str]) -> str:
        return "[" + ", ".join(json.dumps(i) for i in items) + "]"

    args = ["-q", "-p", "no:cacheprovider", f"--timeout={test_timeout_s}", "--hypothesis-profile=mutation"]
    if target.timeout_method != "signal":  # (the default: left out, so that other targets keep results)
        args.append(f"--timeout-method={target.timeout_method}")
    args += [f"--deselect={test}" for test in target.deselect]
    return (
        "\n[tool.mutmut]\n"
        'source_paths = ["src"]\n'
        f"only_mutate = {toml_list([f'src/{target.module}'])}\n"
        f"pytest_add_cli_args_test_selection = {toml_list(target.tests)}\n"
        f"pytest_add_cli_args = {toml_list(args)}\n"
        # grpc is not fork-safe: fork each mutant from a server that never ran the tests.
        'process_isolation = "forkserver"\n'
        "use_git_change_detection = false\n"
    )


def prepare(name: str, target: Target, test_timeout_s: int) -> Path:
    """The target's work directory: src/ and tests/ linked, the repo's pyproject with its [tool.mutmut]."""
    work = WORK / name
    work.mkdir(parents=True, exist_ok=True)
    for part in ("src", "tests"):
        link = work / part
        if link.is_symlink() and link.readlink() != ROOT / part:
            link.unlink()  # results copied from another checkout: test this one's code
        if not link.is_symlink():
            link.symlink_to(ROOT / part)
    config = (ROOT / "pyproject.toml").read_text() + mutmut_config(target, test_timeout_s)
    pyproject = work / "pyproject.toml"
    if not pyproject.exists() or pyproject.read_text() != config:
        pyproject.write_text(config)
        shutil.rmtree(work / "mutants", ignore_errors=True)  # another selection: old verdicts do not hold
    # mutmut runs a copy of tests/ in mutants/: a test that reads the repository's docs (the DRA targets'
    # tests/dra/test_coexistence_doc.py) finds them beside it.
    docs = work / "mutants" / "docs"
    if docs.is_symlink() and docs.readlink() != ROOT / "docs":
        docs.unlink()  # results copied from another checkout
    if not docs.is_symlink():
        docs.parent.mkdir(exist_ok=True)
        docs.symlink_to(ROOT / "docs")
    return work


def run(name: str, target: Target, budget_s: float, jobs: int) -> None:
    """mutmut on the target: new and changed mutants, then again every mutant not killed, so that a test
    written for a survivor counts at the next run.

    mutmut keeps a verdict until the mutated function changes, and tests again every mutant it is given by
    name. A target chosen by function names its mutants: all of them the first time, later those not yet
    killed; mutmut then resets the verdicts of the functions that changed (their mutants renumbered), and a
    second pass tests those."""
    work = prepare(name, target, test_timeout_s=target.test_timeout_s)
    deadline = time.monotonic() + budget_s
    print(f"{name}: mutmut on src/{target.module} ({budget_s:.0f} s at most; log: {work / 'run.log'})")
    known = verdicts(name, target)
    left = [m for m, s in known.items() if s not in KILLED]
    with (work / "run.log").open("w") as log:
        if not target.functions:
            again = [m for m in left if known[m] != "not checked"]  # (those the first pass tests anyway)
            if mutmut(work, [], jobs, deadline, log) and again:
                mutmut(work, again, jobs, deadline, log)
            return
        # With none left, one killed mutant: mutmut still looks for functions that changed.
        first = (left or sorted(known)[:1]) if known else list(target.functions)
        if mutmut(work, first, jobs, deadline, log):
            reset = [m for m, s in verdicts(name, target).items() if s == "not checked" and m not in first]
            if reset:
                mutmut(work, reset, jobs, deadline, log)


def mutmut(work: Path, names: list[str], jobs: int, deadline: float, log: TextIO) -> bool:
    """`mutmut run` on the named mutants (none named: new and changed ones); False when the budget ran out."""
    cmd = ["nice", "-n", "15", str(MUTMUT), "run", "--max-children", str(jobs), *names]
    # Its own process group: at the budget, mutmut's fork server and workers stop with it.
    proc = subprocess.Popen(cmd, cwd=work, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        return True
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        print(f"{work.name}: stopped at its time budget; unchecked mutants are reported as such")
        return False


def verdicts(name: str, target: Target) -> dict[str, str]:
    """Mutant name -> mutmut's status, for the target's mutants (those of its functions, when listed)."""
    meta = WORK / name / "mutants" / "src" / f"{target.module}.meta"
    if not meta.exists():
        return {}
    from mutmut.stats import status_by_exit_code  # the tool's own reading of its exit codes

    codes = json.loads(meta.read_text())["exit_code_by_key"]
    return {
        mutant: status_by_exit_code[code]
        for mutant, code in codes.items()
        if not target.functions or any(fnmatch(mutant, f) for f in target.functions)
    }


def equivalents() -> set[str]:
    """Mutant names docs/mutation.md lists as equivalent (each in backticks at the start of a table row)."""
    if not EQUIVALENTS.exists():
        return set()
    return set(re.findall(r"^\|\s*`([^`]+__mutmut_\d+)`", EQUIVALENTS.read_text(), re.MULTILINE))


def report(names: list[str], *, markdown: bool = False) -> int:
    """Print the table (a README table with `markdown`); return how many targets are below 90 %."""
    listed = equivalents()
    rows, survivors, below = [], [], 0
    for name in names:
        target = TARGETS[name]
        found = verdicts(name, target)
        counts = Counter(found.values())
        equivalent = sum(1 for m, s in found.items() if m in listed and s not in KILLED | {"not checked"})
        killed = sum(counts[s] for s in KILLED)
        unchecked = counts["not checked"]
        scored = len(found) - unchecked - equivalent  # a run cut short scores what it checked
        score = 100.0 * killed / scored if scored else float("nan")
        note = "its reload path" if target.functions else ""
        if unchecked:
            note = ", ".join(filter(None, [note, f"{unchecked} not checked"]))
        if not score >= 90.0:
            below += 1
        module = f"`{target.module}`" if markdown else name
        shown = f"{score:.1f}%" if scored else "not run"
        rows.append((module, str(len(found)), str(killed), str(equivalent), shown, note))
        survivors += [
            f"  {name}: {m} ({s})"
            for m, s in sorted(found.items())
            if s not in KILLED and s != "not checked" and m not in listed
        ]
    header = ("module", "mutants", "killed", "equivalent", "score", "note")
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + " --- |" * len(header))
        for row in rows:
            print("| " + " | ".join(row) + " |")
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        print(f"\nReported {when}, mutmut {version('mutmut')}, Python {platform.python_version()}.")
        return below
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    print(f"\nsurvivors not listed in {EQUIVALENTS.relative_to(ROOT)}: {len(survivors)}")
    print("\n".join(survivors))
    return below


def main() -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("modules", nargs="*", metavar="MODULE", help=f"default: all of {', '.join(TARGETS)}")
    parser.add_argument("--budget-s", type=float, default=3600.0, help="for the whole run (default 3600)")
    parser.add_argument("--jobs", type=int, default=1, help="mutants tested at once (default 1)")
    parser.add_argument("--report-only", action="store_true", help="print the table of the last runs")
    # mutmut learns which tests call each function from one traced run of the tests, and later runs trace
    # only new tests: a function added to a module since is tested by too few (its mutants survive).
    parser.add_argument(
        "--fresh", action="store_true", help="forget the modules' results first (after adding a function)"
    )
    parser.add_argument("--markdown", action="store_true", help="the table for the README")
    args = parser.parse_args()
    names = args.modules or list(TARGETS)
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        parser.error(f"unknown module {', '.join(unknown)}: choose from {', '.join(TARGETS)}")
    if not MUTMUT.exists():
        print(f"{MUTMUT} is missing: run `make mutate`, which installs it", file=sys.stderr)
        return 2
    deadline = time.monotonic() + args.budget_s
    if not args.report_only:
        os.environ.pop("MUTANT_UNDER_TEST", None)
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        for name in names:
            left = deadline - time.monotonic()
            if left < 30:
                print(f"{name}: skipped, the time budget is spent", flush=True)
                continue
            if args.fresh:
                shutil.rmtree(WORK / name / "mutants", ignore_errors=True)
            run(name, TARGETS[name], left, args.jobs)
    below = report(names, markdown=args.markdown)
    return 1 if below else 0


if __name__ == "__main__":
    sys.exit(main())

"""The `kubegpu` command line: one group whose subcommands are imported only when invoked."""

from __future__ import annotations

import errno
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

# gRPC's C core logs connection chatter (GOAWAY on shutdown, ...) to stderr at INFO; keep errors only.
# Must be set before grpc is first imported.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import click

from kubegpu import __version__


class LazyGroup(click.Group):
    """A click group whose subcommands are named "module:attribute" and imported on first use."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands: dict[str, str] = {}
        # Each lazy command's one-line help, as its docstring's first sentence gives it (a test compares).
        self.lazy_help: dict[str, str] = {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy_commands])

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **kwargs: Any,
    ) -> Any:
        """Every error is one line on stderr and a non-zero exit, never a traceback.

        Usage errors exit 2 (click's convention, and the tools' "bad usage or input"); an unexpected
        exception is a bug: one line naming it, exit 1 (with -v the traceback is logged too).
        """
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **kwargs)
        from kubegpu.common.output import flush_stdout

        try:
            code = self._run(args, prog_name, complete_var, **kwargs)
        except SystemExit:
            flush_stdout()  # buffered output whose reader went away: quiet, not 'Exception ignored'
            raise
        flush_stdout()
        sys.exit(code)

    def _run(
        self, args: Sequence[str] | None, prog_name: str | None, complete_var: str | None, **kwargs: Any
    ) -> int:
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False, **kwargs)
        except click.exceptions.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        except click.ClickException as err:
            hint = ""
            if isinstance(err, click.UsageError) and err.ctx is not None:
                hint = f" (see '{err.ctx.command_path} --help')"
            click.echo(f"Error: {' '.join(err.format_message().split())}{hint}", err=True)
            sys.exit(err.exit_code)
        except OSError as err:
            if err.errno == errno.EPIPE:  # the reader of our output went away (| head)
                from kubegpu.common.output import quiet_broken_pipe

                quiet_broken_pipe()
            _internal_error(err)
        except Exception as err:
            _internal_error(err)
        return result if isinstance(result, int) else 0

    def invoke(self, ctx: click.Context) -> Any:
        # Caught here, before click's own handler turns a broken pipe into exit 1.
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            from kubegpu.common.output import quiet_broken_pipe

            quiet_broken_pipe()

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list from `lazy_help`, so `kubegpu --help` imports none of the subcommands."""
        rows = []
        for name in self.list_commands(ctx):
            if name in self.lazy_help:
                rows.append((name, self.lazy_help[name]))
                continue
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(formatter.width - 6 - len(name))))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self.lazy_commands.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module_name, attribute = target.split(":")
        return getattr(importlib.import_module(module_name), attribute)


def _internal_error(err: BaseException) -> None:
    logging.getLogger("kubegpu").debug("traceback of the internal error", exc_info=err)
    message = " ".join(str(err).split()) or "no message"
    click.echo(
        f"Error: internal error ({type(err).__name__}: {message}); please report it with the command line",
        err=True,
    )
    sys.exit(1)


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
)
@click.version_option(__version__, prog_name="kubegpu")
def main() -> None:
    """kubegpu: a Kubernetes GPU device plugin (a drop-in for NVIDIA's) and the SRE tools around it.

    Start with `kubegpu demo` to see a simulated GPU node, kubelet and plugin at work.
    """


# Subcommands in their own packages, imported only when invoked: the daemon should not pay (in start-up
# time and resident memory) for the simulator, the fake NVML, the demo and rich.
main.lazy_commands.update(
    {
        "plugin": "kubegpu.plugin.cli:plugin_cmd",
        "dra": "kubegpu.dra.cli:dra_cmd",
        "demo": "kubegpu.demo.run:demo_cmd",
        "kubelet-sim": "kubegpu.kubeletsim.cli:kubelet_sim",
        "fake-nvml": "kubegpu.node.nvml.fake_cli:fake_nvml",
        "lint": "kubegpu.toolkit.cli:lint",
        "explain": "kubegpu.toolkit.cli:explain",
        "doctor": "kubegpu.toolkit.cli:doctor",
        "top": "kubegpu.toolkit.top.cli:top",
        "config": "kubegpu.configcheck.check:config_group",
        "labels": "kubegpu.labels.cli:labels",
        "config-manager": "kubegpu.configmanager.cli:config_manager",
        "mps-daemon": "kubegpu.mps.cli:mps_daemon",
    }
)
main.lazy_help.update(
    {
        "dra": (
            "Run the DRA driver on this node: the node's GPUs through Dynamic Resource Allocation "
            "(resource.k8s.io), as a drop-in for NVIDIA's DRA driver (driver gpu.nvidia.com, its flags and "
            "env vars)."
        ),
        "plugin": "Run the device plugin daemon on this node.",
        "demo": (
            "Show the plugin on a simulated GPU node: registration, an allocation, an XID, a kubelet restart."
        ),
        "kubelet-sim": "Run a simulated kubelet that device plugins can register with.",
        "fake-nvml": "The fake NVML: GPU nodes without GPUs, for demos and tests.",
        "lint": "Check pod specs for GPU mistakes before they reach the cluster.",
        "explain": (
            "Explain why a GPU pod is Pending, in kube-scheduler's words, and what would let it schedule."
        ),
        "doctor": "Diagnose the classic GPU faults on this node, or across the cluster with --cluster.",
        "top": (
            "Show the cluster's GPUs: model, health, holder pod, utilisation, memory, idle time, "
            "fragmentation."
        ),
        "config": "Work with NVIDIA-format config files.",
        "labels": (
            "Label this node as NVIDIA's GPU Feature Discovery does (nvidia.com/gpu.product, gpu.count, ...)."
        ),
        "config-manager": (
            "Point the plugin's config file at the one this node's label selects, and signal the plugin."
        ),
        "mps-daemon": "The MPS control daemons for resources shared with MPS (NVIDIA's mps-control-daemon).",
    }
)

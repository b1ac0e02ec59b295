"""``sglang-deploy``: the command line around the playbooks and the package's checks."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from rich.markup import escape

from sglang_deploy import ownpath
from sglang_deploy.commands.common import console
from sglang_deploy.playbook.runner import Interrupted, RunnerError, stop_on_signals

# The subcommands, one module each under sglang_deploy.commands, in help order. Each module defines
# ``register(subparsers)``, which adds its parser(s) and sets ``func`` (args -> exit status).
COMMAND_MODULES: tuple[str, ...] = (
    "init",
    "render",
    "validate",
    "up",
    "nccl_check",
    "lock",
    "plan",
    "checkpoint",
    "doctor",
    "kernels",
    "verify",
    "rebuild",
    "bench",
    "quality",
    "rollout",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sglang-deploy",
        description="Rebuild a GPU inference VM into a verified sglang endpoint.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(f"sglang_deploy.commands.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with stop_on_signals():
            return int(args.func(args))
    except (RunnerError, ownpath.UnsafeDirectoryError) as err:
        # A broken inventory, no serving hosts, no Ansible, a directory it must not write into: nothing ran,
        # so no "successful".
        console.print(f"[red]sglang-deploy {args.command}:[/] {escape(str(err))}")
        return 2
    except Interrupted as stop:
        # Any Ansible run of the command is gone by now (stop_on_signals).
        console.print(f"[red]sglang-deploy {args.command}:[/] {escape(stop.line())}")
        return stop.exit_status


if __name__ == "__main__":
    sys.exit(main())

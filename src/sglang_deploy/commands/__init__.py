"""Subcommands of ``sglang-deploy`` that live in their own module.

Each module here defines ``register(subparsers: argparse._SubParsersAction) -> None``, which adds
its parser(s) with ``set_defaults(func=...)`` (a function taking the parsed args and returning the
exit status). ``sglang_deploy.cli.COMMAND_MODULES`` lists the modules, in help order.
"""

from __future__ import annotations

import argparse
import sys

DEFAULT_INVENTORY_HELP = "inventory path (repeatable); default: the project's inventory/proxmox"


def add_inventory_args(parser: argparse.ArgumentParser, *, help_text: str = DEFAULT_INVENTORY_HELP) -> None:
    """``-i/--inventory`` (repeatable) and ``-l/--limit``, as every inventory-driven command has them."""
    parser.add_argument("-i", "--inventory", action="append", help=help_text)
    parser.add_argument("-l", "--limit", help="limit to these hosts or groups (Ansible pattern)")


def usage_error(command: str, message: str) -> int:
    """Say ``sglang-deploy COMMAND: MESSAGE`` on stderr and return exit status 2: the command refused
    its input before running anything."""
    print(f"sglang-deploy {command}: {message}", file=sys.stderr)
    return 2

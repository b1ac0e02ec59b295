"""``sglang-deploy validate [-i INVENTORY]... [-l LIMIT]``: every serving host's flags checked with the
lane's pinned sglang parser (playbooks/validate.yml), before any host is touched.
"""

from __future__ import annotations

import argparse

from sglang_deploy.commands.common import add_inventory_args, console, inventories
from sglang_deploy.playbook.runner import run_playbook


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser("validate", help="check the flags with the lane's pinned sglang parser")
    add_inventory_args(parser)
    parser.set_defaults(func=cmd_validate)


def cmd_validate(args: argparse.Namespace) -> int:
    run = run_playbook(
        "playbooks/validate.yml",
        inventories(args),
        limit=args.limit,
        title="validate",
        live=False,
    )
    if run.rc == 0:
        console.print("[green]flags valid[/] for every serving host")
    return 0 if run.rc == 0 else 1

"""``sglang-deploy up [-i INVENTORY]... [-l LIMIT] [--check] [--tags T] [--skip-tags T] [--artifacts DIR]``:
site.yml (provision + verify) with live progress; without -i, the whole rebuild rehearsed in a local
container (playbooks/rehearsal.yml, inventory/rehearsal).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sglang_deploy.commands.common import add_inventory_args, console
from sglang_deploy.playbook.runner import project_dir, run_playbook


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "up",
        help="run site.yml (provision + verify) with live progress; no -i: rehearse in a local container",
    )
    add_inventory_args(parser, help_text="inventory path (repeatable); none: the rehearsal container of inventory/rehearsal")
    parser.add_argument("--artifacts", help="ansible-runner artifacts directory (default: artifacts/)")
    parser.add_argument(
        "--check", action="store_true",
        help="dry run (ansible-playbook --check --diff): change nothing, report what would change",
    )  # fmt: skip
    parser.add_argument("--tags", help="run only these parts: driver, cuda, ml_env, weights, server, verify (comma-separated)")
    parser.add_argument("--skip-tags", help="skip these parts (same names as --tags)")
    parser.set_defaults(func=cmd_up)


def cmd_up(args: argparse.Namespace) -> int:
    artifacts = Path(args.artifacts) if args.artifacts else None
    if args.check and not args.inventory:
        console.print(
            "[red]sglang-deploy up --check needs -i INVENTORY:[/] the rehearsal container only exists after a "
            "real run creates it (sglang-deploy up), then: sglang-deploy up --check -i inventory/rehearsal"
        )
        return 2
    if args.inventory:
        playbook, inventories, title = "site.yml", args.inventory, "sglang-deploy up"
    else:
        # No inventory: rehearse the whole rebuild in a local container (playbooks/rehearsal.yml).
        playbook, title = "playbooks/rehearsal.yml", "sglang-deploy up (rehearsal container)"
        inventories = [str(project_dir() / "inventory" / "rehearsal")]
        console.print(
            "no inventory given: rehearsing the rebuild in the local container sglang-deploy-rehearsal "
            "(stand-ins for the GPU, NVIDIA's repository and the hub; -i inventory/proxmox for the real box)"
        )
    run = run_playbook(
        playbook,
        inventories,
        limit=args.limit,
        artifacts_dir=artifacts,
        title=title + (" --check" if args.check else ""),
        check=args.check,
        tags=args.tags,
        skip_tags=args.skip_tags,
    )
    console.print(f"artifacts: {run.artifacts}")
    return 0 if run.rc == 0 else 1

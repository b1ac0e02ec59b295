"""``sglang-deploy rebuild``: a serving VM rebuilt from scratch - its root disk re-imaged from the cloud
image, its weights disk kept - and provisioned again in the same run.

  sglang-deploy rebuild -i INVENTORY -l HOST [--yes] [--vm-only] [--artifacts DIR]

Runs site.yml (with --vm-only: playbooks/proxmox.yml alone) with proxmox_vm_rebuild=true for the hosts -l
selects: the VM is stopped, its root disk replaced by a fresh import of the cloud image, cloud-init
regenerated, the VM started; every check of the Proxmox layer runs before the first change. The weights
disk is never detached or destroyed, so hf_model finds the weights complete and fetches nothing. Asks
for confirmation, naming the hosts, unless --yes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sglang_deploy.commands.common import add_inventory_args, usage_error
from sglang_deploy.playbook.runner import project_dir, run_playbook, serving_hosts

CONFIRM_WORD = "rebuild"


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "rebuild",
        help="re-image a serving VM's root disk (weights disk kept) and provision it again (asks first)",
        description=__doc__.split("\n\n", 1)[0] if __doc__ else None,
    )
    add_inventory_args(parser)
    parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    parser.add_argument(
        "--vm-only",
        action="store_true",
        help="only the Proxmox layer (playbooks/proxmox.yml): rebuild and boot the VM, do not provision it",
    )
    parser.add_argument("--artifacts", help="ansible-runner artifacts directory (default: artifacts/)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.limit:
        # A rebuild interrupts serving; doing every host at once is never what a bare command should mean.
        return usage_error("rebuild", "-l HOST is required: name the serving host(s) to rebuild (nothing was changed)")
    inventories = args.inventory or [str(project_dir() / "inventory" / "proxmox")]
    hosts = serving_hosts(inventories, args.limit)  # a bad inventory or limit stops here (exit 2)
    playbook = "playbooks/proxmox.yml" if args.vm_only else "site.yml"
    if not args.yes and not _confirmed(hosts, playbook):
        print("sglang-deploy rebuild: not confirmed; nothing was changed", file=sys.stderr)
        return 1
    result = run_playbook(
        playbook,
        inventories,
        extravars={"proxmox_vm_rebuild": True},
        limit=args.limit,
        artifacts_dir=Path(args.artifacts) if args.artifacts else None,
        title=f"sglang-deploy rebuild {','.join(hosts)}",
    )
    print(f"artifacts: {result.artifacts}", file=sys.stderr)
    return 0 if result.rc == 0 else 1


def _confirmed(hosts: list[str], playbook: str) -> bool:
    then = "boot them" if playbook != "site.yml" else "boot and provision them again (site.yml)"
    print(
        f"This rebuilds {', '.join(hosts)}: stop each VM, DELETE its root disk and import the cloud image anew, "
        f"regenerate cloud-init, {then}. Their weights disks are kept. Serving stops until the run ends.",
        file=sys.stderr,
    )
    print(f"Type {CONFIRM_WORD!r} to continue: ", end="", file=sys.stderr, flush=True)
    try:
        answer = sys.stdin.readline(256)  # the word and a newline; /dev/zero on stdin is no answer
    except (OSError, KeyboardInterrupt, UnicodeDecodeError):
        return False
    if not answer:
        print("\n(no answer: stdin is closed; pass --yes to run without asking)", file=sys.stderr)
    return answer.strip() == CONFIRM_WORD

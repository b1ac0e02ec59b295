"""``sglang-deploy init DIR``: a starter inventory for a new site, the project's inventory/proxmox layout.

DIR gets ``hosts.yml`` (one Proxmox node, one serving VM, documentation addresses marked PLACEHOLDER) and
``group_vars/`` (the GLM-5 launch profiles, the VM's shape, the weights, CUDA, the API-key and Proxmox-token
lookups), every setting with its comment, and no secret: the API key and the token's secret come from vault or
the environment, as the comments say. DIR must not exist yet, or be empty: nothing of an existing inventory
is overwritten. DIR is made by init or is the invoking user's own (never another user's, never reached through a
link another user planted: sglang_deploy.ownpath). Links are copied as the files they point at; the new files are
the user's (umask), DIR 0700 (vault files will live there)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rich.markup import escape

from sglang_deploy import ownpath
from sglang_deploy.commands.common import console, usage_error
from sglang_deploy.playbook.runner import project_dir

# The inventory a new site starts from (the project's own example, validated by the tests as shipped).
TEMPLATE = Path("inventory") / "proxmox"


def _umask() -> int:
    """The process's umask (the new files are the user's, as a shell's would be)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "init",
        help="write a starter inventory (the proxmox layout, commented, no secrets) into a new directory",
        description=__doc__.split("\n\n", 1)[0] if __doc__ else None,
    )
    parser.add_argument("directory", metavar="DIR", help="where the inventory goes (new, or empty)")
    parser.set_defaults(func=cmd_init)


def cmd_init(args: argparse.Namespace) -> int:
    source = project_dir() / TEMPLATE
    try:
        # New, or empty and the invoking user's own: an inventory in a directory another user can write is theirs
        # to rewrite before the next render runs it (ownpath).
        target = ownpath.directory(args.directory, "sglang-deploy init DIR", mode=0o700, empty=True)
        for path in sorted(source.rglob("*")):
            if path.is_file():  # a link is read through: the copy holds the file it points at
                copy = target / path.relative_to(source)
                for parent in reversed(copy.relative_to(target).parents[:-1]):
                    (target / parent).mkdir(mode=0o700, exist_ok=True)
                with os.fdopen(ownpath.new_file(copy, 0o666 & ~_umask()), "wb") as handle:
                    handle.write(path.read_bytes())
        os.chmod(target, 0o700)
    except ownpath.UnsafeDirectoryError as err:
        return usage_error("init", str(err))
    except OSError as err:
        return usage_error("init", f"cannot write {args.directory}: {err.strerror or err}")
    files = sorted(str(path.relative_to(target)) for path in target.rglob("*") if path.is_file())
    console.print(f"[green]wrote[/] {escape(str(target))}: {escape(', '.join(files))}")
    console.print(
        "next: put your node's and VM's addresses in hosts.yml (the PLACEHOLDER lines) and the GPU mappings in "
        "group_vars/sglang_servers/proxmox_vm.yml; create the vault files the comments of "
        "group_vars/sglang_servers/api_key.yml and group_vars/proxmox_nodes/api.yml name; then "
        f"`sglang-deploy validate -i {escape(str(target))}` and `sglang-deploy up -i {escape(str(target))}`"
    )
    return 0

"""``sglang-deploy init DIR``: a starter inventory for a new site, the project's inventory/proxmox layout.

DIR gets ``hosts.yml`` (one Proxmox node, one serving VM, documentation addresses marked PLACEHOLDER) and
``group_vars/`` (the GLM-5 launch profiles, the VM's shape, the weights, CUDA, the API-key and Proxmox-token
lookups), every setting with its comment, and no secret: the API key and the token's secret come from vault or
the environment, as the comments say. DIR must not exist yet, or be empty: nothing of an existing inventory
is overwritten. Links are copied as the files they point at; the new files are the user's (umask), DIR 0700
(vault files will live there)."""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from rich.markup import escape

from sglang_deploy.commands import console, usage_error
from sglang_deploy.playbook.runner import project_dir

# The inventory a new site starts from (the project's own example, validated by the tests as shipped).
TEMPLATE = Path("inventory") / "proxmox"


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "init",
        help="write a starter inventory (the proxmox layout, commented, no secrets) into a new directory",
        description=__doc__.split("\n\n", 1)[0] if __doc__ else None,
    )
    parser.add_argument("directory", metavar="DIR", help="where the inventory goes (new, or empty)")
    parser.set_defaults(func=cmd_init)


def cmd_init(args: argparse.Namespace) -> int:
    target = Path(args.directory)
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        return usage_error("init", f"{target} exists and is not a directory. Fix: name a new directory")
    if target.is_dir() and any(target.iterdir()):
        return usage_error(
            "init", f"{target} is not empty: init writes only into a new or empty directory. Fix: name a new one"
        )
    source = project_dir() / TEMPLATE
    try:
        target.mkdir(mode=0o700, parents=True, exist_ok=True)
        for path in sorted(source.rglob("*")):
            if path.is_file():  # a link is read through: the copy holds the file it points at
                copy = target / path.relative_to(source)
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, copy)
        os.chmod(target, 0o700)
    except OSError as err:
        return usage_error("init", f"cannot write {target}: {err.strerror or err}")
    files = sorted(str(path.relative_to(target)) for path in target.rglob("*") if path.is_file())
    console.print(f"[green]wrote[/] {escape(str(target))}: {escape(', '.join(files))}")
    console.print(
        "next: put your node's and VM's addresses in hosts.yml (the PLACEHOLDER lines) and the GPU mappings in "
        "group_vars/sglang_servers/proxmox_vm.yml; create the vault files the comments of "
        "group_vars/sglang_servers/api_key.yml and group_vars/proxmox_nodes/api.yml name; then "
        f"`sglang-deploy validate -i {escape(str(target))}` and `sglang-deploy up -i {escape(str(target))}`"
    )
    return 0

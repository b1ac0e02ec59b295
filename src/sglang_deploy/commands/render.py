"""``sglang-deploy render [-i INVENTORY]... [-l LIMIT] [--out DIR] [--no-validate]``: each serving host's
systemd unit and env file, written locally (playbooks/render.yml) and checked with systemd-analyze verify.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.markup import escape

from sglang_deploy_host.serving import unitcheck
from sglang_deploy.commands.common import add_inventory_args, console, inventories
from sglang_deploy.playbook.runner import run_playbook


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser("render", help="write each host's systemd unit + env file locally")
    add_inventory_args(parser)
    parser.add_argument("--out", default="render-out", help="output directory (default: render-out)")
    parser.add_argument(
        "--no-validate", action="store_true",
        help="skip the flag validation (the lane's sglang parser) that render runs first, as `validate` and `up` do",
    )  # fmt: skip
    parser.set_defaults(func=cmd_render)


def cmd_render(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    run = run_playbook(
        "playbooks/render.yml",
        inventories(args),
        extravars={"sglang_deploy_render_out": str(out), "sglang_deploy_render_validate": not args.no_validate},
        limit=args.limit,
        title="render",
        live=False,
    )
    if run.rc != 0:
        console.print(f"[red]render failed[/] (artifacts: {run.artifacts})")
        return 1
    units = sorted(out.glob("*/*.service"))
    if not units:
        console.print(f"[red]no units rendered into {out}[/]: does the inventory have sglang_servers?")
        return 1
    if unitcheck.systemd_analyze() is None:
        console.print("[yellow]systemd-analyze not found: units written but not verified[/]")
        for unit in units:
            print(unit)
        return 0
    failed = False
    for unit in units:
        check = unitcheck.verify_unit(unit, rendered_elsewhere=True)
        for note in check.notes:
            console.print(f"  note: {note}")
        if check.ok:
            flags = "flags NOT validated (--no-validate)" if args.no_validate else "flags valid"
            console.print(f"[green]ok[/] {unit} ({flags}; systemd-analyze verify: clean)")
        else:
            failed = True
            console.print(f"[red]FAILED[/] {unit}: systemd-analyze verify printed:")
            for problem in check.problems:
                console.print(f"    {problem}")
    # What `up` would still refuse (render.yml writes it): said last and loudly, so it is seen.
    for note in sorted(out.glob("*/warnings.txt")):
        for line in note.read_text(encoding="utf-8").splitlines():
            console.print(f"[bold yellow]WARNING[/] {escape(note.parent.name)}: {escape(line)}")
    return 1 if failed else 0

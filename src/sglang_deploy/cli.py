"""``sglang-deploy``: the command line around the playbooks and the package's checks."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from sglang_deploy_host import unitcheck
from sglang_deploy.commands import add_inventory_args
from sglang_deploy.runner import Interrupted, RunnerError, project_dir, run_playbook, stop_on_signals

_console = Console(stderr=True, highlight=False, soft_wrap=True)


def _inventories(args: argparse.Namespace) -> list[str]:
    return args.inventory or [str(project_dir() / "inventory" / "proxmox")]


def cmd_render(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    run = run_playbook(
        "playbooks/render.yml",
        _inventories(args),
        extravars={"sglang_deploy_render_out": str(out), "sglang_deploy_render_validate": not args.no_validate},
        limit=args.limit,
        title="render",
        live=False,
    )
    if run.rc != 0:
        _console.print(f"[red]render failed[/] (artifacts: {run.artifacts})")
        return 1
    units = sorted(out.glob("*/*.service"))
    if not units:
        _console.print(f"[red]no units rendered into {out}[/]: does the inventory have sglang_servers?")
        return 1
    if unitcheck.systemd_analyze() is None:
        _console.print("[yellow]systemd-analyze not found: units written but not verified[/]")
        for unit in units:
            print(unit)
        return 0
    failed = False
    for unit in units:
        check = unitcheck.verify_unit(unit, rendered_elsewhere=True)
        for note in check.notes:
            _console.print(f"  note: {note}")
        if check.ok:
            flags = "flags NOT validated (--no-validate)" if args.no_validate else "flags valid"
            _console.print(f"[green]ok[/] {unit} ({flags}; systemd-analyze verify: clean)")
        else:
            failed = True
            _console.print(f"[red]FAILED[/] {unit}: systemd-analyze verify printed:")
            for problem in check.problems:
                _console.print(f"    {problem}")
    # What `up` would still refuse (render.yml writes it): said last and loudly, so it is seen.
    for note in sorted(out.glob("*/warnings.txt")):
        for line in note.read_text(encoding="utf-8").splitlines():
            _console.print(f"[bold yellow]WARNING[/] {escape(note.parent.name)}: {escape(line)}")
    return 1 if failed else 0


def cmd_validate(args: argparse.Namespace) -> int:
    run = run_playbook(
        "playbooks/validate.yml",
        _inventories(args),
        limit=args.limit,
        title="validate",
        live=False,
    )
    if run.rc == 0:
        _console.print("[green]flags valid[/] for every serving host")
    return 0 if run.rc == 0 else 1


def cmd_up(args: argparse.Namespace) -> int:
    artifacts = Path(args.artifacts) if args.artifacts else None
    if args.check and not args.inventory:
        _console.print(
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
        _console.print(
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
    _console.print(f"artifacts: {run.artifacts}")
    return 0 if run.rc == 0 else 1


# Subcommands that live in their own module under sglang_deploy.commands. Each module defines
# ``register(subparsers)``, which adds its parser(s) and sets ``func`` (args -> exit status).
COMMAND_MODULES: tuple[str, ...] = (
    "nccl_check",
    "lock",
    "plan",
    "doctor",
    "kernels",
    "verify",
    "rebuild",
    "bench",
    "rollout",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sglang-deploy",
        description="Rebuild a GPU inference VM into a verified sglang endpoint.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    render = sub.add_parser("render", help="write each host's systemd unit + env file locally")
    add_inventory_args(render)
    render.add_argument("--out", default="render-out", help="output directory (default: render-out)")
    render.add_argument(
        "--no-validate", action="store_true",
        help="skip the flag validation (the lane's sglang parser) that render runs first, as `validate` and `up` do",
    )  # fmt: skip
    render.set_defaults(func=cmd_render)

    validate = sub.add_parser("validate", help="check the flags with the lane's pinned sglang parser")
    add_inventory_args(validate)
    validate.set_defaults(func=cmd_validate)

    up = sub.add_parser(
        "up",
        help="run site.yml (provision + verify) with live progress; no -i: rehearse in a local container",
    )
    add_inventory_args(up, help_text="inventory path (repeatable); none: the rehearsal container of inventory/rehearsal")
    up.add_argument("--artifacts", help="ansible-runner artifacts directory (default: artifacts/)")
    up.add_argument(
        "--check", action="store_true",
        help="dry run (ansible-playbook --check --diff): change nothing, report what would change",
    )  # fmt: skip
    up.add_argument("--tags", help="run only these parts: driver, cuda, ml_env, weights, server, verify (comma-separated)")
    up.add_argument("--skip-tags", help="skip these parts (same names as --tags)")
    up.set_defaults(func=cmd_up)

    for name in COMMAND_MODULES:
        importlib.import_module(f"sglang_deploy.commands.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with stop_on_signals():
            return int(args.func(args))
    except RunnerError as err:
        # A broken inventory, no serving hosts, no Ansible: nothing ran, so no "successful".
        _console.print(f"[red]sglang-deploy {args.command}:[/] {escape(str(err))}")
        return 2
    except Interrupted as stop:
        # Any Ansible run of the command is gone by now (stop_on_signals).
        _console.print(f"[red]sglang-deploy {args.command}:[/] {escape(stop.line())}")
        return stop.exit_status


if __name__ == "__main__":
    sys.exit(main())

"""The subcommands of ``sglang-deploy``, one module each, and what several of them share.

Each module here defines ``register(subparsers: argparse._SubParsersAction) -> None``, which adds
its parser(s) with ``set_defaults(func=...)`` (a function taking the parsed args and returning the
exit status). ``sglang_deploy.cli.COMMAND_MODULES`` lists the modules, in help order.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from pathlib import Path
from collections.abc import Mapping
from typing import Any

from rich.console import Console

from sglang_deploy_host.serving import endpoint, unit_flags
from sglang_deploy import inputfiles
from sglang_deploy.playbook import variables
from sglang_deploy.playbook.runner import project_dir

# Where the commands and cli.main print their rich-marked-up lines: stderr.
console = Console(stderr=True, highlight=False, soft_wrap=True)

DEFAULT_INVENTORY_HELP = "inventory path (repeatable); default: the project's inventory/proxmox"


def add_inventory_args(parser: argparse.ArgumentParser, *, help_text: str = DEFAULT_INVENTORY_HELP) -> None:
    """``-i/--inventory`` (repeatable) and ``-l/--limit``, as every inventory-driven command has them."""
    parser.add_argument("-i", "--inventory", action="append", help=help_text)
    parser.add_argument("-l", "--limit", help="limit to these hosts or groups (Ansible pattern)")


def inventories(args: argparse.Namespace) -> list[str]:
    """The ``-i`` paths given, else the project's inventory/proxmox."""
    return args.inventory or [str(project_dir() / "inventory" / "proxmox")]


def role_defaults(role: str) -> dict[str, Any]:
    """The role's defaults, for the options that stand for its variables (the one place a default is written).
    Empty where the project or the role cannot be read, so that building the parser (``--help``) never fails;
    a command that needs one says so when it runs (:func:`missing_role_defaults`)."""
    try:
        return variables.role_defaults(role, project_dir() / "roles")
    except (SystemExit, variables.UnknownVariablesError):
        return {}


def missing_role_defaults(command: str, role: str, values: Mapping[str, Any]) -> int | None:
    """A usage error naming the role's defaults file when an option that takes its default from there has none."""
    missing = sorted(name for name, value in values.items() if value is None)
    if not missing:
        return None
    return usage_error(
        command,
        f"no default for {', '.join(missing)}: roles/{role}/defaults/main.yml of the project could not be read. "
        "Fix: run from the checkout (or set SGLANG_DEPLOY_PROJECT to it), or give the options",
    )


def usage_error(command: str, message: str) -> int:
    """Say ``sglang-deploy COMMAND: MESSAGE`` on stderr and return exit status 2: the command refused
    its input before running anything."""
    print(f"sglang-deploy {command}: {message}", file=sys.stderr)
    return 2


# --- the API key of a command that talks to a server ----------------------------------------------------
# A key file holds one line; anything larger is not a key file.
API_KEY_FILE_MAX_BYTES = 4096


def add_api_key_args(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--api-key-file`` (a 0600 file), and ``--api-key`` refused by name: one rule for every command,
    the key comes from the environment or a file, never from a command line."""
    parser.add_argument("--api-key-file", help=f"file holding the API key, mode 0600 (default: ${unit_flags.API_KEY_ENV})")
    # Refused (api_key_from): a key typed here is in this process's world-readable argv already.
    parser.add_argument("--api-key", help=argparse.SUPPRESS)


def add_cafile_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--cafile``: the CA an https endpoint's certificate is verified with (never switched off)."""
    parser.add_argument(
        "--cafile", default="", metavar="PEM",
        help="CA that signed an https endpoint's certificate (sglang_server_tls_cafile; default: the system's CAs)",
    )  # fmt: skip


def cafile_from(args: argparse.Namespace) -> str:
    """``--cafile`` as an absolute path, read once here so an unreadable or empty CA file is a usage error before
    anything runs (ValueError naming the option); "" when not given."""
    if not args.cafile:
        return ""
    cafile = str(Path(args.cafile).resolve())
    try:
        endpoint.tls_context(cafile)
    except ValueError as err:
        raise ValueError(f"--cafile: {err}") from None
    return cafile


class ApiKeyError(ValueError):
    """A key the command does not take: the message says where it should come from."""


def api_key_from(args: argparse.Namespace) -> str:
    """The key: ``--api-key-file`` (a regular 0600 file, owned by this user) or ``$SGLANG_API_KEY``;
    ``--api-key`` is refused (every local user can read /proc/PID/cmdline)."""
    if getattr(args, "api_key", None) is not None:
        raise ApiKeyError(
            "--api-key is not taken: on a command line the key is readable by every user of this machine "
            f"(/proc/PID/cmdline). Fix: export {unit_flags.API_KEY_ENV} or pass --api-key-file FILE (0600)"
        )
    path = getattr(args, "api_key_file", None)
    if path is None:
        return _checked(os.environ.get(unit_flags.API_KEY_ENV, "").strip(), f"${unit_flags.API_KEY_ENV}")
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        raise ApiKeyError(f"--api-key-file {path}: cannot read it ({err.strerror})") from None
    if stat.S_ISREG(mode) and mode & 0o077:
        raise ApiKeyError(f"--api-key-file {path}: mode {stat.S_IMODE(mode):04o} lets others read the key. Fix: chmod 600 {path}")
    try:
        key = inputfiles.read_text(path, "--api-key-file", API_KEY_FILE_MAX_BYTES).strip()
    except inputfiles.InputFileError as err:
        raise ApiKeyError(str(err)) from None
    if "\n" in key:
        raise ApiKeyError(f"--api-key-file {path}: more than one line; the file holds the key alone")
    return _checked(key, f"--api-key-file {path}")


def _checked(key: str, source: str) -> str:
    """The key, if the role would take it too (unit_flags.api_key_problem: one rule for every place a key
    comes from); ApiKeyError in one line, without a byte of the key, otherwise."""
    problem = unit_flags.api_key_problem(key, source)
    if problem:
        raise ApiKeyError(problem)
    return key

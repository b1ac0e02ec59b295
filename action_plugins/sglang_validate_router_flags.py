"""Action ``sglang_validate_router_flags``: the routers' flags through the pinned router's (smg's) parser.

Runs on the control node (an action plugin: nothing is sent to a host), before the router role
changes anything. Hosts with the same flags are checked once. Fails with every problem of every
host, each naming the host, argparse's complaint and the variable to fix.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from sglang_deploy.fleet.router import PACKAGE, RouterConfigError, flag_argv
from sglang_deploy.fleet.router_validator import lock_path, validate_router_argv
from sglang_deploy.launch.validate_action import ValidateAction
from sglang_deploy.launch.validator_venv import ValidatorError


class ActionModule(ValidateAction):
    _VALID_ARGS = frozenset(("hosts", "lock_dir"))

    def validate(self, result: dict[str, Any], hosts: dict[str, Any]) -> dict[str, Any]:
        python = f"{sys.version_info.major}.{sys.version_info.minor}"
        lock = lock_path(Path(str(self._task.args.get("lock_dir") or "")), python)
        if not lock.is_file():
            return {**result, "failed": True, "msg": (
                f"no router lock for this control node's Python {python} ({lock}): the router's flags are checked "
                f"with the pinned router here. Fix: run Ansible from a Python the locks cover, or add the lock "
                f"(the command is in the header of the others)"
            )}  # fmt: skip
        errors: list[str] = []
        verdicts: dict[tuple[str, ...], Any] = {}
        checked: dict[str, str] = {}
        # Each host's published sglang_router_resolved (roles/sglang_router/tasks/resolve.yml).
        for host, resolved in hosts.items():
            try:
                argv = tuple(flag_argv(resolved["flags"]))
            except (RouterConfigError, KeyError, TypeError) as err:
                errors.append(f"host {host}: sglang_router_*: {err}")
                continue
            try:
                if argv not in verdicts:
                    verdicts[argv] = validate_router_argv(argv, lock)
            except ValidatorError as err:
                return {**result, "failed": True, "msg": f"cannot validate the router flags of {host}: {err}"}
            verdict = verdicts[argv]
            checked[host] = f"{PACKAGE} {verdict.version}"
            if verdict.error:
                errors.append(verdict.format(host))
        return self.verdict(result, errors, checked, f"{len(checked)} router(s) valid")

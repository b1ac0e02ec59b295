"""The base of the project's validating action plugins (action_plugins/sglang_validate_*flags.py).

They run on the control node only (nothing is sent to a host) and may build a validator venv first
(minutes): its progress lines go through Ansible's Display, which shows them live; a worker's stderr
would become one late, truncated warning.
"""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from sglang_deploy.launch.validator_venv import progress_to

display = Display()


class ValidateAction(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp: Any = None, task_vars: Any = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        # Each host's published resolution (sglang_server_resolved / sglang_router_resolved), by host name.
        hosts: dict[str, Any] = dict(self._task.args.get("hosts") or {})
        if not hosts:
            return {**result, "failed": True, "msg": f"{self._task.action}: no hosts to validate"}
        with progress_to(display.display):
            return self.validate(result, hosts)

    def validate(self, result: dict[str, Any], hosts: dict[str, Any]) -> dict[str, Any]:
        """``result`` (ActionBase's) with the verdict on ``hosts``: ``failed``/``msg``, ``checked`` per host."""
        raise NotImplementedError

    @staticmethod
    def verdict(result: dict[str, Any], errors: list[str], checked: dict[str, str], valid: str) -> dict[str, Any]:
        """Every host's problems at once (failed), else ``valid`` (e.g. "3 host(s) valid")."""
        if errors:
            return {**result, "failed": True, "msg": "\n".join(errors), "checked": checked}
        return {**result, "changed": False, "checked": checked, "msg": valid}

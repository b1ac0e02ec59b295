"""Action ``sglang_validate_flags``: the play's hosts' flags through their lane's sglang parser.

Runs on the control node (an action plugin, not a module: nothing is sent to a host). Hosts with
the same lane and flags are checked once. Fails with every problem of every host, each naming the
host, the flag, the bad value, the valid choices and the sglang version.
"""

from __future__ import annotations

from typing import Any

from sglang_deploy.lanes.catalog import LaneError, load_lane
from sglang_deploy.launch.validate_action import ValidateAction
from sglang_deploy.launch.validator import validate_flags
from sglang_deploy.launch.validator_venv import ValidatorError, ensure_validator_env, torch_source


class ActionModule(ValidateAction):
    _VALID_ARGS = frozenset(("hosts",))

    def validate(self, result: dict[str, Any], hosts: dict[str, Any]) -> dict[str, Any]:
        verdicts: dict[tuple[str, tuple[str, ...]], Any] = {}
        errors: list[str] = []
        checked: dict[str, str] = {}
        # Each host's published sglang_server_resolved (roles/sglang_server/tasks/resolve.yml).
        for host, resolved in hosts.items():
            lane_name = str(resolved["lane"])
            argv = tuple(str(word) for word in resolved["launch"]["validation_argv"])
            try:
                lane = load_lane(lane_name)
            except (LaneError, KeyError, ValueError, FileNotFoundError) as err:
                errors.append(f"host {host}: sglang_server_lane={lane_name!r}: {err}")
                continue
            key = (lane_name, argv)
            try:
                if key not in verdicts:
                    verdicts[key] = validate_flags(list(argv), lane, host=host)
                source = torch_source(ensure_validator_env(lane))
            except ValidatorError as err:
                # The validator could not run (no torch source, a broken venv): not a flag problem.
                return {**result, "failed": True, "msg": f"cannot validate the flags of {host}: {err}"}
            verdict = verdicts[key]
            checked[host] = f"sglang {lane.sglang} ({lane.name}; validator torch from {source})"
            if verdict.problems:
                errors.append(verdict.format(host))
        return self.verdict(result, errors, checked, f"{len(checked)} host(s) valid")

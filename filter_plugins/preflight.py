"""Filters for roles/preflight: each one is a single call into ``sglang_deploy.serving.preflight``."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

from sglang_deploy.serving import preflight
from sglang_deploy_host.gpu import gpufacts
from sglang_deploy.lanes.catalog import LaneError, load_lane
from sglang_deploy.launch.config import LaunchConfig, LaunchConfigError


def _inputs(
    facts: Any, launch: Any, settings: Any, host: str
) -> tuple[gpufacts.GpuFacts, LaunchConfig, preflight.PreflightSettings]:
    try:
        parsed = gpufacts.GpuFacts.from_dict(dict(facts))
        values = dict(settings)
        lane = str(values.pop("lane"))
        # The server's resolved flags and environment (sglang_server_resolved, already in the lane's spelling): the
        # typed launch again on this side of the play boundary, nothing merged here.
        config = LaunchConfig.from_vars(
            launch.get("flags"),
            python="python3",  # the interpreter plays no part in the checks
            env=launch.get("env"),
            secret_env_names=_env_refs(launch.get("flags")),
            lane=lane,
        )
        checked = preflight.settings_from_vars(cuda=load_lane(lane).cuda, **values)
    except (LaunchConfigError, LaneError, preflight.PreflightError, TypeError, KeyError) as err:
        raise AnsibleFilterError(f"host {host}: preflight: {err}") from None
    return parsed, config, checked


def _env_refs(flags: Any) -> list[str]:
    """The variables the resolved flags read from the env file ({env: NAME}): known to the launch."""
    return [str(v["env"]) for v in dict(flags or {}).values() if isinstance(v, dict) and set(v) == {"env"}]


def preflight_problems(
    facts: Any,
    launch: Any,
    settings: Any,
    checks: Any = None,
    unit_active: bool = False,
    host: str = "?",
) -> list[str]:
    """Messages of every failed check ("host H: preflight check C failed: FOUND. Fix: ...")."""
    parsed, config, checked = _inputs(facts, launch, settings, host)
    try:
        problems = preflight.evaluate(
            parsed,
            config,
            checked,
            checks=list(checks) if checks else preflight.ALL_CHECKS,
            unit_active=bool(unit_active),
        )
    except (preflight.PreflightError, ValueError) as err:
        raise AnsibleFilterError(f"host {host}: preflight: {err}") from None
    return [p.message(host) for p in problems]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "preflight_problems": preflight_problems,
        }

"""Action ``sglang_validate_quality``: each host's quality reference judged on the control node (quality.py).

Runs before any host changes (an action plugin: nothing is sent to a host). For each host whose published
``sglang_server_resolved.quality`` names a reference: the file read bounded and checked whole as the check reads
it, and its served model compared with the one the host will serve. Every problem of every host at once, each
naming the host, the variable, the file and the fix. Hosts without a reference pass.
"""

from __future__ import annotations

from typing import Any

from sglang_deploy.launch.validate_action import ValidateAction
from sglang_deploy_host.serving import quality_reference

VARIABLE = "sglang_server_quality_reference"


class ActionModule(ValidateAction):
    _VALID_ARGS = frozenset(("hosts",))

    def validate(self, result: dict[str, Any], hosts: dict[str, Any]) -> dict[str, Any]:
        errors: list[str] = []
        checked: dict[str, Any] = {}
        for host, resolved in hosts.items():
            settings = dict((resolved or {}).get("quality") or {})
            path = str(settings.get("reference") or "")
            if not path:
                checked[host] = "no quality reference"
                continue
            try:
                reference = quality_reference.load_reference(path)
                reference.thresholds.merged(settings.get("thresholds"), "sglang_server_quality_thresholds")
            except quality_reference.QualityInputError as err:
                errors.append(f"host {host}: {VARIABLE}={path}: {err}")
                continue
            served = str(((resolved or {}).get("endpoint") or {}).get("served_model") or "")
            if reference.served_model != served:
                errors.append(
                    f"host {host}: {VARIABLE}={path} was recorded for the served model {reference.served_model!r}, "
                    f"this host serves {served!r}. Fix: record a reference for this model on a known-good launch "
                    "(sglang-deploy quality record, docs/quality.md), or name the right file"
                )
                continue
            checked[host] = f"{reference.served_model}, recorded {reference.recorded}, {len(reference.prompts)} prompts"
        return self.verdict(result, errors, checked, f"{len(hosts)} host(s) checked")

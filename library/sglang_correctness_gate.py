#!/usr/bin/python
"""Ansible module sglang_correctness_gate: the correctness gate against a server, run on its host."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_correctness_gate
short_description: Ask a serving sglang the correctness probes and judge each whole answer
description:
  - Runs the correctness gate (module_utils/sglang_deploy_host/serving/gate.py, the same code as C(sglang-deploy verify))
    against I(url) - each probe at temperature 0, its prompt and max_tokens fitted to the context /v1/models
    reports - and fails unless every answer stopped by itself, matches its probe, fits the probe's length and is
    no loop. The rolling restart runs it against the worker it restarted, before the worker rejoins its routers.
  - The API key is read on the host from the unit's 0600 environment file (I(env_file)), so it is in no
    command line and no task argument.
  - Read-only. In check mode nothing was restarted, so nothing is asked.
extends_documentation_fragment: [sglang_endpoint_client]
options:
  url:
    description: The server's base URL as the host reaches it (sglang_server_resolved.endpoint.local_url).
    type: str
    required: true
  model:
    description: The served model name.
    type: str
    required: true
  probes:
    description: The probes, as a probes file holds them (a list of name, prompt, expect, max_tokens, max_answer_chars, context).
    type: list
    elements: dict
    required: true
  inventory_hostname:
    description: The inventory host the task runs for; failure messages start with it.
    type: str
"""

RETURN = r"""
passed:
  description: Whether every probe passed (null in check mode).
  type: bool
  returned: always
report:
  description: One line per probe, the failures first (probe, reason, the answer's start).
  type: str
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_deploy_host.serving import endpoint, gate, unit_flags


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "model": {"type": "str", "required": True},
            "probes": {"type": "list", "elements": "dict", "required": True},
            **endpoint.CLIENT_OPTIONS,
            "inventory_hostname": {"type": "str"},
        },
        supports_check_mode=True,
    )
    params = module.params
    host = params["inventory_hostname"]
    prefix = f"host {host}: " if host else ""
    try:
        probes = gate.parse_probes(params["probes"], "probes")
        url = unit_flags.check_url(params["url"])
        key = endpoint.api_key_from_env_file(params["env_file"], params["api_key_env"])
    except (gate.ProbeFileError, ValueError) as err:
        module.fail_json(msg=f"{prefix}{err}", passed=None, report="")
    if module.check_mode:
        module.exit_json(changed=False, passed=None, report="check mode: nothing was restarted, nothing asked")
    try:
        target = endpoint.Endpoint(url, api_key=key, cafile=params["cafile"])
    except ValueError as err:
        module.fail_json(msg=f"{prefix}{err}", passed=None, report="")
    results = gate.run_probes(target, params["model"], probes)
    report = gate.report(results)
    failed = [r.probe.name for r in results if not r.ok]
    if failed:
        module.fail_json(
            msg=f"{prefix}the correctness gate failed {len(failed)} of {len(results)} probes at {url} ({', '.join(failed)}):\n{report}",
            passed=False, report=report,
        )  # fmt: skip
    module.exit_json(changed=False, passed=True, report=report)


if __name__ == "__main__":
    main()

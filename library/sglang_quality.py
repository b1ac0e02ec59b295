#!/usr/bin/python
"""Ansible module sglang_quality: record a quality reference, or check a server against one, on its host."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_quality
short_description: Record the served token distribution as a reference, or check a server against one
description:
  - Runs the quality check (module_utils/sglang_deploy_host/serving/quality.py, the same code as C(sglang-deploy quality))
    against I(url) through sglang's native C(/generate) logprob API.
  - C(action=check) compares the server with I(reference) - per-token KL divergence (mean and p99) over teacher-forced
    and greedy positions, top-1 agreement, greedy agreement and batch consistency at concurrency 8 or more - and
    fails unless every figure is within the thresholds. The sglang_server role runs it after its readiness gate when
    the inventory names a reference; the rolling restart runs it before a worker rejoins its routers.
  - C(action=record) answers I(prompts) (a prompt set, as its file holds it) and returns the reference.
  - The API key is read on the host from the unit's 0600 environment file (I(env_file)), so it is in no command
    line and no task argument.
  - The verdict's one line is written to I(verdict_file) (root's, 0644), where C(sglang-deploy doctor -i) reads it.
  - In check mode nothing is asked.
extends_documentation_fragment: [sglang_endpoint_client]
options:
  action:
    description: Record a reference, or check against one.
    type: str
    choices: [check, record]
    default: check
  url:
    description: The server's base URL as the host reaches it (sglang_server_resolved.endpoint.local_url).
    type: str
    required: true
  model:
    description: The served model name (record; a check takes the reference's).
    type: str
  reference:
    description: The reference, as its file holds it (the lookup sglang_deploy_quality_reference reads it). For check.
    type: dict
  prompts:
    description: The prompt set, as its file holds it (the lookup sglang_deploy_quality_prompts reads it). For record.
    type: dict
  thresholds:
    description: Thresholds (kl_mean, kl_p99, top1_agreement, tie_margin) replacing the reference's; empty keeps them.
    type: dict
    default: {}
  verdict_file:
    description: Where the verdict's line is kept on the host for the doctor ("" = nowhere). Its directory must exist.
    type: str
    default: ""
  inventory_hostname:
    description: The inventory host the task runs for; failure messages start with it.
    type: str
"""

RETURN = r"""
passed:
  description: Whether the check passed (null for record and in check mode).
  type: bool
  returned: always
verdict:
  description: Every figure of the check (KL mean/p99/max, top-1 agreement, greedy and batch results, tokens, seconds).
  type: dict
  returned: when a check ran
report:
  description: The verdict in lines, its first the one the doctor reads.
  type: str
  returned: always
reference:
  description: The recorded reference (record).
  type: dict
  returned: when a reference was recorded
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_deploy_host.serving import endpoint, quality, quality_reference, unit_flags


def _keep_line(path: str, line: str) -> None:
    """The verdict's line in ``path``, replaced whole (a temporary file in the same directory, then renamed;
    the name is never followed as a link)."""
    directory = os.path.dirname(path) or "."
    temporary = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(line + "\n")
        os.replace(temporary, path)
    except BaseException:
        if os.path.lexists(temporary):
            os.unlink(temporary)
        raise


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "action": {"type": "str", "choices": ["check", "record"], "default": "check"},
            "url": {"type": "str", "required": True},
            "model": {"type": "str"},
            "reference": {"type": "dict"},
            "prompts": {"type": "dict"},
            "thresholds": {"type": "dict", "default": {}},
            "verdict_file": {"type": "str", "default": ""},
            **endpoint.CLIENT_OPTIONS,
            "inventory_hostname": {"type": "str"},
        },
        required_if=[("action", "check", ["reference"]), ("action", "record", ["prompts", "model"])],
        supports_check_mode=True,
    )
    params = module.params
    host = params["inventory_hostname"]
    prefix = f"host {host}: " if host else ""
    try:
        url = unit_flags.check_url(params["url"])
        key = endpoint.api_key_from_env_file(params["env_file"], params["api_key_env"])
        if params["action"] == "record":
            prompts = quality_reference.parse_prompt_set(params["prompts"], "prompts")
            reference = None
        else:
            reference = quality_reference.parse_reference(params["reference"], "reference")
            prompts = None
        base = reference.thresholds if reference is not None else quality_reference.Thresholds()
        limits = base.merged(params["thresholds"], "thresholds")
    except (quality_reference.QualityInputError, ValueError) as err:
        module.fail_json(msg=f"{prefix}{err}", passed=None, report="")
    if module.check_mode:
        module.exit_json(changed=False, passed=None, report="check mode: nothing asked")
    try:
        target = endpoint.Endpoint(url, api_key=key, cafile=params["cafile"])
        if prompts is not None:
            recorded = quality.record(target, params["model"], prompts, limits)
            module.exit_json(changed=False, passed=None, reference=recorded,
                             report=f"recorded {len(recorded['prompts'])} prompts in {recorded['seconds']} s")  # fmt: skip
        assert reference is not None
        verdict = quality.check(target, reference, limits)
    except (quality.NoVerdictError, endpoint.EndpointError, ValueError) as err:
        line = f"sglang-deploy quality check: NO VERDICT: {' '.join(str(err).split())}"
        if params["verdict_file"] and params["action"] == "check":
            _keep_line(params["verdict_file"], line)
        module.fail_json(msg=f"{prefix}{line} at {url}", passed=None, report=line)
    report = verdict.report()
    if params["verdict_file"]:
        _keep_line(params["verdict_file"], verdict.line())
    if not verdict.passed:
        module.fail_json(
            msg=f"{prefix}the quality check FAILED at {url} against the reference recorded {reference.recorded}:\n{report}",
            passed=False, verdict=verdict.to_dict(), report=report,
        )  # fmt: skip
    module.exit_json(changed=False, passed=True, verdict=verdict.to_dict(), report=report)


if __name__ == "__main__":
    main()

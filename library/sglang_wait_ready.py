#!/usr/bin/python
"""Ansible module sglang_wait_ready: the readiness gate after a (re)start of the sglang unit."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_wait_ready
short_description: Wait until the sglang server generates (/health_generate answers 200), bounded
description:
  - The port opens long before the model can generate, so this polls I(path) with back-off until it
    answers 200 or I(timeout) seconds are spent, and stops early when the unit has failed.
  - The API key is read on the host from the unit's 0600 environment file, so it is in no command
    line and no task argument. Requests go to that host only, follow no redirect, and each has a
    total deadline (the project's endpoint client).
  - Read-only. In check mode nothing was (re)started, so nothing is polled.
extends_documentation_fragment: [sglang_endpoint_client]
options:
  url:
    description: Base URL; default from I(bind_host) and I(port) (a wildcard bind address means loopback).
    type: str
  bind_host:
    description: The server's --host flag.
    type: str
  port:
    description: The server's --port flag (sglang's default 30000).
    type: int
  timeout:
    description: Total budget in seconds.
    type: float
    required: true
  path:
    description: Route to poll.
    type: str
    default: /health_generate
  unit:
    description: A systemd unit; the wait ends early when it failed.
    type: str
  initial_delay:
    description: First pause between polls (s); it doubles up to I(max_delay).
    type: float
    default: 2
  max_delay:
    description: Longest pause between polls (s).
    type: float
    default: 30
"""

RETURN = r"""
ready:
  description: Whether the server answered 200 in time (null in check mode).
  type: bool
  returned: always
verdict:
  description: One line, e.g. "ready - http://127.0.0.1:8000/health_generate answered 200 after 41s (6 polls)".
  type: str
  returned: always
attempts:
  description: Polls made.
  type: int
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_deploy_host.serving import endpoint, unit_flags


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str"},
            "bind_host": {"type": "str"},
            "port": {"type": "int"},
            "timeout": {"type": "float", "required": True},
            "path": {"type": "str", "default": endpoint.READY_PATH},
            "unit": {"type": "str"},
            **endpoint.CLIENT_OPTIONS,
            "initial_delay": {"type": "float", "default": 2.0},
            "max_delay": {"type": "float", "default": 30.0},
        },
        mutually_exclusive=[("url", "bind_host"), ("url", "port")],
        supports_check_mode=True,
    )
    params = module.params
    flags = {name: params[key] for name, key in (("host", "bind_host"), ("port", "port")) if params[key] is not None}
    url = params["url"] or unit_flags.base_url(flags)
    if module.check_mode:
        module.exit_json(changed=False, ready=None, attempts=0, verdict=f"check mode: {url} not polled")
    try:
        result, verdict = endpoint.readiness_gate(
            url,
            params["timeout"],
            path=params["path"],
            unit=params["unit"],
            env_file=params["env_file"],
            api_key_env=params["api_key_env"],
            initial_delay=params["initial_delay"],
            max_delay=params["max_delay"],
            cafile=params["cafile"],
        )
    except ValueError as err:
        module.fail_json(msg=str(err), ready=False, attempts=0, verdict=str(err))
    if not result.ready:
        module.fail_json(msg=verdict, ready=False, attempts=result.attempts, verdict=verdict)
    module.exit_json(changed=False, ready=True, attempts=result.attempts, verdict=verdict)


if __name__ == "__main__":
    main()

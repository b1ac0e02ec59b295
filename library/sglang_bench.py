#!/usr/bin/python
"""Ansible module sglang_bench: sglang's own bench_serving against the host's own server."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_bench
short_description: Plan a concurrency sweep, or run one step of it with sglang's bench_serving on the host
description:
  - I(mode=plan) returns the sweep's steps (concurrency, number of prompts) for the server's launch
    flags; the default sweep is capped and topped by its C(max-running-requests).
  - I(mode=step) runs C(python -m sglang.bench_serving) from the host's ml-env against the server on
    the host itself (its C(--host)/C(--port); a wildcard bind means loopback) with random token ids of
    fixed lengths, and returns bench_serving's JSONL record with the secret fields of the server's
    C(/server_info) redacted, the number of failed requests and samples of their errors.
  - The API key is read on the host from the unit's 0600 environment file and handed to bench_serving
    in its environment (C(OPENAI_API_KEY)), never on a command line or in a task argument.
  - A step that fails (server errors, a timeout, an unhealthy server) is returned with C(ok=false) and
    C(problem), not as a module failure, so the sweep's other results are kept; the playbook fails the host.
  - Changes nothing on the host (bench_serving's output goes to a private temporary directory that is
    removed). In check mode I(mode=plan) runs and I(mode=step) does not.
extends_documentation_fragment: [sglang_endpoint_client]
options:
  mode:
    description: C(plan) the steps, or run one C(step).
    type: str
    choices: [plan, step]
    required: true
  flags:
    description: The server's launch flags (the launch model's C(flags) dict; C({env NAME}) values are references only).
    type: dict
    required: true
  concurrencies:
    description: Concurrencies to run (I(mode=plan)); empty = 1, 8, 16, 32, 64 up to C(max-running-requests), which is the top.
    type: list
    elements: int
    default: []
  prompts_per_concurrency:
    description: Prompts per concurrent request (I(mode=plan)); at least 5 (role default sglang_deploy_bench_prompts_per_concurrency).
    type: int
  concurrency:
    description: The step's concurrency (I(mode=step)).
    type: int
  num_prompts:
    description: The step's number of prompts (I(mode=step)).
    type: int
  python:
    description: Interpreter of the ml-env that has the server's sglang (I(mode=step)).
    type: path
  tokenizer:
    description: Tokenizer directory; default C(tokenizer-path), else the model directory of I(flags).
    type: path
  backend:
    description:
      - bench_serving backend (C(sglang) = /generate; the OpenAI chat backend counts only C(delta.content)); I(mode=step).
      - No option of this module has a default of the sweep's own; the sglang_deploy_bench role passes its defaults.
    type: str
    choices: [sglang, sglang-oai-chat, sglang-oai]
  input_len:
    description: Input tokens per request (I(mode=step)).
    type: int
  output_len:
    description: Output tokens per request (I(mode=step)).
    type: int
  seed:
    description: bench_serving's random seed (I(mode=step)).
    type: int
  warmup_requests:
    description: Warm-up requests before the measurement; default the step's concurrency.
    type: int
  timeout:
    description: Seconds the step may take in all; bench_serving is killed after that (I(mode=step)).
    type: float
"""

RETURN = r"""
steps:
  description: The sweep (I(mode=plan)), each with C(concurrency) and C(num_prompts).
  type: list
  returned: mode=plan
step:
  description: The step's result (I(mode=step)) - C(concurrency), C(num_prompts), C(ok), C(failed_requests),
    C(problem), C(error_samples), C(record) (bench_serving's JSONL record, secrets redacted), C(wall_s),
    C(argv) (bench_serving's arguments), C(output_tail).
  type: dict
  returned: mode=step, not in check mode
ok:
  description: Whether the step ran and every request completed (I(mode=step)).
  type: bool
  returned: mode=step
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_deploy_host.serving import bench_steps, endpoint


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "mode": {"type": "str", "choices": ["plan", "step"], "required": True},
            "flags": {"type": "dict", "required": True},
            "concurrencies": {"type": "list", "elements": "int", "default": []},
            "prompts_per_concurrency": {"type": "int"},
            "concurrency": {"type": "int"},
            "num_prompts": {"type": "int"},
            "python": {"type": "path"},
            "tokenizer": {"type": "path"},
            "backend": {"type": "str", "choices": list(bench_steps.BACKENDS)},
            "input_len": {"type": "int"},
            "output_len": {"type": "int"},
            "seed": {"type": "int"},
            "warmup_requests": {"type": "int"},
            "timeout": {"type": "float"},
            **endpoint.CLIENT_OPTIONS,
        },
        # No defaults here: the sglang_deploy_bench role's are the only ones, and it passes each.
        required_if=[
            ("mode", "plan", ("prompts_per_concurrency",)),
            ("mode", "step", ("concurrency", "num_prompts", "python", "backend", "input_len", "output_len", "seed", "timeout")),
        ],
        supports_check_mode=True,
    )
    params = module.params
    flags = params["flags"]
    try:
        if params["mode"] == "plan":
            steps = bench_steps.plan(
                params["concurrencies"], bench_steps.max_running_requests(flags), params["prompts_per_concurrency"]
            )
            module.exit_json(changed=False, steps=[{"concurrency": s.concurrency, "num_prompts": s.num_prompts} for s in steps])
        settings = bench_steps.settings_from_flags(
            flags,
            tokenizer=params["tokenizer"],
            backend=params["backend"],
            input_len=params["input_len"],
            output_len=params["output_len"],
            seed=params["seed"],
            warmup_requests=params["warmup_requests"],
            timeout_s=params["timeout"],
            # The CA given, else the server's own --ssl-ca-certs (this module runs on its host).
            **({"cafile": params["cafile"]} if params["cafile"] else {}),
        )
        api_key = endpoint.api_key_from_env_file(params["env_file"], params["api_key_env"])
    except ValueError as err:  # BenchError, a bad port or model flag, an unreadable env file
        module.fail_json(msg=f"sglang_bench: {err}")
    if module.check_mode:
        module.exit_json(changed=False, ok=None, msg=f"check mode: bench_serving not run against {settings.base_url}")
    result = bench_steps.run_step(
        bench_steps.bench_command(params["python"]),
        settings,
        bench_steps.Step(params["concurrency"], params["num_prompts"]),
        api_key,
    )
    module.exit_json(
        changed=False, ok=result.ok, step=result.to_dict(), msg=f"concurrency {result.concurrency}: {result.problem or 'ok'}"
    )


if __name__ == "__main__":
    main()

"""The options of the modules that talk to a serving endpoint with its API key (sglang_bench,
sglang_wait_ready, sglang_correctness_gate): the key is read on the host from the unit's environment file,
so it is on no command line and in no task's arguments. Their argument spec:
``sglang_deploy_host.endpoint.API_KEY_OPTIONS``."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  env_file:
    description: The unit's EnvironmentFile= holding the API key.
    type: path
  api_key_env:
    description: The key's variable in I(env_file).
    type: str
    default: SGLANG_API_KEY
"""
